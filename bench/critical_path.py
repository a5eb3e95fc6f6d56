"""Print the critical path of a stack's resource graph: the longest chain of resources that must be created
one after another (along what the engine waits on: trainyard.plan.engine_order), each step named, and its length;
then the chain with the largest summed create timeouts (trainyard.plan.duration), the bound the deploy credentials
must cover.

Usage: .venv/bin/python bench/critical_path.py [stack]   (default: prod)
"""

from __future__ import annotations

import sys

from trainyard.plan.duration import create_seconds, longest_chain, longest_create_chain
from trainyard.plan.runtime import read_stack, render


def main(stack: str) -> None:
    recording = render(read_stack(stack))
    path = longest_chain(recording.resources, lambda record: 1).path
    by_urn = recording.by_urn()
    for step, urn in enumerate(path, 1):
        record = by_urn[urn]
        print(f"{step:3d}  {record.type:55s} {record.name}")
    print(f"critical path length ({stack}): {len(path)} steps over {len(recording.resources)} resources")
    bound = longest_create_chain(recording)
    for urn in bound.path:
        record = by_urn[urn]
        if create_seconds(record):
            print(f"{create_seconds(record):6d} s  {record.type:55s} {record.name}")
    print(f"first-up time bound ({stack}): {bound.seconds} s = {bound.seconds / 3600:.2f} h")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "prod")
