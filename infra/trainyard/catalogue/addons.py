"""The add-on declarations: platform/addons.yaml read, checked against the chart catalogue, in dependency order.

Data only: which charts each add-on installs, the CRD groups they bring, its metrics and what it waits
for. The config layer derives the stack's `addons` section from it; the platform registry (platform/registry.py)
joins each declaration to the code that builds it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml
from pydantic.alias_generators import to_camel, to_pascal, to_snake

from trainyard.catalogue.charts import Catalogue, CatalogueError, load_catalogue

ADDONS_FILE = Path("platform") / "addons.yaml"
# The component of an add-on that names none: its one chart with its values (platform/chart_addon.py).
GENERIC_COMPONENT = "chart_addon"
MONITORING = "monitoring"

_KEYS = frozenset(("charts", "component", "optionalCharts", "crds", "controllers", "needs", "cni", "cniOperator",
                   "serviceMonitors", "scrape", "afterTenants", "switch"))
_SCRAPE_KEYS = frozenset(("name", "selector", "port", "honorLabels", "when"))


@dataclass(frozen=True)
class ScrapeTarget:
    """A Service serving Prometheus metrics that no chart ServiceMonitor covers."""

    name: str
    namespace: str
    selector: Mapping[str, str]
    port: str
    honor_labels: bool = False
    # Values paths of the add-on's first chart that must be on for the Service to exist and serve metrics.
    when: tuple[str, ...] = ()


@dataclass(frozen=True)
class AddonSpec:
    """One entry of platform/addons.yaml (see that file for what each field means)."""

    name: str
    charts: tuple[str, ...]
    # Module of infra/trainyard/platform/ declaring its COMPONENT (GENERIC_COMPONENT when the entry names none).
    component: str = GENERIC_COMPONENT
    optional_charts: frozenset[str] = frozenset()
    crds: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # API group (or `Kind.group` for one kind) -> the rendered workloads that reconcile its custom resources.
    controllers: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    needs: tuple[str, ...] = ()
    cni: bool = False
    # The CNI chart's workload that must run before any node turns Ready (its operator), by rendered name.
    cni_operator: str | None = None
    service_monitors: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    scrape: tuple[ScrapeTarget, ...] = ()
    after_tenants: bool = False
    switch: bool = True

    @property
    def field(self) -> str:
        """The attribute of `Settings.addons` holding its section."""
        return to_snake(self.name)

    @property
    def resource_name(self) -> str:
        return to_snake(self.name).replace("_", "-")

    @property
    def type_name(self) -> str:
        return to_pascal(self.field)

    @property
    def exposes_metrics(self) -> bool:
        return bool(self.service_monitors or self.scrape)


def load_addons(root: Path) -> tuple[AddonSpec, ...]:
    """Read and check `<root>/platform/addons.yaml` against the catalogue, in dependency order: the CNI first,
    every add-on after what it needs (and after monitoring, when it ships ServiceMonitors), ties in file order.
    Cached per process."""
    return _load(root.resolve())


@cache
def _load(root: Path) -> tuple[AddonSpec, ...]:
    catalogue = load_catalogue(root)
    path = root / ADDONS_FILE
    try:
        with path.open(encoding="utf-8") as handle:
            document = yaml.safe_load(handle)
    except FileNotFoundError:
        raise CatalogueError(f"{ADDONS_FILE}: file not found") from None
    if not isinstance(document, dict) or not isinstance(document.get("addons"), dict):
        raise CatalogueError(f"{ADDONS_FILE}: expected a top-level 'addons:' map")
    addons = [_parse(name, entry, catalogue) for name, entry in document["addons"].items()]
    _check_together(addons, catalogue)
    return _dependency_order(addons)


def _parse(name: object, entry: object, catalogue: Catalogue) -> AddonSpec:
    at = f"{ADDONS_FILE}: addons.{name}"
    if not isinstance(name, str) or not name.isidentifier() or to_camel(name) != name:
        raise CatalogueError(f"{at}: an add-on key is its stack switch, in camelCase (such as nodeProblemDetector)")
    if not isinstance(entry, dict):
        raise CatalogueError(f"{at}: expected a map with at least 'charts'")
    unknown = sorted(set(entry) - _KEYS)
    if unknown:
        raise CatalogueError(f"{at}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(_KEYS))}")
    charts = _names(at, "charts", entry.get("charts"))
    if not charts and entry.get("component") is None:
        raise CatalogueError(f"{at}.charts: list at least one release of platform/charts.yaml "
                             "(only an add-on with a component may install no chart)")
    for chart in charts:
        if chart not in catalogue.pins:
            raise CatalogueError(f"{at}.charts: {chart!r} is not a release of platform/charts.yaml "
                                 f"(known: {', '.join(sorted(catalogue.pins))})")
    optional = _names(at, "optionalCharts", entry.get("optionalCharts", []))
    crds = _chart_map(at, "crds", entry.get("crds", {}), charts)
    monitors = _chart_map(at, "serviceMonitors", entry.get("serviceMonitors", {}), charts)
    for key in ("cni", "afterTenants", "switch"):
        if not isinstance(entry.get(key, False), bool):
            raise CatalogueError(f"{at}.{key}: expected true or false")
    operator = entry.get("cniOperator")
    if operator is not None and (not entry.get("cni") or not isinstance(operator, str) or not operator):
        raise CatalogueError(f"{at}.cniOperator: the name of the CNI chart's operator workload, on the CNI only")
    if entry.get("scrape") and not charts:
        raise CatalogueError(f"{at}.scrape: scraped Services live in the namespace of the add-on's first chart; "
                             "an add-on without charts creates its own ServiceMonitors")
    scrape_namespace = catalogue.chart(charts[0]).namespace if charts else ""
    addon = AddonSpec(
        name=name, charts=charts, component=_component(at, entry.get("component"), charts),
        optional_charts=frozenset(optional),
        crds=MappingProxyType(crds),
        controllers=MappingProxyType(_controllers(at, entry.get("controllers", {}), crds)),
        needs=_names(at, "needs", entry.get("needs", [])), cni=entry.get("cni", False), cni_operator=operator,
        service_monitors=MappingProxyType(monitors),
        scrape=tuple(_scrape(f"{at}.scrape[{i}]", target, scrape_namespace)
                     for i, target in enumerate(_list(at, "scrape", entry.get("scrape", [])))),
        after_tenants=entry.get("afterTenants", False), switch=entry.get("switch", True))
    if not set(optional) <= set(charts):
        raise CatalogueError(f"{at}.optionalCharts: only charts of 'charts' can be optional")
    return addon


def _list(at: str, key: str, value: object) -> list[Any]:
    if not isinstance(value, list):
        raise CatalogueError(f"{at}.{key}: expected a list")
    return value


def _names(at: str, key: str, value: object) -> tuple[str, ...]:
    items = _list(at, key, value)
    if not all(isinstance(item, str) and item for item in items):
        raise CatalogueError(f"{at}.{key}: expected a list of names")
    return tuple(items)


def _chart_map(at: str, key: str, value: object, charts: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    if not isinstance(value, dict):
        raise CatalogueError(f"{at}.{key}: expected a map of chart -> list")
    for chart in value:
        if chart not in charts:
            raise CatalogueError(f"{at}.{key}.{chart}: not one of this add-on's charts ({', '.join(charts)})")
    return {chart: _names(f"{at}.{key}", chart, items) for chart, items in value.items()}


def _controllers(at: str, value: object, crds: Mapping[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    if not isinstance(value, dict):
        raise CatalogueError(f"{at}.controllers: expected a map of API group (or Kind.group) -> workload names")
    groups = {group for listed in crds.values() for group in listed}
    for key in value:
        kind, _, rest = str(key).partition(".")
        if (rest if kind[:1].isupper() else str(key)) not in groups:
            raise CatalogueError(f"{at}.controllers.{key}: not an API group of this add-on's crds "
                                 f"({', '.join(sorted(groups)) or 'none'})")
    return {str(key): _names(f"{at}.controllers", str(key), names) for key, names in value.items()}


def _scrape(at: str, target: object, namespace: str) -> ScrapeTarget:
    if not isinstance(target, dict) or not {"name", "selector", "port"} <= set(target) \
            or not set(target) <= _SCRAPE_KEYS:
        raise CatalogueError(f"{at}: expected name, selector, port and optionally honorLabels, when")
    selector = target["selector"]
    if not isinstance(selector, dict) or not selector:
        raise CatalogueError(f"{at}.selector: expected the Service's labels")
    return ScrapeTarget(name=str(target["name"]), namespace=namespace,
                        selector=MappingProxyType({str(k): str(v) for k, v in selector.items()}),
                        port=str(target["port"]), honor_labels=bool(target.get("honorLabels", False)),
                        when=_names(at, "when", target.get("when", [])))


def _component(at: str, module: object, charts: tuple[str, ...]) -> str:
    if module is None:
        if len(charts) != 1:
            raise CatalogueError(f"{at}: an add-on without a component installs exactly one chart")
        return GENERIC_COMPONENT
    if not isinstance(module, str) or not module.isidentifier():
        raise CatalogueError(f"{at}.component: expected a module name of infra/trainyard/platform/")
    return module


def _check_together(addons: list[AddonSpec], catalogue: Catalogue) -> None:
    names = {a.name for a in addons}
    for addon in addons:
        for need in addon.needs:
            if need not in names:
                raise CatalogueError(f"{ADDONS_FILE}: addons.{addon.name}.needs: no add-on {need!r}")
    if sum(a.cni for a in addons) > 1:
        raise CatalogueError(f"{ADDONS_FILE}: at most one add-on is the CNI")
    owners: dict[str, str] = {}
    for addon in addons:
        for chart in addon.charts:
            if chart in owners:
                raise CatalogueError(f"{ADDONS_FILE}: addons.{addon.name}.charts: {chart!r} is already installed "
                                     f"by {owners[chart]}")
            owners[chart] = addon.name
    orphans = sorted(set(catalogue.pins) - set(owners))
    if orphans:
        raise CatalogueError(f"{ADDONS_FILE}: no add-on installs {', '.join(orphans)} of platform/charts.yaml")


def _waits_for(addon: AddonSpec, addons: list[AddonSpec]) -> set[str]:
    """What `addon` is built after: what it needs, the CNI, and monitoring when it ships ServiceMonitors."""
    waits = set(addon.needs)
    if not addon.cni:
        waits |= {a.name for a in addons if a.cni}
    if addon.service_monitors and addon.name != MONITORING:
        waits.add(MONITORING)
    return waits & {a.name for a in addons}


def _dependency_order(addons: list[AddonSpec]) -> tuple[AddonSpec, ...]:
    names = [a.name for a in addons]
    waits = {a.name: _waits_for(a, addons) for a in addons}
    for addon in addons:
        if not addon.after_tenants:
            late = sorted(n for n in addon.needs if next(a for a in addons if a.name == n).after_tenants)
            if late:
                raise CatalogueError(f"{ADDONS_FILE}: addons.{addon.name}.needs {', '.join(late)}, built after the "
                                     "tenants: mark it afterTenants too")
    ordered: list[AddonSpec] = []
    done: set[str] = set()
    while len(ordered) < len(addons):
        ready = [a for a in addons if a.name not in done and waits[a.name] <= done]
        if not ready:
            cycle = sorted(n for n in names if n not in done)
            raise CatalogueError(f"{ADDONS_FILE}: these add-ons wait for each other: {', '.join(cycle)}")
        ordered.append(ready[0])
        done.add(ready[0].name)
    return tuple(ordered)
