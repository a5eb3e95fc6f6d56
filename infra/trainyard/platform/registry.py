"""The add-on registry: platform/addons.yaml read, checked against the catalogue, with each add-on's code, in
dependency order. The platform layer builds from it; the config model's `addons` section and Pulumi.yaml's
description of it are derived from it.
"""

from __future__ import annotations

import dataclasses
import importlib
import textwrap
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pydantic
import yaml
from pydantic.alias_generators import to_camel

from trainyard.config import Settings
from trainyard.config.model import AddonSettings
from trainyard.paths import REPO_ROOT
from trainyard.platform.addon import Addon, AddonCode, ChartPod, ScrapeTarget
from trainyard.platform.catalogue import Catalogue, CatalogueError, load_catalogue

ADDONS_FILE = Path("platform") / "addons.yaml"
PROJECT_FILE = Path("Pulumi.yaml")
_ADDONS_KEY = "\n  addons:\n"
COMPONENT_PACKAGE = "trainyard.platform"
GENERIC_COMPONENT = "chart_addon"
MONITORING = "monitoring"

_KEYS = frozenset(("charts", "component", "optionalCharts", "crds", "needs", "cni", "serviceMonitors", "scrape",
                   "pods", "afterTenants", "switch"))
_SCRAPE_KEYS = frozenset(("name", "selector", "port", "honorLabels", "when"))
# addons.yaml key (camelCase) -> ChartPod field.
_POD_FIELDS = {to_camel(f.name): f.name for f in dataclasses.fields(ChartPod)}


@dataclass(frozen=True)
class Registry:
    # In dependency order: the CNI first, every add-on after what it needs (and after monitoring, when it
    # ships ServiceMonitors), ties in file order.
    addons: tuple[Addon, ...]

    def enabled(self, stack: Settings) -> tuple[Addon, ...]:
        """The add-ons this stack turns on (its switch, and its component's own conditions), in order."""
        return tuple(a for a in self.addons
                     if (not a.switch or getattr(stack.addons, a.field).enabled) and a.code.applies(stack))

    def get(self, name: str) -> Addon:
        return next(a for a in self.addons if a.name == name)

    def owner(self, chart: str) -> Addon:
        """The add-on installing `chart`."""
        return next(a for a in self.addons if chart in a.charts)

    def chart_pods(self) -> dict[str, tuple[ChartPod, ...]]:
        """Release -> the pods a waiting install of it needs (each add-on's `pods`)."""
        return {release: pods for a in self.addons for release, pods in a.pods.items()}

    def crd_owners(self) -> dict[str, str]:
        """CRD API group -> the chart (release) that installs it."""
        return {group: chart for a in self.addons for chart, groups in a.crds.items() for group in groups}


def load_registry(root: Path) -> Registry:
    """Read and check `<root>/platform/addons.yaml` against the catalogue; cached per process."""
    return _load(root.resolve())


@cache
def _load(root: Path) -> Registry:
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
    return Registry(addons=_dependency_order(addons))


def _parse(name: object, entry: object, catalogue: Catalogue) -> Addon:
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
    if entry.get("scrape") and not charts:
        raise CatalogueError(f"{at}.scrape: scraped Services live in the namespace of the add-on's first chart; "
                             "an add-on without charts creates its own ServiceMonitors")
    scrape_namespace = catalogue.chart(charts[0]).namespace if charts else ""
    addon = Addon(
        name=name, charts=charts, code=_code(at, entry.get("component"), charts),
        optional_charts=frozenset(optional),
        crds=MappingProxyType(crds), needs=_names(at, "needs", entry.get("needs", [])), cni=entry.get("cni", False),
        service_monitors=MappingProxyType(monitors),
        scrape=tuple(_scrape(f"{at}.scrape[{i}]", target, scrape_namespace)
                     for i, target in enumerate(_list(at, "scrape", entry.get("scrape", [])))),
        pods=MappingProxyType(_pods(at, entry.get("pods", {}), charts)),
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


def _pods(at: str, value: object, charts: tuple[str, ...]) -> dict[str, tuple[ChartPod, ...]]:
    if not isinstance(value, dict) or not set(value) <= set(charts):
        raise CatalogueError(f"{at}.pods: a map from this add-on's charts ({', '.join(charts)}) to the pods a "
                             "waiting install needs running ([] when Helm waits for none)")
    optional = ", ".join(k for k in _POD_FIELDS if k not in ("name", "at"))
    table = {}
    for chart, pods in value.items():
        parsed = []
        for index, pod in enumerate(_list(at, f"pods.{chart}", pods)):
            if not isinstance(pod, dict) or not {"name", "at"} <= set(pod) or not set(pod) <= set(_POD_FIELDS):
                raise CatalogueError(f"{at}.pods.{chart}[{index}]: expected name, at and optionally {optional}")
            fields = {_POD_FIELDS[key]: item for key, item in pod.items()}
            parsed.append(ChartPod(**{**fields, "tolerations": tuple(fields.get("tolerations") or ())}))
        table[chart] = tuple(parsed)
    return table


def _code(at: str, module: object, charts: tuple[str, ...]) -> AddonCode:
    if module is None:
        if len(charts) != 1:
            raise CatalogueError(f"{at}: an add-on without a component installs exactly one chart")
        module = GENERIC_COMPONENT
    if not isinstance(module, str) or not module.isidentifier():
        raise CatalogueError(f"{at}.component: expected a module name of infra/trainyard/platform/")
    try:
        code = importlib.import_module(f"{COMPONENT_PACKAGE}.{module}").COMPONENT
    except ModuleNotFoundError:
        raise CatalogueError(f"{at}.component: no module infra/trainyard/platform/{module}.py") from None
    except AttributeError:
        raise CatalogueError(f"{at}.component: infra/trainyard/platform/{module}.py declares no COMPONENT") from None
    if not isinstance(code, AddonCode):
        raise CatalogueError(f"{at}.component: {module}.COMPONENT is not an AddonCode")
    return code


def _check_together(addons: list[Addon], catalogue: Catalogue) -> None:
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


def _waits_for(addon: Addon, addons: list[Addon]) -> set[str]:
    """What `addon` is built after: what it needs, the CNI, and monitoring when it ships ServiceMonitors."""
    waits = set(addon.needs)
    if not addon.cni:
        waits |= {a.name for a in addons if a.cni}
    if addon.service_monitors and addon.name != MONITORING:
        waits.add(MONITORING)
    return waits & {a.name for a in addons}


def _dependency_order(addons: list[Addon]) -> tuple[Addon, ...]:
    names = [a.name for a in addons]
    waits = {a.name: _waits_for(a, addons) for a in addons}
    for addon in addons:
        if not addon.after_tenants:
            late = sorted(n for n in addon.needs if next(a for a in addons if a.name == n).after_tenants)
            if late:
                raise CatalogueError(f"{ADDONS_FILE}: addons.{addon.name}.needs {', '.join(late)}, built after the "
                                     "tenants: mark it afterTenants too")
    ordered: list[Addon] = []
    done: set[str] = set()
    while len(ordered) < len(addons):
        ready = [a for a in addons if a.name not in done and waits[a.name] <= done]
        if not ready:
            cycle = sorted(n for n in names if n not in done)
            raise CatalogueError(f"{ADDONS_FILE}: these add-ons wait for each other: {', '.join(cycle)}")
        ordered.append(ready[0])
        done.add(ready[0].name)
    return tuple(ordered)


def settings_section(registry: Registry) -> type[AddonSettings]:
    """The `addons` model: one section per switchable add-on, with the settings type its component declares."""
    switchable = {a.field: a.code.settings for a in registry.addons if a.switch}
    for name, info in AddonSettings.model_fields.items():
        if switchable.get(name) is not info.annotation:
            raise CatalogueError(f"config/model.py: AddonSettings.{name} is typed {info.annotation}, but "
                                 f"{ADDONS_FILE} builds {switchable.get(name)} for it")
    fields: dict[str, Any] = {name: (kind, kind()) for name, kind in switchable.items()}
    section: type[AddonSettings] = pydantic.create_model("AddonSettings", __base__=AddonSettings, **fields)
    return section


def addons_description(registry: Registry) -> str:
    """Pulumi.yaml's description of `addons`, from the registry (`python -m trainyard.platform.registry` writes it;
    tests/platform/test_registry.py keeps the file equal to it)."""
    parts = []
    for addon in registry.addons:
        if not addon.switch:
            continue
        extra = [info.alias or name for name, info in addon.code.settings.model_fields.items() if name != "enabled"]
        parts.append(f"{addon.name} ({', '.join(extra)})" if extra else addon.name)
    return ("One section per add-on of platform/addons.yaml, each with `enabled` (default true) and its settings: "
            + ", ".join(parts) + ".")


def with_addons_description(project_file: str, description: str) -> str:
    """Pulumi.yaml's text with the description of `config.addons` replaced; everything else, comments included, kept."""
    start = project_file.index(_ADDONS_KEY) + len(_ADDONS_KEY)
    end = start
    for line in project_file[start:].splitlines(keepends=True):
        if not line.startswith("    "):
            break
        end += len(line)
    text = textwrap.fill(description, width=118, initial_indent=" " * 6, subsequent_indent=" " * 6)
    return f"{project_file[:start]}    description: >-\n{text}\n{project_file[end:]}"


if __name__ == "__main__":
    project = REPO_ROOT / PROJECT_FILE
    project.write_text(with_addons_description(project.read_text(encoding="utf-8"),
                                               addons_description(load_registry(REPO_ROOT))), encoding="utf-8")
