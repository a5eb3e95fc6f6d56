"""The renders plans/ commits are what Helm renders: every release of every stack rendered with the real Helm, the
local cache and the committed plans both off, against the same stack served from plans/ alone. This is the test
that keeps the committed cache honest (a clean clone plans from it without running Helm)."""

from __future__ import annotations

from pathlib import Path

import pytest
from trainyard.plan.rendering import render_releases
from trainyard.plan.runtime import available_stacks, read_stack, render, settings_of

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.parametrize("stack", available_stacks())
def test_every_committed_render_is_what_helm_renders(stack: str, tmp_path: Path) -> None:
    stack_file = read_stack(stack)
    recording = render(stack_file)
    version = settings_of(stack_file).cluster.kubernetes_version
    helm = render_releases(recording, version, cache_dir=tmp_path / "none", plans=None)
    committed = render_releases(recording, version, cache_dir=tmp_path / "clean-clone", plans=ROOT / "plans")
    assert helm.renders > 0
    assert committed.renders == 0, f"plans/{stack}/ does not hold every render: run `make plans` and commit it"
    assert committed.api_versions == helm.api_versions
    for name, release in helm.releases.items():
        assert committed.releases[name] == release, f"plans/{stack}/rendered/{name} is not what Helm renders"
