"""Tiny synthetic records for the rehearsal's unit tests, shaped as the recording monitor writes them."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from trainyard.catalogue.charts import load_catalogue
from trainyard.paths import REPO_ROOT
from trainyard.plan.recording import Recording, ResourceRecord
from trainyard.plan.rehearse import Rehearsal, rehearse
from trainyard.plan.rendering import chart_name, render_releases

CLUSTER = "aws:eks/cluster:Cluster"
NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
RELEASE = "kubernetes:helm.sh/v3:Release"
NODE_POOL = "kubernetes:karpenter.sh/v1:NodePool"
NODE_CLASS = "kubernetes:karpenter.k8s.aws/v1:EC2NodeClass"
NODE_OVERLAY = "kubernetes:karpenter.sh/v1alpha1:NodeOverlay"
PVC = "kubernetes:core/v1:PersistentVolumeClaim"
JOB = "kubernetes:batch.volcano.sh/v1alpha1:Job"


def urn(type_: str, name: str) -> str:
    return f"urn:pulumi:test::trainyard::{type_}::{name}"


def rec(type_: str, name: str, inputs: dict[str, Any] | None = None, deps: tuple[ResourceRecord, ...] = (),
        parent: ResourceRecord | None = None, custom: bool = True) -> ResourceRecord:
    return ResourceRecord(urn=urn(type_, name), type=type_, name=name, custom=custom,
                          parent=parent.urn if parent else None, provider=None,
                          depends_on=tuple(sorted(d.urn for d in deps)), protect=False, retain_on_delete=False,
                          deleted_with=None, inputs=inputs or {})


def recording(*records: ResourceRecord) -> Recording:
    return Recording(resources=list(records))


Match = Callable[[ResourceRecord], bool]


def edited(recording: Recording, match: Match, change: Callable[[dict[str, Any]], None]) -> Recording:
    """A copy of the recording with `change` applied to the inputs of every record `match` selects (at least one)."""
    resources, matched = [], 0
    for record in recording.resources:
        if match(record):
            matched += 1
            inputs = copy.deepcopy(record.inputs)
            change(inputs)
            record = replace(record, inputs=inputs)
        resources.append(record)
    assert matched, "the edit matched nothing"
    return Recording(resources=resources)


KUBERNETES = "1.34"


def rehearsed(recording: Recording) -> Rehearsal:
    """The rehearsal of a recording whose Helm releases are rendered with the real Helm (cached per values)."""
    versions = [str(r.inputs["version"]) for r in recording.resources if r.type == CLUSTER and "version" in r.inputs]
    return rehearse(recording, render_releases(recording, versions[0] if versions else KUBERNETES))


def cluster(bootstrap: bool = False) -> ResourceRecord:
    return rec(CLUSTER, "eks", {"bootstrapSelfManagedAddons": bootstrap})


def node_group(name: str, *deps: ResourceRecord, instance: str = "m7i.4xlarge", nodes: int = 3,
               labels: dict[str, str] | None = None, taints: list[dict[str, str]] | None = None) -> ResourceRecord:
    return rec(NODE_GROUP, f"{name}-group", {
        "nodeGroupName": name, "instanceTypes": [instance], "amiType": "AL2023_x86_64_STANDARD",
        "labels": labels if labels is not None else {"trainyard.io/role": name},
        "taints": taints or [], "scalingConfig": {"desiredSize": nodes}}, deps)


def release(name: str, chart: str, values: dict[str, Any] | None = None, *deps: ResourceRecord,
            atomic: bool = True, skip_await: bool = False) -> ResourceRecord:
    """A Release of a pinned chart (its version and namespace from platform/charts.yaml), named `name`."""
    (pin,) = [p for p in load_catalogue(REPO_ROOT).pins.values() if chart_name(p.chart) == chart_name(chart)]
    inputs: dict[str, Any] = {"name": name, "chart": chart, "version": pin.version, "namespace": pin.namespace,
                              "values": values or {}, "atomic": atomic}
    if skip_await:
        inputs["skipAwait"] = True
    return rec(RELEASE, name, inputs, deps)


def cilium(*deps: ResourceRecord, skip_await: bool = True) -> ResourceRecord:
    return release("cilium", "cilium", {"operator": {"nodeSelector": {"trainyard.io/role": "system"}}}, *deps,
                   atomic=not skip_await, skip_await=skip_await)


def gpu_operator(*deps: ResourceRecord) -> ResourceRecord:
    """The GPU Operator, whose device plugin advertises nvidia.com/gpu and MIG slices on GPU nodes."""
    return release("gpu-operator", "gpu-operator", {}, *deps, skip_await=True)


def karpenter_pool(name: str, instance: str, *deps: ResourceRecord, labels: dict[str, str] | None = None,
                   taints: list[dict[str, str]] | None = None) -> tuple[ResourceRecord, ResourceRecord]:
    node_class = rec(NODE_CLASS, f"{name}-nodeclass", {"metadata": {"name": name}}, deps)
    pool = rec(NODE_POOL, f"{name}-nodepool", {"metadata": {"name": name}, "spec": {"template": {
        "metadata": {"labels": labels or {"trainyard.io/pool": name}},
        "spec": {"nodeClassRef": {"name": name}, "taints": taints or [],
                 "requirements": [{"key": "node.kubernetes.io/instance-type", "operator": "In",
                                   "values": [instance]}]}}}}, (*deps, node_class))
    return node_class, pool


def gpu_pod(pool: str, resources: dict[str, str], tolerate: bool = True) -> dict[str, Any]:
    return {"nodeSelector": {"trainyard.io/pool": pool},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}] if tolerate
            else [],
            "containers": [{"name": "trainer", "resources": {"requests": resources}}]}


def job(name: str, pod: dict[str, Any], *deps: ResourceRecord, replicas: int = 1) -> ResourceRecord:
    return rec(JOB, name, {"spec": {"minAvailable": replicas, "queue": "default",
                                    "tasks": [{"name": "worker", "replicas": replicas, "template": {"spec": pod}}]}},
               deps)


GPU_TAINT = {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}
