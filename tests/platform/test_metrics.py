"""Metrics follow platform/addons.yaml: what an add-on declares is scraped when monitoring is on and switched off
when it is not, and a chart value turning on metrics that no declaration covers fails here by name."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from owned_stacks import FLEET, LAPTOP, Stack, every_stack, stack_file, stack_settings
from trainyard.catalogue.addons import MONITORING
from trainyard.catalogue.charts import deep_merge
from trainyard.config import Settings
from trainyard.plan.conformance import upstream_dir
from trainyard.plan.engine_order import creation_order
from trainyard.plan.recording import Recording, ResourceRecord
from trainyard.plan.runtime import StackFile, render, settings_of
from trainyard.plan.writers import HELM_RELEASE, is_kubernetes_object, manifest_of, release_of
from trainyard.platform.addon import Addon
from trainyard.platform.registry import load_registry

REPO_ROOT = Path(__file__).resolve().parents[2]
REGISTRY = load_registry(REPO_ROOT)
# The tests' own stacks, then every stack of stacks/.
STACKS = every_stack()
STACK_CHART = "kube-prometheus-stack"
# Every stack as its file sets monitoring; the tests' AWS and local stacks are also rendered with it off.
CASES = [*(pytest.param(p.values[0], stack_settings(p.values[0]).addons.monitoring.enabled, id=p.id) for p in STACKS),
         pytest.param(FLEET, False, id="fleet-without-monitoring"),
         pytest.param(LAPTOP, False, id="laptop-without-monitoring")]
MONITOR_KINDS = ("serviceMonitor", "podMonitor", "prometheusRule")
# `<one of these>.enabled` on (or a non-empty list of metrics) means the chart serves Prometheus metrics.
METRICS_SWITCHES = ("prometheus", "monitoring", "metrics")


def _stack(stack: Stack, monitoring: bool) -> StackFile:
    base = stack_file(stack)
    if stack_settings(stack).addons.monitoring.enabled == monitoring:
        return base
    addons = json.loads(base.values.get("trainyard:addons", "{}"))
    addons["monitoring"] = {**addons.get("monitoring", {}), "enabled": monitoring}
    return dataclasses.replace(base, values={**base.values, "trainyard:addons": json.dumps(addons)})


@cache
def _recording(stack: Stack, monitoring: bool) -> Recording:
    return render(_stack(stack, monitoring))


@cache
def _settings(stack: Stack, monitoring: bool) -> Settings:
    return settings_of(_stack(stack, monitoring))


def _releases(recording: Recording) -> dict[str, ResourceRecord]:
    return {release_of(r)["chart"].rsplit("/", 1)[-1]: r for r in recording.resources if r.type == HELM_RELEASE}


def _upstream(recording: Recording, urn: str) -> frozenset[str]:
    """Everything the engine finishes before it starts `urn` (depends_on, parents, providers, transitively)."""
    return creation_order(recording.resources)[1][urn]


def _get(values: Mapping[str, Any], dotted: str) -> Any:
    node: Any = values
    for key in dotted.split("."):
        node = node.get(key) if isinstance(node, Mapping) else None
    return node


def _leaves(value: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    if isinstance(value, Mapping):
        for key, item in value.items():
            yield from _leaves(item, (*path, str(key)))
    else:
        yield path, value


def undeclared_metrics(addon: Addon, chart: str, values: Mapping[str, Any]) -> list[str]:
    """Values of `chart` that turn metrics on without `addon` declaring them in platform/addons.yaml."""
    problems = []
    for path, value in _leaves(values):
        if value is not True and not (isinstance(value, list) and value):
            continue
        dotted, switch = ".".join(path), path[-2:-1] if path[-1] == "enabled" else ()
        if switch and switch[0] in MONITOR_KINDS and value is True \
                and dotted not in addon.service_monitors.get(chart, ()):
            problems.append(f"{chart}: {dotted} is on but not in addons.{addon.name}.serviceMonitors")
        elif ((value is True and "metrics" in path[-1].lower()) or (switch and switch[0] in METRICS_SWITCHES)) \
                and not addon.exposes_metrics:
            problems.append(f"{chart}: {dotted} serves metrics but addons.{addon.name} declares no serviceMonitors "
                            "or scrape targets")
    return problems


@pytest.mark.parametrize(("stack", "monitoring"), CASES)
def test_declared_chart_service_monitors_follow_monitoring(stack: Stack, monitoring: bool) -> None:
    recording = _recording(stack, monitoring)
    releases = _releases(recording)
    assert (STACK_CHART in releases) == monitoring
    checked, enabled = 0, REGISTRY.enabled(_settings(stack, monitoring))
    for addon in enabled:
        for chart, paths in addon.service_monitors.items():
            if chart not in releases:
                continue  # an optional chart this stack does without
            values = release_of(releases[chart])["values"]
            assert {path: _get(values, path) for path in paths} == dict.fromkeys(paths, monitoring), chart
            waits = _upstream(recording, releases[chart].urn) & {r.urn for r in releases.values()}
            # The monitoring stack's CRDs must exist first when monitoring is on; nothing waits for it otherwise.
            assert (releases[STACK_CHART].urn in waits) if monitoring else True, chart
            checked += 1
    assert checked > 0 or not any(addon.service_monitors for addon in enabled)


def _component_type(recording: Recording, record: ResourceRecord) -> str:
    """The `trainyard:platform:<Name>` component a resource belongs to."""
    by_urn = recording.by_urn()
    while record.parent is not None and not by_urn[record.parent].type.startswith("trainyard:"):
        record = by_urn[record.parent]
    return by_urn[record.parent].type if record.parent is not None else ""


@pytest.mark.parametrize(("stack", "monitoring"), CASES)
def test_declared_scrape_targets_get_a_service_monitor(stack: Stack, monitoring: bool) -> None:
    """Monitoring creates a ServiceMonitor for exactly the declared scrape targets; every other one is made by an
    add-on without charts (which has no chart switch to declare: catalogue.addons), and only with monitoring on."""
    recording = _recording(stack, monitoring)
    enabled = REGISTRY.enabled(_settings(stack, monitoring))
    monitors = [r for r in recording.resources if is_kubernetes_object(r) and r.type.endswith(":ServiceMonitor")]
    by_component: dict[str, list[ResourceRecord]] = {}
    for record in monitors:
        by_component.setdefault(_component_type(recording, record), []).append(record)
    objects = [manifest_of(r) for r in by_component.pop(f"trainyard:platform:{REGISTRY.get(MONITORING).type_name}", [])]
    found = {o["metadata"]["name"]: (o["spec"]["selector"]["matchLabels"], o["spec"]["namespaceSelector"]["matchNames"],
                                     o["spec"]["endpoints"][0]["port"]) for o in objects}
    expected = {target.name: (dict(target.selector), [target.namespace], target.port)
                for addon in enabled for target in addon.scrape} if monitoring else {}
    assert found == expected
    chartless = {f"trainyard:platform:{a.type_name}" for a in enabled if not a.charts}
    assert set(by_component) <= chartless if monitoring else by_component == {}


@pytest.mark.parametrize("stack", STACKS)
def test_scraped_services_are_rendered_by_their_charts(stack: Stack) -> None:
    """A scrape target's `when` switches are on in the values Helm renders with (the chart's defaults at the pinned
    version under ours): else the chart renders no Service, and the ServiceMonitor selects nothing."""
    releases = _releases(_recording(stack, True))
    off = []
    for addon in (a for a in REGISTRY.enabled(_settings(stack, True)) if a.scrape):
        release = release_of(releases[addon.charts[0]])
        chart = release["chart"].rsplit("/", 1)[-1]
        defaults = upstream_dir(REPO_ROOT) / "charts" / chart / release["version"] / "values.yaml"
        values = deep_merge(yaml.safe_load(defaults.read_text()), release["values"])
        off += [f"{addon.charts[0]}: {path} (for {target.name})"
                for target in addon.scrape for path in target.when if not _get(values, path)]
    assert off == []


@pytest.mark.parametrize("stack", STACKS)
def test_metrics_a_chart_turns_on_are_declared(stack: Stack) -> None:
    problems = []
    for chart, record in _releases(_recording(stack, True)).items():
        addon = REGISTRY.owner(chart)
        if addon.name != MONITORING:  # it installs the monitoring CRDs itself
            problems += undeclared_metrics(addon, chart, release_of(record)["values"])
    assert problems == []


def test_an_undeclared_metrics_endpoint_fails_loudly() -> None:
    """Volcano without its scrape targets: the check names the values that serve metrics nobody scrapes."""
    volcano = REGISTRY.get("volcano")
    values = release_of(_releases(_recording(LAPTOP, True))["volcano"])["values"]
    assert undeclared_metrics(volcano, "volcano", values) == []
    problems = undeclared_metrics(dataclasses.replace(volcano, scrape=()), "volcano", values)
    assert problems and all("declares no serviceMonitors or scrape targets" in p for p in problems)
    gpu = REGISTRY.get("gpuOperator")
    gpu_values = release_of(_releases(_recording(FLEET, True))["gpu-operator"])["values"]
    assert undeclared_metrics(dataclasses.replace(gpu, service_monitors={}), "gpu-operator", gpu_values) == [
        "gpu-operator: dcgmExporter.serviceMonitor.enabled is on but not in addons.gpuOperator.serviceMonitors"]
