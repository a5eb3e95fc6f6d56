"""Guards on the repository's shape that the tooling depends on."""

from __future__ import annotations

import ast
import platform
import sysconfig
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "infra" / "trainyard"
# The program's layers, bottom up: each may import the ones below it, never one above (DEVELOPERS.md, Style).
# `program` joins the three resource layers; `plan` runs it offline. The package's small top-level modules (names,
# paths, outputs) sit below them all.
LAYERS = ("catalogue", "config", "cloud", "platform", "workloads", "program", "plan")


def test_platform_folder_never_shadows_the_standard_library() -> None:
    # A package named `platform` on sys.path replaces the stdlib module that uuid, pytest and grpc import.
    assert not (ROOT / "platform" / "__init__.py").exists()
    assert not (ROOT / "platform.py").exists()
    assert not list((ROOT / "platform").glob("*.py"))
    assert Path(platform.__file__).resolve().parent == Path(sysconfig.get_paths()["stdlib"]).resolve()


def test_project_file_points_at_infra_and_stacks() -> None:
    project = yaml.safe_load((ROOT / "Pulumi.yaml").read_text())
    assert project["main"] == "infra/"
    assert project["stackConfigDir"] == "stacks"
    assert (ROOT / "requirements.txt").is_file(), "pulumi install reads requirements.txt beside Pulumi.yaml"
    assert (ROOT / "infra" / "__main__.py").is_file()


def test_every_config_key_is_documented_in_the_project_file() -> None:
    from trainyard.config.load import SECRET_KEYS
    from trainyard.config.model import Settings

    declared = set(yaml.safe_load((ROOT / "Pulumi.yaml").read_text())["config"])
    keys = {f.alias for name, f in Settings.model_fields.items() if name not in ("project", "stack")}
    assert declared == keys | set(SECRET_KEYS)


def test_requirements_are_pinned_exactly() -> None:
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            assert "==" in line, f"requirements.txt: {line!r} is not pinned with =="


def _imported(path: Path) -> set[str]:
    """The trainyard subpackages a module imports, at any depth of its code (imports inside functions too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found |= {name.split(".")[1] for name in names if name.startswith("trainyard.")}
    return found


@pytest.mark.parametrize("layer", LAYERS)
def test_layers_import_only_downwards(layer: str) -> None:
    above = set(LAYERS[LAYERS.index(layer) + 1:])
    modules = sorted((PACKAGE / layer).rglob("*.py")) or [PACKAGE / f"{layer}.py"]
    upward = {f"{path.relative_to(PACKAGE)} -> {target}" for path in modules for target in _imported(path) & above}
    assert not upward, f"{layer} reaches up to a layer above it: {sorted(upward)}"


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The trainyard modules a module imports, at any depth of its code (`from a import b` is a.b when that is a
    module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            found |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                      for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return found & modules


def test_no_module_imports_itself_round_a_circle() -> None:
    """No two modules import each other, directly or through others (an import inside a function included:
    it only postpones the circle)."""
    paths = {_module(p): p for p in PACKAGE.rglob("*.py")}
    graph = {name: _imports(path, set(paths)) - {name} for name, path in paths.items()}
    circles = []
    for start in sorted(graph):
        seen, frontier = set(), list(graph[start])
        while frontier:
            name = frontier.pop()
            if name == start:
                circles.append(start)
                break
            if name not in seen:
                seen.add(name)
                frontier.extend(graph[name])
    assert circles == [], f"modules on an import circle: {circles}"
