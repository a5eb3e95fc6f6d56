"""What a readiness rule is and what it sees: whether one resource, created into a given cluster state, comes up
(or hangs, or fails).

Each rule is a pure function `(record, moment) -> problem or None`, declared with `@rule(name, applies_to, source)`
where `source` names the upstream behaviour it models: `moment.before` is the cluster made of everything the engine
has finished when it starts this resource (its transitive dependencies and parents), and `moment.after` the cluster
once the whole run is done (what a controller acting later sees). `rules.registry.RULES` lists them all.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from trainyard.plan.cluster_model import (
    PodNeeds,
    Pool,
    fits_some_offer,
    label_mismatch,
    short_resources,
    untolerated,
)
from trainyard.plan.cluster_state import ClusterState
from trainyard.plan.pods import lookup
from trainyard.plan.recording import ResourceRecord
from trainyard.plan.rendering import RenderedRelease, RenderedStack
from trainyard.plan.resource_types import NODE_CLASS, NODE_POOL


@dataclass(frozen=True)
class Moment:
    before: ClusterState  # what exists when the engine starts creating the resource
    after: ClusterState  # what exists once the run is over
    records: Mapping[str, ResourceRecord]  # every record by URN, for rules that read a sibling object
    rendered: RenderedStack  # the objects every Helm release installs
    waited: frozenset[str] = frozenset()  # URNs of everything the engine finished before this resource

    def release(self, record: ResourceRecord) -> RenderedRelease:
        """What a Release record renders (every Release of the run is rendered)."""
        return self.rendered.releases[str(record.inputs.get("name", record.name))]


Check = Callable[[ResourceRecord, Moment], "str | None"]


@dataclass(frozen=True)
class Rule:
    name: str
    applies_to: Callable[[ResourceRecord], bool]
    check: Check
    source: str


def rule(name: str, applies_to: Callable[[ResourceRecord], bool], source: str) -> Callable[[Check], Rule]:
    """Declare the function below as the rule `name`, applied to the records `applies_to` accepts; `source` names
    the upstream behaviour it models (the rehearsal prints it beside a finding)."""
    def declare(check: Check) -> Rule:
        return Rule(name, applies_to, check, source)
    return declare


def of_type(*types: str) -> Callable[[ResourceRecord], bool]:
    return lambda record: record.type in types


def ready_pools(state: ClusterState) -> tuple[Pool, ...]:
    """Pools whose nodes are Ready: a node reports NotReady until a CNI is installed."""
    return state.pools if state.cni else ()


def placement_problem(pod: PodNeeds, pools: tuple[Pool, ...], *, launch: bool) -> str:
    """Why no pool takes the pod, pool by pool; pools its selectors already rule out are left out when others
    come closer, so the message shows the nearest misses."""
    if not pools:
        return "there is no Ready node yet" + ("" if launch else " (and no Karpenter pool)")
    matching = [p for p in pools if label_mismatch(pod, p) is None]
    if not matching:
        return "; ".join(f"{p.name}: {label_mismatch(pod, p)} does not match" for p in pools)
    reasons = []
    for pool in matching:
        if taints := untolerated(pod, pool):
            reasons.append(f"{pool.name}: taint {taints[0]} not tolerated")
        elif not fits_some_offer(pod, pool):
            missing = short_resources(pod, pool.offers[0]) if pool.offers else list(pod.extended_resources)
            reasons.append(f"{pool.name}: no instance type offers {', '.join(missing)}")
        elif not pool.autoscaled and pool.nodes < pod.distinct_nodes:
            reasons.append(f"{pool.name}: {pool.nodes} node(s), {pod.distinct_nodes} needed apart")
        elif not pool.autoscaled:
            reasons.append(f"{pool.name}: no node")
    return "; ".join(reasons) or "no pool admits it"


def pool_of(record: ResourceRecord, moment: Moment) -> Pool | None:
    """The pool a NodePool or node group record makes, as the cluster at the end of the run has it."""
    name = str(lookup(record.inputs, "metadata.name") or record.inputs.get("nodeGroupName"))
    return next((p for p in moment.after.pools if p.name == name), None)


def pool_records(pool: str, moment: Moment) -> tuple[ResourceRecord | None, ResourceRecord | None]:
    """The NodePool record named `pool` and the EC2NodeClass record it refers to."""
    node_pool = next((r for r in moment.records.values() if r.type == NODE_POOL
                      and lookup(r.inputs, "metadata.name") == pool), None)
    ref = lookup(node_pool.inputs, "spec.template.spec.nodeClassRef.name") if node_pool else None
    node_class = next((r for r in moment.records.values() if r.type == NODE_CLASS
                       and lookup(r.inputs, "metadata.name") == ref), None)
    return node_pool, node_class
