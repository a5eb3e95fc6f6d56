"""The pack's rules, in the order they are reported."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from trainyard_policy import access, gpu, isolation, pinning, storage, tenancy
from trainyard_policy.resources import Resource, Violation


@dataclass(frozen=True)
class Rule:
    name: str
    description: str
    check: Callable[[Sequence[Resource]], list[Violation]]


RULES: tuple[Rule, ...] = (
    Rule("mig-layout-fits", "A pool's MIG layout exists for every GPU type it launches", gpu.mig_layout_fits),
    Rule("gpu-pools-tainted", "GPU node pools carry the nvidia.com/gpu taint", gpu.gpu_pools_tainted),
    Rule("gpu-workloads", "GPU pods in Volcano Jobs set GPU limits and tolerate the GPU taint", gpu.gpu_workloads),
    Rule("gpu-sharing-renamed", "Time-sliced and MPS replicas are advertised as <resource>.shared, one per pod",
         isolation.sharing_renamed),
    Rule("shared-gpu-pools-marked", "Pools whose GPUs serve several pods (MIG, time-slicing) carry the "
         "trainyard.io/gpu-sharing label and taint", isolation.shared_pools_marked),
    Rule("whole-gpus-unshared", "Volcano Jobs that take whole GPUs do not tolerate shared-GPU pools",
         isolation.whole_gpus_unshared),
    Rule("gpu-env-closed", "No unprivileged container selects GPUs by NVIDIA_VISIBLE_DEVICES, and GPU nodes turn "
         "the toolkit's env-var path off", isolation.gpu_env_closed),
    Rule("buckets-secure", "Buckets are encrypted, versioned and private", storage.buckets_secure),
    Rule("imdsv2-required", "Launch templates and EC2NodeClasses require IMDSv2", access.imdsv2_required),
    Rule("no-wildcard-iam", "No IAM statement allows Action '*' on Resource '*'", access.no_wildcard_iam),
    Rule("preview-read-only", "A role pull-request jobs can assume only reads: read-only AWS policies and a view "
         "EKS access policy", access.preview_read_only),
    Rule("tenant-objects-scoped", "A role shared by several namespaces reaches a bucket it writes only under "
         "the caller's namespace prefix", access.tenant_objects_scoped),
    Rule("charts-pinned", "Helm releases pin an exact chart version", pinning.charts_pinned),
    Rule("images-pinned", "Images carry a tag other than latest, or a digest", pinning.images_pinned),
    Rule("stateful-protected", "Buckets, KMS keys, Ceph clusters (or their chart) and checkpoint claims are protected",
         storage.stateful_protected),
    Rule("tenants-isolated", "Every tenant namespace has a default-deny policy and a Volcano queue",
         tenancy.tenants_isolated),
)


def evaluate(resources: Sequence[Resource]) -> dict[str, list[Violation]]:
    return {rule.name: rule.check(resources) for rule in RULES}
