"""The exit-code contract end to end (trainyard_train/exitcodes.py): what the node agent exits with for each
failure class, one line for a config error whenever it is found, and never a traceback or a retry for it."""

from __future__ import annotations

import json
import os
import signal
import zlib
from pathlib import Path

import pytest
from trainer_launch import launch, run, running
from trainyard_train.checkpoint import COMMIT, step_dir
from trainyard_train.exitcodes import CONFIG_ERROR, GRACE_EXPIRED

pytestmark = pytest.mark.slow
# Old code lost the line in 7 of 12 launches (issue 24): six launches all keeping it would happen by chance with
# probability (5/12)^6 < 0.6%.
LAUNCHES = 6


def unloadable_checkpoint(run_dir: Path, step: int = 10) -> Path:
    """A step whose marker is complete (sizes match) but whose checksum is not: the only checkpoint there is."""
    path = step_dir(run_dir / "checkpoints", step)
    path.mkdir(parents=True)
    (path / ".metadata").write_bytes(b"\0" * 64)
    files = {".metadata": 64}
    (path / COMMIT).write_text(json.dumps({"step": step, "world_size": 2, "files": files,
                                           "crc32": {".metadata": f"{zlib.crc32(b'x') :08x}"}}))
    return path


def config_error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if "config error:" in line]


def test_config_error_after_the_rendezvous_is_one_line_exit_2_every_time(
    tmp_path: Path, cleanup_launches: list
) -> None:
    """Found by the workers (the one checkpoint in run_dir cannot be loaded), after the rendezvous: each launch
    prints the line once, exits 2, never restarts (LOGLEVEL=INFO makes torchrun log each restart), leaves no
    worker behind, and shows no traceback."""
    for attempt in range(LAUNCHES):
        run_dir = tmp_path / f"run-{attempt}"
        unloadable_checkpoint(run_dir)
        launched = launch(run_dir, max_restarts=3, env={"LOGLEVEL": "INFO"})
        cleanup_launches.append(launched)
        launched.wait_for(lambda _ev, launched=launched: bool(launched.worker_pids()) or "config error" in
                          launched.output())
        workers = launched.worker_pids() if launched.proc.poll() is None else []
        rc = launched.wait()
        output = launched.output()
        assert rc == CONFIG_ERROR, output
        lines = config_error_lines(output)
        assert len(lines) == 1, output
        assert "run_dir: no checkpoint under" in lines[0] and "step-00000010" in lines[0], lines
        assert "will restart worker group" not in output and "Traceback" not in output, output
        assert running(workers) == [], output


def test_a_run_of_another_model_in_run_dir_is_refused_before_the_rendezvous(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run(run_dir, ["train.steps=2", "checkpoint.interval_steps=2"], nproc=1, torchrun=False)
    for torchrun in (True, False):
        launched = launch(run_dir, ["model.d_model=32", "train.steps=4"], nproc=1, torchrun=torchrun)
        assert launched.wait() == CONFIG_ERROR, launched.output()
        (line,) = config_error_lines(launched.output())
        assert line == (f"trainyard_train: config error: run_dir: {run_dir} holds a run of another model "
                        "(step-00000002: model.d_model: 64 in the run, 32 now); use a new run_dir, or set the model "
                        "back"), line
        assert "rendezvous" not in launched.output().lower()


def test_a_diverging_loss_stops_the_run_with_one_line_and_no_checkpoint(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    launched = launch(run_dir, ["optim.lr=1e30", "optim.grad_clip=0", "optim.warmup_steps=0", "train.steps=20",
                                "checkpoint.interval_steps=1"], nproc=1, torchrun=False)
    assert launched.wait() == CONFIG_ERROR, launched.output()
    (line,) = config_error_lines(launched.output())
    assert "optim.lr: the loss is" in line and "training diverged" in line, line
    committed = [p for p in (run_dir / "checkpoints").glob("step-*") if (p / COMMIT).exists()]
    losses = [e["loss"] for e in launched.events() if e["event"] == "step"]
    assert len(committed) == len(losses)  # every finite step may be saved; the diverged one is not


def test_a_model_no_node_can_hold_is_refused_by_the_workers_before_allocating(tmp_path: Path) -> None:
    """Only the workers know the world size the planner's estimate needs: each refuses before its process group
    and model exist (issue 24 #7), one line reaches the agent's output, exit 2 without a restart."""
    launched = launch(tmp_path / "run", [f"model.d_model={2**40}"], max_restarts=3, env={"LOGLEVEL": "INFO"})
    assert launched.wait() == CONFIG_ERROR, launched.output()
    (line,) = config_error_lines(launched.output())
    assert line.startswith("trainyard_train: config error: parallel: ddp2 needs ") and "at a world of 2, " in line
    assert "will restart worker group" not in launched.output() and "Traceback" not in launched.output()


@pytest.mark.parametrize("signalled", ["worker", "agent"])
def test_a_stop_that_cannot_commit_within_the_grace_period_exits_124(
    tmp_path: Path, cleanup_launches: list, signalled: str
) -> None:
    """A grace period far shorter than a save (1 ms): the signalled worker's watchdog ends it before the
    checkpoint commits, and the agent ends with 124, without a restart (the old agent restarted the workers after
    a signal to one of them, and said 143, a committed stop, after one to itself), leaving no worker."""
    run_dir = tmp_path / "run"
    launched = launch(run_dir, ["train.steps=400", "checkpoint.interval_steps=1000", "shutdown.grace_period_s=0.001"],
                      max_restarts=3, env={"LOGLEVEL": "INFO"})
    cleanup_launches.append(launched)
    launched.wait_for(lambda ev: any(e["event"] == "step" and e["step"] >= 10 for e in ev))
    workers = launched.worker_pids()
    os.kill(workers[0] if signalled == "worker" else launched.proc.pid, signal.SIGTERM)
    rc = launched.wait()
    output = launched.output()
    assert rc == GRACE_EXPIRED, output
    assert "grace_period_expired" in output and "will restart worker group" not in output, output
    assert not list((run_dir / "checkpoints").glob("step-*/COMMIT")), output
    assert running(workers) == [], output
