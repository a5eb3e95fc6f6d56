"""The chart table's defaults are the charts' own, at the versions the catalogue pins; the merge is Helm's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from trainyard.plan.chart_pods import chart_pod_table, lookup, release_pods
from trainyard.plan.cluster_model import Toleration
from trainyard.plan.conformance import upstream_dir

ROOT = Path(__file__).resolve().parents[2]
CHARTS = upstream_dir(ROOT) / "charts"  # filled by `tools/upstream.py sync`
PINNED = {r["chart"]: str(r["version"]) for r in yaml.safe_load((ROOT / "platform" / "charts.yaml").read_text())[
    "releases"].values()}


def _upstream(chart: str, at: str) -> tuple[dict[str, Any], str]:
    """The values.yaml holding `at` (a subchart's own file when `at` starts with its dependency key)."""
    base = CHARTS / chart / PINNED[chart]
    first = at.split(".", 1)[0]
    if first and (base / "charts" / first / "values.yaml").is_file():
        return yaml.safe_load((base / "charts" / first / "values.yaml").read_text()), at.partition(".")[2]
    return yaml.safe_load((base / "values.yaml").read_text()), at


@pytest.mark.parametrize("chart", sorted(chart_pod_table()))
def test_defaults_match_the_pinned_chart(chart: str) -> None:
    assert chart in PINNED, f"{chart} is not in platform/charts.yaml"
    for pod in chart_pod_table()[chart]:
        values, at = _upstream(chart, pod.at)
        own = lookup(values, at, {}) or {}
        if pod.selector_key:
            assert (own.get(pod.selector_key) or {}) == dict(pod.node_selector), (chart, pod.name)
        assert [Toleration.of(t) for t in own.get(pod.tolerations_key) or ()] == [
            Toleration.of(t) for t in pod.tolerations], (chart, pod.name)
        assert int(own.get(pod.replicas_key, 1) or 1) == pod.replicas, (chart, pod.name)
        if pod.enabled is not None:
            switch, path = _upstream(chart, pod.enabled)
            assert bool(lookup(switch, path, pod.enabled_default)) == pod.enabled_default, (chart, pod.name)


def test_our_values_merge_over_the_chart_defaults() -> None:
    pods = release_pods("cilium", {"operator": {"nodeSelector": {"trainyard.io/role": "system"}, "replicas": 3}})
    assert pods is not None and [p.name for p in pods] == ["cilium-operator"]
    operator = pods[0]
    assert operator.node_selector == {"kubernetes.io/os": "linux", "trainyard.io/role": "system"}
    assert operator.distinct_nodes == 3 and len(operator.tolerations) == 4
    replaced = release_pods("cilium", {"operator": {"tolerations": [{"operator": "Exists"}]}})
    assert replaced is not None and replaced[0].tolerations == (Toleration(operator="Exists"),)
    assert release_pods("something-else", {}) is None


def test_every_catalogued_chart_says_what_its_pods_need() -> None:
    missing = sorted(set(PINNED) - set(chart_pod_table()))
    assert missing == [], "list each chart's pods under its add-on's `pods` in platform/addons.yaml"
