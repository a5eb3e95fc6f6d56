"""Wall time of planning each stack offline: the program under the mock runtime (median of N runs after one
warm-up), and rendering its Helm releases: cold (no cache at all: every `helm template` runs, in parallel), on a
clean clone (no local cache: the renders plans/ commits serve, nothing runs Helm) and warm (the local cache a
previous plan left; median of N).

    .venv/bin/python bench/plan.py [--runs 5] [--stack prod ...]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import tempfile
import time
from pathlib import Path

from trainyard.plan import render_cache, rendering
from trainyard.plan.rendering import render_releases
from trainyard.plan.runtime import available_stacks, read_stack, render, settings_of


def time_stack(stack: str, runs: int) -> tuple[float, int, int, int, float, float, float]:
    """Median program seconds, resources, objects, helm runs; cold, clean-clone and median warm render seconds."""
    stack_file = read_stack(stack)
    version = settings_of(stack_file).cluster.kubernetes_version
    with contextlib.redirect_stdout(io.StringIO()):
        recording = render(stack_file)  # warm-up: imports, schema caches
        samples = []
        for _ in range(runs):
            start = time.perf_counter()
            render(stack_file)
            samples.append(time.perf_counter() - start)
    with tempfile.TemporaryDirectory(prefix="trainyard-bench-") as tmp:
        start = time.perf_counter()
        cold = render_releases(recording, version, cache_dir=Path(tmp) / "cold", plans=None)
        cold_s = time.perf_counter() - start
        rendering._tree_facts.cache_clear()  # a clean clone's process has hashed no chart tree, parsed no file
        render_cache._PARSED.clear()
        start = time.perf_counter()
        clean = render_releases(recording, version, cache_dir=Path(tmp) / "clean")
        clean_s = time.perf_counter() - start
        if clean.releases != cold.releases:
            raise SystemExit(f"plans/{stack}/ is not what Helm renders: run `make plans`")
        warm = []
        for _ in range(runs):
            start = time.perf_counter()
            render_releases(recording, version, cache_dir=Path(tmp) / "clean")
            warm.append(time.perf_counter() - start)
    objects = sum(len(r.objects) for r in cold.releases.values())
    return (statistics.median(samples), len(recording.resources), objects, cold.renders, cold_s, clean_s,
            statistics.median(warm))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--stack", action="append", dest="stacks")
    args = parser.parse_args()
    totals = [0.0, 0.0, 0.0, 0.0]
    print(f"{'stack':<10} {'resources':>9} {'program s':>9} {'objects':>8} {'helm runs':>9} {'cold s':>7} "
          f"{'clean s':>7} {'warm s':>7}  (program and warm: median of {args.runs} runs; load {_load()})")
    for stack in args.stacks or available_stacks():
        program, count, objects, renders, cold, clean, warm = time_stack(stack, args.runs)
        totals = [totals[0] + program, totals[1] + cold, totals[2] + clean, totals[3] + warm]
        print(f"{stack:<10} {count:>9} {program:>9.3f} {objects:>8} {renders:>9} {cold:>7.2f} {clean:>7.2f} "
              f"{warm:>7.3f}")
    print(f"{'total':<10} {'':>9} {totals[0]:>9.3f} {'':>8} {'':>9} {totals[1]:>7.2f} {totals[2]:>7.2f} "
          f"{totals[3]:>7.3f}  (load {_load()}, {os.cpu_count()} cores)")


def _load() -> str:
    """The 1-minute load average: the machine is shared, so every number is read against it."""
    return f"{os.getloadavg()[0]:.1f}"


if __name__ == "__main__":
    main()
