"""A rehearsal of `pulumi up`: walk the recorded resources in the engine's creation order and apply readiness rules.

The plan's other checks look at the shape of each resource. This one asks whether the run converges: the
Pulumi engine starts a resource once everything it waits on is done (its `depends_on`, which the SDK also
fills from the outputs it consumes, its parent and its provider), so the cluster a resource meets is made of
exactly those resources, transitively. Anything else may or may not be there yet, and a rule never counts on it.
For each resource the rules in `readiness.RULES` check it against that cluster (and, for what controllers do
later, against the cluster at the end of the run). The first problem in creation order is what `pulumi up`
would hit first.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from trainyard.plan.cluster_state import ClusterState, cluster_state
from trainyard.plan.readiness import RULES, Moment
from trainyard.plan.recording import Recording, ResourceRecord


@dataclass(frozen=True, slots=True)
class Finding:
    step: int  # position in the creation order (1-based)
    urn: str
    type: str
    name: str
    rule: str
    problem: str
    source: str

    def __str__(self) -> str:
        return f"{self.type} {self.name} (step {self.step}): [{self.rule}] {self.problem}"


@dataclass(frozen=True)
class Rehearsal:
    order: tuple[str, ...]  # URNs of custom resources in creation order
    checks: int  # (resource, rule) pairs applied
    findings: tuple[Finding, ...]  # every problem, in creation order
    end: ClusterState

    @property
    def passed(self) -> bool:
        return not self.findings


def waits_on(record: ResourceRecord, by_urn: dict[str, ResourceRecord], children: dict[str, list[str]]) -> set[str]:
    """What the engine finishes before starting `record`: dependencies, parent, provider.

    Depending on a component means depending on the resources inside it (the SDK expands a component
    dependency into its children), except a dependency on one's own ancestor, which cannot wait for itself.
    """
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


def creation_order(records: Iterable[ResourceRecord]) -> tuple[list[ResourceRecord], dict[str, frozenset[str]]]:
    """Records in an order the engine could create them (ties by URN, so it is deterministic), and each one's
    prerequisites (everything it transitively waits on).

    Raises ValueError on a dependency cycle (the engine would refuse it too).
    """
    records = sorted(records, key=lambda r: r.urn)
    by_urn = {r.urn: r for r in records}
    position = {r.urn: i for i, r in enumerate(records)}
    children: dict[str, list[str]] = defaultdict(list)
    for r in records:
        if r.parent in by_urn:
            children[r.parent].append(r.urn)
    edges = {r.urn: waits_on(r, by_urn, children) for r in records}
    dependents: dict[str, list[str]] = defaultdict(list)
    for urn, prerequisites in edges.items():
        for prerequisite in prerequisites:
            dependents[prerequisite].append(urn)
    waiting = {urn: len(prerequisites) for urn, prerequisites in edges.items()}
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


def rehearse(recording: Recording) -> Rehearsal:
    order, closure = creation_order(recording.resources)
    by_urn = recording.by_urn()
    end = cluster_state(recording.resources)
    custom = [r for r in order if r.custom]
    findings: list[Finding] = []
    checks = 0
    for step, record in enumerate(custom, start=1):
        rules = [rule for rule in RULES if rule.applies_to(record)]
        if not rules:
            continue
        moment = Moment(before=cluster_state(by_urn[u] for u in sorted(closure[record.urn])), after=end,
                        records=by_urn)
        for rule in rules:
            checks += 1
            if problem := rule.check(record, moment):
                findings.append(Finding(step, record.urn, record.type, record.name, rule.name, problem, rule.source))
    return Rehearsal(order=tuple(r.urn for r in custom), checks=checks, findings=tuple(findings), end=end)


def report(result: Rehearsal, stack: str) -> str:
    if result.passed:
        pools = result.end.pools
        return (f"Rehearsal of `pulumi up` for {stack}: converges. {len(result.order)} resources in creation order, "
                f"{result.checks} readiness checks by {len(RULES)} rules; {len(pools)} node pools "
                f"({sum(p.autoscaled for p in pools)} by Karpenter), {len(result.end.storage_classes)} storage "
                f"classes, CNI: {result.end.cni or 'none'}.")
    first, rest = result.findings[0], result.findings[1:]
    lines = [f"Rehearsal of `pulumi up` for {stack}: FAILS. First resource that would hang or fail:",
             f"  {first}", f"    (rule source: {first.source})"]
    if rest:
        lines.append(f"Then {len(rest)} more:")
        lines += [f"  {finding}" for finding in rest]
    return "\n".join(lines)
