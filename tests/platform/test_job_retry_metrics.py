"""A Volcano job's retries reach Prometheus (issue 19 finding 24): kube-state-metrics, as the chart renders it,
reads each Job's status.retryCount and spec.maxRetry, fields the Volcano Job CRD has, and may list and watch
Jobs; TrainingJobRetriesRunningOut uses exactly the metrics it makes."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from owned_stacks import Stack, fleet_and_samples_where, planned
from trainyard.plan.conformance import upstream_dir
from trainyard.plan.rendering import RenderedRelease

REPO = Path(__file__).resolve().parents[2]
JOB_CRD = upstream_dir(REPO) / "crds" / "batch.volcano.sh" / "job_v1alpha1.json"
RULES = REPO / "platform" / "monitoring" / "rules" / "training.rules.yaml"
# The tests' fleet, then every stack of stacks/ with Volcano and monitoring on.
STACKS = fleet_and_samples_where(lambda s: s.addons.volcano.enabled and s.addons.monitoring.enabled)


@cache
def _monitoring(stack: Stack) -> RenderedRelease:
    (release,) = [r for r in planned(stack).rendered.releases.values()
                  if r.chart == "kube-prometheus-stack"]
    return release


def _job_metrics(stack: Stack) -> dict[str, list[str]]:
    """Metric name -> the Job field it reads, from the rendered custom-resource-state config."""
    release = _monitoring(stack)
    (deployment,) = [d for d in release.of_kind("Deployment") if d["metadata"]["name"].endswith("kube-state-metrics")]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    (flag,) = [a for a in container["args"] if a.startswith("--custom-resource-state-config-file=")]
    key = flag.rsplit("/", 1)[1]
    (config_map,) = [c for c in release.of_kind("ConfigMap") if key in c.get("data", {})
                     and "CustomResourceStateMetrics" in c["data"][key]]
    config = yaml.safe_load(config_map["data"][key])
    (jobs,) = [r for r in config["spec"]["resources"]
               if r["groupVersionKind"] == {"group": "batch.volcano.sh", "version": "v1alpha1", "kind": "Job"}]
    return {f"{jobs['metricNamePrefix']}_{m['name']}": m["each"]["gauge"]["path"] for m in jobs["metrics"]}


def _schema_has(schema: dict[str, Any], path: list[str]) -> bool:
    for part in path:
        schema = schema.get("properties", {}).get(part)
        if schema is None:
            return False
    return schema.get("type") == "integer"


@pytest.mark.parametrize("stack", STACKS)
def test_the_retry_metrics_read_fields_the_job_crd_has(stack: Stack) -> None:
    metrics = _job_metrics(stack)
    assert {"trainyard_volcano_job_retry_count", "trainyard_volcano_job_max_retry"} <= set(metrics)
    schema = json.loads(JOB_CRD.read_text())
    assert metrics["trainyard_volcano_job_retry_count"] == ["status", "retryCount"]
    assert metrics["trainyard_volcano_job_max_retry"] == ["spec", "maxRetry"]
    assert all(_schema_has(schema, path) for path in metrics.values()), metrics


@pytest.mark.parametrize("stack", STACKS)
def test_kube_state_metrics_may_list_and_watch_volcano_jobs(stack: Stack) -> None:
    (role,) = [r for r in _monitoring(stack).of_kind("ClusterRole")
               if r["metadata"]["name"].endswith("kube-state-metrics")]
    granted = {(g, res, verb) for rule in role["rules"] for g in rule.get("apiGroups", [])
               for res in rule.get("resources", []) for verb in rule.get("verbs", [])}
    assert {("batch.volcano.sh", "jobs", "list"), ("batch.volcano.sh", "jobs", "watch"),
            ("apiextensions.k8s.io", "customresourcedefinitions", "list")} <= granted


@pytest.mark.parametrize("stack", STACKS)
def test_the_retry_alert_uses_the_metrics_kube_state_metrics_makes(stack: Stack) -> None:
    rules = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    (alert,) = [r for r in rules if r.get("alert") == "TrainingJobRetriesRunningOut"]
    used = {name for name in _job_metrics(stack) if name in alert["expr"]}
    assert used == {"trainyard_volcano_job_retry_count", "trainyard_volcano_job_max_retry"}
