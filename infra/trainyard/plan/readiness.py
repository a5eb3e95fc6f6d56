"""Readiness rules: whether one resource, created into a given cluster state, comes up (or hangs, or fails).

Each rule is a pure function `(record, moment) -> problem or None`: `moment.before` is the cluster made of
everything the engine has finished when it starts this resource (its transitive dependencies and parents), and
`moment.after` the cluster once the whole run is done (what a controller acting later sees). A rule names the
upstream behaviour it models in the comment above it; `RULES` lists them with the resource types they apply to.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from trainyard import names
from trainyard.catalogue.charts import load_catalogue
from trainyard.config.instance_types import INSTANCE_TYPES
from trainyard.names import POOL_LABEL
from trainyard.paths import REPO_ROOT
from trainyard.plan.cluster_model import (
    GIB,
    PodNeeds,
    Pool,
    Toleration,
    admits,
    can_launch,
    can_run_now,
    fits_some_offer,
    label_mismatch,
    quantity,
    short_resources,
    untolerated,
)
from trainyard.plan.cluster_state import (
    EKS_ADDON,
    NODE_CLASS,
    NODE_GROUP,
    NODE_POOL,
    RELEASE,
    ClusterState,
    ceph_cluster_problem,
)
from trainyard.plan.pods import awaited_by_install, lookup, pod_needs, workloads
from trainyard.plan.recording import ResourceRecord
from trainyard.plan.rendering import RenderedRelease, RenderedStack, chart_name
from trainyard.plan.trainer_check import trainer_problem
from trainyard.platform.registry import load_registry

PVC = "kubernetes:core/v1:PersistentVolumeClaim"
VOLCANO_JOB = "kubernetes:batch.volcano.sh/v1alpha1:Job"
QUEUES = ("kubernetes:scheduling.volcano.sh/v1beta1:Queue", "kubernetes:scheduling.volcano.sh/v1beta1:QueuePatch")
ALLUXIO_RUNTIME = "kubernetes:data.fluid.io/v1alpha1:AlluxioRuntime"
DATASET = "kubernetes:data.fluid.io/v1alpha1:Dataset"


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


def ready_pools(state: ClusterState) -> tuple[Pool, ...]:
    """Pools whose nodes are Ready: a node reports NotReady until a CNI is installed."""
    return state.pools if state.cni else ()


def _placement_problem(pod: PodNeeds, pools: tuple[Pool, ...], *, launch: bool) -> str:
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


# --------------------------------------------------------------------------------------------------- nodes


# A node joins Ready only once a CNI is installed; a managed node group whose nodes stay NotReady ends
# CREATE_FAILED "Unhealthy nodes in the kubernetes cluster" (terraform-aws-modules/terraform-aws-eks issues 3160,
# 3446, 3525: install the CNI between the control plane and the nodes).
def node_group_needs_cni(record: ResourceRecord, moment: Moment) -> str | None:
    if moment.before.cni is None:
        return ("no CNI is installed before this node group: its nodes stay NotReady (\"cni plugin not "
                "initialized\") and the group ends CREATE_FAILED")
    return None


# Pods of an EKS add-on with a Deployment: pulumi-aws (terraform-provider-aws internal/service/eks, waitAddonCreated)
# waits for ACTIVE and keeps waiting through CREATING/DEGRADED until its 20 min create timeout.
# Placement from the add-ons' default configuration (`aws eks describe-addon-configuration`): CoreDNS and the EBS
# CSI controller tolerate CriticalAddonsOnly and run on any Linux node.
_ADDON_PODS: Mapping[str, PodNeeds] = {
    name: PodNeeds(name=name, node_selector={"kubernetes.io/os": "linux"},
                   tolerations=(Toleration("CriticalAddonsOnly", "Exists"),))
    for name in ("coredns", "aws-ebs-csi-driver", "snapshot-controller")
}


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
            f"({_placement_problem(pod, pools, launch=False)})")


# ------------------------------------------------------------------------------------------- Helm releases


# A Release waits for its Deployments/StatefulSets unless skipAwait (pulumi-kubernetes Release docs: "skipAwait
# will be disabled automatically if atomic is used"), and for its install hook Jobs always (Helm chart hooks docs);
# the pods the chart renders need nodes present at that point, or a Karpenter NodePool that can launch one
# (Karpenter scheduling docs: node selectors, taints, resources).
def release_waits(record: ResourceRecord) -> bool:
    return bool(record.inputs.get("atomic")) or not record.inputs.get("skipAwait")


def release_needs_nodes(record: ResourceRecord, moment: Moment) -> str | None:
    waits = release_waits(record)
    ready = ready_pools(moment.before)
    for awaited in awaited_by_install(workloads(moment.release(record).objects), waits=waits):
        pod = awaited.needs()
        if can_run_now(pod, ready) or can_launch(pod, ready):
            continue
        why = "waits (atomic/skipAwait false)" if waits and not awaited.hooks else "runs the hook"
        return (f"the install {why} for {pod.name}, which cannot be scheduled: "
                f"{_placement_problem(pod, ready, launch=True)}")
    return None


# Volumes of pods a release's operator creates (kube-prometheus-stack: Prometheus and Alertmanager
# volumeClaimTemplates) stay Pending until their StorageClass's backend can provision (kubernetes.io/docs/
# concepts/storage/dynamic-provisioning); a monitoring volume on a backend installed later waits for it.
_RELEASE_CLAIMS: Mapping[str, tuple[tuple[str, str], ...]] = {
    "kube-prometheus-stack": (
        ("Prometheus", "prometheus.prometheusSpec.storageSpec.volumeClaimTemplate.spec.storageClassName"),
        ("Alertmanager", "alertmanager.alertmanagerSpec.storage.volumeClaimTemplate.spec.storageClassName"),
    ),
}


def release_volumes_bind(record: ResourceRecord, moment: Moment) -> str | None:
    values = record.inputs.get("values") or {}
    for owner, path in _RELEASE_CLAIMS.get(chart_name(str(record.inputs.get("chart", ""))), ()):
        name = lookup(values, path)
        if name is None:
            continue
        if problem := _class_problem(str(name), moment.before):
            return f"{owner}'s volume (StorageClass {name}) stays Pending when this release installs: {problem}"
    return None


# Rook's storage selection decides which nodes get OSDs: useAllNodes, or a nodes: list (useAllNodes false with
# no list selects none), filtered by the OSD placement; mons need `mon.count` distinct nodes unless
# allowMultiplePerNode (Rook ceph-cluster-crd doc, "Storage Selection Settings", "Mon Settings"). Rook keeps
# reconciling, so the nodes at the end of the run count.
def ceph_has_osds(record: ResourceRecord, moment: Moment) -> str | None:
    if chart_name(str(record.inputs.get("chart", ""))) != "rook-ceph-cluster" or moment.after.ceph is None:
        return None
    if problem := ceph_cluster_problem(moment.after.ceph):
        return f"the CephCluster never serves storage: {problem}"
    return None


# ------------------------------------------------------------------------------------------ custom resources


# Creating an object whose CRD is not installed fails ("no matches for kind"); platform/addons.yaml says which
# chart installs each API group. Cilium's CRDs are registered by cilium-operator when it starts (docs.cilium.io,
# "cilium-operator": CRD registration), so they also need a Ready node for the operator.
@functools.cache
def crd_charts() -> Mapping[str, str]:
    """CRD API group -> the chart (by chart name) that installs it."""
    pins = load_catalogue(REPO_ROOT).pins
    return {group: chart_name(pins[release].chart) for group, release in load_registry(REPO_ROOT).crd_owners().items()}


def _group(record: ResourceRecord) -> str | None:
    parts = record.type.split(":")
    if parts[0] != "kubernetes" or len(parts) != 3 or "/" not in parts[1]:
        return None
    return parts[1].rsplit("/", 1)[0]


def is_custom_resource(record: ResourceRecord) -> bool:
    return _group(record) in crd_charts()


def crd_installed(record: ResourceRecord, moment: Moment) -> str | None:
    group = _group(record)
    chart = crd_charts()[group] if group else ""
    if chart not in moment.before.charts:
        return f"its CRD ({group}) comes with the {chart} chart, which is not installed before it"
    if group == "cilium.io" and not any(p.nodes for p in ready_pools(moment.before)):
        return "Cilium's CRDs are registered by cilium-operator, which has no Ready node before this object"
    return None


# --------------------------------------------------------------------------------------------------- storage


def _class_problem(name: str | None, state: ClusterState) -> str | None:
    if name is None:
        return "it names no StorageClass and the cluster has no default class"
    storage_class = state.storage_classes.get(name)
    if storage_class is None:
        return f"StorageClass {name} does not exist yet"
    return storage_class.problem


# pulumi-kubernetes waits for a PersistentVolumeClaim to be Bound unless the pulumi.com/skipAwait annotation is
# set or its class binds WaitForFirstConsumer (pulumi-kubernetes await logic; issue 895). Binding needs the
# class's backend to provision: Ceph needs the Rook operator, a CephCluster, mons and OSD hosts, and a pool
# size no larger than the OSD hosts with failureDomain host (Rook ceph-cluster-crd and ceph-pool-crd docs).
def claim_binds(record: ResourceRecord, moment: Moment) -> str | None:
    annotations = lookup(record.inputs, "metadata.annotations", {}) or {}
    name = lookup(record.inputs, "spec.storageClassName")
    awaited_class = moment.before.storage_classes.get(str(name or moment.before.default_class))
    awaited = annotations.get("pulumi.com/skipAwait") != "true" and (awaited_class is None or
                                                                       awaited_class.immediate)
    state = moment.before if awaited else moment.after
    problem = _class_problem(str(name) if name else state.default_class, state)
    if problem is None:
        return None
    if awaited:
        return f"pulumi up waits for the claim to bind, and nothing it waits on can serve it: {problem}"
    return f"the claim never binds: {problem}"


# ------------------------------------------------------------------------------------------------ workloads


def task_pods(record: ResourceRecord) -> list[tuple[PodNeeds, int]]:
    tasks = lookup(record.inputs, "spec.tasks", ()) or ()
    return [(pod_needs(f"{record.name}/{t.get('name', 'task')}", lookup(t, "template.spec", {}) or {}),
             int(t.get("replicas", 1))) for t in tasks]


def gang_needs(record: ResourceRecord) -> dict[str, float]:
    """What a Volcano job's gang (its first minAvailable pods) requests in all."""
    pods = [pod for pod, replicas in task_pods(record) for _ in range(replicas)]
    wanted: dict[str, float] = {}
    for pod in pods[: int(lookup(record.inputs, "spec.minAvailable", len(pods)) or len(pods))]:
        for resource, amount in pod.requests.items():
            wanted[resource] = wanted.get(resource, 0.0) + amount
    return wanted


# A pending pod makes Karpenter launch a node only if some NodePool's requirements and labels match its
# selectors, it tolerates the pool's taints, and an instance type offers every resource it requests;
# Karpenter knows nvidia.com/gpu and vpc.amazonaws.com/efa per instance type, MIG slices only from a NodeOverlay
# with the NodeOverlay feature gate on (karpenter.sh/docs/concepts/scheduling; aws/karpenter-provider-aws PR 8710).
def karpenter_can_launch(record: ResourceRecord, moment: Moment) -> str | None:
    pools = ready_pools(moment.after)
    for pod, _replicas in task_pods(record):
        if can_run_now(pod, pools) or can_launch(pod, pools):
            continue
        problem = _placement_problem(pod, pools, launch=True)
        mig = [r for r in pod.extended_resources if r.startswith("nvidia.com/mig-")]
        if mig and not moment.after.overlay_gate:
            problem += " (Karpenter's nodeOverlay feature gate is off, so no NodeOverlay counts)"
        elif mig:
            problem += f" (no NodeOverlay gives {', '.join(mig)} to the pool; overlays: " \
                       f"{', '.join(moment.after.overlays) or 'none'})"
        return f"{pod.name} stays Pending, Karpenter launches no node for it: {problem}"
    return _within_pool_limits(record, pools)


# nvidia.com/gpu and nvidia.com/mig-* are extended resources only the NVIDIA device plugin advertises on a node,
# and the GPU Operator is what deploys it here (kubernetes.io/docs/concepts/extend-kubernetes/compute-storage-net/
# device-plugins; NVIDIA/gpu-operator): without it Karpenter may launch the node, but the pod stays Pending.
GPU_OPERATOR_CHART = "gpu-operator"


def gpu_device_plugin(record: ResourceRecord, moment: Moment) -> str | None:
    if GPU_OPERATOR_CHART in moment.after.charts:
        return None
    for pod, _replicas in task_pods(record):
        if nvidia := [r for r in pod.extended_resources if r.startswith("nvidia.com/")]:
            return (f"{pod.name} would hang Pending: it requests {', '.join(nvidia)}, which only the device plugin "
                    f"of the GPU Operator advertises, and no {GPU_OPERATOR_CHART} release is installed")
    return None


# With the mixed MIG strategy (platform/gpu-operator/values.yaml) the device plugin advertises a MIG-enabled GPU
# only as its slices, nvidia.com/mig-<profile>, never as nvidia.com/gpu (NVIDIA/k8s-device-plugin README, "MIG
# support"): a pod asking for whole GPUs never fits a node mig-manager partitioned (nvidia.com/mig.config).
WHOLE_GPU = "nvidia.com/gpu"


def whole_gpus_on_mig(record: ResourceRecord, moment: Moment) -> str | None:
    pools = ready_pools(moment.after)
    for pod, _replicas in task_pods(record):
        if WHOLE_GPU not in pod.requests:
            continue
        landing = [p for p in pools if label_mismatch(pod, p) is None and not untolerated(pod, p)]
        if landing and all(names.MIG_CONFIG_LABEL in p.labels for p in landing):
            return (f"{pod.name} would hang Pending: it requests whole GPUs ({WHOLE_GPU}) and every pool it may "
                    f"land on ({', '.join(p.name for p in landing)}) partitions its GPUs with MIG "
                    f"({names.MIG_CONFIG_LABEL}), which advertises only MIG slices")
    return None


# Karpenter launches no node past a NodePool's spec.limits (karpenter.sh/docs/concepts/nodepools, "Limits"): a
# gang needing more of a limited resource than its pools may hold never gets all its nodes.
def _within_pool_limits(record: ResourceRecord, pools: tuple[Pool, ...]) -> str | None:
    pods = [pod for pod, _ in task_pods(record)]
    if any(can_run_now(pod, pools) for pod in pods):
        return None
    candidates = {p.name: p for p in pools
                  if p.autoscaled and any(admits(pod, p) and fits_some_offer(pod, p) for pod in pods)}
    for resource, amount in sorted(gang_needs(record).items()):
        limits = [pool.limits.get(resource) for pool in candidates.values()]
        if not limits or any(limit is None for limit in limits):
            continue  # some pool sets no limit on it
        allowed = sum(limit for limit in limits if limit is not None)
        if amount > allowed:
            return (f"its gang needs {amount:g} {resource}, more than the limits of NodePool(s) "
                    f"{', '.join(candidates)} allow ({allowed:g})")
    return None


# With the `enqueue` action, Volcano admits a PodGroup only into resources the cluster has now (proportion's
# queue capacity and overcommit's idle x factor); a job for a pool at zero stays Pending, its pods are never
# created, and no autoscaler sees them (volcano-sh/volcano issue 3910). Without `enqueue`, allocate moves a
# Pending PodGroup to Inqueue itself (pkg/scheduler/actions/allocate/allocate.go, "no enqueue action").
def gang_admitted(record: ResourceRecord, moment: Moment) -> str | None:
    scheduler = moment.after.scheduler
    if scheduler is None:
        return "no Volcano scheduler is installed to run this job"
    if "enqueue" not in scheduler.actions or not scheduler.plugins & {"proportion", "overcommit"}:
        return None
    wanted = gang_needs(record)
    present: dict[str, float] = {}
    for pool in ready_pools(moment.after):
        for resource, amount in (pool.offers[0].resources if pool.offers else {}).items():
            present[resource] = present.get(resource, 0.0) + amount * pool.nodes
    short = sorted(r for r, amount in wanted.items() if amount > present.get(r, 0.0) * scheduler.overcommit_factor)
    if not short:
        return None
    return (f"the scheduler's enqueue action keeps its PodGroup Pending: {', '.join(short)} are not in the "
            f"cluster until Karpenter adds nodes, and no pod is created for Karpenter to see")


# The proportion plugin never allocates a queue more than its `capability` (volcano.sh docs, "Queue":
# capability is a hard limit), so a gang asking more than its queue's capability never starts.
def queue_fits(record: ResourceRecord, moment: Moment) -> str | None:
    queue_name = lookup(record.inputs, "spec.queue", "default")
    queues = [r for r in moment.records.values()
              if r.type in QUEUES and lookup(r.inputs, "metadata.name") == queue_name]
    if not queues:
        return None if queue_name == "default" else f"its queue {queue_name} does not exist"
    capability = lookup(queues[0].inputs, "spec.capability", {}) or {}
    wanted = gang_needs(record)
    over = [f"{_amount(r, wanted[r])} {r} (capability {limit})" for r, limit in sorted(capability.items())
            if wanted.get(r, 0.0) > quantity(limit)]
    if not over:
        return None
    return f"its gang (minAvailable pods) needs more than queue {queue_name} may hold: {', '.join(over)}"


def _amount(resource: str, value: float) -> str:
    return f"{value / GIB:.1f}Gi" if resource == "memory" else f"{value:g}"


# A queue marked reclaimable gives resources back only through the `reclaim` action (volcano.sh docs, "Actions":
# reclaim); without it the flag promises something the scheduler never does.
def reclaim_configured(record: ResourceRecord, moment: Moment) -> str | None:
    if not lookup(record.inputs, "spec.reclaimable"):
        return None
    scheduler = moment.after.scheduler
    if scheduler is not None and "reclaim" not in scheduler.actions:
        return "the queue is reclaimable but the scheduler runs no reclaim action"
    return None


def _dataset(record: ResourceRecord, moment: Moment) -> Mapping[str, Any]:
    namespace = lookup(record.inputs, "metadata.namespace")
    name = lookup(record.inputs, "metadata.name")
    for other in moment.records.values():
        if other.type == DATASET and lookup(other.inputs, "metadata.name") == name and \
                lookup(other.inputs, "metadata.namespace") == namespace:
            return lookup(other.inputs, "spec", {}) or {}
    return {}


# Fluid places an AlluxioRuntime's cache workers by the runtime's worker nodeSelector and its Dataset's
# nodeAffinity and tolerations (data.fluid.io CRDs: AlluxioRuntime spec.worker, Dataset spec.nodeAffinity). A
# worker that can only land on a GPU pool makes Karpenter launch GPU nodes for the cache alone, and WhenEmpty
# consolidation never reclaims a node that runs a non-DaemonSet pod (karpenter.sh/docs/concepts/disruption).
def cache_off_gpu_nodes(record: ResourceRecord, moment: Moment) -> str | None:
    spec = lookup(record.inputs, "spec", {}) or {}
    replicas = int(spec.get("replicas", 1) or 0)
    if replicas == 0 or lookup(spec, "worker.enabled") is False:
        return None
    dataset = _dataset(record, moment)
    worker = pod_needs(f"{record.name} worker", {
        "nodeSelector": lookup(spec, "worker.nodeSelector", {}),
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                                      lookup(dataset, "nodeAffinity.required")}} if dataset.get("nodeAffinity") else {},
        "tolerations": dataset.get("tolerations") or (),
    })
    ready = ready_pools(moment.after)
    pools = [p for p in ready if admits(worker, p)]
    if not pools:
        return f"its {replicas} cache workers fit no node pool ({_placement_problem(worker, ready, launch=True)})"
    if all(p.has_accelerators for p in pools):
        names = ", ".join(p.name for p in pools)
        return (f"its {replicas} cache workers can only run on GPU pools ({names}): Karpenter launches GPU nodes "
                f"for the cache alone and WhenEmpty consolidation never reclaims them")
    return None


POD_IDENTITY = "aws:eks/podIdentityAssociation:PodIdentityAssociation"
CILIUM_POLICY = "kubernetes:cilium.io/v2:CiliumNetworkPolicy"
POD_IDENTITY_PORT = "80"  # the agent serves credentials on 169.254.170.23:80 (EKS docs, "EKS Pod Identity")


def _allows_host(rule: Mapping[str, Any]) -> bool:
    if not {"host", "all"} & set(rule.get("toEntities") or ()):
        return False
    ports = [p for to in rule.get("toPorts") or () for p in to.get("ports") or ()]
    return not ports or any(str(p.get("port")) == POD_IDENTITY_PORT for p in ports)


def _all_pods_allowed_host(namespace: object, moment: Moment) -> bool:
    """Whether a policy that selects every pod of the namespace allows the agent: Cilium adds up the allow rules
    of all policies that select a pod (Policy Language, "Layer 3 Examples": policies are additive), so a narrower
    policy's own egress rules take nothing away from it."""
    return any(r.type == CILIUM_POLICY and lookup(r.inputs, "metadata.namespace") == namespace
               and not lookup(r.inputs, "spec.endpointSelector")
               and any(_allows_host(rule) for rule in lookup(r.inputs, "spec.egress") or ())
               for r in moment.records.values())


# The pod identity agent listens on the node (hostNetwork) at 169.254.170.23, which Cilium classifies as the
# `host` entity, so a toCIDR rule for that address never matches and a default-deny egress policy drops the
# credential fetch; allow it with toEntities: [host] (cilium/cilium issue 34387).
def pod_identity_reachable(record: ResourceRecord, moment: Moment) -> str | None:
    egress = lookup(record.inputs, "spec.egress")
    namespace = lookup(record.inputs, "metadata.namespace")
    if not egress:  # a policy without egress rules leaves egress open
        return None
    users = sorted(str(r.inputs.get("serviceAccount")) for r in moment.records.values()
                   if r.type == POD_IDENTITY and r.inputs.get("namespace") == namespace)
    if not users or any(_allows_host(rule) for rule in egress) or _all_pods_allowed_host(namespace, moment):
        return None
    return (f"pods of {namespace} with EKS Pod Identity ({', '.join(users)}) cannot fetch credentials: egress to "
            f"169.254.170.23:{POD_IDENTITY_PORT} is the Cilium `host` entity and no rule allows toEntities host")


# A hard networkTopology job binds only when one HyperNode of at most its tier holds its whole gang, and a running
# one places new pods only under the HyperNode it holds (volcano pkg/scheduler/actions/allocate, plugins/
# network-topology-aware, getSearchRoot @v1.15.1). Karpenter does not see HyperNodes: it launches nodes for the
# pending pods wherever the NodePool allows; if they share no such HyperNode the pods stay Pending, the empty nodes
# are consolidated after consolidateAfter and Karpenter launches again, a loop that bills GPU hours. Only capacity
# that is co-located by construction breaks it: Capacity Blocks (EC2 UltraClusters) or one instance type in a
# cluster placement group, on types EC2 reports a topology for, with no spot replacements and no growth.
CAPACITY_RESERVATION_TYPE = "karpenter.k8s.aws/capacity-reservation-type"


def pool_records(pool: str, moment: Moment) -> tuple[ResourceRecord | None, ResourceRecord | None]:
    node_pool = next((r for r in moment.records.values() if r.type == NODE_POOL
                      and lookup(r.inputs, "metadata.name") == pool), None)
    ref = lookup(node_pool.inputs, "spec.template.spec.nodeClassRef.name") if node_pool else None
    node_class = next((r for r in moment.records.values() if r.type == NODE_CLASS
                       and lookup(r.inputs, "metadata.name") == ref), None)
    return node_pool, node_class


def hard_topology_co_located(record: ResourceRecord, moment: Moment) -> str | None:
    topology = lookup(record.inputs, "spec.networkTopology") or {}
    if topology.get("mode") != "hard":
        return None
    pool = next((lookup(t, "template.spec.nodeSelector") or {} for t in lookup(record.inputs, "spec.tasks") or ()),
                {}).get(POOL_LABEL)
    node_pool, node_class = pool_records(str(pool), moment)
    if node_pool is None:
        return None  # not Karpenter's: no launch to loop
    requirements = {r.get("key"): list(r.get("values") or ()) for r in
                    lookup(node_pool.inputs, "spec.template.spec.requirements") or ()}
    types = requirements.get("node.kubernetes.io/instance-type", [])
    capacity = requirements.get("karpenter.sh/capacity-type", [])
    class_spec = (node_class.inputs.get("spec") or {}) if node_class else {}
    blocks = (capacity == ["reserved"] and requirements.get(CAPACITY_RESERVATION_TYPE) == ["capacity-block"]
              and bool(class_spec.get("capacityReservationSelectorTerms")))
    placed = bool(class_spec.get("placementGroupSelector")) and len(types) == 1
    tasks = lookup(record.inputs, "spec.tasks") or ()
    replicas = sum(int(t.get("replicas", 1)) for t in tasks)
    loop = f"hard networkTopology on NodePool {pool}: "
    unlabelled = [t for t in types if (offer := INSTANCE_TYPES.get(t)) is None or not offer.network_layers]
    if unlabelled:
        return loop + (f"{', '.join(unlabelled)} report no EC2 network topology, so their nodes are in no "
                       "HyperNode and the job never binds (Karpenter keeps launching and consolidating)")
    if "spot" in capacity:
        return loop + "a reclaimed spot node's replacement may land outside the job's HyperNode and never bind"
    if replicas > int(lookup(record.inputs, "spec.minAvailable") or replicas):
        return loop + (f"the job grows to {replicas} pods, whose nodes Karpenter may launch outside the HyperNode "
                       "the job holds")
    if not (blocks or placed):
        return loop + ("its capacity is not co-located by construction (neither Capacity Blocks only nor one "
                       "instance type in a placement group): Karpenter may launch nodes that share no HyperNode "
                       "of the job's tier, which stay empty, are consolidated and launched again")
    # Co-located capacity shares only the top layer: EC2 promises UltraCluster / placement-group proximity, not one
    # lower network node (tier 1 = one network-node-layer-3 node: Volcano label.go generateHyperNodeInfo @v1.15.1).
    top = min(INSTANCE_TYPES[t].network_layers for t in types) if types else 0
    if (tier := int(topology.get("highestTierAllowed") or top)) < top:
        return loop + (f"highestTierAllowed {tier} needs the nodes under one network node below the top layer, "
                       f"which neither Capacity Blocks nor a placement group promise (only tier {top} is "
                       "co-located): launched nodes may never bind, and are consolidated and launched again")
    return None


def _is(*types: str) -> Callable[[ResourceRecord], bool]:
    return lambda record: record.type in types


def trainer_config_valid(record: ResourceRecord, moment: Moment) -> str | None:
    """The trainer accepts its config at every node count of the job's range, and fits the smallest device its
    pods can get (issue 19 finding 4: an elastic job that forms at a size its batch cannot split fails there)."""
    return trainer_problem(record, moment.records, {pool.name: pool for pool in moment.after.pools})


RULES: tuple[Rule, ...] = (
    Rule("node-needs-cni", _is(NODE_GROUP), node_group_needs_cni,
         "terraform-aws-modules/terraform-aws-eks issues 3160, 3446, 3525"),
    Rule("addon-needs-nodes", _is(EKS_ADDON), addon_needs_nodes,
         "terraform-provider-aws eks addon waitAddonCreated (ACTIVE); EKS add-on health DEGRADED"),
    Rule("crd-installed", is_custom_resource, crd_installed,
         "Kubernetes API: no matches for kind; Cilium operator registers Cilium CRDs"),
    Rule("release-needs-nodes", _is(RELEASE), release_needs_nodes,
         "pulumi-kubernetes Release (atomic disables skipAwait); helm install --wait"),
    Rule("release-volumes-bind", _is(RELEASE), release_volumes_bind,
         "Kubernetes dynamic provisioning: a claim waits for its class's provisioner"),
    Rule("ceph-has-osds", _is(RELEASE), ceph_has_osds, "Rook ceph-cluster-crd doc: storage selection, mon count"),
    Rule("claim-binds", _is(PVC), claim_binds,
         "pulumi-kubernetes PVC await (Bound; issue 895); Rook ceph-cluster-crd / ceph-pool-crd"),
    Rule("gang-admitted", _is(VOLCANO_JOB), gang_admitted, "volcano-sh/volcano issue 3910"),
    Rule("queue-fits", _is(VOLCANO_JOB), queue_fits, "Volcano proportion plugin: queue capability"),
    Rule("karpenter-can-launch", _is(VOLCANO_JOB), karpenter_can_launch,
         "Karpenter scheduling docs and NodePool limits; aws/karpenter-provider-aws PR 8710 (NodeOverlay)"),
    Rule("gpu-device-plugin", _is(VOLCANO_JOB), gpu_device_plugin,
         "Kubernetes device plugins; the NVIDIA device plugin is deployed by the GPU Operator"),
    Rule("whole-gpus-on-mig", _is(VOLCANO_JOB), whole_gpus_on_mig,
         "NVIDIA/k8s-device-plugin README, MIG support (mixed strategy)"),
    Rule("reclaim-configured", _is(*QUEUES), reclaim_configured, "volcano.sh docs, actions: reclaim"),
    Rule("pod-identity-reachable", _is(CILIUM_POLICY), pod_identity_reachable, "cilium/cilium issue 34387"),
    Rule("hard-topology-co-located", _is(VOLCANO_JOB), hard_topology_co_located,
         "volcano v1.15.1 network-topology-aware plugin, allocate getSearchRoot; Karpenter WhenEmpty consolidation"),
    Rule("cache-off-gpu-nodes", _is(ALLUXIO_RUNTIME), cache_off_gpu_nodes,
         "Karpenter disruption docs (WhenEmpty); Fluid AlluxioRuntime/Dataset placement"),
    Rule("trainer-config-valid", _is(VOLCANO_JOB), trainer_config_valid,
         "trainyard_train validate.check_node_range and planner.check_fits (the trainer's own checks)"),
)
