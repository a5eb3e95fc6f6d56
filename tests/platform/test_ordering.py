"""Ordering and teardown rules, read from the plan records (the fields resources.json holds)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
from owned_stacks import FLEET, Stack, every_stack, recording, stack_file, stack_settings, stacks_where
from trainyard.plan.engine_order import creation_order
from trainyard.plan.recording import Recording, ResourceRecord
from trainyard.plan.runtime import render
from trainyard.plan.writers import HELM_RELEASE, is_kubernetes_object, release_of
from trainyard.platform.registry import load_registry

REPO_ROOT = Path(__file__).resolve().parents[2]
# The tests' own stacks, then every stack of stacks/ (AWS: those that target AWS).
STACKS = every_stack()
AWS_STACKS = stacks_where(lambda s: s.is_aws)
# API groups served by Kubernetes itself; everything else is a custom resource whose CRD a release installs.
BUILTIN_GROUPS = frozenset((
    "core", "apps", "batch", "autoscaling", "policy", "networking.k8s.io", "scheduling.k8s.io",
    "rbac.authorization.k8s.io", "storage.k8s.io", "apiextensions.k8s.io", "admissionregistration.k8s.io",
    "coordination.k8s.io", "discovery.k8s.io", "node.k8s.io", "certificates.k8s.io", "events.k8s.io",
    "apiregistration.k8s.io", "flowcontrol.apiserver.k8s.io", "resource.k8s.io",
))
REGISTRY = load_registry(REPO_ROOT)
# CRD group -> chart of the release that installs it (platform/addons.yaml `crds`).
CRD_OWNERS = REGISTRY.crd_owners()
CNI_CHART = next(addon.charts[0] for addon in REGISTRY.addons if addon.cni)
WORKLOAD_KINDS = frozenset(("Deployment", "DaemonSet", "StatefulSet", "Job", "CronJob", "Pod"))
NODE_CAPACITY_KINDS = frozenset(("kubernetes:karpenter.sh/v1:NodePool", "kubernetes:karpenter.k8s.aws/v1:EC2NodeClass",
                                 "kubernetes:karpenter.sh/v1alpha1:NodeOverlay"))
PROMETHEUS_KINDS = frozenset(("ServiceMonitor", "PodMonitor", "PrometheusRule"))


def _recording(stack: Stack) -> Recording:
    return recording(stack)


def group_of(record: ResourceRecord) -> str:
    """`kubernetes:<group>/<version>:<Kind>` -> group ("core" for the legacy group)."""
    return record.type.split(":", 2)[1].rsplit("/", 1)[0]


def upstream(recording: Recording, urn: str) -> frozenset[str]:
    """Everything the engine finishes before it starts `urn` (depends_on, parents, providers, transitively)."""
    return creation_order(recording.resources)[1][urn]


def releases_by_chart(recording: Recording) -> dict[str, str]:
    return {release_of(r)["chart"].rsplit("/", 1)[-1]: r.urn for r in recording.resources if r.type == HELM_RELEASE}


def custom_resources(recording: Recording) -> Iterator[ResourceRecord]:
    return (r for r in recording.resources if is_kubernetes_object(r) and group_of(r) not in BUILTIN_GROUPS)


@pytest.mark.parametrize("stack", STACKS)
def test_custom_resources_wait_for_the_release_owning_their_crd(stack: Stack) -> None:
    recording = _recording(stack)
    releases = releases_by_chart(recording)
    checked, problems = 0, []
    for record in custom_resources(recording):
        owner = CRD_OWNERS.get(group_of(record))
        if owner is None:
            problems.append(f"{record.urn}: no known release installs group {group_of(record)}")
        elif owner not in releases:
            problems.append(f"{record.urn}: {owner} is not installed in this stack")
        elif releases[owner] not in upstream(recording, record.urn):
            problems.append(f"{record.urn}: does not depend on the {owner} release")
        checked += 1
    assert checked > 0
    assert problems == []


@pytest.mark.parametrize("stack", STACKS)
def test_prometheus_objects_wait_for_kube_prometheus_stack(stack: Stack) -> None:
    recording = _recording(stack)
    stack_release = releases_by_chart(recording)["kube-prometheus-stack"]
    objects = [r for r in recording.resources
               if is_kubernetes_object(r) and r.type.rsplit(":", 1)[1] in PROMETHEUS_KINDS]
    assert objects
    assert [r.urn for r in objects if stack_release not in upstream(recording, r.urn)] == []


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_cilium_comes_before_every_other_release(stack: Stack) -> None:
    recording = _recording(stack)
    releases = releases_by_chart(recording)
    cilium = releases.pop(CNI_CHART)
    assert len(releases) >= 5
    assert sorted(chart for chart, urn in releases.items() if cilium not in upstream(recording, urn)) == []


@pytest.mark.parametrize("stack", STACKS)
def test_every_addon_waits_for_the_cni_and_what_it_needs(stack: Stack) -> None:
    """Edges from platform/addons.yaml: what an add-on runs (its releases and workloads) and its custom resources
    wait for the CNI's release and the first release of each add-on it `needs` that the stack turns on. Objects
    that only describe (RBAC, ConfigMaps, namespaces) may be created earlier."""
    recording = _recording(stack)
    by_urn, releases = recording.by_urn(), releases_by_chart(recording)
    enabled = {addon.name: addon for addon in REGISTRY.enabled(stack_settings(stack))}
    components = {(r.type, r.name): r.urn for r in recording.resources if r.type.startswith("trainyard:platform:")}

    def addon_of(record: ResourceRecord) -> str | None:
        parent = record.parent
        while parent is not None:
            name = next((a.name for a in enabled.values()
                         if components.get((f"trainyard:platform:{a.type_name}", a.resource_name)) == parent), None)
            if name is not None:
                return name
            parent = by_urn[parent].parent if parent in by_urn else None
        return None

    problems, checked = [], 0
    for record in recording.resources:
        runs = record.type == HELM_RELEASE or record.type.rsplit(":", 1)[-1] in WORKLOAD_KINDS or (
            is_kubernetes_object(record) and group_of(record) not in BUILTIN_GROUPS)
        name = addon_of(record) if runs else None
        if name is None:
            continue
        addon = enabled[name]
        waits = [*(a.name for a in enabled.values() if a.cni and not addon.cni), *addon.needs]
        for need in (n for n in waits if n in enabled and enabled[n].charts):
            checked += 1
            if releases[enabled[need].charts[0]] not in upstream(recording, record.urn):
                problems.append(f"{record.urn} does not wait for {need}")
    assert problems == []
    assert checked > 0 or not any(a.cni or a.needs for a in enabled.values())


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_every_node_group_waits_for_the_cni(stack: Stack) -> None:
    """No node turns Ready without a CNI, and a managed node group whose nodes stay NotReady fails
    (terraform-aws-modules/terraform-aws-eks issues 3106, 3160, 3446): Cilium goes in first, without waiting for
    pods that only the nodes can run; the pod identity agent (which its operator needs) before it, CoreDNS after
    the nodes."""
    recording = _recording(stack)
    by_urn = recording.by_urn()
    cilium = releases_by_chart(recording)["cilium"]
    groups = [r.urn for r in recording.resources if r.type == "aws:eks/nodeGroup:NodeGroup"]
    assert len(groups) >= 2
    assert [g for g in groups if cilium not in upstream(recording, g)] == []
    inputs = by_urn[cilium].inputs
    assert (inputs.get("skipAwait"), inputs.get("atomic")) == (True, False)
    addons = {r.inputs["addonName"]: r.urn for r in recording.resources if r.type == "aws:eks/addon:Addon"}
    assert addons["eks-pod-identity-agent"] in upstream(recording, cilium)
    assert not set(groups) & upstream(recording, addons["eks-pod-identity-agent"])
    assert set(groups) <= upstream(recording, addons["coredns"])


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_in_cluster_resources_are_deleted_with_the_cluster(stack: Stack) -> None:
    recording = _recording(stack)
    in_cluster = [r for r in recording.resources
                  if r.type.startswith("kubernetes:") and not r.type.startswith("pulumi:providers")]
    clusters = {r.deleted_with for r in in_cluster if r.deleted_with}
    assert len(clusters) == 1, clusters
    (cluster,) = clusters
    assert recording.by_urn()[cluster].type == "aws:eks/cluster:Cluster"
    missing = [r.urn for r in in_cluster if r.type not in NODE_CAPACITY_KINDS and r.deleted_with is None]
    assert missing == []


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_node_capacity_objects_are_really_deleted_by_their_controller(stack: Stack) -> None:
    recording = _recording(stack)
    capacity = [r for r in recording.resources if r.type in NODE_CAPACITY_KINDS]
    assert capacity, f"{stack[0]}: no Karpenter NodePool/EC2NodeClass rendered"
    karpenter = releases_by_chart(recording)["karpenter"]
    assert [r.urn for r in capacity if r.deleted_with is not None] == []
    assert [r.urn for r in capacity if karpenter not in upstream(recording, r.urn)] == []


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_destroy_order_is_workloads_addons_nodes_cluster(stack: Stack) -> None:
    """Destroy walks dependencies backwards, so each later stage must wait, at creation, for the earlier one."""
    recording = _recording(stack)
    of_type = {t: [r.urn for r in recording.resources if r.type == t] for t in (
        "aws:eks/cluster:Cluster", "aws:eks/nodeGroup:NodeGroup", HELM_RELEASE,
        "kubernetes:batch.volcano.sh/v1alpha1:Job", *NODE_CAPACITY_KINDS)}
    [cluster] = of_type["aws:eks/cluster:Cluster"]
    releases = releases_by_chart(recording)
    system_nodes = [urn for urn in of_type["aws:eks/nodeGroup:NodeGroup"] if "system" in urn.rsplit("::", 1)[-1]]
    assert len(system_nodes) == 1 and of_type["kubernetes:batch.volcano.sh/v1alpha1:Job"]
    for job in of_type["kubernetes:batch.volcano.sh/v1alpha1:Job"]:
        assert releases["volcano"] in upstream(recording, job), f"{job} outlives Volcano on destroy"
    # Cilium precedes the nodes (they need a CNI to turn Ready); it is deleted with the cluster, after them.
    for release in (urn for urn in of_type[HELM_RELEASE] if urn != releases["cilium"]):
        assert system_nodes[0] in upstream(recording, release), f"{release} outlives the system nodes on destroy"
    for capacity in (urn for kind in NODE_CAPACITY_KINDS for urn in of_type[kind]):
        assert releases["karpenter"] in upstream(recording, capacity), f"{capacity} outlives Karpenter on destroy"
    for group in of_type["aws:eks/nodeGroup:NodeGroup"]:
        assert cluster in upstream(recording, group), f"{group} outlives the cluster on destroy"


def test_unprotected_stack_destroys_without_manual_steps() -> None:
    """`protect: false` (non-prod only) leaves nothing protected, so `pulumi destroy` needs no state surgery."""
    fleet = stack_file(FLEET)
    recording = render(dataclasses.replace(fleet, values={
        **fleet.values, "trainyard:environment": "staging", "trainyard:protect": "false"}))
    assert [r.urn for r in recording.resources if r.protect] == []
    protected_by_default = {r.urn for r in _recording(FLEET).resources if r.protect}
    assert protected_by_default, "the fleet protects its stateful resources by default"
    # Data stays in the account even then: buckets and keys are retained when Pulumi deletes them.
    retained = {r.type for r in recording.resources if r.retain_on_delete}
    assert {"aws:s3/bucket:Bucket", "aws:kms/key:Key"} <= retained
