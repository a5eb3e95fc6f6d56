"""Print the critical path of a stack's resource graph: the longest chain of resources that must be created
one after another (an edge per depends_on entry and per parent link), each step named, and its length; then the
chain with the largest summed create timeouts (trainyard.plan.duration), the bound the deploy credentials must cover.

Usage: .venv/bin/python bench/critical_path.py [stack]   (default: prod)
"""

from __future__ import annotations

import sys
from functools import cache

from trainyard.plan.duration import create_seconds, longest_create_chain
from trainyard.plan.recording import Recording
from trainyard.plan.runtime import read_stack, render


def critical_path(recording: Recording) -> list[str]:
    """URNs of the longest dependency chain, first-created first (the graph is acyclic: Pulumi requires it)."""
    by_urn = recording.by_urn()

    def waits_for(urn: str) -> tuple[str, ...]:
        record = by_urn[urn]
        edges = (*record.depends_on, *([record.parent] if record.parent else []))
        return tuple(e for e in edges if e in by_urn)

    @cache
    def longest(urn: str) -> tuple[str, ...]:
        best: tuple[str, ...] = ()
        for dep in waits_for(urn):
            chain = longest(dep)
            if len(chain) > len(best):
                best = chain
        return (*best, urn)

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(by_urn)))
    path: tuple[str, ...] = ()
    for urn in sorted(by_urn):
        if len(longest(urn)) > len(path):
            path = longest(urn)
    return list(path)


def main(stack: str) -> None:
    recording = render(read_stack(stack))
    path = critical_path(recording)
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
