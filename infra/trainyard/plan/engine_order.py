"""The order in which the Pulumi engine creates a program's resources: what each one waits on.

The engine starts a resource once everything it waits on is done: its `depends_on` (which the SDK also fills from
the outputs it consumes), its parent and its provider. Depending on a component means depending on the resources
inside it (the SDK expands a component dependency into its children), except a dependency on one's own ancestor,
which cannot wait for itself. The rehearsal (`rehearse.py`) and the first-up time bound (`duration.py`) both
walk this one model.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Iterable

from trainyard.plan.recording import ResourceRecord


def waits_on(record: ResourceRecord, by_urn: dict[str, ResourceRecord], children: dict[str, list[str]]) -> set[str]:
    """What the engine finishes before starting `record`: dependencies, parent, provider, a component's children."""
    ancestors = set()
    parent = record.parent
    while parent in by_urn:
        ancestors.add(parent)
        parent = by_urn[parent].parent
    direct = {*record.depends_on, *(u for u in (record.parent, record.provider) if u)}
    edges: set[str] = set()
    for urn in direct & by_urn.keys():
        edges.add(urn)
        if by_urn[urn].custom or urn in ancestors:
            continue
        stack = list(children.get(urn, ()))
        while stack:
            child = stack.pop()
            if child not in edges:
                edges.add(child)
                stack.extend(children.get(child, ()))
    edges.discard(record.urn)
    return edges


def prerequisites(records: Iterable[ResourceRecord]) -> dict[str, set[str]]:
    """Each record's URN mapped to what it waits on directly (`waits_on`), among these records."""
    by_urn = {r.urn: r for r in records}
    children: dict[str, list[str]] = defaultdict(list)
    for r in sorted(by_urn.values(), key=lambda r: r.urn):
        if r.parent in by_urn:
            children[r.parent].append(r.urn)
    return {urn: waits_on(r, by_urn, children) for urn, r in by_urn.items()}


def creation_order(records: Iterable[ResourceRecord]) -> tuple[list[ResourceRecord], dict[str, frozenset[str]]]:
    """Records in an order the engine could create them (ties by URN, so it is deterministic), and each one's
    prerequisites (everything it transitively waits on).

    Raises ValueError on a dependency cycle (the engine would refuse it too).
    """
    records = sorted(records, key=lambda r: r.urn)
    by_urn = {r.urn: r for r in records}
    position = {r.urn: i for i, r in enumerate(records)}
    edges = prerequisites(records)
    dependents: dict[str, list[str]] = defaultdict(list)
    for urn, waited in edges.items():
        for prerequisite in waited:
            dependents[prerequisite].append(urn)
    waiting = {urn: len(waited) for urn, waited in edges.items()}
    ready = [(position[urn], urn) for urn, count in waiting.items() if count == 0]
    heapq.heapify(ready)
    order: list[ResourceRecord] = []
    closure: dict[str, frozenset[str]] = {}
    while ready:
        _, urn = heapq.heappop(ready)
        order.append(by_urn[urn])
        closure[urn] = frozenset(edges[urn]).union(*(closure[p] for p in edges[urn]))
        for dependent in dependents[urn]:
            waiting[dependent] -= 1
            if waiting[dependent] == 0:
                heapq.heappush(ready, (position[dependent], dependent))
    if len(order) != len(records):
        stuck = sorted(by_urn[u].name for u, count in waiting.items() if count)
        raise ValueError(f"dependency cycle among: {', '.join(stuck[:8])}")
    return order, closure
