"""Rules on where the platform's own pods land: an EKS add-on's and a Helm release's pods need a node when they are
created, and controllers stay off the GPU and storage nodes."""

from __future__ import annotations

import json
from collections.abc import Mapping

from trainyard.plan.cluster_model import PodNeeds, Pool, Toleration, admits, can_launch, can_run_now
from trainyard.plan.pods import awaited_by_install, pod_makers, workloads
from trainyard.plan.recording import ResourceRecord
from trainyard.plan.resource_types import EKS_ADDON, RELEASE
from trainyard.plan.rules.base import Moment, of_type, placement_problem, ready_pools, rule

ROLE = "trainyard.io/role"  # the label every node group and pool of this project carries (cloud/node_groups.py)
STORAGE_ROLE = "storage"
ACCELERATORS = ("nvidia.com/", "vpc.amazonaws.com/efa")

# Placement from the add-ons' default configuration (`aws eks describe-addon-configuration`): CoreDNS and the EBS
# CSI controller tolerate CriticalAddonsOnly and run on any Linux node.
_ADDON_PODS: Mapping[str, PodNeeds] = {
    name: PodNeeds(name=name, node_selector={"kubernetes.io/os": "linux"},
                   tolerations=(Toleration("CriticalAddonsOnly", "Exists"),))
    for name in ("coredns", "aws-ebs-csi-driver", "snapshot-controller")
}


# Pods of an EKS add-on with a Deployment: pulumi-aws (terraform-provider-aws internal/service/eks, waitAddonCreated)
# waits for ACTIVE and keeps waiting through CREATING/DEGRADED until its 20 min create timeout.
@rule("addon-needs-nodes", of_type(EKS_ADDON),
      "terraform-provider-aws eks addon waitAddonCreated (ACTIVE); EKS add-on health DEGRADED")
def addon_needs_nodes(record: ResourceRecord, moment: Moment) -> str | None:
    name = str(record.inputs.get("addonName"))
    pod = _ADDON_PODS.get(name)
    if pod is None:  # a DaemonSet-only add-on (pod identity agent, vpc-cni) is ACTIVE with no node
        return None
    config = json.loads(str(record.inputs.get("configurationValues") or "{}"))
    if config.get("nodeSelector") or config.get("tolerations"):
        pod = PodNeeds(name=name, node_selector=dict(config.get("nodeSelector") or pod.node_selector),
                       tolerations=tuple(Toleration.of(t) for t in config.get("tolerations") or ()))
    pools = ready_pools(moment.before)
    if can_run_now(pod, pools):
        return None
    return (f"EKS add-on {name} stays DEGRADED and its create times out: its pods need a Ready node "
            f"({placement_problem(pod, pools, launch=False)})")


def release_waits(record: ResourceRecord) -> bool:
    return bool(record.inputs.get("atomic")) or not record.inputs.get("skipAwait")


# A Release waits for its Deployments/StatefulSets unless skipAwait (pulumi-kubernetes Release docs: "skipAwait
# will be disabled automatically if atomic is used"), and for its install hook Jobs always (Helm chart hooks docs);
# the pods the chart renders need nodes present at that point, or a Karpenter NodePool that can launch one
# (Karpenter scheduling docs: node selectors, taints, resources).
@rule("release-needs-nodes", of_type(RELEASE),
      "pulumi-kubernetes Release (atomic disables skipAwait); helm install --wait")
def release_needs_nodes(record: ResourceRecord, moment: Moment) -> str | None:
    waits = release_waits(record)
    ready = ready_pools(moment.before)
    for awaited in awaited_by_install(workloads(moment.release(record).objects), waits=waits):
        pod = awaited.needs()
        if can_run_now(pod, ready) or can_launch(pod, ready):
            continue
        why = "waits (atomic/skipAwait false)" if waits and not awaited.hooks else "runs the hook"
        return (f"the install {why} for {pod.name}, which cannot be scheduled: "
                f"{placement_problem(pod, ready, launch=True)}")
    return None


def special_pools(pools: tuple[Pool, ...]) -> list[Pool]:
    """Pools a controller must stay off: GPU pools and the storage group."""
    return [p for p in pools if p.has_accelerators or STORAGE_ROLE in p.labels.get(ROLE, frozenset())]


# A pod that is not a DaemonSet's and lands on a GPU or storage node keeps Karpenter from consolidating that node
# (pkg/utils/pod IsReschedulable: such pods must be rescheduled first) and takes capacity meant for training or
# Ceph. Controllers with 0 replicas count too: something scales them later (Fluid's runtime controllers,
# pkg/controllers/deploy/runtime_controllers.go @ v1.0.8).
@rule("controllers-off-special-nodes", of_type(RELEASE),
      "kubernetes-sigs/karpenter v1.14.1 IsReschedulable (consolidation)")
def controllers_off_special_nodes(record: ResourceRecord, moment: Moment) -> str | None:
    special = special_pools(moment.after.pools)
    for pod in pod_makers(moment.release(record).objects):
        if pod.daemon or pod.kind == "CronJob":
            continue
        needs = pod.needs()
        if any(r.startswith(ACCELERATORS) for r in needs.requests):
            continue  # a GPU workload belongs there
        if landing := [p.name for p in special if admits(needs, p)]:
            return (f"{pod.label} is not a DaemonSet and can land on {', '.join(landing)} (it tolerates their "
                    "taints): a controller there keeps Karpenter from consolidating the node")
    return None
