"""`make plan` on a fresh clone installs requirements.txt (through its lock), the trainyard package and the trainer
without its dependencies (Makefile `$(VENV)/.installed`), nothing else: every package the trainyard package
imports, and every trainer module it reaches, must be named there. requirements-dev.txt is the suite's, which
`make plan` never installs.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from collections.abc import Iterator, Mapping
from importlib.metadata import distribution, packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "infra" / "trainyard"
TRAINER = ROOT / "workloads" / "trainyard_train"
_NAME = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)")


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()  # PEP 503


def _runtime_imports(path: Path) -> Iterator[str]:
    """The modules a file imports when it runs (anywhere in it, functions included; not under `if TYPE_CHECKING`)."""
    package = ".".join(path.relative_to(ROOT).parts[1:-1])  # infra/trainyard/plan/x.py -> trainyard.plan
    tree = ast.parse(path.read_text(), str(path))
    guarded = [n for n in ast.walk(tree) if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"]
    skipped = {id(n) for node in guarded for child in node.body for n in ast.walk(child)}
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(part for part in (base, node.module) if part)
            yield module
            if module.startswith("trainyard_train"):  # `from trainyard_train import config` reaches a module
                yield from (f"{module}.{alias.name}" for alias in node.names)


def _trainer_file(module: str) -> Path | None:
    parts = module.split(".")[1:]
    candidate = TRAINER.joinpath(*parts)
    if (candidate / "__init__.py").is_file():
        return candidate / "__init__.py"
    return candidate.with_suffix(".py") if candidate.with_suffix(".py").is_file() else None


def plan_imports() -> dict[str, set[str]]:
    """Third-party module -> the files that import it: all of infra/trainyard, and the trainer modules (with their
    packages' __init__) that it reaches."""
    found: dict[str, set[str]] = {}
    todo = sorted(PACKAGE.rglob("*.py"))
    seen: set[Path] = set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for module in _runtime_imports(path):
            top = module.split(".")[0]
            if top == "trainyard_train":
                for depth in range(1, module.count(".") + 2):
                    reached = _trainer_file(".".join(module.split(".")[:depth]))
                    if reached is not None:
                        todo.append(reached)
            elif top and top != "trainyard" and top not in sys.stdlib_module_names:
                found.setdefault(module, set()).add(str(path.relative_to(ROOT)))
    return found


def _owners(module: str, installed: Mapping[str, list[str]]) -> set[str]:
    """The distributions that hold `module`; of a namespace package (google), only those with the module's files."""
    candidates = installed.get(module.split(".")[0], [])
    if len(candidates) < 2:
        return set(candidates)
    prefix = module.replace(".", "/")
    return {dist for dist in candidates
            if any(str(f).startswith((f"{prefix}/", f"{prefix}.")) for f in distribution(dist).files or ())}


def _distributions() -> dict[str, set[str]]:
    """Distribution -> the modules of it that the plan imports."""
    installed = packages_distributions()
    by_distribution: dict[str, set[str]] = {}
    for module in plan_imports():
        owners = _owners(module, installed)
        assert owners, f"{module}: imported by the trainyard package, installed by nothing here"
        for dist in owners:
            by_distribution.setdefault(_normal(dist), set()).add(module)
    return by_distribution


def _names(requirements: list[str]) -> set[str]:
    return {_normal(m.group(1)) for line in requirements if (m := _NAME.search(line.split("#")[0].strip()))}


def test_the_scan_sees_the_plans_schema_libraries() -> None:
    imported = plan_imports()
    tops = {module.split(".")[0] for module in imported}
    assert {"pulumi", "jsonschema", "kubernetes_validate", "yaml"} <= tops, sorted(tops)
    assert "infra/trainyard/plan/conformance.py" in imported["jsonschema"]
    assert "torch" not in tops  # the trainer's training modules are not reached


def test_requirements_txt_names_everything_the_plan_imports() -> None:
    named = _names((ROOT / "requirements.txt").read_text().splitlines())
    missing = {dist: sorted(modules) for dist, modules in _distributions().items() if dist not in named}
    assert not missing, f"requirements.txt lacks what the plan imports (make plan installs only it): {missing}"


def test_pyproject_lists_what_the_package_imports() -> None:
    declared = _names(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"])
    missing = sorted(set(_distributions()) - declared)
    assert not missing, f"pyproject.toml [project] dependencies lack {missing}"
