"""The trainer on this machine's accelerator: speed against a plain compiled loop, and a one-command check.

    .venv/bin/python bench/gpu.py            # numbers: matmul peak, tokens/s + MFU vs the peer, FSDP2 vs DDP,
                                             #   the planner vs measured memory, checkpoint blocking
    .venv/bin/python bench/gpu.py --check    # pass/fail: sync/async checkpoints, resume, worker kill, a DDP
                                             #   checkpoint resumed under FSDP2, PowerSGD

On CUDA it uses gpt-small.yaml (124M parameters, bf16, torch.compile) on generated data and NCCL; without
CUDA it runs the same steps on tiny.yaml with gloo, and says which GPU-only parts it skipped, so the
script is exercised on every CPU machine too. MFU uses nanoGPT's estimate (flops per token
6N + 12·L·d·T, N without the input embedding) against the bf16 matmul peak measured here, not a datasheet.
The memory lines compare the planner (planner.py, without its fixed reserve for the CUDA context and NCCL) with
what the run held: its model states, and on CUDA torch.cuda.max_memory_allocated after the first step.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workloads"))
from trainyard_train.config import Config, load_config  # noqa: E402
from trainyard_train.distributed import DistEnv, destroy_distributed, init_distributed  # noqa: E402
from trainyard_train.loop import Trainer  # noqa: E402
from trainyard_train.model import DecoderLM  # noqa: E402
from trainyard_train.planner import NVIDIA_SMI_MIB, estimate, gpu_memory_bytes, parameter_count  # noqa: E402

CUDA = torch.cuda.is_available()
CONFIG = REPO / "workloads" / "configs" / ("gpt-small.yaml" if CUDA else "tiny.yaml")
# Same model and batch for the trainer and the peer: 16-sequence micro-batches (as in issue 10), 4 of them.
BATCH = ["train.micro_batch_size=16", "train.global_batch_size=64"] if CUDA else []
COMMON = ["data.path=data", "data.generate=true", "metrics.port=0", "train.log_every=1", "comm.hook=allreduce"]
WARMUP_STEPS = 10  # compile, allocator warm-up, DDP bucket rebuild
MiB = 2**20


def skip(what: str) -> None:
    print(f"SKIP {what}: no CUDA device on this machine")


# -- running the trainer ------------------------------------------------------------------------------------


@dataclass
class Run:
    run_dir: Path
    proc: subprocess.Popen[str]
    log: Path

    def events(self) -> list[dict[str, Any]]:
        path = self.run_dir / "progress.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def wait(self, timeout: float = 900) -> int:
        return self.proc.wait(timeout=timeout)

    def wait_for_step(self, step: int, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(e["event"] == "step" and e["step"] >= step for e in self.events()):
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"run exited {self.proc.returncode} before step {step}:\n{self.log.read_text()}")
            time.sleep(0.05)
        raise TimeoutError(f"no step {step} within {timeout} s")

    def worker_pids(self) -> list[int]:
        return [int(p) for p in Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()]


def start(run_dir: Path, overrides: Sequence[str], *, nproc: int = 1, max_restarts: int = 0) -> Run:
    run_dir.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "trainyard_train.agent", "--standalone", f"--nproc-per-node={nproc}",
        f"--max-restarts={max_restarts}", "--monitor-interval=0.1",
        "-m", "trainyard_train", "--config", str(CONFIG), f"run_dir={run_dir}", *COMMON, *BATCH, *overrides,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO / "workloads"), "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    env.setdefault("OMP_NUM_THREADS", "1")
    log = run_dir / f"run-{time.monotonic_ns()}.log"
    with open(log, "w") as handle:
        proc = subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT, env=env, text=True)
    return Run(run_dir, proc, log)


def finish(run_dir: Path, overrides: Sequence[str], **kwargs: Any) -> list[dict[str, Any]]:
    run = start(run_dir, overrides, **kwargs)
    rc = run.wait()
    if rc != 0:
        raise RuntimeError(f"trainer exited {rc}:\n{run.log.read_text()[-4000:]}")
    return run.events()


def steps(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["event"] == "step"]


def median_step_seconds(events: list[dict[str, Any]]) -> float:
    timed = [e["seconds"] for e in steps(events) if e["step"] > WARMUP_STEPS]
    return statistics.median(timed)


# -- numbers ------------------------------------------------------------------------------------------------


def matmul_peak_tflops(n: int = 8192, iters: int = 50) -> float:
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(5):
        a @ b
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(iters):
        a @ b
    torch.cuda.synchronize()
    return 2 * n**3 * iters / (time.perf_counter() - started) / 1e12


def flops_per_token(cfg: Config) -> float:
    """nanoGPT's estimate: 6N for the parameter matmuls (forward + backward) plus 12·L·d·T for attention, N
    without the input embedding (a lookup, no matmul) unless the head shares it."""
    m = cfg.model
    lookup = 0 if m.tie_embeddings else m.vocab_size * m.d_model
    return 6 * (parameter_count(cfg) - lookup) + 12 * m.n_layers * m.d_model * m.seq_len


class _PlainLoss(torch.nn.Module):
    """nanoGPT's way: full logits, then cross-entropy on them in fp32, all inside the compiled graph."""

    def __init__(self, model: DecoderLM) -> None:
        super().__init__()
        self.model = model

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.model(inputs)
        return functional.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


class Peer:
    """A plain best-practice loop on the same model and batch, no DDP: on CUDA torch.compile, fused AdamW,
    TF32 and bf16; on CPU the same loop eager in fp32 (compiling on CPU takes minutes)."""

    def __init__(self, cfg: Config) -> None:
        device = torch.device("cuda" if CUDA else "cpu")
        if CUDA:
            torch.set_float32_matmul_precision("high")
        self.model = DecoderLM(cfg.model).to(device)
        plain = _PlainLoss(self.model)
        self.compiled = torch.compile(plain) if CUDA else plain
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.optim.lr, betas=cfg.optim.betas,
                                           fused=True)
        self.micro, self.accum = cfg.train.micro_batch_size, cfg.train.global_batch_size // cfg.train.micro_batch_size
        self.tokens = torch.randint(0, cfg.model.vocab_size, (self.accum, self.micro, cfg.model.seq_len + 1),
                                    device=device)

    def step(self) -> None:
        for i in range(self.accum):
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=CUDA):
                loss = self.compiled(self.tokens[i, :, :-1], self.tokens[i, :, 1:])
            (loss / self.accum).backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        loss.item()  # one host sync per step, as the trainer's


def timed(step: Any) -> float:
    if CUDA:
        torch.cuda.synchronize()
    started = time.perf_counter()
    step()
    return time.perf_counter() - started


def interleaved_seconds(cfg: Config, root: Path, steps_: int = 200) -> tuple[float, float]:
    """Median step seconds of the trainer's own step (Trainer._train_step, in this process, one rank) and of the
    peer, one step of each in turn: both see the same machine load, which on a shared CPU swings from one
    second to the next far more than the difference being measured."""
    peer = Peer(cfg)
    runtime = init_distributed(DistEnv.from_env({}), timeout_s=600)
    try:
        trainer = Trainer(dataclasses.replace(cfg, run_dir=str(root / "interleaved")), runtime)
        ours, theirs = [], []
        for _ in range(steps_):
            ours.append(timed(trainer._train_step))
            theirs.append(timed(peer.step))
        return statistics.median(ours[WARMUP_STEPS:]), statistics.median(theirs[WARMUP_STEPS:])
    finally:
        destroy_distributed()


def memory_line(cfg: Config, events: list[dict[str, Any]], label: str) -> None:
    """The planner's estimate for one rank beside what the run measured (max_memory_allocated on CUDA)."""
    held = next(e for e in events if e["event"] == "memory")["ranks"][0]
    plan = estimate(cfg, world_size=1, local_world_size=1, device_type="cuda" if CUDA else "cpu", overhead_bytes=0)
    states = held["params"] + held["grads"] + held["optimizer"]
    line = (f"memory {label}: model states measured {states / MiB:.1f} MiB, planned {plan.states / MiB:.1f}; "
            f"planned total without the fixed reserve {plan.total / MiB:.1f} MiB")
    if "max_allocated" in held:
        measured = held["max_allocated"]
        print(f"{line}; torch.cuda.max_memory_allocated {measured / MiB:.1f} MiB (planned / measured "
              f"{plan.total / measured:.2f}x)")
    else:
        print(line)
        skip(f"torch.cuda.max_memory_allocated for {label}")


def numbers(root: Path) -> None:
    cfg = load_config(CONFIG, [*COMMON, *BATCH])
    tokens_per_step = cfg.train.global_batch_size * cfg.model.seq_len
    device = torch.cuda.get_device_name() if CUDA else "CPU"
    print(f"device: {device}; torch {torch.__version__}; config {CONFIG.name} ({parameter_count(cfg) / 1e6:.1f}M "
          f"parameters); {tokens_per_step} tokens/step")
    if CUDA:  # the planner's table of what CUDA gives each GPU model (planner.py CUDA_TOTAL_MIB), measured here
        total = torch.cuda.mem_get_info()[1]
        planned = ", ".join(f"{gpu} {gpu_memory_bytes(gpu) / MiB:.0f} MiB" for gpu in NVIDIA_SMI_MIB
                            if gpu.split("-")[0] in device)
        print(f"CUDA total memory (torch.cuda.mem_get_info): {total / MiB:.0f} MiB; planner: {planned or 'no entry'}")
    else:
        skip("torch.cuda.mem_get_info total")
    peak = matmul_peak_tflops() if CUDA else None
    if peak is None:
        skip("bf16 matmul peak")
    else:
        print(f"bf16 matmul peak (8192^3): {peak:.0f} TFLOP/s")
    speed = finish(root / "speed", ["train.steps=40", "checkpoint.interval_steps=1000"])
    trainer = median_step_seconds(speed)
    trainer_tps = tokens_per_step / trainer
    print(f"trainer (DDP layout, one process): {trainer_tps:,.0f} tokens/s ({trainer * 1000:.1f} ms/step)", end="")
    if peak is not None:
        achieved = flops_per_token(cfg) * trainer_tps / 1e12
        print(f", {achieved:.0f} TFLOP/s, MFU {achieved / peak:.1%} of the measured peak")
    else:
        print()
        skip("MFU")
    ours, theirs = interleaved_seconds(cfg, root)
    kind = "torch.compile + fused AdamW + TF32 + bf16" if CUDA else "eager fp32 on CPU, not compiled"
    print(f"peer (plain loop, {kind}): {tokens_per_step / theirs:,.0f} tokens/s; trainer / peer: "
          f"{theirs / ours:.2f}x ({ours * 1000:.2f} vs {theirs * 1000:.2f} ms/step, alternating steps in one process)")
    memory_line(cfg, speed, "DDP layout")
    fsdp_overrides = ["train.steps=40", "checkpoint.interval_steps=1000", "parallel.data_parallel=fsdp"]
    fsdp_events = finish(root / "fsdp", fsdp_overrides)
    fsdp = median_step_seconds(fsdp_events)
    print(f"FSDP2 on one {'GPU' if CUDA else 'process'}: {tokens_per_step / fsdp:,.0f} tokens/s "
          f"({fsdp * 1000:.1f} ms/step); FSDP2 / DDP-layout step time: {fsdp / trainer:.2f}x")
    memory_line(load_config(CONFIG, [*COMMON, *BATCH, *fsdp_overrides]), fsdp_events, "FSDP2")
    for async_save in (False, True):
        events = finish(
            root / f"ckpt-{async_save}",
            ["train.steps=30", "checkpoint.interval_steps=10", f"checkpoint.async_save={str(async_save).lower()}"],
        )
        blocking = [e["blocking_seconds"] for e in events if e["event"] == "checkpoint"]
        mode = "async" if async_save else "sync"
        print(
            f"checkpoint {mode}: blocks the step {statistics.median(blocking):.3f} s per save (median of "
            f"{len(blocking)}; one step is {median_step_seconds(events):.3f} s)"
        )
    if torch.cuda.device_count() < 2:
        skip("tensor parallelism and compile + TP (one device: bench/layouts.py runs the layouts on gloo)")


# -- check --------------------------------------------------------------------------------------------------


class Checks:
    def __init__(self) -> None:
        self.failed: list[str] = []

    def report(self, name: str, ok: bool, detail: str) -> None:
        print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}")
        if not ok:
            self.failed.append(name)


def check(root: Path) -> int:
    checks = Checks()
    nproc = max(1, torch.cuda.device_count()) if CUDA else 2
    print(f"check on {'CUDA/NCCL' if CUDA else 'CPU/gloo'} with {nproc} process(es), config {CONFIG.name}")
    if not CUDA:
        skip("NCCL, bf16 and torch.compile in these checks (they run on gloo/fp32)")
    for async_save in (False, True):
        mode = "async" if async_save else "sync"
        run_dir = root / mode
        common = ["checkpoint.interval_steps=10", f"checkpoint.async_save={str(async_save).lower()}"]
        try:
            first = finish(run_dir, ["train.steps=40", *common], nproc=nproc)
            committed = [e["step"] for e in first if e["event"] == "checkpoint"]
            blocking = max(e["blocking_seconds"] for e in first if e["event"] == "checkpoint")
            checks.report(f"40 steps, {mode} checkpoints", committed == [10, 20, 30, 40],
                          f"committed at {committed}, longest blocking {blocking:.3f} s")  # fmt: skip
            resumed = finish(run_dir, ["train.steps=45", *common], nproc=nproc)
            start_event = [e for e in resumed if e["event"] == "start"][-1]  # the file holds both runs
            ok = start_event["step"] == 40 and resumed[-1]["event"] == "done" and resumed[-1]["step"] == 45
            checks.report(f"resume after {mode} checkpoints", ok, f"resumed at step {start_event['step']}")
        except RuntimeError as exc:
            checks.report(f"{mode} checkpoints", False, str(exc)[-2000:])

    run = start(root / "kill", ["train.steps=60", "checkpoint.interval_steps=10"], nproc=nproc, max_restarts=1)
    try:
        run.wait_for_step(25)
        killed_at = time.time()
        os.kill(run.worker_pids()[-1], signal.SIGKILL)
        rc = run.wait()
        events = run.events()
        starts = [e for e in events if e["event"] == "start"]
        first_new = next((e for e in steps(events) if len(starts) > 1 and e["time"] > starts[1]["time"]), None)
        ok = rc == 0 and len(starts) == 2 and starts[1]["step"] >= 20 and events[-1]["event"] == "done"
        detail = f"restarted at step {starts[-1]['step']}" + (
            f", {first_new['time'] - killed_at:.1f} s from kill to the first new step" if first_new else ""
        )
        checks.report("worker SIGKILL, restart and resume", ok, detail)
    except (RuntimeError, TimeoutError) as exc:
        checks.report("worker SIGKILL, restart and resume", False, str(exc)[-2000:])

    try:
        # A DDP checkpoint resumes under FSDP2 (DCP resharding on this device's collectives) with the losses DDP
        # itself goes on with: equal on gloo/fp32, within bf16's rounding on CUDA (FSDP2 gathers bf16 weights where
        # DDP autocasts from fp32 ones).
        common = ["checkpoint.interval_steps=20"]
        finish(root / "ddp", ["train.steps=20", *common], nproc=nproc)
        shutil.copytree(root / "ddp", root / "fsdp")
        went_on = steps(finish(root / "ddp", ["train.steps=30", *common], nproc=nproc))[-10:]
        resumed = steps(finish(root / "fsdp", ["train.steps=30", *common, "parallel.data_parallel=fsdp"],
                               nproc=nproc))[-10:]  # fmt: skip
        gap = max(abs(a["loss"] - b["loss"]) / a["loss"] for a, b in zip(went_on, resumed, strict=True))
        ok = [e["step"] for e in resumed] == list(range(21, 31)) and gap < (2e-2 if CUDA else 1e-5)
        checks.report("DDP checkpoint resumed under FSDP2", ok, f"largest relative loss gap {gap:.1e} over steps 21-30")
    except RuntimeError as exc:
        checks.report("DDP checkpoint resumed under FSDP2", False, str(exc)[-2000:])

    try:
        events = finish(
            root / "powersgd",
            ["train.steps=40", "checkpoint.interval_steps=20", "comm.hook=powersgd", "comm.powersgd_start_iter=10"],
            nproc=nproc,
        )
        sent = {e["step"]: e["grad_bytes"] for e in steps(events)}
        ratio = sent[5] / sent[30]
        losses = [e["loss"] for e in steps(events)]
        ok = ratio > 2 and all(map(lambda x: x == x, losses)) and losses[-1] < losses[0]
        backend = "NCCL" if CUDA else "gloo"
        checks.report(f"PowerSGD on {backend}", ok, f"{ratio:.1f}x fewer gradient bytes, loss {losses[0]:.2f} -> "
                      f"{losses[-1]:.2f}")  # fmt: skip
    except RuntimeError as exc:
        checks.report("PowerSGD", False, str(exc)[-2000:])
    print("gpu-check:", "PASS" if not checks.failed else f"FAIL ({', '.join(checks.failed)})")
    return 1 if checks.failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="pass/fail checks instead of speed numbers")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="trainyard-gpu-") as tmp:
        if args.check:
            return check(Path(tmp))
        numbers(Path(tmp))
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
