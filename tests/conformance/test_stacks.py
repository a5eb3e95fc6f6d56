"""Every stack's rendered objects and Helm values conform to the upstream schemas and chart values."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from owned_stacks import FLEET, Stack, recording, sample_stacks, stack_settings
from trainyard.plan.conformance import Problem, check_helm_values, check_manifest, upstream_dir
from trainyard.plan.recording import SECRET, Recording
from trainyard.plan.runtime import STACKS_DIR
from trainyard.plan.writers import HELM_RELEASE, is_kubernetes_object, manifest_of, release_of

REPO_ROOT = Path(__file__).resolve().parents[2]
UPSTREAM = upstream_dir(REPO_ROOT)

# Every stack of stacks/, as the user has them.
STACKS = [pytest.param(stack, id=stack[0]) for stack in sample_stacks()]


def _recording(stack: Stack) -> Recording:
    return recording(stack)


def _kubernetes_version(stack: Stack) -> str:
    return stack_settings(stack).cluster.kubernetes_version


@pytest.mark.parametrize("stack", STACKS)
def test_every_manifest_conforms(stack: Stack) -> None:
    objects = [manifest_of(r) for r in _recording(stack).resources if is_kubernetes_object(r)]
    assert objects, f"{stack[0]}: no Kubernetes objects rendered"
    version = _kubernetes_version(stack)
    problems = [str(p) for obj in objects for p in check_manifest(obj, version, upstream=UPSTREAM)]
    assert problems == []


@pytest.mark.parametrize("stack", STACKS)
def test_every_helm_release_conforms(stack: Stack) -> None:
    releases = [release_of(r) for r in _recording(stack).resources if r.type == HELM_RELEASE]
    assert releases, f"{stack[0]}: no Helm releases rendered"
    problems: list[Problem] = [p for release in releases for p in check_helm_values(release, upstream=UPSTREAM)]
    # A release without upstream data is a failure too: tools/upstream.lock.yaml must cover every pinned chart.
    assert [str(p) for p in problems] == []


GRAFANA_SECRET = "monitoring.secret.grafana-admin.yaml"


@pytest.mark.parametrize("stack", [pytest.param(FLEET, id="fleet"), *(
    pytest.param(s, id=s[0]) for s in sample_stacks() if stack_settings(s).addons.monitoring.enabled)])
def test_the_grafana_secret_keeps_its_shape(stack: Stack) -> None:
    """The plan masks a secret's leaves, not the whole map: the Secret passes the Secret schema, as rendered (what
    `plan --out` writes) and, for a stack of stacks/, as committed in plans/<stack>."""
    assert stack_settings(stack).addons.monitoring.enabled
    [secret] = [r for r in _recording(stack).resources if is_kubernetes_object(r)
                and manifest_of(r)["kind"] == "Secret" and manifest_of(r)["metadata"]["name"] == "grafana-admin"]
    objects = [manifest_of(secret)]
    if stack[1] == STACKS_DIR:
        objects.append(yaml.safe_load((REPO_ROOT / "plans" / stack[0] / "manifests" / GRAFANA_SECRET)
                                      .read_text(encoding="utf-8")))
    for obj in objects:
        assert obj["stringData"] == {"admin-user": SECRET, "admin-password": SECRET}
        assert [str(p) for p in check_manifest(obj, _kubernetes_version(stack), upstream=UPSTREAM)] == []
