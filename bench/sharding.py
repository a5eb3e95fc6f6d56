"""Shard-assignment benchmark: jump consistent hash (the trainer's) beside the reconstructed baseline.

The baseline is a RECONSTRUCTION of the common broken form of the `consistent_hash` this project was told
about (the original is not available): ``hash(key) % num_nodes`` with Python's per-process salted
``hash()``. It lives only here, for comparison. Prints numbers, asserts nothing.

    .venv/bin/python bench/sharding.py [--keys 1000000]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workloads"))
from trainyard_train.sharding import jump_hash, stable_hash64  # noqa: E402


def baseline_assign(key: str, num_nodes: int) -> int:
    """Reconstructed baseline: salted per process (PYTHONHASHSEED), and modulo reshuffles on resize."""
    return hash(key) % num_nodes


def jump_assign(key: str, num_nodes: int) -> int:
    return jump_hash(stable_hash64(key), num_nodes)


def measure(name: str, assign: Callable[[str, int], int], keys: list[str]) -> None:
    started = time.perf_counter()
    on8 = [assign(k, 8) for k in keys]
    rate = len(keys) / (time.perf_counter() - started)
    on9 = [assign(k, 9) for k in keys]
    counts = Counter(on8)
    balance = max(counts.values()) / (len(keys) / 8)
    moved = sum(a != b for a, b in zip(on8, on9, strict=True)) / len(keys)
    print(
        f"{name:<28} balance max/mean (8 nodes) {balance:.4f}   moved 8->9 {moved:.4f} "
        f"(optimum {1 / 9:.4f}, {moved * 9:.2f}x)   {rate / 1e6:.2f} M keys/s"
    )


def cross_process_disagreement(sample: int) -> float:
    """Fraction of keys two fresh interpreters place on different nodes (8 nodes)."""
    code = f"print(','.join(str(hash(f'sample-{{i}}') % 8) for i in range({sample})))"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    runs = [subprocess.check_output([sys.executable, "-c", code], env=env, text=True).split(",") for _ in range(2)]
    return sum(a != b for a, b in zip(*runs, strict=True)) / sample


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", type=int, default=1_000_000)
    args = parser.parse_args()
    keys = [f"sample-{i}" for i in range(args.keys)]
    print(f"{args.keys} keys")
    measure("jump(blake2b) [trainer]", jump_assign, keys)
    measure("hash()%n [baseline, recon.]", baseline_assign, keys)
    print(
        f"baseline: keys placed differently by two processes: {cross_process_disagreement(100_000):.4f} "
        "(jump(blake2b): 0 by construction, tested in tests/workloads/test_train_sharding.py)"
    )


if __name__ == "__main__":
    main()
