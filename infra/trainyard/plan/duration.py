"""An upper bound on how long a first `pulumi up` of a stack takes: the critical path weighted by create timeouts.

Each resource costs the longest its create may take before the engine gives up: the provider's create timeout
for slow AWS resources, a Helm release's own `timeout`, the await timeout for a PVC. The longest chain of such
costs (edges: depends_on and parent links, as `bench/critical_path.py` draws them) bounds the run, since
everything off that chain runs beside it. The deploy workflow's credentials must outlive this bound.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from functools import cache

from trainyard.plan.recording import Recording, ResourceRecord

# Default create timeouts of pulumi-aws (bridged from terraform-provider-aws; registry.terraform.io resource
# docs, "Timeouts": eks_cluster 30m, eks_node_group 60m, eks_addon 20m, nat_gateway 10m).
AWS_CREATE_TIMEOUTS = {
    "aws:eks/cluster:Cluster": 30 * 60,
    "aws:eks/nodeGroup:NodeGroup": 60 * 60,
    "aws:eks/addon:Addon": 20 * 60,
    "aws:ec2/natGateway:NatGateway": 10 * 60,
}
# pulumi-kubernetes awaits a PVC until Bound, 10 minutes by default (pulumi.com/registry/packages/kubernetes,
# PersistentVolumeClaim "creation" await logic).
PVC_AWAIT_SECONDS = 10 * 60
# Helm's --timeout default (helm.sh/docs/helm/helm_install) when a release sets none.
HELM_DEFAULT_TIMEOUT = 300
# Anything else: one API call and at most a short readiness poll.
OTHER_SECONDS = 60


def create_seconds(record: ResourceRecord) -> int:
    if not record.custom:
        return 0
    if record.type == "kubernetes:helm.sh/v3:Release":
        return 0 if record.inputs.get("skipAwait") else int(record.inputs.get("timeout") or HELM_DEFAULT_TIMEOUT)
    if record.type == "kubernetes:core/v1:PersistentVolumeClaim":
        return PVC_AWAIT_SECONDS
    return AWS_CREATE_TIMEOUTS.get(record.type, OTHER_SECONDS)


@dataclass(frozen=True, slots=True)
class Estimate:
    path: tuple[str, ...]  # URNs, first created first
    seconds: int


def longest_create_chain(recording: Recording) -> Estimate:
    """The chain of resources with the largest summed create bound (the graph is acyclic: Pulumi requires it)."""
    by_urn = recording.by_urn()

    @cache
    def longest(urn: str) -> tuple[int, tuple[str, ...]]:
        record = by_urn[urn]
        edges = (*record.depends_on, *([record.parent] if record.parent else []))
        best: tuple[int, tuple[str, ...]] = (0, ())
        for dep in edges:
            if dep in by_urn:
                best = max(best, longest(dep))
        return best[0] + create_seconds(record), (*best[1], urn)

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(by_urn)))
    seconds, path = max((longest(urn) for urn in sorted(by_urn)), default=(0, ()))
    return Estimate(path, seconds)
