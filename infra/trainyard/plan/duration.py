"""An upper bound on how long a first `pulumi up` of a stack takes: the critical path weighted by create timeouts.

Each resource costs the longest its create may take before the engine gives up: the provider's create timeout
for slow AWS resources, a Helm release's own `timeout`, the await timeout for a PVC. The longest chain of such
costs, along what the engine waits on (`engine_order`, the model the rehearsal walks), bounds the run, since
everything off that chain runs beside it. The deploy workflow's credentials must outlive this bound.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from trainyard.plan.engine_order import creation_order, prerequisites
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
    # A provider resource is configured inside the engine's plugin (CheckConfig/Configure), with no cloud call.
    if not record.custom or record.type.startswith("pulumi:providers:"):
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


def longest_chain(records: Iterable[ResourceRecord], cost: Callable[[ResourceRecord], int]) -> Estimate:
    """The chain of resources, each waiting on the one before, with the largest summed cost."""
    records = list(records)
    edges = prerequisites(records)
    order, _ = creation_order(records)
    best: dict[str, tuple[int, tuple[str, ...]]] = {}
    for record in order:
        seconds, path = max((best[urn] for urn in edges[record.urn]), default=(0, ()))
        best[record.urn] = (seconds + cost(record), (*path, record.urn))
    seconds, path = max(best.values(), default=(0, ()))
    return Estimate(path, seconds)


def longest_create_chain(recording: Recording) -> Estimate:
    """The chain of resources with the largest summed create bound."""
    return longest_chain(recording.resources, create_seconds)
