"""Grafana dashboards and the metric catalogue: valid JSON, datasource as a variable, known metrics only."""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DASHBOARD_DIR = REPO / "platform" / "monitoring" / "dashboards"
DASHBOARDS = sorted(DASHBOARD_DIR.glob("*.json"))
DCGM_CSV = REPO / "platform" / "gpu-operator" / "dcgm-metrics.csv"
LISTED_METRICS = REPO / "platform" / "monitoring" / "metrics.yaml"
RULE_FILES = sorted((REPO / "platform" / "monitoring" / "rules").glob("*.rules.yaml"))
TRAINER_METRICS_SOURCE = REPO / "workloads" / "trainyard_train" / "metrics.py"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}

# PromQL words that look like metric names but are not.
_KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "inf",
    "nan",
}


def dcgm_fields() -> dict[str, list[str]]:
    rows = [line for line in DCGM_CSV.read_text().splitlines() if line.strip() and not line.startswith("#")]
    return {row[0].strip(): [cell.strip() for cell in row[1:]] for row in csv.reader(rows)}


def recorded_names() -> set[str]:
    return {
        rule["record"]
        for path in RULE_FILES
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
        if "record" in rule
    }


def catalogue() -> set[str]:
    listed = yaml.safe_load(LISTED_METRICS.read_text())
    return set(dcgm_fields()) | {name for names in listed.values() for name in names} | recorded_names()


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects (good enough for the queries in this repository)."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    expr = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    expr = re.sub(r"\$\{?\w+\}?", "", expr)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][\w:]*", expr):
        before = expr[match.start() - 1] if match.start() else " "
        after = expr[match.end() :].lstrip()
        if before.isdigit() or before == "." or after.startswith("(") or match.group().lower() in _KEYWORDS:
            continue
        names.add(match.group())
    return names


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def dashboard_queries(board: dict[str, Any]) -> list[str]:
    queries = [target["expr"] for panel in _panels(board["panels"]) for target in panel.get("targets", [])]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
            match = re.fullmatch(r"label_values\((.+),\s*\w+\)", query)
            assert match, f"{board['uid']}: variable {variable['name']} is not label_values(selector, label)"
            queries.append(match.group(1))
    return queries


def _load(path: Path) -> dict[str, Any]:
    board: dict[str, Any] = json.loads(path.read_text())
    return board


def _datasource_refs(node: Any) -> Iterator[Any]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "datasource":
                yield value
            else:
                yield from _datasource_refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _datasource_refs(item)


# --- dcgm-exporter counters ---------------------------------------------------------------------------------


def test_dcgm_csv_rows_are_field_type_help() -> None:
    rows = [line for line in DCGM_CSV.read_text().splitlines() if line.strip() and not line.startswith("#")]
    names = [line.split(",")[0].strip() for line in rows]
    assert len(names) == len(set(names)), "duplicate DCGM fields"
    for line in rows:
        # dcgm-exporter splits on commas: a comma in the help text would break the row.
        field, kind, help_text = (cell.strip() for cell in line.split(","))
        assert re.fullmatch(r"DCGM_FI_(DEV|PROF)_[A-Z0-9_]+", field), line
        assert kind in {"gauge", "counter"}, line
        assert help_text, line


def test_dcgm_csv_has_the_counters_rules_and_dashboards_need() -> None:
    required = {
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        "DCGM_FI_DEV_XID_ERRORS",
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "DCGM_FI_PROF_SM_ACTIVE",
        "DCGM_FI_PROF_SM_OCCUPANCY",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "DCGM_FI_PROF_NVLINK_TX_BYTES",
        "DCGM_FI_PROF_NVLINK_RX_BYTES",
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "DCGM_FI_PROF_PCIE_RX_BYTES",
    }
    fields = dcgm_fields()
    assert required <= set(fields), required - set(fields)
    # Renamed in DCGM 3.3; only the new name is known to every dcgm-exporter 4.x field table.
    assert "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS" not in fields
    assert fields["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"][0] == "counter"


# --- PromQL metric extraction -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ('sum by (namespace, pod) (rate(foo_total{a="b",c=~"$x"}[5m]))', {"foo_total"}),
        ("floor(bar / 32) % 4 > 0", {"bar"}),
        ('label_replace(baz{x!=""}, "pod", "$1", "exported_pod", "(.+)")', {"baz"}),
        ("time() - a:b:c offset 5m and on (pod) qux == bool 1e3", {"a:b:c", "qux"}),
        ("increase(x[$__rate_interval]) / 3.6e9 or vector(0)", {"x"}),
    ],
)
def test_metric_names_extraction(expr: str, expected: set[str]) -> None:
    assert metric_names(expr) == expected


# --- dashboards ---------------------------------------------------------------------------------------------


def test_expected_dashboards_with_unique_uids_and_titles() -> None:
    boards = [_load(path) for path in DASHBOARDS]
    assert {path.stem for path in DASHBOARDS} == {"gpu-nodes", "gpu-mig", "gpu-jobs", "training"}
    uids = [board["uid"] for board in boards]
    titles = [board["title"] for board in boards]
    assert len(set(uids)) == len(uids) and len(set(titles)) == len(titles)
    for board in boards:
        assert re.fullmatch(r"[a-z0-9-]{1,40}", board["uid"]), board["uid"]
        assert board["schemaVersion"] >= 39, board["uid"]
        assert "id" not in board, f"{board['uid']}: a fixed numeric id clashes across Grafana instances"


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda path: path.name)
def test_datasource_is_a_template_variable(path: Path) -> None:
    board = _load(path)
    variables = {variable["name"]: variable for variable in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    refs = list(_datasource_refs(board["panels"])) + list(_datasource_refs(board["templating"]["list"]))
    assert refs
    assert all(ref == DATASOURCE for ref in refs), [ref for ref in refs if ref != DATASOURCE]


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda path: path.name)
def test_panels_have_unique_ids_and_queries(path: Path) -> None:
    panels = list(_panels(_load(path)["panels"]))
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids))
    for panel in panels:
        assert {"x", "y", "w", "h"} <= set(panel["gridPos"]), panel["title"]
        if panel["type"] != "row":
            assert panel["targets"] and all(target["expr"] for target in panel["targets"]), panel["title"]
            refs = [target["refId"] for target in panel["targets"]]
            assert len(refs) == len(set(refs)), panel["title"]


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda path: path.name)
def test_dashboards_query_only_catalogued_metrics(path: Path) -> None:
    known = catalogue()
    used = {name for query in dashboard_queries(_load(path)) for name in metric_names(query)}
    assert used, path.name
    assert used <= known, f"{path.name} queries metrics nobody exports: {sorted(used - known)}"


def test_mig_dashboard_breaks_down_by_mig_labels() -> None:
    queries = dashboard_queries(_load(DASHBOARD_DIR / "gpu-mig.json"))
    assert any("GPU_I_PROFILE" in query for query in queries)
    legends = json.dumps(_load(DASHBOARD_DIR / "gpu-mig.json")["panels"])
    assert "{{GPU_I_ID}}" in legends and "{{GPU_I_PROFILE}}" in legends


def test_training_dashboard_shows_every_trainer_metric() -> None:
    listed = set(yaml.safe_load(LISTED_METRICS.read_text())["trainer"])
    used = {
        name
        for query in dashboard_queries(_load(DASHBOARD_DIR / "training.json"))
        for name in metric_names(query)
    }
    assert listed <= used, listed - used


# --- rules against the same catalogue -------------------------------------------------------------------------


def test_rules_query_only_catalogued_metrics() -> None:
    known = catalogue()
    exprs = [
        rule["expr"]
        for path in RULE_FILES
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
    ]
    used = {name for expr in exprs for name in metric_names(expr)}
    assert used <= known, sorted(used - known)


def test_listed_trainer_metrics_are_the_ones_the_trainer_exports() -> None:
    if not TRAINER_METRICS_SOURCE.is_file():
        pytest.fail(f"trainer source not found at {TRAINER_METRICS_SOURCE}")
    source = TRAINER_METRICS_SOURCE.read_text()
    for name in yaml.safe_load(LISTED_METRICS.read_text())["trainer"]:
        # prometheus_client appends _total to counters itself.
        assert f'"{name.removesuffix("_total")}"' in source, name


def test_gpu_nodes_dashboard_shows_admission_repair_and_xids() -> None:
    queries = dashboard_queries(_load(DASHBOARD_DIR / "gpu-nodes.json"))
    used = {name for query in queries for name in metric_names(query)}
    assert {"kube_node_spec_taint", "karpenter_nodeclaims_unhealthy_disrupted_total", "kube_node_status_condition",
            "DCGM_FI_DEV_XID_ERRORS"} <= used
    # Both admission taints (platform/gpu-health/gpu-health-check.sh): held and failed.
    assert any('key="trainyard.io/gpu-health"' in query for query in queries)
    assert any('key="trainyard.io/gpu-health-failed"' in query for query in queries)
