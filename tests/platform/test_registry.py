"""The add-on registry: platform/addons.yaml checked against the catalogue, its order, and what derives from it
(the stack config model's `addons` section and Pulumi.yaml's description of it)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml
from trainyard.catalogue.addons import MONITORING
from trainyard.catalogue.charts import CatalogueError
from trainyard.config.addons import addons_section
from trainyard.config.load import settings_model
from trainyard.config.model import AddonSettings, AddonSwitch
from trainyard.platform.registry import (
    PROJECT_FILE,
    addons_description,
    load_registry,
    with_addons_description,
)

ROOT = Path(__file__).resolve().parents[2]
REGISTRY = load_registry(ROOT)

CHARTS = """releases:
{releases}"""
RELEASE = """  {name}:
    chart: {name}
    repository: https://charts.example
    version: 1.0.0
    namespace: {name}
"""


def _repo(root: Path, addons: str, releases: tuple[str, ...] = ("one", "two")) -> Path:
    (root / "platform").mkdir(parents=True)
    (root / "platform" / "charts.yaml").write_text(
        CHARTS.format(releases="".join(RELEASE.format(name=name) for name in releases)))
    (root / "platform" / "addons.yaml").write_text(addons)
    return root


def test_repository_registry_covers_the_catalogue() -> None:
    charts = [chart for addon in REGISTRY.addons for chart in addon.charts]
    assert sorted(charts) == sorted(set(charts))  # no chart installed twice
    assert REGISTRY.addons[0].cni, "the CNI comes first"


def test_every_addon_comes_after_what_it_waits_for() -> None:
    position = {addon.name: i for i, addon in enumerate(REGISTRY.addons)}
    for addon in REGISTRY.addons:
        waits = set(addon.needs) | ({MONITORING} if addon.service_monitors and addon.name != MONITORING else set())
        assert all(position[name] < position[addon.name] for name in waits), addon.name


@pytest.mark.parametrize(("addons", "message"), [
    ("addons:\n  one: {charts: [one]}\n", r"no add-on installs two of platform/charts.yaml"),
    ("addons:\n  one: {charts: [one, three]}\n  two: {charts: [two]}\n",
     r"addons\.one\.charts: 'three' is not a release"),
    ("addons:\n  one: {charts: [one, two]}\n", r"addons\.one: an add-on without a component installs exactly one"),
    ("addons:\n  one: {charts: [one], needs: [nope]}\n  two: {charts: [two]}\n", r"needs: no add-on 'nope'"),
    ("addons:\n  one: {charts: [one], needs: [two]}\n  two: {charts: [two], needs: [one]}\n",
     r"wait for each other: one, two"),
    ("addons:\n  one: {charts: [one], component: nope}\n  two: {charts: [two]}\n",
     r"addons\.one\.component: no module infra/trainyard/platform/nope\.py"),
    ("addons:\n  one: {charts: [one], component: kube}\n  two: {charts: [two]}\n", r"declares no COMPONENT"),
    ("addons:\n  one: {charts: [one], sevriceMonitors: {}}\n  two: {charts: [two]}\n",
     r"addons\.one: unknown key\(s\) sevriceMonitors"),
    ("addons:\n  one: {charts: [one], serviceMonitors: {two: [a.enabled]}}\n  two: {charts: [two]}\n",
     r"addons\.one\.serviceMonitors\.two: not one of this add-on's charts"),
    ("addons:\n  one: {charts: [one], scrape: [{name: x, port: metrics}]}\n  two: {charts: [two]}\n",
     r"addons\.one\.scrape\[0\]: expected name, selector, port"),
    ("addons:\n  node-problem-detector: {charts: [one]}\n  two: {charts: [two]}\n", r"in camelCase"),
    ("addons:\n  one: {charts: [one]}\n  two: {charts: [two]}\n  three: {charts: [], component: chart_addon, "
     "scrape: [{name: x, selector: {a: b}, port: metrics}]}\n", r"addons\.three\.scrape: scraped Services live in"),
    ("addons:\n  one: {charts: [one], cni: true}\n  two: {charts: [two], cni: true}\n",
     r"at most one add-on is the CNI"),
    ("addons:\n  one: {charts: [one], crds: {one: [a.example]}, controllers: {b.example: [op]}}\n"
     "  two: {charts: [two]}\n", r"addons\.one\.controllers\.b\.example: not an API group of this add-on's crds"),
    ("addons:\n  one: {charts: [one], crds: {one: [a.example]}, controllers: {Thing.b.example: [op]}}\n"
     "  two: {charts: [two]}\n", r"addons\.one\.controllers\.Thing\.b\.example: not an API group"),
    ("addons:\n  one: {charts: [one], crds: {one: [a.example]}, controllers: {a.example: op}}\n"
     "  two: {charts: [two]}\n", r"addons\.one\.controllers\.a\.example: expected a list"),
    ("addons:\n  one: {charts: [one], cniOperator: op}\n  two: {charts: [two]}\n",
     r"addons\.one\.cniOperator: the name of the CNI chart's operator workload, on the CNI only"),
])
def test_bad_addon_data_is_refused_by_key(tmp_path: Path, addons: str, message: str) -> None:
    with pytest.raises(CatalogueError, match=message):
        load_registry(_repo(tmp_path, addons))


def test_order_puts_the_cni_first_and_needs_before(tmp_path: Path) -> None:
    registry = load_registry(_repo(tmp_path, "addons:\n  one: {charts: [one], needs: [two]}\n"
                                             "  two: {charts: [two]}\n  three: {charts: [three], cni: true}\n",
                                   ("one", "two", "three")))
    assert [a.name for a in registry.addons] == ["three", "two", "one"]


def test_settings_section_is_built_from_the_addon_declarations() -> None:
    section = settings_model().model_fields["addons"].annotation
    assert isinstance(section, type) and issubclass(section, AddonSettings)
    fields = {info.alias: info.annotation for info in section.model_fields.values()}
    typed = {name: info.annotation for name, info in AddonSettings.model_fields.items()}
    assert fields == {addon.name: typed.get(addon.field, AddonSwitch) for addon in REGISTRY.addons if addon.switch}
    assert "karpenter" not in fields  # no stack switch: the cloud layer decides


def test_typed_view_cannot_drift_from_the_declarations() -> None:
    without_cilium = tuple(a for a in REGISTRY.addons if a.name != "cilium")
    with pytest.raises(CatalogueError, match=r"AddonSettings\.cilium is no add-on of platform/addons\.yaml"):
        addons_section(without_cilium)
    switchless = tuple(dataclasses.replace(a, switch=False) if a.name == MONITORING else a for a in REGISTRY.addons)
    with pytest.raises(CatalogueError, match=r"AddonSettings\.monitoring is no add-on .* with a stack switch"):
        addons_section(switchless)


def test_pulumi_yaml_describes_the_registered_addons() -> None:
    text = (ROOT / PROJECT_FILE).read_text()
    description = addons_description(REGISTRY)
    assert yaml.safe_load(text)["config"]["addons"]["description"] == description, (
        "Pulumi.yaml's addons description is stale: run `make plans` (python -m trainyard.platform.registry)")
    assert with_addons_description(text, description) == text
    for addon in REGISTRY.addons:
        assert addon.switch == (addon.name in description), addon.name
