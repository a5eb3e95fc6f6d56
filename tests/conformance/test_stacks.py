"""Every stack's rendered objects and Helm values conform to the upstream schemas and chart values."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest
import yaml
from trainyard.config.model import Settings
from trainyard.plan.conformance import Problem, check_helm_values, check_manifest, upstream_dir
from trainyard.plan.recording import SECRET, Recording
from trainyard.plan.runtime import available_stacks, read_stack, render
from trainyard.plan.writers import HELM_RELEASE, is_kubernetes_object, manifest_of, release_of

REPO_ROOT = Path(__file__).resolve().parents[2]
UPSTREAM = upstream_dir(REPO_ROOT)

STACKS = available_stacks()


@cache
def _recording(stack: str) -> Recording:
    return render(read_stack(stack))


def _kubernetes_version(stack: str) -> str:
    # Settings default; every stack file may override it.
    version = read_stack(stack).values.get("trainyard:cluster")
    default = Settings.model_fields["cluster"].default.kubernetes_version
    return str(json.loads(version).get("kubernetesVersion", default)) if version else default


@pytest.mark.parametrize("stack", STACKS)
def test_every_manifest_conforms(stack: str) -> None:
    objects = [manifest_of(r) for r in _recording(stack).resources if is_kubernetes_object(r)]
    assert objects, f"{stack}: no Kubernetes objects rendered"
    version = _kubernetes_version(stack)
    problems = [str(p) for obj in objects for p in check_manifest(obj, version, upstream=UPSTREAM)]
    assert problems == []


@pytest.mark.parametrize("stack", STACKS)
def test_every_helm_release_conforms(stack: str) -> None:
    releases = [release_of(r) for r in _recording(stack).resources if r.type == HELM_RELEASE]
    assert releases, f"{stack}: no Helm releases rendered"
    problems: list[Problem] = [p for release in releases for p in check_helm_values(release, upstream=UPSTREAM)]
    # A release without upstream data is a failure too: tools/upstream.lock.yaml must cover every pinned chart.
    assert [str(p) for p in problems] == []


def test_committed_prod_secret_keeps_its_shape() -> None:
    """The plan masks a secret's leaves, not the whole map: the committed Secret passes the Secret schema."""
    path = REPO_ROOT / "plans" / "prod" / "manifests" / "monitoring.secret.grafana-admin.yaml"
    obj = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert obj["stringData"] == {"admin-user": SECRET, "admin-password": SECRET}
    assert [str(p) for p in check_manifest(obj, _kubernetes_version("prod"), upstream=UPSTREAM)] == []
