"""Rules on nodes joining and initializing: a CNI before the first node group, the host paths pods mount, and a
device plugin for every extended resource a pool's pods ask for."""

from __future__ import annotations

from collections.abc import Iterator

from trainyard.plan.cluster_model import PodNeeds, Pool, Taint, Toleration, admits
from trainyard.plan.node_image import missing_path
from trainyard.plan.pods import lookup, pod_makers, workload, workloads
from trainyard.plan.recording import ResourceRecord
from trainyard.plan.resource_types import EKS_CLUSTER, NODE_GROUP, NODE_POOL, RELEASE, VOLCANO_JOB
from trainyard.plan.rules.base import Moment, of_type, pool_of, rule
from trainyard.plan.rules.startup_taints import startup_taints
from trainyard.plan.volcano_jobs import task_pods


# A node joins Ready only once a CNI is installed; a managed node group whose nodes stay NotReady ends
# CREATE_FAILED "Unhealthy nodes in the kubernetes cluster" (install the CNI between the control plane and the nodes).
@rule("node-needs-cni", of_type(NODE_GROUP), "terraform-aws-modules/terraform-aws-eks issues 3160, 3446, 3525")
def node_group_needs_cni(record: ResourceRecord, moment: Moment) -> str | None:
    if moment.before.cni is None:
        return ("no CNI is installed before this node group: its nodes stay NotReady (\"cni plugin not "
                "initialized\") and the group ends CREATE_FAILED")
    return None


# The kubelet mounts a hostPath of type File/Directory (Socket, CharDevice, BlockDevice) only when the path is
# already there on the node, else the pod stays ContainerCreating (kubernetes.io/docs/concepts/storage/volumes,
# "hostPath volume types"); every EKS node here is Amazon Linux 2023, whose paths node_image lists.
@rule("host-paths-exist", of_type(RELEASE),
      "kubernetes.io hostPath volume types; awslabs/amazon-eks-ami nodeadm (AL2023 node paths)")
def host_paths_exist(record: ResourceRecord, moment: Moment) -> str | None:
    if not any(r.type == EKS_CLUSTER for r in moment.records.values()):
        return None  # an existing cluster (kind): its node image is not ours to know
    for pod in pod_makers(moment.release(record).objects):
        for volume, path, host_type in pod.host_paths():
            if problem := missing_path(path, host_type):
                return f"{pod.label} mounts hostPath volume {volume}: {problem}, so its pods never start"
    return None


# Karpenter marks a node initialized only when every extended resource the pods it was launched for asked for is
# registered on it (pkg/controllers/nodeclaim/lifecycle/initialization.go); a device plugin registers it, so one
# must land on the pool.
@rule("nodes-initialize", of_type(NODE_POOL), "kubernetes-sigs/karpenter v1.14.1 RequestedResourcesRegistered")
def nodes_initialize(record: ResourceRecord, moment: Moment) -> str | None:
    pool = pool_of(record, moment)
    if pool is None:
        return None
    startup = startup_taints(record, moment)
    requested = sorted({r for job in moment.records.values() if job.type == VOLCANO_JOB
                        for pod, _ in task_pods(job) if admits(pod, pool) for r in pod.extended_resources})
    for resource in requested:
        if not any(_plugin_lands(resource, pool, startup, moment)):
            return (f"its nodes offer {resource} but no device plugin for it lands on them, so Karpenter never "
                    f"marks a {pool.name} node initialized")
    return None


def _plugin_lands(resource: str, pool: Pool, startup: tuple[Taint, ...], moment: Moment) -> Iterator[bool]:
    if resource == "vpc.amazonaws.com/efa":
        for release in moment.rendered.releases.values():
            if release.chart == "aws-efa-k8s-device-plugin":
                yield any(p.daemon and admits(p.needs(), pool, startup) for p in workloads(release.objects))
    elif resource.startswith("nvidia.com/"):
        # The GPU Operator makes its device plugin from the ClusterPolicy, on GPU nodes, with the policy's
        # spec.daemonsets.tolerations (gpu-operator v26.7.0 templates/clusterpolicy.yaml, values daemonsets); MIG
        # resources appear only once mig-manager applies the layout (spec.migManager).
        labelled = _gpu_labelled(pool, startup, moment)
        for release in moment.rendered.releases.values():
            for policy in release.of_kind("ClusterPolicy"):
                spec = policy.get("spec") or {}
                if lookup(spec, "devicePlugin.enabled", True) is False:
                    continue
                if resource.startswith("nvidia.com/mig-") and lookup(spec, "migManager.enabled", True) is False:
                    continue
                tolerations = tuple(Toleration.of(t) for t in lookup(spec, "daemonsets.tolerations", ()) or ())
                yield labelled and admits(PodNeeds("nvidia-device-plugin", tolerations=tolerations), pool, startup)


# The GPU Operator deploys its operands only to nodes labelled as NVIDIA PCI hosts, which Node Feature Discovery's
# worker does (NVIDIA/gpu-operator v26.7.0 controllers/state_manager.go gpuNodeLabels); a pool whose nodes carry
# such a label from the start needs no worker.
GPU_NODE_LABELS = ("feature.node.kubernetes.io/pci-10de.present", "feature.node.kubernetes.io/pci-0302_10de.present",
                   "feature.node.kubernetes.io/pci-0300_10de.present")
NFD_WORKER = {"app.kubernetes.io/name": "node-feature-discovery", "role": "worker"}  # the NFD chart's labels


def _gpu_labelled(pool: Pool, startup: tuple[Taint, ...], moment: Moment) -> bool:
    if any("true" in pool.labels.get(label, frozenset()) for label in GPU_NODE_LABELS):
        return True
    return any(pod.daemon and admits(pod.needs(), pool, startup) for _, obj in moment.rendered.objects()
               if NFD_WORKER.items() <= dict(lookup(obj, "metadata.labels") or {}).items()
               and (pod := workload(obj)) is not None)
