"""Only global rank 0 of a training job serves metrics (issue 19 finding 15): the chart's TargetDown, which would
fire for every multi-pod job, is off; the rule replacing it leaves out exactly the targets the training PodMonitors
mark, and TrainingMetricsDown watches those."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from owned_stacks import Stack, fleet_and_samples_where, planned
from trainyard.plan.writers import is_kubernetes_object, manifest_of
from trainyard.workloads.jobs import RANK_ZERO_LABEL

REPO = Path(__file__).resolve().parents[2]
CLUSTER_RULES = REPO / "platform" / "monitoring" / "rules" / "cluster.rules.yaml"
# The tests' fleet, then every stack of stacks/ with monitoring on.
STACKS = fleet_and_samples_where(lambda s: s.addons.monitoring.enabled)


@cache
def _objects(stack: Stack) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the program's objects, the kube-prometheus-stack release's rendered objects)."""
    plan = planned(stack)
    program = [manifest_of(r) for r in plan.recording.resources if is_kubernetes_object(r)]
    (release,) = [r for r in plan.rendered.releases.values() if r.chart == "kube-prometheus-stack"]
    return program, list(release.objects)


def _alerts(documents: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {rule["alert"]: rule for doc in documents for group in doc["spec"]["groups"] for rule in group["rules"]
            if "alert" in rule}


@pytest.mark.parametrize("stack", STACKS)
def test_the_charts_target_down_is_off(stack: Stack) -> None:
    _, rendered = _objects(stack)
    alerts = _alerts([o for o in rendered if o["kind"] == "PrometheusRule"])
    assert "Watchdog" in alerts, "the chart's default rules are not rendered at all"
    assert "TargetDown" not in alerts


@pytest.mark.parametrize("stack", STACKS)
def test_every_training_target_carries_the_label_the_rules_key_on(stack: Stack) -> None:
    program, _ = _objects(stack)
    monitors = [o for o in program if o["kind"] == "PodMonitor" and "trainyard.io/job" in
                o["spec"]["selector"].get("matchLabels", {})]
    assert monitors
    label, value = RANK_ZERO_LABEL
    for monitor in monitors:
        for endpoint in monitor["spec"]["podMetricsEndpoints"]:
            assert {"targetLabel": label, "replacement": value} in endpoint.get("relabelings", []), monitor
    alerts = _alerts([{"spec": yaml.safe_load(CLUSTER_RULES.read_text())}])
    assert f'up{{{label}!="{value}"}}' in alerts["TrainyardTargetDown"]["expr"]
    assert f'up{{{label}="{value}"}}' in alerts["TrainingMetricsDown"]["expr"]
