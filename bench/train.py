"""Trainer benchmarks on CPU/gloo with the tiny config: steps/s at 1 and 2 processes, PowerSGD vs plain
all-reduce (bytes and step time), and recovery time after a worker is SIGKILLed. Prints numbers only.

    .venv/bin/python bench/train.py
"""

from __future__ import annotations

import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "workloads"))
from trainer_launch import launch, run, steps  # noqa: E402

STEPS = 200
WARMUP = 20  # skip start-up steps (allocation, DDP bucket rebuild, PowerSGD warm-up)


def step_stats(events: list[dict]) -> tuple[float, float]:
    timed = [e for e in steps(events) if e["step"] > WARMUP]
    median = statistics.median(e["seconds"] for e in timed)
    return 1 / median, statistics.median(e["grad_bytes"] for e in timed)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        common = [f"train.steps={STEPS}", "checkpoint.interval_steps=1000"]
        for nproc in (1, 2):
            sps, _ = step_stats(run(root / f"p{nproc}", common, nproc=nproc).events())
            print(f"steps/s, {nproc} process(es), global batch 16: {sps:.1f}")
        plain_sps, plain_bytes = step_stats(run(root / "plain", common).events())
        psgd_sps, psgd_bytes = step_stats(
            run(root / "psgd", [*common, "comm.hook=powersgd", "comm.powersgd_rank=4"]).events()
        )
        print(f"allreduce: {plain_bytes / 1024:.1f} KiB/step, {1000 / plain_sps:.2f} ms/step")
        print(
            f"powersgd r=4: {psgd_bytes / 1024:.1f} KiB/step ({plain_bytes / psgd_bytes:.1f}x less), "
            f"{1000 / psgd_sps:.2f} ms/step"
        )

        interval = 20
        launched = launch(root / "kill", ["train.steps=150", f"checkpoint.interval_steps={interval}"], max_restarts=2)
        launched.wait_for(lambda ev: any(e["event"] == "step" and e["step"] >= 50 for e in ev))
        killed_at = time.time()
        os.kill(launched.worker_pids()[-1], signal.SIGKILL)
        launched.wait()
        events = launched.events()
        restart = [i for i, e in enumerate(events) if e["event"] == "start"][1]
        first_new = next(e for e in events[restart:] if e["event"] == "step")
        lost = max(e["step"] for e in steps(events[:restart])) - events[restart]["step"]
        print(
            f"recovery after SIGKILL of a worker: {first_new['time'] - killed_at:.2f} s to the first new step, "
            f"{events[restart]['time'] - killed_at:.2f} s to resume; steps redone {lost} (interval {interval})"
        )


if __name__ == "__main__":
    main()
