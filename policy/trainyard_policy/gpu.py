"""GPU guardrails: MIG layouts fit the GPUs, GPU pools are tainted, GPU pods ask for GPUs and tolerate the taint."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from trainyard.config.instance_types import INSTANCE_TYPES, InstanceType
from trainyard.config.mig import MigCatalog, load_mig_catalog

from trainyard_policy.resources import Resource, Violation, containers, kind_of, metadata, pod_specs

GPU_TAINT = "nvidia.com/gpu"
MIG_CONFIG_LABEL = "nvidia.com/mig.config"
_INSTANCE_TYPE_KEY = "node.kubernetes.io/instance-type"


@dataclass(frozen=True)
class Pool:
    """A node pool as either a Karpenter NodePool or an EKS managed node group declares it."""

    resource: Resource
    instance_types: tuple[str, ...]
    labels: Mapping[str, Any]
    taint_keys: frozenset[str]

    @property
    def gpu_types(self) -> list[InstanceType]:
        return [t for name in self.instance_types if (t := INSTANCE_TYPES.get(name)) and t.gpu_count > 0]


@cache
def _catalog() -> MigCatalog:
    return load_mig_catalog()


def pools(resources: Sequence[Resource]) -> Iterator[Pool]:
    for r in resources:
        if kind_of(r) == "NodePool":
            template = (r.inputs.get("spec") or {}).get("template") or {}
            node_spec = template.get("spec") or {}
            types = [v for req in node_spec.get("requirements") or [] if req.get("key") == _INSTANCE_TYPE_KEY
                     and req.get("operator", "In") == "In" for v in req.get("values") or []]
            yield Pool(r, tuple(types), (template.get("metadata") or {}).get("labels") or {},
                       frozenset(t.get("key", "") for t in node_spec.get("taints") or []))
        elif r.type == "aws:eks/nodeGroup:NodeGroup":
            yield Pool(r, tuple(r.inputs.get("instanceTypes") or ()), r.inputs.get("labels") or {},
                       frozenset(t.get("key", "") for t in r.inputs.get("taints") or []))


def mig_layout_fits(resources: Sequence[Resource]) -> list[Violation]:
    """The pool's `nvidia.com/mig.config` layout exists in the MIG catalogue for every GPU the pool can launch."""
    found = []
    for pool in pools(resources):
        layout = pool.labels.get(MIG_CONFIG_LABEL)
        if layout is None:
            continue
        if not pool.gpu_types:
            found.append(Violation(pool.resource.urn, f"MIG layout {layout!r} on a pool without known GPU types "
                                                      f"({', '.join(pool.instance_types) or 'none listed'})"))
        for itype in pool.gpu_types:
            if itype.gpu is None or not _catalog().supports(str(layout), itype.gpu):
                found.append(Violation(pool.resource.urn,
                                       f"MIG layout {layout!r} does not fit {itype.name} ({itype.gpu})"))
    return found


def gpu_pools_tainted(resources: Sequence[Resource]) -> list[Violation]:
    """Pools with GPUs carry the nvidia.com/gpu taint, so only pods that asked for a GPU land there."""
    return [Violation(p.resource.urn, f"GPU pool without the {GPU_TAINT} taint")
            for p in pools(resources) if p.gpu_types and GPU_TAINT not in p.taint_keys]


def _gpu_amount(container: Mapping[str, Any], section: str) -> int:
    values = (container.get("resources") or {}).get(section) or {}
    return sum(int(v) for k, v in values.items() if k == GPU_TAINT or k.startswith("nvidia.com/mig-"))


def _tolerates_gpu(pod: Mapping[str, Any]) -> bool:
    for toleration in pod.get("tolerations") or []:
        key, operator = toleration.get("key"), toleration.get("operator", "Equal")
        if operator == "Exists" and key in (None, "", GPU_TAINT):
            return True
        if key == GPU_TAINT:
            return True
    return False


def _targets_gpu_nodes(pod: Mapping[str, Any]) -> bool:
    return any(str(k).startswith("nvidia.com/") for k in (pod.get("nodeSelector") or {}))


def gpu_workloads(resources: Sequence[Resource]) -> list[Violation]:
    """Volcano Job pods that want GPU nodes put a GPU amount in limits (what the scheduler counts) and tolerate
    the GPU taint; a GPU asked for only in requests is rejected by the API server for extended resources."""
    found = []
    for r in resources:
        if kind_of(r) != "Job" or not r.type.startswith("kubernetes:batch.volcano.sh/"):
            continue
        for pod in pod_specs(r.inputs.get("spec")):
            requested = sum(_gpu_amount(c, "requests") for c in containers(pod))
            limited = sum(_gpu_amount(c, "limits") for c in containers(pod))
            if not (requested or limited or _targets_gpu_nodes(pod)):
                continue
            where = f"job {metadata(r).get('name', r.name)}"
            if limited <= 0:
                found.append(Violation(r.urn, f"{where}: pod targets GPU nodes but sets no GPU limit"))
            if requested and requested != limited:
                found.append(Violation(r.urn, f"{where}: GPU requests ({requested}) differ from limits ({limited})"))
            if not _tolerates_gpu(pod):
                found.append(Violation(r.urn, f"{where}: GPU pod does not tolerate the {GPU_TAINT} taint"))
    return found
