"""The cluster a set of created resources adds up to: CNI, node pools, CRD charts, storage classes, scheduler.

`cluster_state(records, rendered)` reads what the recording holds (inputs as the provider would receive them), what
its Helm releases render (the scheduler's configuration, the CephCluster, pools and storage classes, as the charts
write them from their defaults and our values), and the instance-type and MIG tables for what a node offers.
"""

from __future__ import annotations

import functools
import posixpath
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from trainyard import names
from trainyard.catalogue.charts import load_catalogue
from trainyard.config.instance_types import INSTANCE_TYPES
from trainyard.paths import REPO_ROOT
from trainyard.plan.cluster_model import (
    GIB,
    InstanceOffer,
    PodNeeds,
    Pool,
    Requirement,
    StorageClass,
    Taint,
    Toleration,
    admits,
    frozen_labels,
    quantity,
    satisfies,
)
from trainyard.plan.pods import affinity_terms, lookup
from trainyard.plan.recording import ResourceRecord
from trainyard.plan.rendering import RenderedStack, chart_name
from trainyard.plan.resource_types import (
    EKS_ADDON,
    EKS_CLUSTER,
    K8S_PROVIDER,
    NODE_CLASS,
    NODE_GROUP,
    NODE_OVERLAY,
    NODE_POOL,
    RELEASE,
    STORAGE_CLASS,
)
from trainyard.platform.registry import load_registry

CILIUM_AGENT_NOT_READY = names.CILIUM_AGENT_NOT_READY_TAINT_KEY
EBS_PROVISIONER = "ebs.csi.aws.com"
CEPH_CSI_SUFFIX = ".csi.ceph.com"  # Rook's provisioners: <operator namespace>.rbd.csi.ceph.com / .cephfs.csi...
# Volcano 1.15.1 chart's default scheduler config (installer/helm/chart/volcano/config/volcano-scheduler.conf).
VOLCANO_DEFAULT_ACTIONS = ("enqueue", "allocate", "backfill")


@dataclass(frozen=True)
class SchedulerConfig:
    """What Volcano's scheduler runs: its actions in order and the plugins of every tier."""

    actions: tuple[str, ...]
    plugins: frozenset[str]
    overcommit_factor: float  # overcommit plugin's factor (1.2 upstream default); 1.0 without the plugin


@dataclass(frozen=True)
class Ceph:
    """A Rook CephCluster as the rook-ceph-cluster chart renders it, with the hosts it can use."""

    osd_hosts: int
    osd_selection: str  # how storage selection picked (or failed to pick) OSD hosts, for messages
    mon_count: int
    mon_nodes_needed: int  # mon.count, or 1 with allowMultiplePerNode
    mon_hosts: int


@dataclass(frozen=True)
class ClusterState:
    cni: str | None
    pools: tuple[Pool, ...]
    charts: frozenset[str]  # Helm charts installed (by chart name)
    eks_addons: frozenset[str]
    storage_classes: Mapping[str, StorageClass]
    default_class: str | None
    scheduler: SchedulerConfig | None
    overlay_gate: bool  # Karpenter's NodeOverlay feature gate (alpha, off in the 1.14 chart)
    overlays: tuple[str, ...]  # NodeOverlay names present
    ceph: Ceph | None = None
    removed_taints: frozenset[str] = frozenset()  # taint keys the CNI removes from a node once it runs there
    ipam: str | None = None  # the CNI operator's IPAM mode (Cilium's `ipam`: eni, cluster-pool, ...)


def _rendered(record: ResourceRecord, rendered: RenderedStack) -> tuple[Mapping[str, Any], ...]:
    release = rendered.releases.get(str(record.inputs.get("name", record.name)))
    return release.objects if release is not None else ()


def releases(records: Iterable[ResourceRecord]) -> dict[str, ResourceRecord]:
    """Chart name -> its Release record."""
    return {chart_name(str(r.inputs.get("chart", ""))): r for r in records if r.type == RELEASE}


def cluster_state(records: Iterable[ResourceRecord], rendered: RenderedStack) -> ClusterState:
    """What `records` add up to; `rendered` is what their Helm releases install (the pools too depend on it: the
    taints the CNI removes, the capacity Karpenter's NodeOverlays add only with its feature gate on)."""
    records = sorted(records, key=lambda r: r.urn)  # the same state whatever order the program registered in
    charts = releases(records)
    objects = {chart: _rendered(record, rendered) for chart, record in charts.items()}
    addons = frozenset(str(r.inputs.get("addonName")) for r in records if r.type == EKS_ADDON)
    cni = _cni(records, charts, addons)
    existing = any(r.type == K8S_PROVIDER and "context" in r.inputs for r in records) and not any(
        r.type == EKS_CLUSTER for r in records)
    karpenter = charts.get("karpenter")
    gate = karpenter is not None and _karpenter_gates(objects["karpenter"]).get("NodeOverlay", False)
    overlays = [r for r in records if r.type == NODE_OVERLAY]
    removed = _cni_removed_taints(objects["cilium"]) if "cilium" in charts else frozenset()
    pools = [_managed_pool(r, removed) for r in records if r.type == NODE_GROUP]
    if karpenter is not None and cni is not None:
        classes = {str(r.inputs["metadata"]["name"]) for r in records if r.type == NODE_CLASS}
        pools += [_karpenter_pool(r, overlays if gate else []) for r in records
                  if r.type == NODE_POOL and lookup(r.inputs, "spec.template.spec.nodeClassRef.name") in classes]
    if existing:
        # A cluster the plan cannot see: its nodes are there, with labels and sizes it does not know and no GPU.
        unknown = InstanceOffer("unknown", {"cpu": float("inf"), "memory": float("inf"), "pods": float("inf")})
        pools.append(Pool("existing cluster", frozen_labels({}), (), (unknown,), nodes=1, unknown_labels=True))
    ceph = _ceph(objects["rook-ceph-cluster"], pools) if "rook-ceph-cluster" in charts else None
    classes_by_name = _storage_classes(records, objects, addons, ceph, existing)
    default = next((name for name, sc in classes_by_name.items() if sc.default), None)
    return ClusterState(
        cni=cni, pools=tuple(pools), charts=frozenset(charts), eks_addons=addons,
        storage_classes=classes_by_name, default_class=default,
        scheduler=_scheduler(objects["volcano"]) if "volcano" in charts else None,
        overlay_gate=gate, overlays=tuple(sorted(r.name for r in overlays)), ceph=ceph, removed_taints=removed,
        ipam=_cni_ipam(objects["cilium"]) if "cilium" in charts else None)


@functools.cache
def cni_charts() -> frozenset[str]:
    """Charts that give pods a network: the add-ons platform/addons.yaml marks `cni`; vpc-cni is the EKS add-on
    alternative."""
    pins = load_catalogue(REPO_ROOT).pins
    return frozenset(chart_name(pins[release].chart) for addon in load_registry(REPO_ROOT).addons if addon.cni
                     for release in addon.charts)


def _cni(records: list[ResourceRecord], charts: Mapping[str, ResourceRecord], addons: frozenset[str]) -> str | None:
    if cni := sorted(cni_charts() & set(charts)):
        return f"{cni[0]} (Helm)"
    if "vpc-cni" in addons:
        return "vpc-cni (EKS add-on)"
    for cluster in (r for r in records if r.type == EKS_CLUSTER):
        # Without bootstrapSelfManagedAddons=false EKS installs vpc-cni, kube-proxy and CoreDNS itself
        # (EKS CreateCluster API, bootstrapSelfManagedAddons, default true).
        if cluster.inputs.get("bootstrapSelfManagedAddons", True) is not False:
            return "vpc-cni (bootstrapped by EKS)"
    if any(r.type == K8S_PROVIDER and "context" in r.inputs for r in records):
        return "the existing cluster's"
    return None


def _offer(instance_type: str) -> InstanceOffer | None:
    itype = INSTANCE_TYPES.get(instance_type)
    if itype is None:
        return None
    # Karpenter's AWS provider knows these per instance type (karpenter.sh/docs/reference/instance-types);
    # MIG slices it learns only from a NodeOverlay.
    resources = {"cpu": float(itype.vcpu), "memory": itype.memory_gib * GIB, "pods": 110.0}
    if itype.gpu_count:
        resources["nvidia.com/gpu"] = float(itype.gpu_count)
    if itype.efa_interfaces:
        resources["vpc.amazonaws.com/efa"] = float(itype.efa_interfaces)
    return InstanceOffer(instance_type, resources)


def _cni_removed_taints(objects: tuple[Mapping[str, Any], ...]) -> frozenset[str]:
    """Taint keys the CNI removes from a node once its agent runs there: Cilium's operator removes the agent-not-ready
    taint while `remove-cilium-node-taints` (default true) in the configuration directory its `--config-dir` names
    (the rendered cilium-config ConfigMap) is true, and its service account may patch nodes (cilium 1.20.0
    operator/watchers node taint sync, RemoveCiliumNodeTaints default true; the chart's
    templates/cilium-operator/clusterrole.yaml grants `patch nodes` only with operator.removeNodeTaints, and its
    ConfigMap then omits the key; pkg/option/config.go `agent-not-ready-taint-key`)."""
    found = _config_dir(objects, "cilium-operator")
    if found is None:
        return frozenset()
    pod, config = found
    if not _go_bool(config.get("remove-cilium-node-taints", "true")) or not may_patch_nodes(objects, pod):
        return frozenset()
    return frozenset({str(config.get("agent-not-ready-taint-key", CILIUM_AGENT_NOT_READY))})


def _cni_ipam(objects: tuple[Mapping[str, Any], ...]) -> str | None:
    """The IPAM mode Cilium's operator runs with: `ipam` in the configuration directory its `--config-dir` names
    (cilium 1.20.0 pkg/option/config.go IPAM; in ENI mode the operator allocates the nodes' ENIs, docs.cilium.io
    network/concepts/ipam/eni); None where no operator runs or the key is left to its default (cluster-pool)."""
    found = _config_dir(objects, "cilium-operator")
    return str(found[1]["ipam"]) if found is not None and "ipam" in found[1] else None


def may_patch_nodes(objects: Sequence[Mapping[str, Any]], workload: Mapping[str, Any]) -> bool:
    """The workload's service account holds `patch` on core nodes through a rendered ClusterRoleBinding (Kubernetes
    RBAC: a ClusterRole's rules, bound to the ServiceAccount subject by name and namespace). Removing a taint or a
    label is an HTTP PATCH, which RBAC checks as verb `patch` (kubernetes.io/docs/reference/access-authn-authz/
    authorization, "Request verb"): `update` alone, or nodes of another API group, cannot."""
    account = (str(lookup(workload, "spec.template.spec.serviceAccountName") or "default"),
               str(lookup(workload, "metadata.namespace") or ""))
    roles = {str(lookup(o, "roleRef.name")) for o in objects if o.get("kind") == "ClusterRoleBinding"
             and any(s.get("kind") == "ServiceAccount" and (str(s.get("name")), str(s.get("namespace") or ""))
                     == account for s in o.get("subjects") or ())}
    return any(set(rule.get("apiGroups") or ()) & {"", "*"} and set(rule.get("resources") or ()) & {"nodes", "*"}
               and set(rule.get("verbs") or ()) & {"patch", "*"}
               for o in objects if o.get("kind") == "ClusterRole" and lookup(o, "metadata.name") in roles
               for rule in o.get("rules") or ())


def _karpenter_gates(objects: tuple[Mapping[str, Any], ...]) -> dict[str, bool]:
    """The feature gates the rendered Karpenter controller runs with: `--feature-gates` in its args, else its
    FEATURE_GATES env (kubernetes-sigs/karpenter pkg/operator/options/options.go: the flag defaults to the env,
    ParseFeatureGates reads `Name=bool,...` with cliflag.NewMapStringBool; a gate it does not list is off)."""
    for container in _containers(objects, "Deployment"):
        env = {str(e.get("name")): e.get("value") for e in container.get("env") or ()}
        flags = [str(a).removeprefix("--feature-gates=") for a in container.get("args") or ()
                 if str(a).startswith("--feature-gates=")]
        text = flags[-1] if flags else env.get("FEATURE_GATES")
        if text is not None:
            pairs = (item.split("=", 1) for item in str(text).split(",") if "=" in item)
            return {name.strip(): _go_bool(value.strip()) for name, value in pairs}
    return {}


def _config_dir(objects: tuple[Mapping[str, Any], ...],
                container_name: str) -> tuple[Mapping[str, Any], Mapping[str, Any]] | None:
    """The Deployment running the container, and the ConfigMap data the container reads from the directory its
    `--config-dir=` names (the volume mounted there), as Cilium's agents and operator read their options; None
    where no such container runs."""
    for obj in objects:
        if obj.get("kind") != "Deployment":
            continue
        volumes = {str(v.get("name")): v for v in lookup(obj, "spec.template.spec.volumes", ()) or ()}
        for container in lookup(obj, "spec.template.spec.containers", ()) or ():
            if container.get("name") != container_name:
                continue
            folders = [str(a).removeprefix("--config-dir=") for a in container.get("args") or ()
                       if str(a).startswith("--config-dir=")]
            for mount in container.get("volumeMounts") or ():
                if folders and posixpath.normpath(str(mount.get("mountPath"))) == posixpath.normpath(folders[-1]):
                    name = lookup(volumes.get(str(mount.get("name")), {}), "configMap.name")
                    return obj, next((o.get("data") or {} for o in objects
                                      if o.get("kind") == "ConfigMap" and lookup(o, "metadata.name") == name), {})
    return None


def _containers(objects: tuple[Mapping[str, Any], ...], kind: str) -> Iterable[Mapping[str, Any]]:
    for obj in objects:
        if obj.get("kind") == kind:
            yield from lookup(obj, "spec.template.spec.containers", ()) or ()


def _go_bool(value: Any) -> bool:
    """A flag value as Go's strconv.ParseBool reads it (anything else fails the controller's start: off here)."""
    return str(value) in ("1", "t", "T", "true", "TRUE", "True")


def _managed_pool(record: ResourceRecord, removed: frozenset[str] = frozenset()) -> Pool:
    inputs = record.inputs
    types = [str(t) for t in inputs.get("instanceTypes") or ()]
    arch = "arm64" if "ARM" in str(inputs.get("amiType", "")) else "amd64"
    labels: dict[str, set[str]] = {k: {str(v)} for k, v in (inputs.get("labels") or {}).items()}
    # Labels every EKS managed node carries (EKS docs, "Managed node groups": eks.amazonaws.com/nodegroup).
    labels |= {"kubernetes.io/os": {"linux"}, "kubernetes.io/arch": {arch},
               "eks.amazonaws.com/nodegroup": {str(inputs.get("nodeGroupName", record.name))},
               "node.kubernetes.io/instance-type": set(types)}
    offers = tuple(o for o in map(_offer, types) if o is not None)
    return Pool(name=str(inputs.get("nodeGroupName", record.name)), labels=frozen_labels(labels),
                taints=tuple(Taint.of(t) for t in inputs.get("taints") or () if t.get("key") not in removed),
                offers=offers,
                nodes=int(lookup(inputs, "scalingConfig.desiredSize", 0) or 0))


def _karpenter_pool(record: ResourceRecord, overlays: list[ResourceRecord]) -> Pool:
    spec = lookup(record.inputs, "spec.template", {}) or {}
    name = str(record.inputs["metadata"]["name"])
    labels: dict[str, set[str]] = {k: {str(v)} for k, v in (lookup(spec, "metadata.labels", {}) or {}).items()}
    labels["karpenter.sh/nodepool"] = {name}
    labels.setdefault("kubernetes.io/os", {"linux"})
    for requirement in lookup(spec, "spec.requirements", ()) or ():
        if requirement.get("operator") == "In":
            labels[str(requirement["key"])] = {str(v) for v in requirement.get("values") or ()}
    types = sorted(labels.get("node.kubernetes.io/instance-type", set()))
    offers = []
    for itype in types:
        offer = _offer(itype)
        if offer is None:
            continue
        resources = dict(offer.resources)
        for overlay in overlays:
            # A NodeOverlay adds capacity to the instance types its requirements select
            # (karpenter.sh/docs/concepts/nodeoverlays; aws/karpenter-provider-aws PR 8710).
            node_labels = labels | {"node.kubernetes.io/instance-type": {itype}}
            wanted = lookup(overlay.inputs, "spec.requirements", ()) or ()
            if all(satisfies(Requirement.of(r), node_labels) for r in wanted):
                for resource, amount in (lookup(overlay.inputs, "spec.capacity", {}) or {}).items():
                    resources[str(resource)] = quantity(amount)
        offers.append(InstanceOffer(itype, resources))
    # startupTaints are expected to go once the node is set up; Karpenter schedules as if they were gone
    # (karpenter.sh/docs/concepts/nodepools, "startupTaints").
    taints = tuple(Taint.of(t) for t in lookup(spec, "spec.taints", ()) or ())
    limits = {str(k): quantity(v) for k, v in (lookup(record.inputs, "spec.limits", {}) or {}).items()}
    return Pool(name=name, labels=frozen_labels(labels), taints=taints, offers=tuple(offers), nodes=0,
                autoscaled=True, limits=limits)


def _placement_pod(name: str, placement: Mapping[str, Any]) -> PodNeeds:
    return PodNeeds(name=name, affinity_terms=affinity_terms(placement),
                    tolerations=tuple(Toleration.of(t) for t in placement.get("tolerations") or ()))


def _ceph(objects: tuple[Mapping[str, Any], ...], pools: list[Pool]) -> Ceph | None:
    """The CephCluster the rook-ceph-cluster release renders, with the hosts it can use (None: it renders none)."""
    cluster = next((o for o in objects if o.get("kind") == "CephCluster"), None)
    if cluster is None:
        return None
    spec = cluster.get("spec") or {}
    placement = spec.get("placement") or {}

    def placed(component: str, own: Mapping[str, Any] | None = None) -> PodNeeds:
        # Rook merges placement.all into each component's placement (ceph-cluster-crd doc, "Placement").
        merged = dict(placement.get("all") or {}) | dict(own if own is not None else placement.get(component) or {})
        return _placement_pod(component, merged)

    def hosts(pod: PodNeeds, with_devices: bool = False) -> int:
        # Only nodes that are there: Rook does not make Karpenter launch storage or mon nodes. Rook prepares OSDs
        # on raw devices, which on EC2 are the instance-store NVMe drives (the root volume is partitioned).
        return sum(p.nodes for p in pools if not p.autoscaled and admits(pod, p) and (
            not with_devices or any(INSTANCE_TYPES[o.instance_type].nvme_devices for o in p.offers)))

    storage = spec.get("storage") or {}
    # Rook's defaults where the rendered spec leaves a key out (ceph-cluster-crd doc, "Storage Selection Settings").
    device_filter = (storage.get("useAllDevices", True) or storage.get("deviceFilter")
                     or storage.get("devicePathFilter") or storage.get("devices"))
    set_hosts = sum(min(int(device_set.get("count", 0) or 0), hosts(placed("osd", device_set.get("placement"))))
                    for device_set in storage.get("storageClassDeviceSets") or ())
    if storage.get("useAllNodes", True):
        node_hosts = hosts(placed("osd"), with_devices=True) if device_filter else 0
        how = "useAllNodes, on nodes the OSD placement admits" + ("" if device_filter else ", but no device selected")
    elif storage.get("nodes"):
        # Rook matches nodes[].name against kubernetes.io/hostname, which EC2 assigns at launch.
        node_hosts, how = 0, "a nodes: list of hostnames, which the plan cannot know"
    else:
        node_hosts, how = 0, "useAllNodes: false with no nodes: list selects no node"
    mon = spec.get("mon") or {}
    count = int(mon.get("count", 3))
    return Ceph(osd_hosts=node_hosts + set_hosts, osd_selection=how if not set_hosts else how + " and device sets",
                mon_count=count, mon_nodes_needed=1 if mon.get("allowMultiplePerNode") else count,
                mon_hosts=hosts(placed("mon")))


def ceph_cluster_problem(ceph: Ceph) -> str | None:
    """Why a CephCluster never becomes healthy on the nodes it has, or None."""
    if ceph.mon_hosts < ceph.mon_nodes_needed:
        return (f"{ceph.mon_count} Ceph mons need {ceph.mon_nodes_needed} node(s) their placement admits; there "
                f"are {ceph.mon_hosts}")
    if ceph.osd_hosts == 0:
        return f"Rook creates no OSD ({ceph.osd_selection})"
    return None


def _ceph_problem(size: int, charts: frozenset[str] | set[str], ceph: Ceph | None) -> str | None:
    if "rook-ceph" not in charts:
        return "the Rook operator (rook-ceph chart) is not installed yet"
    if ceph is None:
        return "no CephCluster (rook-ceph-cluster chart) is installed yet"
    if problem := ceph_cluster_problem(ceph):
        return problem
    if size > ceph.osd_hosts:
        return f"pool replica size {size} exceeds the {ceph.osd_hosts} OSD host(s) (failureDomain host)"
    return None


def _storage_classes(records: list[ResourceRecord], objects: Mapping[str, tuple[Mapping[str, Any], ...]],
                     addons: frozenset[str], ceph: Ceph | None, existing: bool) -> dict[str, StorageClass]:
    classes: dict[str, StorageClass] = {}
    if existing:
        # kind's default class (rancher local-path, WaitForFirstConsumer; kind.sigs.k8s.io/docs/user/configuration).
        classes["standard"] = StorageClass("standard", "existing cluster", immediate=False, default=True)
    rendered = [o for chart_objects in objects.values() for o in chart_objects]
    sizes = _ceph_pool_sizes(rendered)
    charts = set(objects)
    ours = [r.inputs for r in records if r.type == STORAGE_CLASS]
    for sc in [*(o for o in rendered if o.get("kind") == "StorageClass"), *ours]:
        name = str(lookup(sc, "metadata.name"))
        provisioner = str(sc.get("provisioner", ""))
        annotations = lookup(sc, "metadata.annotations", {}) or {}
        problem = None
        if provisioner == EBS_PROVISIONER and "aws-ebs-csi-driver" not in addons:
            problem = "the aws-ebs-csi-driver EKS add-on is not installed yet"
        elif provisioner.endswith(CEPH_CSI_SUFFIX):
            parameters = sc.get("parameters") or {}
            pool = str(parameters.get("fsName") or parameters.get("pool") or "")
            problem = _ceph_problem(sizes.get(pool, 1), charts, ceph)
        classes[name] = StorageClass(
            name, provisioner, immediate=sc.get("volumeBindingMode", "Immediate") == "Immediate",
            default=str(annotations.get("storageclass.kubernetes.io/is-default-class")) == "true", problem=problem)
    return classes


def _ceph_pool_sizes(objects: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Replica size by the name a Ceph StorageClass gives its pool: a CephBlockPool's name, a CephFilesystem's
    (its largest pool: metadata and every data pool hold the volume's data)."""
    sizes: dict[str, int] = {}
    for obj in objects:
        name, spec = str(lookup(obj, "metadata.name")), obj.get("spec") or {}
        if obj.get("kind") == "CephBlockPool":
            sizes[name] = int(lookup(spec, "replicated.size", 1) or 1)
        elif obj.get("kind") == "CephFilesystem":
            pools = [spec.get("metadataPool") or {}, *(spec.get("dataPools") or ())]
            sizes[name] = max(int(lookup(p, "replicated.size", 1) or 1) for p in pools)
    return sizes


# The scheduler reads its actions and tiers from the file its --scheduler-conf names, a key of the ConfigMap the
# chart mounts there (volcano 1.15.1 templates/scheduler.yaml: basic.scheduler_config_file's base name).
SCHEDULER_CONF_FLAG = "--scheduler-conf="


def _scheduler(objects: tuple[Mapping[str, Any], ...]) -> SchedulerConfig:
    files = {posixpath.basename(str(arg).removeprefix(SCHEDULER_CONF_FLAG))
             for obj in objects if obj.get("kind") == "Deployment"
             for c in lookup(obj, "spec.template.spec.containers", ()) or ()
             for arg in c.get("args") or () if str(arg).startswith(SCHEDULER_CONF_FLAG)}
    text = next((o["data"][name] for o in objects if o.get("kind") == "ConfigMap"
                 for name in sorted(files) if name in (o.get("data") or {})), None)
    if not text:
        # Without its configuration file the scheduler runs its built-in one (volcano pkg/scheduler/util
        # scheduler_helper.go defaultSchedulerConf).
        return SchedulerConfig(VOLCANO_DEFAULT_ACTIONS, frozenset({"overcommit", "proportion", "gang"}), 1.2)
    config = yaml.safe_load(str(text)) or {}
    actions = tuple(a.strip() for a in str(config.get("actions", "")).split(",") if a.strip())
    plugins = {str(p.get("name")): p for tier in config.get("tiers") or () for p in tier.get("plugins") or ()}
    factor = 1.0
    if "overcommit" in plugins:
        # overcommit plugin: idle resources times overcommit-factor (default 1.2) admit a job (volcano docs).
        factor = float((plugins["overcommit"].get("arguments") or {}).get("overcommit-factor", 1.2))
    return SchedulerConfig(actions, frozenset(plugins), factor)
