"""Issue 17 §2: each rule that reads the rendered objects, shown naming its defect when the defect is put back on a
copy of a stack (the stack is picked by what it has, never by name)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from owned_stacks import OWNED_STACKS, recording
from rehearsal_records import Match, edited, rec, rehearsed
from trainyard.paths import REPO_ROOT
from trainyard.plan.cluster_state import cluster_state
from trainyard.plan.engine_order import creation_order
from trainyard.plan.node_image import missing_path
from trainyard.plan.pods import workloads
from trainyard.plan.recording import Recording, ResourceRecord
from trainyard.plan.rehearse import Finding
from trainyard.plan.rendering import RELEASE, RenderedRelease, RenderedStack, chart_name, render_releases
from trainyard.plan.rules import custom_resources
from trainyard.plan.rules.base import Moment
from trainyard.plan.runtime import STACKS_DIR, available_stacks
from trainyard.platform.registry import load_registry


def recorded(stack: str) -> Recording:
    return recording((stack, STACKS_DIR))


def owned(stack: str) -> Recording:
    """A stack the tests own (tests/fixtures/stacks): fleet is AWS with every add-on, laptop the local one."""
    return recording((stack, OWNED_STACKS))



def stack_with(match: Match) -> str:
    """The first stack holding a matching record."""
    for stack in available_stacks():
        if any(match(r) for r in recorded(stack).resources):
            return stack
    raise AssertionError("no stack has it")


def release_of(chart: str) -> Match:
    return lambda r: r.type == RELEASE and chart_name(str(r.inputs.get("chart"))) == chart


def edit(stack: str, match: Match, change: Callable[[dict[str, Any]], None]) -> Recording:
    return edited(recorded(stack), match, change)


def drop(stack: str, match: Match) -> Recording:
    kept = [r for r in recorded(stack).resources if not match(r)]
    assert len(kept) < len(recorded(stack).resources), "nothing dropped"
    return Recording(resources=kept)


def found(recording: Recording, rule: str) -> list[Finding]:
    return [f for f in rehearsed(recording).findings if f.rule == rule]


def test_node_paths_follow_nodeadm_not_kubeadm() -> None:
    assert missing_path("/etc/kubernetes/kubelet.conf", "File") == (
        "/etc/kubernetes/kubelet.conf (File) does not exist on Amazon Linux 2023 EKS nodes")
    assert missing_path("/var/lib/kubelet/kubeconfig", "File") is None
    assert missing_path("/var/lib/kubelet", "File") is not None  # a Directory there
    assert missing_path("/anything", "DirectoryOrCreate") is None and missing_path("/anything", "") is None


def test_host_paths_the_node_image_lacks_are_named() -> None:
    """Fluid's chart default (csi.useNodeAuthorization) mounts kubeadm's kubelet.conf, which AL2023 lacks."""
    def node_authorization(inputs: dict[str, Any]) -> None:
        inputs["values"].setdefault("csi", {})["useNodeAuthorization"] = True

    old = edit(stack_with(release_of("fluid")), release_of("fluid"), node_authorization)
    (finding,) = found(old, "host-paths-exist")
    assert "DaemonSet/csi-nodeplugin-fluid" in finding.problem
    assert "/etc/kubernetes/kubelet.conf (File) does not exist" in finding.problem


def test_a_controller_that_tolerates_every_taint_is_named() -> None:
    """Fluid's chart default: its controllers tolerate everything, so they can land on a GPU or storage node."""
    def tolerate_all(inputs: dict[str, Any]) -> None:
        inputs["values"].setdefault("dataset", {})["tolerations"] = [{"operator": "Exists"}]

    old = edit(stack_with(release_of("fluid")), release_of("fluid"), tolerate_all)
    (finding,) = found(old, "controllers-off-special-nodes")
    assert finding.problem.startswith("Deployment/dataset-controller is not a DaemonSet and can land on ")


def test_a_prometheus_that_can_land_on_gpu_nodes_is_named() -> None:
    """prometheus-operator gives the Prometheus pods the CR's own placement: tolerating everything, without the
    system node selector, the 500 GiB Prometheus can land on a p5."""
    def anywhere(inputs: dict[str, Any]) -> None:
        spec = inputs["values"]["prometheus"]["prometheusSpec"]
        spec["tolerations"] = [{"operator": "Exists"}]
        del spec["nodeSelector"]

    old = edited(owned("fleet"), release_of("kube-prometheus-stack"), anywhere)
    (finding,) = found(old, "controllers-off-special-nodes")
    assert finding.problem.startswith("Prometheus/kube-prometheus-stack-prometheus is not a DaemonSet and can land on ")


def test_a_cni_operator_that_fits_no_joining_node_group_is_named() -> None:
    def nowhere(inputs: dict[str, Any]) -> None:
        inputs["values"].setdefault("operator", {})["nodeSelector"] = {"trainyard.io/role": "nowhere"}

    stack = stack_with(release_of("cilium"))
    (finding,) = found(edit(stack, release_of("cilium"), nowhere), "cni-runs-where-nodes-join")
    assert "Deployment/cilium-operator can run on none of the node groups that join first" in finding.problem


def _operator(**values: Any) -> Callable[[dict[str, Any]], None]:
    return lambda inputs: inputs["values"].setdefault("operator", {}).update(values)


@pytest.mark.parametrize(("values", "problem"), [
    ({"replicas": 0}, "Deployment/cilium-operator (the CNI's operator) has no replicas: no node turns Ready"),
    ({"hostNetwork": False}, "Deployment/cilium-operator (the CNI's operator) is not on the host network"),
    ({"enabled": False}, "it renders no cilium-operator (the CNI's operator)"),
], ids=["no-replicas", "pod-network", "disabled"])
def test_a_cni_operator_that_does_not_run_is_named(values: dict[str, Any], problem: str) -> None:
    """Cilium's operator at 0 (or off the host network, or off) leaves every node NotReady: the agent waits for the
    CRDs it registers and, in ENI mode, for the addresses it allocates."""
    (finding,) = found(edited(owned("fleet"), release_of("cilium"), _operator(**values)),
                       "cni-runs-where-nodes-join")
    assert finding.problem.startswith(problem)


def test_a_cni_operator_without_its_pod_identity_is_named() -> None:
    def is_operator_identity(r: ResourceRecord) -> bool:
        return r.type.endswith("PodIdentityAssociation") and r.inputs.get("serviceAccount") == "cilium-operator"

    (finding,) = found(drop(stack_with(is_operator_identity), is_operator_identity), "cni-runs-where-nodes-join")
    assert "runs as kube-system/cilium-operator, which has no Pod Identity association" in finding.problem


def _expected_tsv(r: ResourceRecord) -> bool:
    return r.type == "kubernetes:core/v1:ConfigMap" and "expected.tsv" in (r.inputs.get("data") or {})


def test_dcgm_diag_on_a_mig_pool_is_named() -> None:
    """The admission check's dcgmi diag on MIG-partitioned GPUs never passes (NVIDIA/DCGM IsMigModeDiagCompatible)."""
    def diag_everywhere(inputs: dict[str, Any]) -> None:
        lines = inputs["data"]["expected.tsv"].splitlines()
        header = lines[0].lstrip("# ").split()
        rows = [dict(zip(header, line.split(), strict=False)) for line in lines[1:] if line.strip()]
        columns = [c for c in header if c != "check"]
        inputs["data"]["expected.tsv"] = "\n".join(
            ["# " + " ".join(columns), *(" ".join(row[c] for c in columns) for row in rows)]) + "\n"

    stack = next(s for s in available_stacks() if any(
        _expected_tsv(r) and any(line.split()[5] != "-" for line in r.inputs["data"]["expected.tsv"].splitlines()
                                 if line.strip() and not line.startswith("#")) for r in recorded(s).resources))
    findings = found(edit(stack, _expected_tsv, diag_everywhere), "startup-taints-removable")
    assert findings and all("runs dcgmi diag on" in f.problem and "MIG-partitioned" in f.problem for f in findings)


def test_a_startup_taint_nothing_lands_to_remove_is_named() -> None:
    def is_check(r: ResourceRecord) -> bool:
        return r.type == "kubernetes:apps/v1:DaemonSet" and r.name.startswith("gpu-health")

    findings = found(drop(stack_with(is_check), is_check), "startup-taints-removable")
    assert findings and all("removes its startup taint trainyard.io/gpu-health" in f.problem for f in findings)


def test_a_gpu_pool_whose_device_plugin_cannot_land_is_named() -> None:
    """The GPU Operator's operands run with the ClusterPolicy's tolerations; without the GPU taint's, nothing
    registers nvidia.com/gpu and Karpenter never initializes the node."""
    def no_tolerations(inputs: dict[str, Any]) -> None:
        inputs["values"].setdefault("daemonsets", {})["tolerations"] = []

    stack = stack_with(release_of("gpu-operator"))
    findings = found(edit(stack, release_of("gpu-operator"), no_tolerations), "nodes-initialize")
    assert findings and all("no device plugin for it lands on them" in f.problem for f in findings)
    assert any("nvidia.com/gpu" in f.problem for f in findings)


def _mig_pools(recording: Recording) -> set[str]:
    """NodePools whose jobs ask for MIG slices (the fleet's h100-mig)."""
    return {str(r.inputs["metadata"]["name"]) for r in recording.resources if r.type.endswith(":NodePool")
            and "trainyard.io/gpu-sharing" in {t.get("key") for t in r.inputs["spec"]["template"]["spec"].get(
                "taints") or ()}}


def test_gpu_pools_the_node_feature_discovery_worker_cannot_reach_are_named() -> None:
    """The GPU Operator deploys its device plugin only where NFD labelled the node an NVIDIA PCI host: without the
    MIG pools' taint among the worker's tolerations, their nodes never register a GPU resource."""
    def untolerated(inputs: dict[str, Any]) -> None:
        worker = inputs["values"]["node-feature-discovery"]["worker"]
        worker["tolerations"] = [t for t in worker["tolerations"] if t.get("key") != "trainyard.io/gpu-sharing"]

    fleet = owned("fleet")
    findings = found(edited(fleet, release_of("gpu-operator"), untolerated), "nodes-initialize")
    named = {f.problem.rsplit("marks a ", 1)[1].split(" node")[0] for f in findings}
    assert _mig_pools(fleet) and named == _mig_pools(fleet)


def test_mig_pools_without_mig_manager_are_named() -> None:
    def no_mig_manager(inputs: dict[str, Any]) -> None:
        inputs["values"].setdefault("migManager", {})["enabled"] = False

    fleet = owned("fleet")
    findings = found(edited(fleet, release_of("gpu-operator"), no_mig_manager), "nodes-initialize")
    assert findings and all("its nodes offer nvidia.com/mig-" in f.problem for f in findings)
    assert {f.problem.rsplit("marks a ", 1)[1].split(" node")[0] for f in findings} == _mig_pools(fleet)


def test_a_custom_resource_without_a_running_controller_is_named() -> None:
    """Fluid's Datasets wait on its dataset controller; with none running nothing ever makes their volumes."""
    def no_controller(inputs: dict[str, Any]) -> None:
        inputs["values"].setdefault("dataset", {})["replicas"] = 0

    old = edit(stack_with(release_of("fluid")), release_of("fluid"), no_controller)
    findings = [f for f in found(old, "resource-reconciled") if f.type.endswith(":Dataset")]
    assert findings and all("Deployment/dataset-controller of release fluid has no replicas" in f.problem
                            for f in findings)


VOLCANO_JOB = "kubernetes:batch.volcano.sh/v1alpha1:Job"
DATASET = "kubernetes:data.fluid.io/v1alpha1:Dataset"


def _kube_version(recording: Recording) -> str:
    return next((str(r.inputs["version"]) for r in recording.resources if r.type == "aws:eks/cluster:Cluster"), "1.34")


def _cut(recording: Recording, consumer: ResourceRecord, providers: set[str]) -> Recording:
    """The recording with `consumer` (and its ancestors) no longer waiting, directly or through anything, on the
    `providers` URNs."""
    _, closure = creation_order(recording.resources)
    by_urn = {r.urn: r for r in recording.resources}
    cut, urn = set(), consumer.urn
    while urn in by_urn:
        cut.add(urn)
        urn = by_urn[urn].parent or ""
    resources = [replace(r, depends_on=tuple(d for d in r.depends_on if d not in providers and
                                             not providers & closure.get(d, frozenset()))) if r.urn in cut else r
                 for r in recording.resources]
    return Recording(resources=resources)


def test_a_release_rendering_custom_resources_before_their_crds_is_named() -> None:
    """Every fleet release that renders a custom resource whose CRD another release brings (a chart ServiceMonitor,
    rook-ceph-cluster's PrometheusRule, its CephCluster) is named once it stops waiting for that release."""
    recording = owned("fleet")
    rendered = render_releases(recording, _kube_version(recording))
    crds = {str(o["spec"]["group"]): r.name for r, o in rendered.objects()
            if o.get("kind") == "CustomResourceDefinition"}
    records = {str(r.inputs.get("name")): r for r in recording.resources if r.type == RELEASE}
    pairs = {(release.name, crds[group]) for release, obj in rendered.objects()
             if (group := str(obj.get("apiVersion", "")).rpartition("/")[0]) in crds and crds[group] != release.name}
    assert pairs
    for consumer, provider in sorted(pairs):
        cut = _cut(recording, records[consumer], {records[provider].urn})
        waited = creation_order(cut.resources)[1][records[consumer].urn]
        assert records[provider].urn not in waited
        unwaited = {rendered.releases[name].chart for name, r in records.items() if r.urn not in waited}
        (finding,) = [f for f in found(cut, "custom-resources-after-their-crds") if f.urn == records[consumer].urn]
        named = re.search(r"whose CRD comes with (\S+), which is not installed before it", finding.problem)
        assert named and named[1] in unwaited, finding.problem


def test_volcano_jobs_without_the_controller_manager_are_named() -> None:
    """Volcano's job controller runs in vc-controller-manager alone: with it at 0 replicas no Job ever makes a pod,
    however many of the chart's other Deployments (scheduler, admission) run."""
    def no_controllers(inputs: dict[str, Any]) -> None:
        inputs["values"].setdefault("custom", {})["controller_replicas"] = 0

    old = edited(owned("fleet"), release_of("volcano"), no_controllers)
    jobs = {r.urn for r in old.resources if r.type == VOLCANO_JOB}
    findings = [f for f in found(old, "resource-reconciled") if f.type == VOLCANO_JOB]
    assert jobs and {f.urn for f in findings} == jobs
    assert all("Deployment/volcano-controllers of release volcano has no replicas" in f.problem for f in findings)


def test_monitors_without_the_prometheus_operator_are_named() -> None:
    """Grafana and kube-state-metrics run, but only prometheus-operator turns a ServiceMonitor into scrape config."""
    def no_operator(inputs: dict[str, Any]) -> None:
        inputs["values"].setdefault("prometheusOperator", {})["enabled"] = False

    findings = found(edited(owned("fleet"), release_of("kube-prometheus-stack"), no_operator), "resource-reconciled")
    monitors = [f for f in findings if f.type.endswith(":ServiceMonitor")]
    assert monitors and all("renders no kube-prometheus-stack-operator" in f.problem for f in monitors)


def test_a_custom_resource_whose_controller_nobody_names_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(custom_resources, "crd_controllers", lambda: {})
    findings = [f for f in found(owned("fleet"), "resource-reconciled") if f.type == VOLCANO_JOB]
    assert findings and all("platform/addons.yaml names no controller for batch.volcano.sh" in f.problem
                            for f in findings)


def test_every_named_controller_is_rendered_by_its_chart() -> None:
    """The workloads platform/addons.yaml names as controllers are rendered under those names by the owned stacks
    (fleet and laptop between them install every chart that brings CRDs)."""
    owners = {group: chart for addon in load_registry(REPO_ROOT).addons
              for chart, groups in addon.crds.items() for group in groups}
    named = {(owners[key.split(".", 1)[1] if key[:1].isupper() else key], name)
             for key, names in custom_resources.crd_controllers().items() for name in names}
    seen = set()
    for stack in ("fleet", "laptop"):
        recording = owned(stack)
        rendered = render_releases(recording, _kube_version(recording))
        for release in rendered.releases.values():
            seen |= {(release.name, w.name) for w in workloads(release.objects)}
    assert named and named <= seen, sorted(named - seen)


def _source_dataset(r: ResourceRecord) -> bool:
    """A Dataset over object storage (not a `dataset://` reference), the source tenants' references name."""
    mounts = r.inputs["spec"].get("mounts") or [] if r.type == DATASET else []
    return len(mounts) == 1 and not str(mounts[0].get("mountPoint", "")).startswith("dataset://")


def _job_reading_data(r: ResourceRecord) -> bool:
    return r.type == VOLCANO_JOB and any(str(a).startswith("data.path=") for t in r.inputs["spec"]["tasks"]
                                         for c in t["template"]["spec"]["containers"] for a in c.get("args") or ())


def _stack_with_a_dataset_job() -> str:
    return next(s for s in available_stacks() if any(_source_dataset(r) for r in recorded(s).resources)
                and any(_job_reading_data(r) for r in recorded(s).resources))


def test_a_reference_to_a_dataset_that_is_not_there_is_named() -> None:
    stack = _stack_with_a_dataset_job()
    findings = found(drop(stack, _source_dataset), "dataset-chain")
    assert findings and all("its claim" in f.problem and "which is no Dataset" in f.problem for f in findings)


def test_a_dataset_without_its_runtime_is_named() -> None:
    stack = _stack_with_a_dataset_job()
    findings = found(drop(stack, lambda r: r.type == "kubernetes:data.fluid.io/v1alpha1:AlluxioRuntime"),
                     "dataset-chain")
    assert findings and all("has no AlluxioRuntime of its name, so Fluid never binds it" in f.problem
                            for f in findings)



def test_the_cni_taint_stays_when_its_operator_may_not_patch_nodes() -> None:
    """With operator.removeNodeTaints false the cilium 1.20.0 chart leaves remove-cilium-node-taints out of
    cilium-config (the operator's default is true) but grants the operator no `patch nodes`: the agent-not-ready
    startup taint stays on every Karpenter node, and the rule says so (it once read the ConfigMap alone)."""
    fleet = owned("fleet")
    pools = {str(r.inputs["metadata"]["name"]) for r in fleet.resources if r.type.endswith(":NodePool")
             and any(t.get("key") == "node.cilium.io/agent-not-ready"
                     for t in r.inputs["spec"]["template"]["spec"].get("startupTaints") or ())}
    findings = found(edited(fleet, release_of("cilium"), _operator(removeNodeTaints=False)), "startup-taints-removable")
    named = {f.problem.split("lands on a new ", 1)[1].split(" node:")[0] for f in findings
             if "removes its startup taint node.cilium.io/agent-not-ready" in f.problem}
    assert pools and named == pools


def test_a_custom_resource_needs_its_own_kinds_crd_not_one_of_its_group() -> None:
    """The API server maps a kind (cli-runtime mapper.go "no matches for kind"): a release that waits for the chart
    bringing one CRD of a group still fails on a kind whose CRD another chart brings."""
    def crd(kind: str) -> dict[str, Any]:
        return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                "metadata": {"name": f"{kind.lower()}s.example.io"},
                "spec": {"group": "example.io", "names": {"kind": kind}, "scope": "Namespaced"}}

    def release(name: str, *objects: dict[str, Any]) -> RenderedRelease:
        return RenderedRelease(name, "default", name, "1.0.0", objects)

    bar = {"apiVersion": "example.io/v1", "kind": "Bar", "metadata": {"name": "bar"}}
    rendered = RenderedStack({"foo": release("foo", crd("Foo")), "bars": release("bars", crd("Bar")),
                              "user": release("user", bar)})
    empty = cluster_state([], rendered)
    moment = Moment(before=replace(empty, charts=frozenset({"foo"})), after=empty, records={}, rendered=rendered)
    problem = custom_resources.custom_resources_after_their_crds.check(rec(RELEASE, "user", {"name": "user"}), moment)
    assert problem is not None and "Bar/bar (example.io), whose CRD comes with bars," in problem
    moment = replace(moment, before=replace(empty, charts=frozenset({"bars"})))
    assert custom_resources.custom_resources_after_their_crds.check(rec(RELEASE, "user", {"name": "user"}),
                                                                    moment) is None


def test_a_startup_taint_remover_whose_role_may_only_update_nodes_is_no_remover() -> None:
    """`kubectl taint NODE KEY-` sends a PATCH, which RBAC checks as verb `patch` on core nodes
    (kubernetes.io/docs/reference/access-authn-authz/authorization): the GPU admission check's role with `update`
    instead leaves its taint on every node, and the rule reads RBAC as the CNI's taint does (review-rules-speed M1)."""
    def node_role(r: ResourceRecord) -> bool:
        return (r.type == "kubernetes:rbac.authorization.k8s.io/v1:ClusterRole" and r.name.startswith("gpu-health")
                and any("nodes" in rule.get("resources", ()) for rule in r.inputs.get("rules") or ()))

    def update_only(inputs: dict[str, Any]) -> None:
        for rule in inputs["rules"]:
            if "nodes" in rule["resources"]:
                rule["verbs"] = ["update" if v == "patch" else v for v in rule["verbs"]]

    stack = stack_with(node_role)
    assert not found(recorded(stack), "startup-taints-removable")
    findings = found(edit(stack, node_role, update_only), "startup-taints-removable")
    assert findings and all("removes its startup taint trainyard.io/gpu-health" in f.problem for f in findings)
