"""Readiness rules that read what the charts really render (issue 17 §2): each a small function, its upstream
source in the comment above it, applied by the rehearsal beside `readiness.RULES`.

A rule on a Release looks at that release's rendered objects (`moment.release(record)`); a rule on a NodePool or
node group asks whether some rendered pod does what the pool needs. Pods that controllers create from custom
resources at run time appear in no render, so where a rule needs one it reads that resource's placement fields.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from trainyard.catalogue.charts import load_catalogue
from trainyard.paths import REPO_ROOT
from trainyard.plan.cluster_model import (
    PodNeeds,
    Pool,
    Taint,
    Toleration,
    admits,
    can_launch,
    can_run_now,
    label_mismatch,
    untolerated,
)
from trainyard.plan.cluster_state import NODE_POOL, RELEASE, cni_charts
from trainyard.plan.node_image import missing_path
from trainyard.plan.pods import Workload, lookup, pod_makers, workload, workloads
from trainyard.plan.readiness import (
    ALLUXIO_RUNTIME,
    DATASET,
    VOLCANO_JOB,
    Moment,
    Rule,
    crd_charts,
    is_custom_resource,
    ready_pools,
    task_pods,
)
from trainyard.plan.recording import ResourceRecord
from trainyard.plan.rendering import chart_name
from trainyard.platform import alluxio
from trainyard.platform.registry import load_registry

EKS_CLUSTER = "aws:eks/cluster:Cluster"
POD_IDENTITY = "aws:eks/podIdentityAssociation:PodIdentityAssociation"
ROLE = "trainyard.io/role"  # the label every node group and pool of this project carries (cloud/node_groups.py)
STORAGE_ROLE = "storage"
ACCELERATORS = ("nvidia.com/", "vpc.amazonaws.com/efa")


def _is(*types: str) -> Callable[[ResourceRecord], bool]:
    return lambda record: record.type in types


def _pools(moment: Moment) -> tuple[Pool, ...]:
    return moment.after.pools


# -------------------------------------------------------------------------------------------- host paths


# The kubelet mounts a hostPath of type File/Directory (Socket, CharDevice, BlockDevice) only when the path is
# already there on the node, else the pod stays ContainerCreating (kubernetes.io/docs/concepts/storage/volumes,
# "hostPath volume types"); every EKS node here is Amazon Linux 2023, whose paths node_image lists.
def host_paths_exist(record: ResourceRecord, moment: Moment) -> str | None:
    if not any(r.type == EKS_CLUSTER for r in moment.records.values()):
        return None  # an existing cluster (kind): its node image is not ours to know
    for pod in pod_makers(moment.release(record).objects):
        for volume, path, host_type in pod.host_paths():
            if problem := missing_path(path, host_type):
                return f"{pod.label} mounts hostPath volume {volume}: {problem}, so its pods never start"
    return None


# ---------------------------------------------------------------------------- controllers on special nodes


def special_pools(pools: tuple[Pool, ...]) -> list[Pool]:
    """Pools a controller must stay off: GPU pools and the storage group."""
    return [p for p in pools if p.has_accelerators or STORAGE_ROLE in p.labels.get(ROLE, frozenset())]


# A pod that is not a DaemonSet's and lands on a GPU or storage node keeps Karpenter from consolidating that node
# (kubernetes-sigs/karpenter v1.14.1 pkg/utils/pod IsReschedulable: such pods must be rescheduled first) and
# takes capacity meant for training or Ceph. Controllers with 0 replicas count too: something scales them later
# (Fluid's runtime controllers, pkg/controllers/deploy/runtime_controllers.go @ v1.0.8).
def controllers_off_special_nodes(record: ResourceRecord, moment: Moment) -> str | None:
    special = special_pools(_pools(moment))
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


# ------------------------------------------------------------------------------------------- node start-up


def _objects(moment: Moment) -> Iterator[Mapping[str, Any]]:
    """Every Kubernetes object of the run: rendered by a chart or created by the program."""
    for _, obj in moment.rendered.objects():
        yield obj
    for record in moment.records.values():
        if record.type.startswith("kubernetes:") and "kind" in record.inputs:
            yield record.inputs


_TAINT_REMOVAL = re.compile(r"kubectl\s+taint\b[^\n]*-[\"']?\s*($|\|\||&&|;|\))", re.MULTILINE)


def taint_removers(moment: Moment, key: str) -> Iterator[Workload]:
    """DaemonSets that remove the taint `key`: their service account may patch Nodes (a taint is part of the
    Node's spec; kubernetes.io/docs/reference/access-authn-authz/rbac), and their command, or a script they mount
    from a ConfigMap, names the key and runs a `kubectl taint ... <key>-` removal."""
    objects = list(_objects(moment))
    scripts = {(str(lookup(o, "metadata.namespace") or ""), str(lookup(o, "metadata.name"))):
               "\n".join(map(str, (o.get("data") or {}).values())) for o in objects if o.get("kind") == "ConfigMap"}
    for pod, namespace in _node_patchers(objects):
        containers = [*(pod.spec.get("initContainers") or ()), *(pod.spec.get("containers") or ())]
        text = "\n".join([json.dumps([(c.get("command"), c.get("args"), c.get("env")) for c in containers]), *(
            scripts.get((namespace, str(lookup(v, "configMap.name"))), "") for v in pod.spec.get("volumes") or ())])
        if key in text and _TAINT_REMOVAL.search(text):
            yield pod


def _node_patchers(objects: list[Mapping[str, Any]]) -> Iterator[tuple[Workload, str]]:
    patching = {str(lookup(o, "metadata.name")) for o in objects if o.get("kind") == "ClusterRole" and any(
        {"nodes", "*"} & set(rule.get("resources") or ()) and {"patch", "update", "*"} & set(rule.get("verbs") or ())
        for rule in o.get("rules") or ())}
    accounts = {(str(s.get("namespace")), str(s.get("name"))) for o in objects
                if o.get("kind") == "ClusterRoleBinding" and lookup(o, "roleRef.name") in patching
                for s in o.get("subjects") or () if s.get("kind") == "ServiceAccount"}
    for obj in objects:
        pod = workload(obj)
        namespace = str(lookup(obj, "metadata.namespace") or "")
        if pod is not None and pod.daemon and (namespace, str(pod.spec.get("serviceAccountName"))) in accounts:
            yield pod, namespace


def pool_of(record: ResourceRecord, moment: Moment) -> Pool | None:
    name = str(lookup(record.inputs, "metadata.name") or record.inputs.get("nodeGroupName"))
    return next((p for p in _pools(moment) if p.name == name), None)


def cni_removed_taints(moment: Moment) -> frozenset[str]:
    """Startup taint keys the CNI's own agent removes once it runs on the node: Cilium's agent-not-ready taint
    (cilium-config `agent-not-ready-taint-key` with `remove-cilium-node-taints`, docs.cilium.io
    "Taint effects"); every other startup taint must be tolerated by whatever has to run before it goes."""
    keys = set()
    for release in moment.rendered.releases.values():
        if release.chart not in cni_charts():
            continue
        for config in release.of_kind("ConfigMap"):
            data = config.get("data") or {}
            if data.get("remove-cilium-node-taints", "true") == "true" and data.get("agent-not-ready-taint-key"):
                keys.add(str(data["agent-not-ready-taint-key"]))
    return frozenset(keys)


def startup_taints(record: ResourceRecord, moment: Moment) -> tuple[Taint, ...]:
    """The NodePool's startup taints still on a new node once the CNI runs there."""
    removed = cni_removed_taints(moment)
    return tuple(t for t in map(Taint.of, lookup(record.inputs, "spec.template.spec.startupTaints", ()) or ())
                 if t.key not in removed)


def _lands(pod: PodNeeds, pool: Pool, also: tuple[Taint, ...] = ()) -> bool:
    """The pod lands on a new node of the pool, which still carries its startup taints (`also`)."""
    with_startup = Pool(pool.name, pool.labels, (*pool.taints, *also), pool.offers, pool.nodes)
    return label_mismatch(pod, with_startup) is None and not untolerated(pod, with_startup)


# A NodePool's startupTaints stay until something removes them, and Karpenter counts such a node as capacity to
# come (kubernetes-sigs/karpenter v1.14.1 statenode.go Taints()): every startup taint needs a DaemonSet that
# lands on the new node (tolerating all its taints) and may patch the Node to remove it, or the pool's pods never
# schedule; the CNI's own taint goes once the CNI runs (cni_removed_taints).
def startup_taints_removable(record: ResourceRecord, moment: Moment) -> str | None:
    pool = pool_of(record, moment)
    every = tuple(Taint.of(t) for t in lookup(record.inputs, "spec.template.spec.startupTaints", ()) or ())
    startup = startup_taints(record, moment)
    if pool is None or not every:
        return None
    removed = cni_removed_taints(moment)
    for taint in every:
        if taint.key in removed:
            continue
        runners = [d.needs() for d in taint_removers(moment, taint.key)]
        if not any(_lands(d, pool, startup) and any(t.tolerates(taint) for t in d.tolerations) for d in runners):
            return (f"no DaemonSet that removes its startup taint {taint} lands on a new {pool.name} node: the "
                    "taint stays, and nothing is ever scheduled there")
        if problem := _gpu_health_unreachable(pool, taint, moment):
            return problem
    return None


GPU_HEALTH_TAINT = "trainyard.io/gpu-health"
CONFIG_MAP = "kubernetes:core/v1:ConfigMap"
EXPECTED = "expected.tsv"  # the GPU admission check's table: one row per pool (platform/gpu_health.py)


# The GPU admission check removes trainyard.io/gpu-health only when its DCGM check passes; `dcgmi diag` refuses
# MIG-partitioned GPUs (NVIDIA/DCGM v4.6.0 nvvs/src/Gpu.cpp IsMigModeDiagCompatible), so on a pool with a MIG
# layout it can never pass (expected.tsv names each pool's layout and check; without a check column: diag).
def _gpu_health_unreachable(pool: Pool, taint: Taint, moment: Moment) -> str | None:
    if taint.key != GPU_HEALTH_TAINT:
        return None
    for row in _expected_rows(moment):
        if row.get("pool") == pool.name and row.get("mig-layout", "-") != "-" and \
                row.get("check", "dcgm-diag") == "dcgm-diag":
            return (f"the GPU admission check runs dcgmi diag on {pool.name}, whose GPUs are MIG-partitioned "
                    f"(layout {row['mig-layout']}): DCGM refuses the diagnostic there, so {taint} never goes")
    return None


def _expected_rows(moment: Moment) -> Iterator[Mapping[str, str]]:
    for record in moment.records.values():
        text = (record.inputs.get("data") or {}).get(EXPECTED) if record.type == CONFIG_MAP else None
        if not isinstance(text, str):
            continue
        lines = [line for line in text.splitlines() if line.strip()]
        header = next((line.lstrip("# ").split() for line in lines if line.startswith("# pool")), [])
        yield from (dict(zip(header, line.split(), strict=False)) for line in lines if not line.startswith("#"))


# Karpenter marks a node initialized only when every extended resource the pods it was launched for asked for is
# registered on it (kubernetes-sigs/karpenter v1.14.1 pkg/controllers/nodeclaim/lifecycle/initialization.go
# RequestedResourcesRegistered); a device plugin registers it, so one must land on the pool.
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
                yield any(p.daemon and _lands(p.needs(), pool, startup) for p in workloads(release.objects))
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
                yield labelled and _lands(PodNeeds("nvidia-device-plugin", tolerations=tolerations), pool, startup)


# The GPU Operator deploys its operands only to nodes labelled as NVIDIA PCI hosts, which Node Feature Discovery's
# worker does (NVIDIA/gpu-operator v26.7.0 controllers/state_manager.go gpuNodeLabels); a pool whose nodes carry
# such a label from the start needs no worker.
GPU_NODE_LABELS = ("feature.node.kubernetes.io/pci-10de.present", "feature.node.kubernetes.io/pci-0302_10de.present",
                   "feature.node.kubernetes.io/pci-0300_10de.present")
NFD_WORKER = {"app.kubernetes.io/name": "node-feature-discovery", "role": "worker"}  # the NFD chart's labels


def _gpu_labelled(pool: Pool, startup: tuple[Taint, ...], moment: Moment) -> bool:
    if any("true" in pool.labels.get(label, frozenset()) for label in GPU_NODE_LABELS):
        return True
    return any(pod.daemon and _lands(pod.needs(), pool, startup) for _, obj in moment.rendered.objects()
               if NFD_WORKER.items() <= dict(lookup(obj, "metadata.labels") or {}).items()
               and (pod := workload(obj)) is not None)


# --------------------------------------------------------------------------------------------------- CNI


@functools.cache
def cni_operators() -> Mapping[str, str]:
    """CNI chart (by chart name) -> its operator workload (platform/addons.yaml `cniOperator`)."""
    pins = load_catalogue(REPO_ROOT).pins
    return {chart_name(pins[release].chart): addon.cni_operator for addon in load_registry(REPO_ROOT).addons
            if addon.cni_operator for release in addon.charts}


# A node joins Ready only once the CNI runs on it, and with Cilium only once cilium-operator has registered the CRDs
# the agent waits for and, in ENI mode, allocated the node's ENI addresses (docs.cilium.io internals/
# cilium_operator "CRD Registration", network/concepts/ipam/eni "Architecture"): the operator must run (replicas,
# on the host network, as there is no pod network yet), land on the first node groups (NotReady until then) and
# have its AWS credentials (its Pod Identity association) before it starts.
def cni_runs_where_nodes_join(record: ResourceRecord, moment: Moment) -> str | None:
    chart = chart_name(str(record.inputs.get("chart", "")))
    if chart not in cni_charts() or chart not in cni_operators():
        return None
    groups = [p for p in _pools(moment) if not p.autoscaled and p.nodes]
    not_ready = Taint("node.kubernetes.io/not-ready", "", "NoSchedule")
    release = moment.release(record)
    name = cni_operators()[chart]
    pod = next((w for w in workloads(release.objects) if w.name == name and not w.daemon and not w.hooks), None)
    if pod is None:
        return f"it renders no {name} (the CNI's operator): no node turns Ready"
    if pod.replicas == 0:
        return f"{pod.label} (the CNI's operator) has no replicas: no node turns Ready"
    if not pod.spec.get("hostNetwork"):
        return (f"{pod.label} (the CNI's operator) is not on the host network: it waits for the pod network it "
                "brings up, so no node turns Ready")
    if groups and not any(_lands(pod.needs(), g, (not_ready,)) for g in groups):
        names = ", ".join(g.name for g in groups)
        return f"{pod.label} can run on none of the node groups that join first ({names}): no node turns Ready"
    account = pod.spec.get("serviceAccountName")
    eni = lookup(record.inputs.get("values") or {}, "ipam.mode") == "eni"
    if eni and account and not _identity_before(moment, release.namespace, str(account)):
        return (f"{pod.label} runs as {release.namespace}/{account}, which has no Pod Identity association "
                "created before this release: in ENI mode it cannot allocate addresses, so no node turns Ready")
    return None


def _identity_before(moment: Moment, namespace: str, account: str) -> bool:
    return any(r.type == POD_IDENTITY and r.inputs.get("namespace") == namespace and
               r.inputs.get("serviceAccount") == account for r in map(moment.records.get, moment.waited) if r)


# ------------------------------------------------------------------------------------- custom resources


@functools.cache
def crd_controllers() -> Mapping[str, tuple[str, ...]]:
    """API group, or `Kind.group` for one kind, -> the rendered workloads that reconcile it (platform/addons.yaml
    `controllers`)."""
    return {key: names for addon in load_registry(REPO_ROOT).addons for key, names in addon.controllers.items()}


# A custom resource does nothing until its controllers reconcile it: the workloads platform/addons.yaml names for
# its kind or group must be rendered by the chart that brings its CRD, with replicas and a node to run on. Fluid's
# dataset controller scales a runtime controller from 0 when a runtime of its kind appears (fluid-cloudnative/fluid
# v1.0.8 pkg/controllers/deploy runtime_controllers.go, ScaleoutRuntimeControllerOnDemand), so 0 replicas there is
# a start, not a stop.
ON_DEMAND = {"fluid": "dataset-controller"}  # chart -> the controller that scales the others out


def resource_reconciled(record: ResourceRecord, moment: Moment) -> str | None:
    group, kind = record.type.split(":")[1].rsplit("/", 1)[0], record.type.split(":")[2]
    chart = crd_charts().get(group)
    release = next((r for r in moment.rendered.releases.values() if r.chart == chart), None)
    if release is None:
        return None  # crd-installed names a missing chart
    names = crd_controllers().get(f"{kind}.{group}") or crd_controllers().get(group)
    if not names:
        return (f"platform/addons.yaml names no controller for {group} (controllers: of the add-on installing "
                f"{chart}), so nothing shows that one acts on it")
    rendered = {w.name: w for w in workloads(release.objects) if not w.hooks}
    pools = ready_pools(moment.after)
    scaler = rendered.get(ON_DEMAND.get(release.chart, ""))
    for name in names:
        controller = rendered.get(name)
        if controller is None:
            return f"no controller reconciles it: release {release.name} renders no {name}"
        on_demand = controller.replicas == 0 and scaler is not None and scaler.replicas > 0
        if controller.replicas == 0 and not on_demand:
            return (f"no controller reconciles it: {controller.label} of release {release.name} has no replicas, "
                    "so the object is never acted on")
        pod = controller.needs()
        if not (can_run_now(pod, pools) or can_launch(pod, pools)):
            return (f"no controller reconciles it: {controller.label} of release {release.name} has no node to "
                    "run on, so the object is never acted on")
    return None


def _crd_releases(moment: Moment) -> dict[str, set[str]]:
    """API group -> the charts (by chart name) whose render defines a CRD of it, or that register it at run time
    (platform/addons.yaml `crds`: cilium-operator creates cilium.io's)."""
    served: dict[str, set[str]] = {}
    for release, obj in moment.rendered.objects():
        if obj.get("kind") == "CustomResourceDefinition" and (group := lookup(obj, "spec.group")):
            served.setdefault(str(group), set()).add(release.chart)
    for group, chart in crd_charts().items():
        served.setdefault(group, set()).add(chart)
    return served


# Helm maps every object of a release to a served API before it creates any (helm v3.19.0 pkg/action/install.go
# KubeClient.Build, "unable to build kubernetes objects from release manifest"; k8s.io/cli-runtime
# pkg/resource/mapper.go "no matches for kind ... ensure CRDs are installed first"), and a template that asks
# `.Capabilities.APIVersions.Has` gets the cluster's discovery at that moment: a custom resource a release renders
# needs its CRD's release installed before it (or its own), else the first install fails or leaves it out.
def custom_resources_after_their_crds(record: ResourceRecord, moment: Moment) -> str | None:
    release = moment.release(record)
    served = _crd_releases(moment)
    for obj in release.objects:
        group = str(obj.get("apiVersion", "")).rpartition("/")[0]
        charts = served.get(group)
        if not charts or release.chart in charts or charts & moment.before.charts:
            continue
        return (f"it renders {obj.get('kind')}/{lookup(obj, 'metadata.name')} ({group}), whose CRD comes with "
                f"{', '.join(sorted(charts))}, which is not installed before it: the first install fails with "
                "'no matches for kind' (or, where the chart asks .Capabilities.APIVersions, leaves it out)")
    return None


# ---------------------------------------------------------------------------------------------- dataset chain


def _named(moment: Moment, kind: str, namespace: str, name: str) -> ResourceRecord | None:
    return next((r for r in moment.records.values() if r.type == kind and lookup(r.inputs, "metadata.name") == name
                 and lookup(r.inputs, "metadata.namespace") == namespace), None)


def _unbound(dataset: ResourceRecord, moment: Moment) -> str | None:
    """Why Fluid never makes the claim of a Dataset, or None. It makes one, named after the Dataset, once a runtime
    of its name binds it (fluid v1.0.8 pkg/utils/dataset/volume CreatePersistentVolumeClaimForRuntime); a
    `dataset://` reference is bound through the source Dataset it names."""
    mounts: list[Mapping[str, Any]] = list(lookup(dataset.inputs, "spec.mounts", ()) or ())
    namespace, name = lookup(dataset.inputs, "metadata.namespace"), lookup(dataset.inputs, "metadata.name")
    point = str(mounts[0].get("mountPoint", "")) if len(mounts) == 1 else ""
    if not point.startswith(alluxio.REFERENCE_SCHEME):
        if _named(moment, ALLUXIO_RUNTIME, namespace, name) is None:
            return f"Dataset {namespace}/{name} has no AlluxioRuntime of its name, so Fluid never binds it"
        return None
    source_ns, _, rest = point.removeprefix(alluxio.REFERENCE_SCHEME).strip("/").partition("/")
    source = _named(moment, DATASET, source_ns, rest.split("/")[0])
    if source is None:
        return f"Dataset {namespace}/{name} references {point}, which is no Dataset"
    return _unbound(source, moment)


# A job's dataset is a chain: its volume's claim is the PVC Fluid makes for the Dataset of that name, and that
# Dataset is bound (its runtime, or the source a `dataset://` reference names). A missing link leaves every pod
# Pending on a claim that never appears. Where in the claim the data shows is dataset-path-served's (job_rules).
def dataset_chain(record: ResourceRecord, moment: Moment) -> str | None:
    namespace = lookup(record.inputs, "metadata.namespace")
    for task in lookup(record.inputs, "spec.tasks", ()) or ():
        spec = lookup(task, "template.spec", {}) or {}
        for volume in spec.get("volumes") or ():
            claim = lookup(volume, "persistentVolumeClaim.claimName")
            dataset = _named(moment, DATASET, namespace, str(claim)) if claim else None
            if dataset is not None and (why := _unbound(dataset, moment)):
                return f"its claim {claim} never appears: {why}"
    return None


RULES: tuple[Rule, ...] = (
    Rule("host-paths-exist", _is(RELEASE), host_paths_exist,
         "kubernetes.io hostPath volume types; awslabs/amazon-eks-ami nodeadm (AL2023 node paths)"),
    Rule("controllers-off-special-nodes", _is(RELEASE), controllers_off_special_nodes,
         "kubernetes-sigs/karpenter v1.14.1 IsReschedulable (consolidation)"),
    Rule("cni-runs-where-nodes-join", _is(RELEASE), cni_runs_where_nodes_join,
         "docs.cilium.io ENI IPAM architecture (operator allocates before a node is Ready)"),
    Rule("startup-taints-removable", _is(NODE_POOL), startup_taints_removable,
         "kubernetes-sigs/karpenter v1.14.1 statenode Taints(); NVIDIA/DCGM v4.6.0 IsMigModeDiagCompatible"),
    Rule("nodes-initialize", _is(NODE_POOL), nodes_initialize,
         "kubernetes-sigs/karpenter v1.14.1 RequestedResourcesRegistered"),
    Rule("dataset-chain", _is(VOLCANO_JOB), dataset_chain,
         "fluid v1.0.8 pkg/utils/dataset/volume (a Dataset's claim, made once a runtime binds it)"),
    Rule("custom-resources-after-their-crds", _is(RELEASE), custom_resources_after_their_crds,
         "helm v3.19.0 pkg/action/install.go KubeClient.Build (ensure CRDs are installed first)"),
    Rule("resource-reconciled", is_custom_resource, resource_reconciled,
         "fluid-cloudnative/fluid v1.0.8 ScaleoutRuntimeControllerOnDemand; a CR needs a running controller"),
)
