"""Prometheus rules: promtool accepts them, their unit tests pass, and every alert is tested both ways."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from trainyard.plan.conformance import upstream_dir

REPO = Path(__file__).resolve().parents[2]
RULES_DIR = REPO / "platform" / "monitoring" / "rules"
RULE_FILES = sorted(RULES_DIR.glob("*.rules.yaml"))
TEST_FILES = sorted((RULES_DIR / "tests").glob("*.test.yaml"))
README = REPO / "platform" / "monitoring" / "README.md"
PROMETHEUS_RULE_SCHEMA = upstream_dir(REPO) / "crds" / "monitoring.coreos.com" / "prometheusrule_v1.json"
SEVERITIES = {"warning", "critical"}


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool not installed: make deps (Debian: apt-get install -y prometheus)")
    return path


def _run_promtool(*args: str) -> None:
    result = subprocess.run([_promtool(), *args], capture_output=True, text=True, check=False, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def _load(path: Path) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(path.read_text())
    return document


def _rules(path: Path) -> list[dict[str, Any]]:
    return [rule for group in _load(path)["groups"] for rule in group["rules"]]


def _alerts(path: Path) -> list[dict[str, Any]]:
    return [rule for rule in _rules(path) if "alert" in rule]


def _tests_for(rule_file: Path) -> list[dict[str, Any]]:
    """Test cases of every test file that loads ``rule_file``."""
    cases: list[dict[str, Any]] = []
    for test_file in TEST_FILES:
        document = _load(test_file)
        loaded = {(test_file.parent / name).resolve() for name in document["rule_files"]}
        if rule_file.resolve() in loaded:
            cases.extend(document["tests"])
    return cases


def _anchor(heading: str) -> str:
    # GitHub's heading anchors: lower-case, punctuation dropped, spaces to dashes.
    return re.sub(r"[^a-z0-9 _-]", "", heading.strip().lower()).replace(" ", "-")


def test_catalogue_is_not_empty() -> None:
    assert {path.name for path in RULE_FILES} == {
        "gpu.rules.yaml",
        "training.rules.yaml",
        "cluster.rules.yaml",
        "gpu-health.rules.yaml",
    }
    assert len(TEST_FILES) == len(RULE_FILES)


def test_the_promtool_version_is_stated_beside_the_clusters_prometheus() -> None:
    """No registry has a 3.x promtool (platform/monitoring/README.md): the pair tested is stated, and kept true."""
    shown = subprocess.run([_promtool(), "--version"], capture_output=True, text=True, check=True, timeout=60)
    promtool = re.search(r"version (\d+\.\d+\.\d+)", shown.stdout + shown.stderr)
    assert promtool is not None, shown.stdout + shown.stderr
    servers = {yaml.safe_load(path.read_text())["spec"]["version"].removesuffix("-distroless")
               for path in REPO.glob("plans/*/rendered/kube-prometheus-stack/prometheus.*.yaml")}
    assert servers, "no rendered Prometheus in plans/"
    readme = " ".join(README.read_text().split())
    assert f"The tests run on promtool {promtool.group(1)} " in readme
    for server in servers:
        assert f"the cluster runs Prometheus {server}." in readme


def test_promtool_check_rules() -> None:
    _run_promtool("check", "rules", *map(str, RULE_FILES))


@pytest.mark.parametrize("test_file", TEST_FILES, ids=lambda path: path.name)
def test_promtool_unit_tests(test_file: Path) -> None:
    _run_promtool("test", "rules", str(test_file))


@pytest.mark.parametrize("rule_file", RULE_FILES, ids=lambda path: path.name)
def test_every_alert_fires_in_one_case_and_stays_silent_in_another(rule_file: Path) -> None:
    cases = [check for test in _tests_for(rule_file) for check in test.get("alert_rule_test", [])]
    for alert in _alerts(rule_file):
        name = alert["alert"]
        checks = [check for check in cases if check["alertname"] == name]
        assert any(check.get("exp_alerts") for check in checks), f"{name}: no test case where it fires"
        assert any(not check.get("exp_alerts") for check in checks), (
            f"{name}: no near-miss case where it is silent"
        )


@pytest.mark.parametrize("rule_file", RULE_FILES, ids=lambda path: path.name)
def test_every_recording_rule_is_evaluated_in_a_test(rule_file: Path) -> None:
    exprs = " ".join(
        check["expr"] for test in _tests_for(rule_file) for check in test.get("promql_expr_test", [])
    )
    for rule in _rules(rule_file):
        if "record" in rule:
            assert re.fullmatch(r"[a-z_]+:[a-z_]+:[a-z_]+", rule["record"]), rule["record"]
            assert rule["record"] in exprs, f"{rule['record']}: not evaluated by any promql_expr_test"


def test_alerts_carry_severity_annotations_and_a_runbook_that_exists() -> None:
    anchors = {_anchor(line.lstrip("#")) for line in README.read_text().splitlines() if line.startswith("#")}
    names: list[str] = []
    for rule_file in RULE_FILES:
        for alert in _alerts(rule_file):
            name = alert["alert"]
            names.append(name)
            assert alert.get("labels", {}).get("severity") in SEVERITIES, name
            annotations = alert.get("annotations", {})
            assert {"summary", "description", "runbook"} <= set(annotations), name
            path, _, anchor = annotations["runbook"].partition("#")
            assert path == "platform/monitoring/README.md", name
            assert anchor == name.lower() and anchor in anchors, f"{name}: README has no section #{anchor}"
    assert len(names) == len(set(names)), "alert names must be unique"
    assert len(names) >= 12


def test_rule_files_fit_the_prometheusrule_crd() -> None:
    # Not jsonschema.validate: its schema self-check rejects the CRD's Go-style inline (?i) regex flags.
    validator = jsonschema.Draft7Validator(json.loads(PROMETHEUS_RULE_SCHEMA.read_text()))
    for rule_file in RULE_FILES:
        document = {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "PrometheusRule",
            "metadata": {"name": rule_file.name.removesuffix(".rules.yaml"), "namespace": "monitoring"},
            "spec": _load(rule_file),
        }
        errors = [
            f"{'/'.join(map(str, error.absolute_path))}: {error.message}"
            for error in validator.iter_errors(document)
        ]
        assert not errors, (rule_file.name, errors)


DASHBOARDS = sorted((REPO / "platform" / "monitoring" / "dashboards").glob("*.json"))


def test_dashboard_queries_are_valid_promql(tmp_path: Path) -> None:
    # promtool parses every panel query once Grafana's variables are replaced by what Grafana would send.
    exprs = [
        target["expr"]
        for path in DASHBOARDS
        for panel in json.loads(path.read_text())["panels"]
        for target in panel.get("targets", [])
    ]
    assert len(exprs) > 30
    rendered = [re.sub(r"\$\{?\w+\}?", ".*", expr.replace("$__rate_interval", "5m")) for expr in exprs]
    rules = {
        "groups": [
            {
                "name": "dashboards",
                "rules": [
                    {"record": f"dashboard:query_{index}:check", "expr": expr}
                    for index, expr in enumerate(rendered)
                ],
            }
        ]
    }
    rule_file = tmp_path / "dashboards.rules.yaml"
    rule_file.write_text(yaml.safe_dump(rules))
    _run_promtool("check", "rules", str(rule_file))


GPU_OPERATOR_VALUES = REPO / "platform" / "gpu-operator" / "values.yaml"


def test_dcgm_service_monitor_keeps_workload_labels_as_exported() -> None:
    # Rules and dashboards find the pod holding a GPU in exported_namespace/exported_pod. With
    # honorLabels true an unallocated GPU's series would instead inherit the exporter pod's own namespace/pod
    # target labels and look allocated to it.
    if not GPU_OPERATOR_VALUES.is_file():
        pytest.fail(f"{GPU_OPERATOR_VALUES} not present")
    service_monitor = _load(GPU_OPERATOR_VALUES)["dcgmExporter"]["serviceMonitor"]
    assert service_monitor.get("honorLabels", False) is False, (
        f"{GPU_OPERATOR_VALUES}: dcgmExporter.serviceMonitor.honorLabels must be false (the default)"
    )
