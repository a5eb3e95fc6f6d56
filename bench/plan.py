"""Wall time of rendering each stack offline: median of N runs after one warm-up, all in one process.

    .venv/bin/python bench/plan.py [--runs 5] [--stack prod ...]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import time

from trainyard.plan.runtime import available_stacks, read_stack, render


def time_stack(stack: str, runs: int) -> tuple[float, int]:
    """Median seconds per render, and how many resources a render records."""
    stack_file = read_stack(stack)
    with contextlib.redirect_stdout(io.StringIO()):
        count = len(render(stack_file).resources)  # warm-up: imports, schema caches
        samples = []
        for _ in range(runs):
            start = time.perf_counter()
            render(stack_file)
            samples.append(time.perf_counter() - start)
    return statistics.median(samples), count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--stack", action="append", dest="stacks")
    args = parser.parse_args()
    total = 0.0
    print(f"{'stack':<10} {'resources':>9} {'median s':>9}  (of {args.runs} runs after a warm-up)")
    for stack in args.stacks or available_stacks():
        seconds, count = time_stack(stack, args.runs)
        total += seconds
        print(f"{stack:<10} {count:>9} {seconds:>9.3f}")
    print(f"{'total':<10} {'':>9} {total:>9.3f}")


if __name__ == "__main__":
    main()
