"""The add-on registry: each declaration of platform/addons.yaml (trainyard.catalogue.addons) joined to the code
that builds it, in dependency order. The platform layer builds from it; Pulumi.yaml's description of the stack's
`addons` section is written from it.
"""

from __future__ import annotations

import importlib
import textwrap
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from trainyard.catalogue.addons import ADDONS_FILE, AddonSpec, load_addons
from trainyard.catalogue.charts import CatalogueError
from trainyard.config import Settings
from trainyard.config.addons import addon_settings
from trainyard.paths import REPO_ROOT
from trainyard.platform.addon import Addon, AddonCode

PROJECT_FILE = Path("Pulumi.yaml")
_ADDONS_KEY = "\n  addons:\n"
COMPONENT_PACKAGE = "trainyard.platform"


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

    def crd_owners(self) -> dict[str, str]:
        """CRD API group -> the chart (release) that installs it."""
        return {group: chart for a in self.addons for chart, groups in a.crds.items() for group in groups}


def load_registry(root: Path) -> Registry:
    """`<root>/platform/addons.yaml` with each add-on's code; cached per process."""
    return _load(root.resolve())


@cache
def _load(root: Path) -> Registry:
    return Registry(addons=tuple(Addon.of(spec, _code(spec)) for spec in load_addons(root)))


def _code(spec: AddonSpec) -> AddonCode:
    at = f"{ADDONS_FILE}: addons.{spec.name}.component"
    try:
        code = importlib.import_module(f"{COMPONENT_PACKAGE}.{spec.component}").COMPONENT
    except ModuleNotFoundError:
        raise CatalogueError(f"{at}: no module infra/trainyard/platform/{spec.component}.py") from None
    except AttributeError:
        raise CatalogueError(f"{at}: infra/trainyard/platform/{spec.component}.py declares no COMPONENT") from None
    if not isinstance(code, AddonCode):
        raise CatalogueError(f"{at}: {spec.component}.COMPONENT is not an AddonCode")
    return code


def addons_description(registry: Registry) -> str:
    """Pulumi.yaml's description of `addons`, from the registry (`python -m trainyard.platform.registry` writes it;
    tests/platform/test_registry.py keeps the file equal to it)."""
    settings = addon_settings(registry.addons)
    parts = []
    for addon in registry.addons:
        if not addon.switch:
            continue
        fields = settings[addon.field].model_fields
        extra = [info.alias or name for name, info in fields.items() if name != "enabled"]
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
