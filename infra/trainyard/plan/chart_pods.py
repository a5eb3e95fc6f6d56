"""Which pods a Helm release makes that a waiting install needs running, and where they may go.

`helm install --wait` (what a pulumi-kubernetes Release does unless `skipAwait`) waits until every Deployment and
StatefulSet the chart created has its pods ready (helm.sh/docs/helm/helm_install, "--wait"); a DaemonSet with no
matching node is ready with zero pods, so only Deployment/StatefulSet components are listed, plus hook Jobs, which
Helm runs to completion with or without --wait (helm.sh/docs/topics/charts_hooks). For each chart the
table names where in the chart's values a component's placement keys live and the chart's own defaults for them
(read from the pinned chart's values.yaml in the upstream data, `.upstream/charts/<chart>/<version>/`); Helm
merges our maps over those defaults and replaces lists (helm.sh/docs/chart_template_guide/values_files).
A chart missing from the table is reported, so a new add-on has to say what its pods need.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trainyard.plan.cluster_model import PodNeeds, Requirement, Toleration, quantity

_LINUX = {"kubernetes.io/os": "linux"}
_CONTROL_PLANE = ({"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"},)


@dataclass(frozen=True)
class ChartPod:
    """One Deployment/StatefulSet of a chart: where its placement keys live and the chart's defaults."""

    name: str
    at: str  # dotted values path holding nodeSelector / tolerations / affinity / replicas ("" = top level)
    enabled: str | None = None  # dotted path of the switch that deploys it; None: always deployed
    enabled_default: bool = True
    replicas: int = 1
    spread: bool = False  # the chart's default affinity keeps replicas on distinct nodes (required)
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    affinity: Mapping[str, Any] = field(default_factory=dict)
    selector_key: str = "nodeSelector"
    tolerations_key: str = "tolerations"
    replicas_key: str = "replicas"
    hook: bool = False  # a Helm hook Job: Helm runs it to completion even without --wait


CHART_PODS: Mapping[str, tuple[ChartPod, ...]] = {
    # cilium 1.20.0 values.yaml: operator.replicas 2 with required hostname anti-affinity, nodeSelector
    # kubernetes.io/os=linux, tolerations for control-plane/not-ready/uninitialized; hubble.relay off by default.
    "cilium": (
        ChartPod("cilium-operator", "operator", "operator.enabled", replicas=2, spread=True, node_selector=_LINUX,
                 tolerations=(*_CONTROL_PLANE, {"key": "node-role.kubernetes.io/master", "operator": "Exists"},
                              {"key": "node.kubernetes.io/not-ready", "operator": "Exists"},
                              {"key": "node.cloudprovider.kubernetes.io/uninitialized", "operator": "Exists"})),
        ChartPod("hubble-relay", "hubble.relay", "hubble.relay.enabled", enabled_default=False,
                 node_selector=_LINUX),
    ),
    # karpenter 1.14.1 values.yaml: replicas 2, required hostname anti-affinity and karpenter.sh/nodepool
    # DoesNotExist (the controller never runs on nodes it manages), nodeSelector linux, CriticalAddonsOnly.
    "karpenter": (
        ChartPod("karpenter", "", replicas=2, spread=True, node_selector=_LINUX,
                 tolerations=({"key": "CriticalAddonsOnly", "operator": "Exists"},),
                 affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                     {"matchExpressions": [{"key": "karpenter.sh/nodepool", "operator": "DoesNotExist"}]}]}}}),
    ),
    # kube-prometheus-stack 88.5.3: the operator, grafana and kube-state-metrics Deployments (no defaults for
    # placement), and the admission webhook's certificate Jobs, which are install hooks. Prometheus and
    # Alertmanager are StatefulSets the operator creates later: Helm does not wait for them (their volumes are
    # checked by the storage rule instead).
    "kube-prometheus-stack": (
        ChartPod("prometheus-operator", "prometheusOperator", "prometheusOperator.enabled"),
        ChartPod("admission-webhook-jobs", "prometheusOperator.admissionWebhooks.patch",
                 "prometheusOperator.admissionWebhooks.patch.enabled", hook=True),
        ChartPod("grafana", "grafana", "grafana.enabled"),
        ChartPod("kube-state-metrics", "kube-state-metrics", "kubeStateMetrics.enabled"),
    ),
    # prometheus-adapter 5.3.0: replicas 1, no placement defaults.
    "prometheus-adapter": (ChartPod("prometheus-adapter", ""),),
    # rook-ceph v1.20.6: the operator (no placement defaults) and, with csi.installCsiOperator (default true),
    # the ceph-csi-operator controller manager subchart.
    "rook-ceph": (
        ChartPod("rook-ceph-operator", ""),
        ChartPod("ceph-csi-operator", "ceph-csi-operator.controllerManager", "csi.installCsiOperator"),
    ),
    # rook-ceph-cluster v1.20.6: the CephCluster and pools are custom resources Helm does not wait for; only the
    # toolbox (toolbox.enabled, default false) is a Deployment. Its chart has no nodeSelector key.
    "rook-ceph-cluster": (
        ChartPod("rook-ceph-tools", "toolbox", "toolbox.enabled", enabled_default=False, selector_key=""),
    ),
    # ceph-csi-drivers 1.0.4 creates Driver custom resources; the operator makes the pods later.
    "ceph-csi-drivers": (),
    # gpu-operator v26.7.0: the operator (nodeSelector linux) and NFD's master and gc (nfd.enabled, default
    # true); every GPU-node component is a DaemonSet.
    "gpu-operator": (
        ChartPod("gpu-operator", "operator", node_selector=_LINUX,
                 tolerations=({"key": "node-role.kubernetes.io/control-plane", "operator": "Equal", "value": "",
                               "effect": "NoSchedule"},)),
        ChartPod("nfd-master", "node-feature-discovery.master", "nfd.enabled", replicas_key="replicaCount",
                 tolerations=({"key": "node-role.kubernetes.io/control-plane", "operator": "Equal", "value": "",
                               "effect": "NoSchedule"},)),
        ChartPod("nfd-gc", "node-feature-discovery.gc", "node-feature-discovery.gc.enable",
                 replicas_key="replicaCount"),
    ),
    # aws-efa-k8s-device-plugin v0.5.30: a DaemonSet only.
    "aws-efa-k8s-device-plugin": (),
    # volcano 1.15.1: scheduler, controllers and admission share custom.default_ns (a nodeSelector) and
    # custom.default_tolerations; each can be switched off.
    "volcano": tuple(
        ChartPod(f"volcano-{part}", "custom", f"custom.{part}_enable", selector_key="default_ns",
                 tolerations_key="default_tolerations", replicas_key=f"{part}_replicas")
        for part in ("scheduler", "controller", "admission")
    ),
    # fluid 1.0.8: dataset and application controllers and the webhook tolerate everything; the Alluxio runtime
    # controller is off unless runtime.alluxio.enabled.
    "fluid": (
        ChartPod("fluid-dataset-controller", "dataset", tolerations=({"operator": "Exists"},)),
        ChartPod("fluid-app-controller", "fluidapp", "fluidapp.enabled", tolerations=({"operator": "Exists"},)),
        ChartPod("fluid-webhook", "webhook", "webhook.enabled", tolerations=({"operator": "Exists"},)),
        ChartPod("alluxio-runtime-controller", "runtime.alluxio", "runtime.alluxio.enabled", enabled_default=False,
                 tolerations=({"operator": "Exists"},)),
    ),
}


def chart_name(chart: str) -> str:
    """`oci://public.ecr.aws/karpenter/karpenter` -> `karpenter`."""
    return chart.rstrip("/").rsplit("/", 1)[-1]


def lookup(values: Mapping[str, Any], path: str, default: Any = None) -> Any:
    current: Any = values
    for part in (p for p in path.split(".") if p):
        if not isinstance(current, Mapping) or part not in current:
            return default
        current = current[part]
    return current


def release_pods(chart: str, values: Mapping[str, Any], *, waits: bool = True) -> tuple[PodNeeds, ...] | None:
    """The pods an install of `chart` needs running (only its hook Jobs when it does not wait); None when the
    chart is not in the table."""
    components = CHART_PODS.get(chart_name(chart))
    if components is None:
        return None
    pods: list[PodNeeds] = []
    for c in components:
        if not (waits or c.hook) or (c.enabled is not None and not lookup(values, c.enabled, c.enabled_default)):
            continue
        own = lookup(values, c.at, {}) or {}
        replicas = int(own.get(c.replicas_key, c.replicas)) if isinstance(own, Mapping) else c.replicas
        if replicas < 1:
            continue
        selector = dict(c.node_selector)
        if c.selector_key:
            selector.update(own.get(c.selector_key) or {})
        tolerations = own.get(c.tolerations_key, c.tolerations) or ()
        affinity = dict(c.affinity) | dict(own.get("affinity") or {})
        pods.append(PodNeeds(
            name=c.name, node_selector=selector, affinity_terms=affinity_terms(affinity),
            tolerations=tuple(Toleration.of(t) for t in tolerations),
            distinct_nodes=replicas if c.spread else 1))
    return tuple(pods)


def affinity_terms(affinity: Mapping[str, Any]) -> tuple[tuple[Requirement, ...], ...]:
    """The required node affinity terms of a pod `affinity` (preferred terms never block scheduling)."""
    required = lookup(affinity, "nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution", {}) or {}
    return tuple(tuple(Requirement.of(e) for e in term.get("matchExpressions") or ())
                 for term in required.get("nodeSelectorTerms") or ())


def pod_needs(name: str, spec: Mapping[str, Any]) -> PodNeeds:
    """A pod spec's placement and the sum of its containers' requests (limits stand in where none)."""
    requests: dict[str, float] = {}
    for container in spec.get("containers") or ():
        resources = container.get("resources") or {}
        for resource, amount in (resources.get("requests") or resources.get("limits") or {}).items():
            requests[resource] = requests.get(resource, 0.0) + quantity(amount)
    return PodNeeds(name=name, node_selector=dict(spec.get("nodeSelector") or {}),
                    affinity_terms=affinity_terms(spec.get("affinity") or {}),
                    tolerations=tuple(Toleration.of(t) for t in spec.get("tolerations") or ()),
                    requests=requests)
