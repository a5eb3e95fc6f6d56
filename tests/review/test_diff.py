"""The plan diff: pure comparison over two renders, formatting, and rendering a git ref with its own code."""

from __future__ import annotations

import copy
import dataclasses
import json
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from owned_stacks import OWNED_STACKS, recording
from review_support import REPO_ROOT, STACKS, rendered
from trainyard.config.mig import load_mig_catalog
from trainyard.plan.capacity import pool_capacity
from trainyard.plan.diff import StackRender, changed_paths, diff_stack, format_diff, render_tree
from trainyard.plan.recording import ResourceRecord
from trainyard.plan.runtime import PROJECT, read_stack, render, settings_of

FLEET = read_stack("fleet", OWNED_STACKS)  # the tests' own stack: the edits below name its pools
# A sample stack to render in a fresh interpreter: a local one when stacks/ has one (no cloud layer: quickest).
SAMPLE = next((s for s in STACKS if read_stack(s).values.get(f"{PROJECT}:target") == "local"), STACKS[0])


def _fleet_resources() -> tuple[ResourceRecord, ...]:
    return tuple(recording(("fleet", OWNED_STACKS)).resources)


def fleet() -> StackRender:
    pools = pool_capacity(settings_of(FLEET), load_mig_catalog())
    return StackRender(resources=_fleet_resources(), pools=tuple(pools))


def test_same_render_has_no_changes() -> None:
    assert diff_stack("fleet", fleet(), fleet()).empty


def test_changed_paths_names_nested_keys_and_list_items() -> None:
    before = {"spec": {"replicas": 1, "tasks": [{"image": "a:1"}]}, "values": {"prometheus": {"retention": "15d"}}}
    after = {"spec": {"replicas": 2, "tasks": [{"image": "a:2"}]}, "values": {"prometheus": {"retention": "30d"}}}
    assert changed_paths(before, after) == ["spec.replicas", "spec.tasks[0].image", "values.prometheus.retention"]


def test_added_changed_and_removed_resources() -> None:
    base = fleet()
    resources = list(base.resources)
    release = next(r for r in resources if r.type == "kubernetes:helm.sh/v3:Release")
    inputs = copy.deepcopy(release.inputs)
    inputs["version"] = "0.0.1-test"
    removed = resources.pop(0)
    added = dataclasses.replace(resources[0], urn=resources[0].urn + "-copy")
    resources = [dataclasses.replace(r, inputs=inputs, protect=not r.protect) if r.urn == release.urn else r
                 for r in resources] + [added]
    diff = diff_stack("fleet", base, dataclasses.replace(base, resources=tuple(resources)))
    assert diff.added == (added.urn,)
    assert diff.removed == (removed.urn,)
    assert diff.changed == {release.urn: ("version", "options.protect")}


def test_pool_deltas_and_cost() -> None:
    base = fleet()
    gpu = next(p for p in base.pools if p.gpus_per_node)
    grown = dataclasses.replace(gpu, desired_nodes=gpu.desired_nodes + 2)
    head = dataclasses.replace(base, pools=tuple(grown if p.name == gpu.name else p for p in base.pools))
    diff = diff_stack("fleet", base, head)
    [delta] = diff.pools
    assert (delta.name, delta.nodes, delta.gpus, delta.slices) == (
        gpu.name, 2, 2 * gpu.gpus_per_node, 2 * gpu.slices_per_node)
    assert diff.hourly_usd == pytest.approx(2 * gpu.hourly_usd_per_node)
    assert diff.monthly_usd == pytest.approx(2 * gpu.hourly_usd_per_node * 730)
    text = format_diff([diff], "markdown", "origin/main")
    assert f"| {gpu.name} | +2 | +{2 * gpu.gpus_per_node} |" in text
    assert "## trainyard plan diff against `origin/main`" in text


def test_new_stack_is_all_additions() -> None:
    diff = diff_stack("fleet", StackRender(exists=False), fleet())
    assert len(diff.added) == len(fleet().resources) and not diff.removed
    assert sum(p.nodes for p in diff.pools) == sum(p.desired_nodes for p in fleet().pools)


def test_render_tree_uses_the_trees_own_code(tmp_path: Path) -> None:
    # A tree without infra/trainyard must not silently fall back to the installed (working tree) package.
    (tmp_path / "infra").mkdir()
    with pytest.raises(RuntimeError, match="not from"):
        render_tree(tmp_path, ["local"])


def test_render_tree_matches_in_process_render() -> None:
    [(name, render)] = render_tree(REPO_ROOT, [SAMPLE]).items()
    assert name == SAMPLE
    # Registration order varies with the event loop; the diff keys by URN, so compare in URN order.
    def as_json(resources: Iterable[ResourceRecord]) -> list[dict[str, Any]]:
        return [r.as_json() for r in sorted(resources, key=lambda r: r.urn)]

    assert as_json(render.resources) == as_json(rendered(SAMPLE).resources)


def _render_edited(edit: Any) -> StackRender:
    """The fleet rendered with its nodePools edited in the stack file, as a reviewer's change would."""
    stack = FLEET
    pools = json.loads(stack.values["trainyard:nodePools"])
    edit({p["name"]: p for p in pools})
    edited = dataclasses.replace(stack, values={**stack.values, "trainyard:nodePools": json.dumps(pools)})
    capacity = pool_capacity(settings_of(edited), load_mig_catalog())
    return StackRender(resources=tuple(render(edited).resources), pools=tuple(capacity))


def test_stack_edit_of_pool_size_and_mig_layout_shows_resources_gpus_slices_and_cost() -> None:
    def edit(pools: dict[str, dict[str, Any]]) -> None:
        pools["h100"]["desiredSize"] += 2  # 2 more p5 nodes: 16 GPUs
        pools["h100"]["maxSize"] += 2  # raises the NodePool's GPU limit
        pools["h100-mig"]["migLayout"] = "balanced"  # 3 slices per GPU become 4

    diff = diff_stack("fleet", fleet(), _render_edited(edit))
    node_pools = {urn.rsplit("::", 1)[-1]: paths for urn, paths in diff.changed.items()
                  if "karpenter.sh/v1:NodePool" in urn}
    assert "spec.limits.nvidia.com/gpu" in node_pools["karpenter-h100-nodepool"]
    assert "spec.template.metadata.labels.nvidia.com/mig.config" in node_pools["karpenter-h100-mig-nodepool"]
    deltas = {d.name: d for d in diff.pools}
    p5 = next(p for p in fleet().pools if p.name == "h100")
    assert (deltas["h100"].nodes, deltas["h100"].gpus, deltas["h100"].slices) == (2, 16, 0)
    assert deltas["h100"].hourly_usd == pytest.approx(2 * p5.hourly_usd_per_node)
    assert (deltas["h100-mig"].nodes, deltas["h100-mig"].gpus, deltas["h100-mig"].slices) == (0, 0, 8 * (4 - 3))
    assert diff.hourly_usd == pytest.approx(2 * p5.hourly_usd_per_node)
    text = format_diff([diff], "markdown", "HEAD")
    assert "| h100 | +2 | +16 |" in text and "karpenter-h100-mig-nodepool" in text


# ---- a base the diff cannot render is one message naming it ---------------------------------------------------------

def _tree(tmp_path: Path, runtime: str) -> Path:
    """A checkout whose trainyard package has `runtime` as trainyard/plan/runtime.py."""
    plan = tmp_path / "base" / "infra" / "trainyard" / "plan"
    plan.mkdir(parents=True)
    (plan.parent / "__init__.py").write_text("")
    (plan / "__init__.py").write_text("")
    (plan / "runtime.py").write_text(runtime)
    return tmp_path / "base"


@pytest.mark.parametrize(("runtime", "shown"), [
    ("def available_stacks(): return ['dev']\n", "ImportError"),  # older than the plan API (the first commit)
    ("raise ZeroDivisionError('its own bug')\n", "ZeroDivisionError: its own bug"),
    ("import sys\nprint('not json'); sys.exit(0)\n", "Expecting value"),  # exits 0 with no render
])
def test_a_base_that_cannot_be_rendered_is_named_not_traced(tmp_path: Path, runtime: str, shown: str) -> None:
    root = _tree(tmp_path, runtime)
    with pytest.raises(ValueError, match=r"--base abc123: `trainyard diff` cannot render this revision") as raised:
        render_tree(root, ["dev"], revision="abc123")
    assert shown in str(raised.value) and "Traceback" not in str(raised.value)


def test_a_base_with_a_link_out_of_its_tree_is_refused(tmp_path: Path) -> None:
    from trainyard.plan.diff import checkout
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "escape").symlink_to("/etc")
    git = ["git", "-c", "user.email=t@example.invalid", "-c", "user.name=t", "-C", str(repo)]
    for args in (["init", "-q"], ["add", "escape"], ["commit", "-q", "-m", "link"]):
        subprocess.run([*git, *args], check=True, capture_output=True)
    with pytest.raises(ValueError, match="--base HEAD: its files cannot be unpacked safely"), checkout(repo, "HEAD"):
        pass
