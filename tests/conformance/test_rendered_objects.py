"""What the charts render conforms too: built-in kinds to Kubernetes' schemas, custom resources to the CRDs the
stack's own charts install."""

from __future__ import annotations

import pytest
from owned_stacks import planned
from trainyard.plan.conformance import check_rendered
from trainyard.plan.rendering import RenderedRelease, RenderedStack
from trainyard.plan.runtime import STACKS_DIR, available_stacks

CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.example.com"},
    "spec": {"group": "example.com", "scope": "Namespaced",
             "names": {"kind": "Widget", "plural": "widgets", "singular": "widget", "listKind": "WidgetList"},
             "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                 "type": "object", "properties": {"spec": {"type": "object", "required": ["size"],
                                                           "properties": {"size": {"type": "integer"}}}}}}}]},
}


def _stack(*objects: dict[str, object]) -> RenderedStack:
    return RenderedStack(releases={"demo": RenderedRelease("demo", "demo", "demo", "1.0.0", (CRD, *objects))})


def test_a_custom_resource_is_held_to_the_crd_its_chart_renders() -> None:
    good = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": {"size": 3}}
    bad = {**good, "spec": {"size": "three"}}
    assert check_rendered(_stack(good), "1.34") == []
    (problem,) = check_rendered(_stack(bad), "1.34")
    assert str(problem).startswith("rendered/demo/Widget/w:spec.size: [invalid] 'three' is not of type 'integer'")


def test_a_built_in_object_is_held_to_kubernetes_schema() -> None:
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}, "spec": {"ports": [{"port": "x"}]}}
    (problem,) = check_rendered(_stack(service), "1.34")
    assert str(problem).startswith("rendered/demo/Service/s:spec.ports.0.port: [invalid]")


@pytest.mark.parametrize("stack", available_stacks())
def test_every_rendered_object_conforms(stack: str) -> None:
    plan = planned((stack, STACKS_DIR))
    assert [str(p) for p in check_rendered(plan.rendered, plan.settings.cluster.kubernetes_version)] == []
