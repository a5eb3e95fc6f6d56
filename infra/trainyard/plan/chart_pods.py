"""Which pods a Helm release makes that a waiting install needs running, and where they may go.

`helm install --wait` (what a pulumi-kubernetes Release does unless `skipAwait`) waits until every Deployment and
StatefulSet the chart created has its pods ready (helm.sh/docs/helm/helm_install, "--wait"); a DaemonSet with no
matching node is ready with zero pods, so only Deployment/StatefulSet components are listed, plus hook Jobs, which
Helm runs to completion with or without --wait (helm.sh/docs/topics/charts_hooks). For each chart the
table names where in the chart's values a component's placement keys live and the chart's own defaults for them
(read from the pinned chart's values.yaml in the upstream data, `.upstream/charts/<chart>/<version>/`); Helm
merges our maps over those defaults and replaces lists (helm.sh/docs/chart_template_guide/values_files).
The table is data: each add-on's `pods` in platform/addons.yaml, which the registry requires for every chart, so
a new add-on says what its pods need where it declares its charts.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any

from trainyard.catalogue.addons import ChartPod
from trainyard.catalogue.charts import load_catalogue
from trainyard.paths import REPO_ROOT
from trainyard.plan.cluster_model import PodNeeds, Requirement, Toleration, quantity
from trainyard.platform.registry import load_registry


@cache
def chart_pod_table() -> Mapping[str, tuple[ChartPod, ...]]:
    """Chart name -> the pods a waiting install of it needs, from the add-ons' `pods` (platform/addons.yaml)."""
    pins = load_catalogue(REPO_ROOT).pins
    return {chart_name(pins[release].chart): pods for release, pods in load_registry(REPO_ROOT).chart_pods().items()}


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
    components = chart_pod_table().get(chart_name(chart))
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
