"""Every regular expression that checks a value checks all of it: `fullmatch`, never `match` or `$`.

`re.match(r"^[a-z]+$", "ml\\n")` matches: `$` accepts a final newline, so a check written that way lets
"research\\n", a label "ml\\n" or an image "...:latest\\n" through. This test walks every pattern the program, the
trainer, the policy pack and the tools compile, builds a string each accepts, and requires that the same string
with a newline appended is refused; and it reads every Python file for a `.match(` call or a `$` anchor.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from tool_scripts import load_tool

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "policy") not in sys.path:  # the policy pack is not installed; its own __main__ adds the same path
    sys.path.insert(0, str(ROOT / "policy"))
PACKAGES = ("trainyard", "trainyard_train", "trainyard_policy")
TOOLS = sorted(p.stem for p in (ROOT / "tools").glob("*.py"))
SOURCES = sorted(p for folder in ("infra", "workloads", "policy", "tools", "bench", "tests")
                 for p in (ROOT / folder).rglob("*.py"))
# The policy pack's entry module needs pulumi_policy, which only `pulumi policy` installs (it compiles no pattern;
# the source walk below still reads it).
NOT_IMPORTABLE = {"trainyard_policy.pack"}
# Patterns that find text inside a document (a changelog, an HTML table, a Dockerfile) rather than check a value;
# they are only ever used with search/finditer, which the source walk below confirms.
SCANNERS = {"trainyard.config.release_check._FROM", "trainyard_tool_refresh_releases._AMI_RELEASE",
            "trainyard_tool_refresh_releases._K8S_BLOCK", "trainyard_tool_refresh_releases._RELEASE_VERSION",
            "trainyard_tool_upstream._MIG",
            # finds a `kubectl taint ... key-` line inside a DaemonSet's command or mounted script
            "trainyard.plan.rules.startup_taints._TAINT_REMOVAL"}


def _modules() -> Iterator[ModuleType]:
    for package in PACKAGES:
        root = importlib.import_module(package)
        yield root
        for info in pkgutil.walk_packages(root.__path__, prefix=f"{package}."):
            if info.name.endswith("__main__") or info.name in NOT_IMPORTABLE:
                continue
            yield importlib.import_module(info.name)
    for tool in TOOLS:
        yield load_tool(tool)


def _patterns_in(name: str, value: Any) -> Iterator[tuple[str, re.Pattern[str]]]:
    if isinstance(value, re.Pattern) and isinstance(value.pattern, str):
        yield name, value
    elif isinstance(getattr(value, "pattern", None), re.Pattern):
        yield f"{name}.pattern", value.pattern
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _patterns_in(f"{name}[{key!r}]", item)
    elif isinstance(value, tuple | list | frozenset):
        for i, item in enumerate(value):
            yield from _patterns_in(f"{name}[{i}]", item)


def all_patterns() -> dict[str, re.Pattern[str]]:
    found: dict[str, re.Pattern[str]] = {}
    for module in _modules():
        for attr, value in vars(module).items():
            for name, pattern in _patterns_in(f"{module.__name__}.{attr}", value):
                if not any(pattern is p for p in found.values()):
                    found[name] = pattern
    return found


PATTERNS = all_patterns()
CHECKS = {name: p for name, p in PATTERNS.items() if name.split("[")[0] not in SCANNERS}

# --- a string each pattern accepts, built from its parse tree ----------------------------------------------------

_parser: Any = sys.modules.get("re._parser") or importlib.import_module("sre_parse")
_constants: Any = sys.modules.get("re._constants") or importlib.import_module("sre_constants")
_CATEGORY = {"CATEGORY_DIGIT": "0", "CATEGORY_WORD": "a", "CATEGORY_SPACE": " ", "CATEGORY_NOT_SPACE": "a",
             "CATEGORY_NOT_DIGIT": "a", "CATEGORY_NOT_WORD": "-"}


def _char(items: list[tuple[Any, Any]]) -> str:
    """One character of a character class."""
    negate = any(str(op) == "NEGATE" for op, _ in items)
    if negate:
        pattern = re.compile("[" + "".join(_member(op, v) for op, v in items) + "]")
        return next(c for c in "azAZ09_-./ !#" if pattern.fullmatch(c))
    op, value = next((op, v) for op, v in items if str(op) != "NEGATE")
    if str(op) == "LITERAL":
        return chr(value)
    if str(op) == "RANGE":
        return chr(value[0])
    return _CATEGORY[str(value)]


def _member(op: Any, value: Any) -> str:
    """One member of a parsed character class, written back as regex text."""
    kind = str(op)
    if kind == "NEGATE":
        return "^"
    if kind == "LITERAL":
        return re.escape(chr(value))
    if kind == "RANGE":
        return f"{re.escape(chr(value[0]))}-{re.escape(chr(value[1]))}"
    return {"CATEGORY_DIGIT": r"\d", "CATEGORY_WORD": r"\w", "CATEGORY_SPACE": r"\s", "CATEGORY_NOT_SPACE": r"\S",
            "CATEGORY_NOT_DIGIT": r"\D", "CATEGORY_NOT_WORD": r"\W"}[str(value)]


def sample(tree: Any, groups: dict[int, str] | None = None) -> str:
    """A string the parsed pattern `tree` accepts (lookarounds are not taken into account)."""
    groups = {} if groups is None else groups
    out = ""
    for op, value in tree:
        kind = str(op)
        if kind == "LITERAL":
            out += chr(value)
        elif kind == "NOT_LITERAL":
            out += "a" if chr(value) != "a" else "b"
        elif kind == "ANY":
            out += "a"
        elif kind == "IN":
            out += _char(value)
        elif kind in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            low, _high, sub = value
            out += sample(sub, groups) * max(low, 1)
        elif kind == "BRANCH":
            out += sample(value[1][0], groups)
        elif kind == "SUBPATTERN":
            text = sample(value[-1], groups)
            if value[0] is not None:
                groups[value[0]] = text
            out += text
        elif kind == "GROUPREF":
            out += groups[value]
        elif kind in ("AT", "ASSERT", "ASSERT_NOT"):
            continue
        else:
            raise AssertionError(f"no sample for regex node {kind}")
    return out


def accepted(pattern: re.Pattern[str]) -> str:
    text = sample(_parser.parse(pattern.pattern, pattern.flags))
    assert pattern.fullmatch(text), f"the sample {text!r} does not match {pattern.pattern!r}"
    return text


def test_the_walk_finds_the_checks_it_must_cover() -> None:
    from trainyard.config import name_rules
    from trainyard.plan import runtime
    from trainyard_policy import pinning
    from trainyard_train import checkpoint
    checks = list(CHECKS.values())
    for expected in (name_rules.DNS1123_LABEL.pattern, name_rules.IMAGE_REFERENCE, name_rules.IAM_PRINCIPAL_ARN,
                     runtime._STACK_NAME, checkpoint._STEP_DIR, pinning._EXACT_VERSION,
                     load_tool("upstream")._SHA256):
        assert any(expected is p for p in checks), expected.pattern
    assert len(checks) >= 30


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_a_trailing_newline_is_refused(name: str) -> None:
    pattern = CHECKS[name]
    text = accepted(pattern)
    assert pattern.fullmatch(text + "\n") is None, f"{name} accepts {text + chr(10)!r}"
    assert "$" not in pattern.pattern.replace("\\$", ""), f"{name}: drop the '$' anchor, the check is a fullmatch"


@pytest.mark.parametrize("path", SOURCES, ids=[str(p.relative_to(ROOT)) for p in SOURCES])
def test_no_check_uses_match_or_a_dollar_anchor(path: Path) -> None:
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "match":
            found.append(f"line {node.lineno}: .match( (use .fullmatch, or .search to find text)")
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "compile"
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "re" and node.args
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            flags = ast.unparse(node.args[1]) if len(node.args) > 1 else ""
            if node.args[0].value.endswith("$") and "M" not in flags:
                found.append(f"line {node.lineno}: a pattern ending in '$' (use fullmatch)")
    assert found == []
