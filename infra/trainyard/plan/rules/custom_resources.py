"""Rules on custom resources: their CRD is served before they are created, and a running controller acts on them."""

from __future__ import annotations

import functools
from collections.abc import Mapping

from trainyard.catalogue.charts import load_catalogue
from trainyard.paths import REPO_ROOT
from trainyard.plan.cluster_model import can_launch, can_run_now
from trainyard.plan.pods import lookup, workloads
from trainyard.plan.recording import ResourceRecord
from trainyard.plan.rendering import chart_name
from trainyard.plan.resource_types import RELEASE
from trainyard.plan.rules.base import Moment, of_type, ready_pools, rule
from trainyard.platform.registry import load_registry


@functools.cache
def crd_charts() -> Mapping[str, str]:
    """CRD API group -> the chart (by chart name) that installs it (platform/addons.yaml)."""
    pins = load_catalogue(REPO_ROOT).pins
    return {group: chart_name(pins[release].chart) for group, release in load_registry(REPO_ROOT).crd_owners().items()}


def _group(record: ResourceRecord) -> str | None:
    parts = record.type.split(":")
    if parts[0] != "kubernetes" or len(parts) != 3 or "/" not in parts[1]:
        return None
    return parts[1].rsplit("/", 1)[0]


def is_custom_resource(record: ResourceRecord) -> bool:
    return _group(record) in crd_charts()


# Creating an object whose CRD is not installed fails ("no matches for kind"); platform/addons.yaml says which
# chart installs each API group. Cilium's CRDs are registered by cilium-operator when it starts (docs.cilium.io,
# "cilium-operator": CRD registration), so they also need a Ready node for the operator.
@rule("crd-installed", is_custom_resource,
      "Kubernetes API: no matches for kind; Cilium operator registers Cilium CRDs")
def crd_installed(record: ResourceRecord, moment: Moment) -> str | None:
    group = _group(record)
    chart = crd_charts()[group] if group else ""
    if chart not in moment.before.charts:
        return f"its CRD ({group}) comes with the {chart} chart, which is not installed before it"
    if group == "cilium.io" and not any(p.nodes for p in ready_pools(moment.before)):
        return "Cilium's CRDs are registered by cilium-operator, which has no Ready node before this object"
    return None


def _crd_releases(moment: Moment) -> dict[tuple[str, str], set[str]]:
    """(API group, kind) -> the charts (by chart name) whose render defines that kind's CRD; (group, "") -> the chart
    platform/addons.yaml names for the group (`crds`), for kinds no render defines (cilium-operator registers
    cilium.io's at run time)."""
    served: dict[tuple[str, str], set[str]] = {}
    for release, obj in moment.rendered.objects():
        if obj.get("kind") == "CustomResourceDefinition" and (group := lookup(obj, "spec.group")):
            served.setdefault((str(group), str(lookup(obj, "spec.names.kind"))), set()).add(release.chart)
    for group, chart in crd_charts().items():
        served.setdefault((group, ""), set()).add(chart)
    return served


# Helm maps every object of a release to a served API, kind by kind, before it creates any (pkg/action/install.go
# KubeClient.Build, "unable to build kubernetes objects from release manifest"; k8s.io/cli-runtime
# pkg/resource/mapper.go "no matches for kind ... ensure CRDs are installed first"), and a template that asks
# `.Capabilities.APIVersions.Has` gets the cluster's discovery at that moment: a custom resource a release renders
# needs its CRD's release installed before it (or its own), else the first install fails or leaves it out.
@rule("custom-resources-after-their-crds", of_type(RELEASE),
      "helm v3.19.0 pkg/action/install.go KubeClient.Build (ensure CRDs are installed first)")
def custom_resources_after_their_crds(record: ResourceRecord, moment: Moment) -> str | None:
    release = moment.release(record)
    served = _crd_releases(moment)
    for obj in release.objects:
        group = str(obj.get("apiVersion", "")).rpartition("/")[0]
        # The API server maps a kind, not a group: the kind's own CRD, else the group's run-time registration.
        charts = served.get((group, str(obj.get("kind")))) or served.get((group, ""))
        if not charts or release.chart in charts or charts & moment.before.charts:
            continue
        return (f"it renders {obj.get('kind')}/{lookup(obj, 'metadata.name')} ({group}), whose CRD comes with "
                f"{', '.join(sorted(charts))}, which is not installed before it: the first install fails with "
                "'no matches for kind' (or, where the chart asks .Capabilities.APIVersions, leaves it out)")
    return None


@functools.cache
def crd_controllers() -> Mapping[str, tuple[str, ...]]:
    """API group, or `Kind.group` for one kind, -> the rendered workloads that reconcile it (platform/addons.yaml
    `controllers`)."""
    return {key: names for addon in load_registry(REPO_ROOT).addons for key, names in addon.controllers.items()}


ON_DEMAND = {"fluid": "dataset-controller"}  # chart -> the controller that scales the others out


# A custom resource does nothing until its controllers reconcile it: the workloads platform/addons.yaml names for
# its kind or group must be rendered by the chart that brings its CRD, with replicas and a node to run on. Fluid's
# dataset controller scales a runtime controller from 0 when a runtime of its kind appears (pkg/controllers/deploy
# runtime_controllers.go, ScaleoutRuntimeControllerOnDemand), so 0 replicas there is a start, not a stop.
@rule("resource-reconciled", is_custom_resource,
      "fluid-cloudnative/fluid v1.0.8 ScaleoutRuntimeControllerOnDemand; a CR needs a running controller")
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
