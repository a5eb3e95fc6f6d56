"""Launching the trainer under torchrun (CPU, gloo) in subprocesses, for the workloads tests and bench."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
WORKLOADS = REPO / "workloads"
TINY = WORKLOADS / "configs" / "tiny.yaml"

if str(WORKLOADS) not in sys.path:  # works without `pip install -e workloads` too
    sys.path.insert(0, str(WORKLOADS))

from trainyard_train.progress import read_progress  # noqa: E402


def free_port() -> int:
    """A port for a server this test starts later. Picked and closed, it could be handed to any process binding
    port 0 before ours binds it; one connection closed from the listening side leaves it in TIME_WAIT for a minute,
    during which the kernel hands it to nobody, while a server that sets SO_REUSEADDR (http.server, uvicorn,
    torch's TCPStore) binds it at once. One that does not (socketserver.TCPServer: allow_reuse_address = False)
    gets EADDRINUSE for that minute."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port: int = listener.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)):
            accepted, _ = listener.accept()
            accepted.close()  # this side closes first: it holds the TIME_WAIT
        return port


def subprocess_env() -> dict[str, str]:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    # A fresh TCPStore per rendezvous round: with torchrun's shared store, restarted workers can read
    # their predecessors' gloo addresses and fail to connect (see workloads/README.md).
    env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(WORKLOADS), str(HERE), env.get("PYTHONPATH")]))
    env.pop("TRAINYARD_METRICS_PORT", None)
    return env


@dataclass
class Launch:
    proc: subprocess.Popen[str]
    run_dir: Path
    log_path: Path

    def events(self) -> list[dict[str, Any]]:
        path = self.run_dir / "progress.jsonl"
        return read_progress(path) if path.exists() else []

    # Both bounds only stop a hung run: on a loaded 2-core CI machine a run takes minutes where here it takes seconds.
    def wait_for(self, predicate: Callable[[list[dict[str, Any]]], bool], timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate(self.events()):
                return
            if self.proc.poll() is not None:
                raise AssertionError(f"run exited ({self.proc.returncode}) before condition:\n{self.output()}")
            time.sleep(0.02)
        raise AssertionError(f"timed out waiting for condition:\n{self.output()}")

    def wait(self, timeout: float = 300) -> int:
        return self.proc.wait(timeout=timeout)

    def output(self) -> str:
        return self.log_path.read_text()

    def worker_pids(self) -> list[int]:
        """Direct children of the node agent are the worker processes."""
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
        return [int(pid) for pid in children]


def running(pids: list[int]) -> list[int]:
    """The processes among ``pids`` that still run (a zombie has finished)."""
    alive = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            continue
        if state != "Z":
            alive.append(pid)
    return alive


def launch(
    run_dir: Path,
    overrides: Sequence[str] = (),
    *,
    nproc: int = 2,
    max_nodes: int | None = None,
    max_restarts: int = 0,
    torchrun: bool = True,
    env: Mapping[str, str] | None = None,
) -> Launch:
    """``max_nodes`` (default nproc) bounds the elastic range --nnodes=1:MAX the node agent checks the layout
    over before torchrun starts (validate.check_torchrun_command); layouts with a fixed model-parallel block and
    a small batch allow one node."""
    run_dir.mkdir(parents=True, exist_ok=True)
    # The trainer under a default process group that refuses CPU tensors, as NCCL's does (strict_trainer.py).
    trainer = ["-m", "strict_trainer", "--config", str(TINY), f"run_dir={run_dir}", *overrides]
    if torchrun:
        cmd = [
            sys.executable,
            "-m",
            "trainyard_train.agent",  # torchrun's agent behind the exit-code contract, as the jobs launch it
            f"--nnodes=1:{max_nodes or nproc}",
            f"--nproc-per-node={nproc}",
            "--rdzv-backend=c10d",
            "--rdzv-endpoint=127.0.0.1:0",  # the store binds a free port itself: no port picked, then bound later
            # min < max makes the rendezvous wait for late joiners; nobody else is coming here.
            "--rdzv-conf=last_call_timeout=1",
            f"--max-restarts={max_restarts}",
            "--monitor-interval=0.1",
            *trainer,
        ]
    else:
        cmd = [sys.executable, *trainer]
    log_path = run_dir / f"launch-{time.monotonic_ns()}.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env={**subprocess_env(), **(env or {})}, text=True,
            start_new_session=True
        )
    return Launch(proc, run_dir, log_path)


def run(run_dir: Path, overrides: Sequence[str] = (), **kwargs: Any) -> Launch:
    """Launch and wait; fail with the run's output if it does not exit 0."""
    launched = launch(run_dir, overrides, **kwargs)
    rc = launched.wait()
    assert rc == 0, f"exit {rc}:\n{launched.output()}"
    return launched


def steps(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["event"] == "step"]
