"""Time to refuse hostile stack files, and to read the largest one accepted: median of N runs, milliseconds.

    .venv/bin/python bench/config_input.py [--runs 5]

The bounds in trainyard/config/yaml_input.py make each refusal cheap; this prints how cheap.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from trainyard.config.yaml_input import MAX_BYTES, InputError, load_yaml

LAUGHS = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi", strict=True))
TENANT = "    - {name: t, weight: 1, capability: {gpu: 1, cpu: '16', memory: 64Gi}}\n"
HEADER = "config:\n  trainyard:tenants:\n"


def cases() -> dict[str, str]:
    return {
        "billion laughs (9^9 expansions)": LAUGHS,
        "5 MB file": HEADER + TENANT * (5_000_000 // len(TENANT)),
        "1000 tenants (accepted)": HEADER + TENANT * 1000,
        "just under the size bound": HEADER + TENANT * ((MAX_BYTES - len(HEADER)) // len(TENANT)),
        "100k-item flat list": "config: [" + "0," * 100_000 + "]\n",
        "100-deep nesting": "config: " + "[" * 100 + "]" * 100 + "\n",
    }


def time_case(path: Path, runs: int) -> tuple[float, str]:
    samples, outcome = [], ""
    for _ in range(runs):
        start = time.perf_counter()
        try:
            load_yaml(path)
            outcome = "read"
        except InputError as error:
            outcome = "refused: " + str(error).split(": ", 1)[1][:70]
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1000, outcome


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in cases().items():
            path = Path(tmp) / "Pulumi.bench.yaml"
            path.write_text(text)
            ms, outcome = time_case(path, args.runs)
            print(f"{name:34} {path.stat().st_size:>9} bytes {ms:9.1f} ms  {outcome}")


if __name__ == "__main__":
    main()
