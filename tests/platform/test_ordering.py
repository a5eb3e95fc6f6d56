"""Ordering and teardown rules, read from the plan records (the fields resources.json holds)."""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache

import pytest
from trainyard.plan.recording import Recording, ResourceRecord
from trainyard.plan.runtime import available_stacks, read_stack, render
from trainyard.plan.writers import HELM_RELEASE, is_kubernetes_object, release_of

STACKS = available_stacks()
AWS_STACKS = [s for s in STACKS if read_stack(s).values.get("trainyard:target") == "aws"]
# API groups served by Kubernetes itself; everything else is a custom resource whose CRD a release installs.
BUILTIN_GROUPS = frozenset((
    "core", "apps", "batch", "autoscaling", "policy", "networking.k8s.io", "scheduling.k8s.io",
    "rbac.authorization.k8s.io", "storage.k8s.io", "apiextensions.k8s.io", "admissionregistration.k8s.io",
    "coordination.k8s.io", "discovery.k8s.io", "node.k8s.io", "certificates.k8s.io", "events.k8s.io",
    "apiregistration.k8s.io", "flowcontrol.apiserver.k8s.io", "resource.k8s.io",
))
# CRD group -> chart of the release that installs it.
CRD_OWNERS = {
    "cilium.io": "cilium",
    "monitoring.coreos.com": "kube-prometheus-stack",
    "scheduling.volcano.sh": "volcano",
    "batch.volcano.sh": "volcano",
    "data.fluid.io": "fluid",
    "ceph.rook.io": "rook-ceph",
    "karpenter.sh": "karpenter",
    "karpenter.k8s.aws": "karpenter",
}
NODE_CAPACITY_KINDS = frozenset(("kubernetes:karpenter.sh/v1:NodePool", "kubernetes:karpenter.k8s.aws/v1:EC2NodeClass"))
PROMETHEUS_KINDS = frozenset(("ServiceMonitor", "PodMonitor", "PrometheusRule"))


@cache
def _recording(stack: str) -> Recording:
    return render(read_stack(stack))


def group_of(record: ResourceRecord) -> str:
    """`kubernetes:<group>/<version>:<Kind>` -> group ("core" for the legacy group)."""
    return record.type.split(":", 2)[1].rsplit("/", 1)[0]


def upstream(recording: Recording, urn: str) -> set[str]:
    """Everything `urn` waits for: its depends_on, its parents' depends_on, and theirs, transitively."""
    by_urn = recording.by_urn()
    seen: set[str] = set()
    todo = [urn]
    while todo:
        record = by_urn.get(todo.pop())
        if record is None:
            continue
        for nxt in (*record.depends_on, *([record.parent] if record.parent else [])):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def releases_by_chart(recording: Recording) -> dict[str, str]:
    return {release_of(r)["chart"].rsplit("/", 1)[-1]: r.urn for r in recording.resources if r.type == HELM_RELEASE}


def custom_resources(recording: Recording) -> Iterator[ResourceRecord]:
    return (r for r in recording.resources if is_kubernetes_object(r) and group_of(r) not in BUILTIN_GROUPS)


@pytest.mark.parametrize("stack", STACKS)
def test_custom_resources_wait_for_the_release_owning_their_crd(stack: str) -> None:
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
def test_prometheus_objects_wait_for_kube_prometheus_stack(stack: str) -> None:
    recording = _recording(stack)
    stack_release = releases_by_chart(recording)["kube-prometheus-stack"]
    objects = [r for r in recording.resources
               if is_kubernetes_object(r) and r.type.rsplit(":", 1)[1] in PROMETHEUS_KINDS]
    assert objects
    assert [r.urn for r in objects if stack_release not in upstream(recording, r.urn)] == []


@pytest.mark.parametrize("stack", STACKS)
def test_releases_emitting_service_monitors_wait_for_kube_prometheus_stack(stack: str) -> None:
    recording = _recording(stack)
    releases = releases_by_chart(recording)
    emitting = [chart for chart in ("gpu-operator", "rook-ceph", "rook-ceph-cluster", "karpenter") if chart in releases]
    assert [c for c in emitting if releases["kube-prometheus-stack"] not in upstream(recording, releases[c])] == []


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_cilium_comes_before_every_other_release(stack: str) -> None:
    recording = _recording(stack)
    releases = releases_by_chart(recording)
    cilium = releases.pop("cilium")
    assert len(releases) >= 5
    assert sorted(chart for chart, urn in releases.items() if cilium not in upstream(recording, urn)) == []


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_in_cluster_resources_are_deleted_with_the_cluster(stack: str) -> None:
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
def test_node_capacity_objects_are_really_deleted_by_their_controller(stack: str) -> None:
    recording = _recording(stack)
    capacity = [r for r in recording.resources if r.type in NODE_CAPACITY_KINDS]
    if not capacity:
        pytest.skip(f"{stack}: no Karpenter NodePool/EC2NodeClass rendered (Karpenter component not wired yet)")
    karpenter = releases_by_chart(recording)["karpenter"]
    assert [r.urn for r in capacity if r.deleted_with is not None] == []
    assert [r.urn for r in capacity if karpenter not in upstream(recording, r.urn)] == []
