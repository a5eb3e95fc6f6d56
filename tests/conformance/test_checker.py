"""The conformance checker on small fixtures: it must catch each class of mistake and pass valid objects."""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import SchemaNotFoundError
from trainyard.plan.conformance import (
    INVALID,
    MISSING_SCHEMA,
    MISSING_UPSTREAM,
    UNKNOWN_KEY,
    YAML_LOADER,
    Problem,
    check_helm_values,
    check_manifest,
    kubernetes_schema_version,
    upstream_dir,
)

K8S = "1.34"
UPSTREAM = upstream_dir()

DEPLOYMENT: dict[str, Any] = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "web", "namespace": "team-a"},
    "spec": {
        "replicas": 2,
        "selector": {"matchLabels": {"app": "web"}},
        "template": {
            "metadata": {"labels": {"app": "web"}},
            "spec": {"containers": [{"name": "web", "image": "nginx:1.27.3"}]},
        },
    },
}

VOLCANO_JOB: dict[str, Any] = {
    "apiVersion": "batch.volcano.sh/v1alpha1",
    "kind": "Job",
    "metadata": {"name": "train", "namespace": "team-a"},
    "spec": {
        "schedulerName": "volcano",
        "minAvailable": 2,
        "queue": "team-a",
        "tasks": [{
            "name": "worker",
            "replicas": 2,
            "template": {"spec": {"containers": [{"name": "trainer", "image": "trainer:1.0.0"}]}},
        }],
    },
}


def _helm(chart: str, version: str, values: dict[str, Any]) -> dict[str, Any]:
    return {"name": chart, "namespace": "x", "chart": chart, "repository": "https://example.invalid",
            "version": version, "values": values}


def _kinds(problems: list[Problem]) -> set[str]:
    return {p.kind for p in problems}


def test_schema_version_is_newest_not_above_cluster() -> None:
    assert kubernetes_schema_version("1.34") == "1.34.0"
    assert kubernetes_schema_version("v1.34.2") == "1.34.0"


def test_valid_builtin_and_custom_resources_pass() -> None:
    assert check_manifest(DEPLOYMENT, K8S, upstream=UPSTREAM) == []
    assert check_manifest(VOLCANO_JOB, K8S, upstream=UPSTREAM) == []


def test_unknown_field_in_deployment_spec() -> None:
    bad = copy.deepcopy(DEPLOYMENT)
    bad["spec"]["replica"] = 3  # typo of replicas
    problems = check_manifest(bad, K8S, upstream=UPSTREAM)
    assert len(problems) == 1
    assert problems[0].kind == INVALID
    assert problems[0].where == "Deployment/team-a/web"
    assert "replica" in problems[0].message


def test_wrong_type_in_deployment() -> None:
    bad = copy.deepcopy(DEPLOYMENT)
    bad["spec"]["replicas"] = "two"
    problems = check_manifest(bad, K8S, upstream=UPSTREAM)
    assert [(p.kind, p.path) for p in problems] == [(INVALID, "spec.replicas")]


def test_unknown_field_in_volcano_job() -> None:
    bad = copy.deepcopy(VOLCANO_JOB)
    bad["spec"]["tasks"][0]["replica"] = 4
    problems = check_manifest(bad, K8S, upstream=UPSTREAM)
    assert len(problems) == 1
    assert problems[0].path == "spec.tasks.0"
    assert "replica" in problems[0].message


@pytest.mark.parametrize("obj", [
    {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": 1}},
    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "r"}, "rules": [{"verb": []}]},
    {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": 5}},
    {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "p"}, "spec": {"minAvailable": []}},
    {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "j"}, "spec": {"schedule": "@daily"}},
    DEPLOYMENT,
    {"apiVersion": "apps/v1", "kind": "Deploymentz", "metadata": {"name": "d"}},
    {"apiVersion": "v2", "kind": "Pod", "metadata": {"name": "p"}},
], ids=lambda obj: f"{obj['apiVersion']}-{obj['kind']}")
def test_a_built_in_kind_gets_kubernetes_validates_first_error(obj: dict[str, Any]) -> None:
    """The checker compiles kubernetes-validate's strict schemas itself (its validate() reads them per object): the
    same schema file for each group and kind, and the same first error, as kubernetes-validate's own validate."""
    try:
        kubernetes_validate.validate(obj, kubernetes_schema_version(K8S), strict=True)
        expected = []
    except SchemaNotFoundError:
        expected = [MISSING_SCHEMA]
    except kubernetes_validate.ValidationError as err:
        expected = [(".".join(map(str, err.absolute_path)), err.message)]
    found = [p.kind if p.kind == MISSING_SCHEMA else (p.path, p.message) for p in check_manifest(obj, K8S)]
    assert found == expected


def test_custom_resource_without_schema_is_a_problem() -> None:
    unknown_kind = {**VOLCANO_JOB, "kind": "Jobz"}
    problems = check_manifest(unknown_kind, K8S, upstream=UPSTREAM)
    assert _kinds(problems) == {MISSING_SCHEMA}
    unknown_group = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
    assert _kinds(check_manifest(unknown_group, K8S, upstream=UPSTREAM)) == {MISSING_SCHEMA}


def test_helm_values_known_keys_and_free_form_maps_pass() -> None:
    values = {
        "replicas": 2,
        "controller": {"resources": {"requests": {"cpu": "1"}}},
        # upstream nodeSelector is {kubernetes.io/os: linux}: data map, any key allowed
        "nodeSelector": {"trainyard.io/role": "system"},
        "settings": {"featureGates": {"nodeOverlay": True}},
    }
    assert check_helm_values(_helm("karpenter", "1.14.1", values), upstream=UPSTREAM) == []


def test_unknown_helm_values_key() -> None:
    values = {"settings": {"clusterNmae": "typo"}, "replicas": 2}
    problems = check_helm_values(_helm("karpenter", "1.14.1", values), upstream=UPSTREAM)
    assert [(p.kind, p.path) for p in problems] == [(UNKNOWN_KEY, "settings.clusterNmae")]


def test_map_where_upstream_has_a_scalar() -> None:
    problems = check_helm_values(_helm("karpenter", "1.14.1", {"replicas": {"count": 2}}), upstream=UPSTREAM)
    assert [(p.kind, p.path) for p in problems] == [(INVALID, "replicas")]


def test_subchart_keys_are_checked_against_the_subchart() -> None:
    ok = {"grafana": {"enabled": True, "sidecar": {"dashboards": {"searchNamespace": "ALL"}}}}
    assert check_helm_values(_helm("kube-prometheus-stack", "88.5.3", ok), upstream=UPSTREAM) == []
    bad = {"grafana": {"sidecar": {"dashbords": {"enabled": True}}}}
    problems = check_helm_values(_helm("kube-prometheus-stack", "88.5.3", bad), upstream=UPSTREAM)
    assert [(p.kind, p.path) for p in problems] == [(UNKNOWN_KEY, "grafana.sidecar.dashbords")]


def test_cilium_values_schema_violation() -> None:
    # hubble.relay.replicas is an integer in cilium's values.schema.json; the key itself exists.
    problems = check_helm_values(_helm("cilium", "1.20.0", {"hubble": {"relay": {"replicas": "two"}}}),
                                 upstream=UPSTREAM)
    assert [(p.kind, p.path) for p in problems] == [(INVALID, "hubble.relay.replicas")]
    assert "values.schema.json" in problems[0].message


def test_values_passed_to_a_crd_are_checked_against_it() -> None:
    bad = {"cephClusterSpec": {"mon": {"count": 3, "allowMultiplePerNod": False}}}
    problems = check_helm_values(_helm("rook-ceph-cluster", "v1.20.6", bad), upstream=UPSTREAM)
    assert len(problems) == 1
    assert problems[0].path == "cephClusterSpec.mon"
    assert "allowMultiplePerNod" in problems[0].message


def test_chart_without_upstream_data_is_reported_distinctly() -> None:
    problems = check_helm_values(_helm("no-such-chart", "1.0.0", {"anything": 1}), upstream=UPSTREAM)
    assert _kinds(problems) == {MISSING_UPSTREAM}


def test_the_fast_yaml_loader_reads_every_pinned_charts_values_as_the_pure_one_does() -> None:
    """The chart defaults conformance checks against are the same whichever loader PyYAML offers."""
    files = sorted(upstream_dir().glob("**/values.yaml"))
    assert files
    for path in files:
        text = path.read_text(encoding="utf-8")
        assert yaml.load(text, Loader=YAML_LOADER) == yaml.safe_load(text), path  # noqa: S506
