"""A rehearsal of `pulumi up`: walk the recorded resources in the engine's creation order and apply readiness rules.

The plan's other checks look at the shape of each resource. This one asks whether the run converges: the
Pulumi engine starts a resource once everything it waits on is done (`engine_order`: its `depends_on`, which the
SDK also fills from the outputs it consumes, its parent and its provider), so the cluster a resource meets is made of
exactly those resources, transitively. Anything else may or may not be there yet, and a rule never counts on it.
What a Helm release puts into the cluster is read from its rendered objects (`rendering`), never from a model
of the chart. For each resource the rules `rules.registry` lists (one module per subject: nodes, placement, storage,
scheduling, network, ...) check it against that cluster (and, for what controllers do later, against the cluster at
the end of the run). The first problem in creation order is what `pulumi up` would hit first.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainyard.plan.cluster_state import ClusterState, cluster_state
from trainyard.plan.engine_order import creation_order
from trainyard.plan.recording import Recording
from trainyard.plan.rendering import RenderedStack
from trainyard.plan.rules.base import Moment
from trainyard.plan.rules.registry import RULES


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


def rehearse(recording: Recording, rendered: RenderedStack) -> Rehearsal:
    """Walk `recording` in creation order; `rendered` holds what each of its Helm releases installs."""
    order, closure = creation_order(recording.resources)
    by_urn = recording.by_urn()
    end = cluster_state(recording.resources, rendered)
    custom = [r for r in order if r.custom]
    findings: list[Finding] = []
    checks = 0
    for step, record in enumerate(custom, start=1):
        rules = [rule for rule in RULES if rule.applies_to(record)]
        if not rules:
            continue
        moment = Moment(before=cluster_state((by_urn[u] for u in sorted(closure[record.urn])), rendered), after=end,
                        records=by_urn, rendered=rendered, waited=frozenset(closure[record.urn]))
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
