"""The offline plan: faithful to the program, complete, deterministic, and never shows a secret."""

from __future__ import annotations

import filecmp
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from owned_stacks import FLEET, LAPTOP, OWNED_STACKS, Stack, stack_file
from trainyard.plan.recording import SECRET
from trainyard.plan.runtime import available_stacks, plan_stack, read_stack
from trainyard.plan.writers import write_plan

ROOT = Path(__file__).resolve().parents[2]
STACKS = available_stacks()
RESOURCE_KEYS = {"urn", "type", "name", "parent", "provider", "depends_on", "protect", "retain_on_delete",
                 "deleted_with", "replace_on_changes", "delete_before_replace", "custom_timeouts", "inputs"}


def _same_tree(a: Path, b: Path) -> list[str]:
    """Files that differ or exist on one side only."""
    cmp = filecmp.dircmp(a, b)
    diffs = [*cmp.left_only, *cmp.right_only, *cmp.diff_files, *cmp.funny_files]
    _, mismatch, errors = filecmp.cmpfiles(a, b, cmp.common_files, shallow=False)
    diffs += mismatch + errors
    for sub in cmp.common_dirs:
        diffs += [f"{sub}/{d}" for d in _same_tree(a / sub, b / sub)]
    return sorted(set(diffs))


def _assert_complete(tree: Path) -> None:
    """Every resource with every field, in URN order; every manifest an object; every release pinned."""
    resources = json.loads((tree / "resources.json").read_text())
    assert resources == sorted(resources, key=lambda r: r["urn"])
    assert all(set(r) == RESOURCE_KEYS for r in resources)
    for path in (tree / "manifests").glob("*.yaml"):
        obj = yaml.safe_load(path.read_text())
        assert {"apiVersion", "kind", "metadata"} <= set(obj), path.name
    for path in (tree / "helm").glob("*.yaml"):
        release = yaml.safe_load(path.read_text())
        assert set(release) == {"name", "namespace", "chart", "repository", "version", "values"}, path.name
        assert release["version"], path.name


@pytest.mark.parametrize("stack", [FLEET, LAPTOP], ids=[FLEET[0], LAPTOP[0]])
def test_plan_out_is_complete_and_deterministic(stack: Stack, tmp_path: Path) -> None:
    """Two plans of one stack in one process write the same tree (each sample stack's plan is also compared with
    the one committed from another process: test_committed_plan_is_fresh)."""
    first, second = tmp_path / "a", tmp_path / "b"
    planned = plan_stack(stack_file(stack))
    write_plan(planned.recording, first, planned.rendered)
    again = plan_stack(stack_file(stack))
    write_plan(again.recording, second, again.rendered)
    assert _same_tree(first, second) == []
    _assert_complete(first)


def test_plan_cli_runs_the_program_from_the_repository_root(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "trainyard", "plan", "--stack", LAPTOP[0], "--stacks-dir",
                             str(OWNED_STACKS), "--out", str(tmp_path / "out")], capture_output=True, text=True,
                            cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "pulumi:pulumi:Stack" in result.stdout and "Resources:" in result.stdout
    assert (tmp_path / "out" / "resources.json").is_file()


def test_secrets_are_masked_everywhere(tmp_path: Path) -> None:
    clear = "correct-horse-battery-staple"
    stack = stack_file(LAPTOP)
    values = dict(stack.values)
    values["trainyard:grafanaAdminPassword"] = clear
    secret = type(stack)(stack=stack.stack, values=values, secret_keys=("trainyard:grafanaAdminPassword",))
    planned = plan_stack(secret)
    write_plan(planned.recording, tmp_path / "plan", planned.rendered)
    text = "".join(p.read_text() for p in (tmp_path / "plan").rglob("*") if p.is_file())
    assert clear not in text
    assert SECRET in text


@pytest.mark.parametrize("stack", STACKS)
def test_committed_plan_is_fresh(stack: str, tmp_path: Path) -> None:
    """plans/<stack>/ is what reviewers diff in a pull request: it must match the code and stack file."""
    committed = ROOT / "plans" / stack
    assert committed.is_dir(), f"plans/{stack}/ is missing: run `make plans` and commit it"
    planned = plan_stack(read_stack(stack))
    write_plan(planned.recording, tmp_path / stack, planned.rendered)
    _assert_complete(tmp_path / stack)
    stale = _same_tree(tmp_path / stack, committed)
    assert stale == [], f"plans/{stack}/ is stale ({', '.join(stale[:5])}...): run `make plans` and commit it"
