"""Wall time of planning each stack offline: the program under the mock runtime (median of N runs after one
warm-up), and rendering its Helm releases with the real Helm, cold (an empty render cache: every `helm template`
runs, in parallel) and warm (the cache a previous plan left: nothing changed, nothing re-rendered).

    .venv/bin/python bench/plan.py [--runs 5] [--stack prod ...]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import tempfile
import time
from pathlib import Path

from trainyard.plan.rendering import render_releases
from trainyard.plan.runtime import available_stacks, read_stack, render, settings_of


def time_stack(stack: str, runs: int) -> tuple[float, int, float, int, float, int]:
    """Median program seconds, resources; cold render seconds, helm runs; median warm render seconds, objects."""
    stack_file = read_stack(stack)
    version = settings_of(stack_file).cluster.kubernetes_version
    with contextlib.redirect_stdout(io.StringIO()):
        recording = render(stack_file)  # warm-up: imports, schema caches
        samples = []
        for _ in range(runs):
            start = time.perf_counter()
            render(stack_file)
            samples.append(time.perf_counter() - start)
    with tempfile.TemporaryDirectory(prefix="trainyard-bench-") as cache:
        start = time.perf_counter()
        cold = render_releases(recording, version, cache_dir=Path(cache))
        cold_s = time.perf_counter() - start
        warm = []
        for _ in range(runs):
            start = time.perf_counter()
            render_releases(recording, version, cache_dir=Path(cache))
            warm.append(time.perf_counter() - start)
    objects = sum(len(r.objects) for r in cold.releases.values())
    return statistics.median(samples), len(recording.resources), cold_s, cold.renders, statistics.median(warm), objects


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--stack", action="append", dest="stacks")
    args = parser.parse_args()
    totals = [0.0, 0.0, 0.0]
    print(f"{'stack':<10} {'resources':>9} {'program s':>9} {'objects':>8} {'helm runs':>9} {'cold s':>7} "
          f"{'warm s':>7}  (program and warm: median of {args.runs} runs)")
    for stack in args.stacks or available_stacks():
        program, count, cold, renders, warm, objects = time_stack(stack, args.runs)
        totals = [totals[0] + program, totals[1] + cold, totals[2] + warm]
        print(f"{stack:<10} {count:>9} {program:>9.3f} {objects:>8} {renders:>9} {cold:>7.2f} {warm:>7.3f}")
    print(f"{'total':<10} {'':>9} {totals[0]:>9.3f} {'':>8} {'':>9} {totals[1]:>7.2f} {totals[2]:>7.3f}")


if __name__ == "__main__":
    main()
