"""The policy pack over what the cluster receives: our resources and every object the Helm releases render.

CrossGuard sees a Helm release as one resource (its chart, version and values), so a pod a chart renders with an
unpinned image or a GPU-selecting environment passes `pulumi preview --policy-pack` unseen. Here each rendered
object becomes a resource of its own, child of its release, typed as the Kubernetes provider types it.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from functools import cache
from typing import Any

import pytest
from owned_stacks import planned
from review_support import STACKS
from trainyard.plan.recording import ResourceRecord
from trainyard.plan.rendering import RELEASE, RenderedRelease
from trainyard.plan.runtime import STACKS_DIR
from trainyard_policy.isolation import GPU_ENV
from trainyard_policy.resources import Resource, from_record, pod_specs
from trainyard_policy.rules import evaluate


def type_token(obj: Mapping[str, Any]) -> str:
    """`kubernetes:<group>/<version>:<Kind>`, the core group named `core` (pulumi-kubernetes type tokens)."""
    api = str(obj.get("apiVersion", ""))
    return f"kubernetes:{api if '/' in api else f'core/{api}'}:{obj.get('kind')}"


def chart_resource(release: RenderedRelease, record: ResourceRecord, obj: Mapping[str, Any]) -> Resource:
    """A rendered object as a child of its release; it lives and dies with the release, so it is protected
    exactly when the release is."""
    meta = obj.get("metadata") or {}
    name = f"{meta.get('namespace') or release.namespace}/{meta.get('name')}"
    return Resource(urn=f"{record.urn}/{obj.get('kind')}/{name}", type=type_token(obj), name=name,
                    inputs=copy.deepcopy(dict(obj)), protect=record.protect, parent=record.urn)


@cache
def _views(stack: str) -> tuple[tuple[Resource, ...], tuple[Resource, ...]]:
    """(our resources, the rendered objects) of a stack."""
    plan = planned((stack, STACKS_DIR))
    releases = {str(r.inputs.get("name", r.name)): r for r in plan.recording.resources if r.type == RELEASE}
    charts = (chart_resource(release, releases[name], obj)
              for name, release in plan.rendered.releases.items() for obj in release.objects)
    return tuple(from_record(r) for r in plan.recording.resources), tuple(charts)


def views(stack: str) -> tuple[list[Resource], list[Resource]]:
    ours, charts = _views(stack)
    return list(ours), [dataclasses.replace(r, inputs=copy.deepcopy(r.inputs)) for r in charts]


def _containers(resource: Resource) -> list[dict[str, Any]]:
    return [c for pod in pod_specs(resource.inputs) for key in ("initContainers", "containers")
            for c in pod.get(key) or []]


@pytest.mark.parametrize("stack", STACKS)
def test_every_rule_passes_on_the_stack_with_its_rendered_objects(stack: str) -> None:
    ours, charts = views(stack)
    assert charts
    violations = {name: [str(v) for v in found] for name, found in evaluate(ours + charts).items() if found}
    assert violations == {}


def _plain(container: Mapping[str, Any]) -> bool:
    """Neither privileged nor adding a capability."""
    context = container.get("securityContext") or {}
    return not context.get("privileged") and not (context.get("capabilities") or {}).get("add")


def _unprivileged_chart_pod(stack: str) -> tuple[list[Resource], Resource]:
    ours, charts = views(stack)
    for r in charts:
        if _containers(r) and all(_plain(c) for c in _containers(r)):
            return ours + charts, r
    pytest.fail(f"{stack}: no chart renders a pod whose containers are all unprivileged")


@pytest.mark.parametrize("stack", STACKS[:1])
def test_a_chart_container_on_a_moving_tag_is_named(stack: str) -> None:
    resources, resource = _unprivileged_chart_pod(stack)
    for container in _containers(resource):
        container["image"] = str(container["image"]).split("@")[0].rsplit(":", 1)[0] + ":latest"
    assert resource.urn in {v.urn for v in evaluate(resources)["images-pinned"]}


@pytest.mark.parametrize("stack", STACKS[:1])
def test_a_chart_container_that_names_gpus_in_its_environment_is_named(stack: str) -> None:
    resources, resource = _unprivileged_chart_pod(stack)
    for container in _containers(resource):
        container.setdefault("env", []).append({"name": GPU_ENV, "value": "all"})
    assert resource.urn in {v.urn for v in evaluate(resources)["gpu-env-closed"]}
