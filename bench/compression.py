"""Gradient compression on CPU (gloo, 2 ranks, tiny.yaml): bytes each rank sends per step and the loss after N steps,
for DDP's all-reduce, PowerSGD, QSGD and top-k (the last two with error feedback, trainyard_train/comm.py).

    .venv/bin/python bench/compression.py [--steps 150] [--topk-ratio 0.01] [--qsgd-levels 127]

`payload` is what the trainer's meter counts per optimizer step (progress.jsonl `grad_bytes`): the gradient bytes
for all-reduce, P and Q for PowerSGD, the quantized or sparse payload for QSGD and top-k. `wire` is what one rank
puts on the network for it with ring algorithms: all-reduce sends 2(W-1)/W of the buffer; all-gather (QSGD and top-k,
whose payloads cannot be summed in flight) sends W-1 payloads (its own and the ones it forwards), so their saving
shrinks as W grows. Prints numbers only; the loss gap is against all-reduce over the same last steps.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workloads"))
from trainyard_train.progress import read_progress  # noqa: E402

WORLD = 2
HOOKS = ("allreduce", "powersgd", "qsgd", "topk")


def train(hook: str, steps: int, extra: list[str], run_dir: Path) -> list[dict]:
    cmd = [sys.executable, "-m", "trainyard_train.agent", "--standalone", f"--nproc-per-node={WORLD}",
           "-m", "trainyard_train", "--config", str(REPO / "workloads" / "configs" / "tiny.yaml"),
           f"run_dir={run_dir}", f"train.steps={steps}", f"comm.hook={hook}", "comm.powersgd_start_iter=10",
           "checkpoint.interval_steps=100000", *extra]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO / "workloads"), "OMP_NUM_THREADS": "1",
           "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{hook}: exit {done.returncode}\n{done.stderr[-3000:]}")
    return [e for e in read_progress(run_dir / "progress.jsonl") if e["event"] == "step"]


def wire_bytes(hook: str, payload: float) -> float:
    if hook in ("qsgd", "topk"):
        return payload * (WORLD - 1)  # ring all-gather: each rank forwards W-1 payloads of this size
    return payload * 2 * (WORLD - 1) / WORLD  # ring all-reduce: reduce-scatter + all-gather


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--topk-ratio", type=float, default=0.01)
    parser.add_argument("--qsgd-levels", type=int, default=127)
    args = parser.parse_args()
    extra = [f"comm.topk_ratio={args.topk_ratio}", f"comm.qsgd_levels={args.qsgd_levels}"]
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for hook in HOOKS:
            results[hook] = train(hook, args.steps, extra, Path(tmp) / hook)
    last = 10
    base = sum(e["loss"] for e in results["allreduce"][-last:]) / last
    plain = results["allreduce"][-1]["grad_bytes"]
    print(f"gradient compression, tiny.yaml, {WORLD} ranks on gloo, {args.steps} steps "
          f"(top-k ratio {args.topk_ratio}, QSGD levels {args.qsgd_levels}; PowerSGD rank 4 after 10 steps)")
    print(f"{'hook':<10} {'payload B/step':>15} {'wire B/step':>12} {'vs all-reduce':>14} "
          f"{'loss (last ' + str(last) + ')':>15} {'loss gap':>9}")
    for hook, events in results.items():
        payload = sum(e["grad_bytes"] for e in events[-last:]) / last  # after warm-ups
        loss = sum(e["loss"] for e in events[-last:]) / last
        print(f"{hook:<10} {payload:>15,.0f} {wire_bytes(hook, payload):>12,.0f} "
              f"{wire_bytes(hook, payload) / wire_bytes('allreduce', plain):>13.3f}x {loss:>15.4f} "
              f"{loss - base:>+9.4f}")


if __name__ == "__main__":
    main()
