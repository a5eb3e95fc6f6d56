"""Memory per rank by layout, measured and planned, and the step time of each layout (CPU, gloo; numbers only).

    .venv/bin/python bench/layouts.py

Each layout trains the same 4-layer model (width 256, vocabulary 512) for a few steps under torchrun. In its
second optimizer step every rank reports the bytes it holds (parameters, gradients, optimizer state: its shards
only); the planner's count for the rank's pipeline coordinate is printed beside it, with the planner's whole
per-rank estimate (activations included) and the median step time. On CPU the planner runs in its fp32 mode.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "workloads"))
from trainer_launch import TINY, run, steps  # noqa: E402
from trainyard_train.config import load_config  # noqa: E402
from trainyard_train.planner import estimate_rank  # noqa: E402

MODEL = ["model.d_model=256", "model.n_layers=4", "model.vocab_size=512", "model.n_kv_heads=4"]
COMMON = [*MODEL, "train.steps=12", "checkpoint.interval_steps=1000"]
FSDP = "parallel.data_parallel=fsdp"
LAYOUTS: list[tuple[int, list[str]]] = [
    (1, []),
    (2, []),
    (2, [FSDP]),
    (4, [FSDP, "parallel.dp_replicate=2"]),
    (4, [FSDP, "parallel.tp=2"]),
    (2, [FSDP, "parallel.pp=2"]),
    (4, [FSDP, "parallel.pp=2", "parallel.tp=2"]),
    (8, [FSDP, "parallel.pp=2", "parallel.tp=2"]),
]
KiB = 1024


def rows(events: list[dict[str, Any]], overrides: list[str], nproc: int) -> list[str]:
    cfg = load_config(TINY, [*COMMON, *overrides])
    memory = next(e for e in events if e["event"] == "memory")
    step_ms = 1000 * statistics.median(e["seconds"] for e in steps(events)[2:])
    per_pp = nproc // cfg.parallel.pp
    lines = []
    for rank, held in enumerate(memory["ranks"]):
        plan = estimate_rank(cfg, world_size=nproc, pp_rank=rank // per_pp, device_type="cpu")
        measured = held["params"] + held["grads"] + held["optimizer"]
        lines.append(f"{memory['layout']:30s} {rank:4d} {held['params'] / KiB:9.1f} {held['grads'] / KiB:9.1f} "
                     f"{held['optimizer'] / KiB:9.1f} {measured / KiB:9.1f} {plan.states / KiB:9.1f} "
                     f"{plan.total / KiB:9.1f} {step_ms:8.1f}")
    return lines


def main() -> None:
    print(f"{'layout':30s} {'rank':>4s} {'params':>9s} {'grads':>9s} {'optim':>9s} {'states':>9s} {'planned':>9s} "
          f"{'plan all':>9s} {'ms/step':>8s}   (KiB; planned = the planner's states, plan all = its total)")
    with tempfile.TemporaryDirectory() as tmp:
        for i, (nproc, overrides) in enumerate(LAYOUTS):
            events = run(Path(tmp) / f"run-{i}", [*COMMON, *overrides], nproc=nproc, max_nodes=1).events()
            for line in rows(events, overrides, nproc):
                print(line, flush=True)


if __name__ == "__main__":
    main()
