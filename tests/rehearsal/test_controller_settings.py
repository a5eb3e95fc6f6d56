"""The controller settings the rehearsal's cluster state depends on are read from the rendered objects, as each
controller parses them, not from the values the charts were given: Karpenter's NodeOverlay feature gate from its
Deployment's `--feature-gates`/FEATURE_GATES, Cilium's startup-taint removal from the ConfigMap its operator's
`--config-dir` mounts."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
from owned_stacks import FLEET, planned
from trainyard.names import CILIUM_AGENT_NOT_READY_TAINT_KEY
from trainyard.plan.cluster_state import cluster_state
from trainyard.plan.rendering import RenderedStack
from trainyard.plan.runtime import StackPlan


@pytest.fixture(scope="module")
def fleet() -> StackPlan:
    """The tests' own prod-like AWS stack: Karpenter with NodeOverlays on, Cilium, tainted node groups."""
    return planned(FLEET)


def _edited(rendered: RenderedStack, release: str, change: Callable[[dict[str, Any]], None]) -> RenderedStack:
    objects = tuple(copy.deepcopy(dict(o)) for o in rendered.releases[release].objects)
    for obj in objects:
        change(obj)
    return dataclasses.replace(rendered, releases={**rendered.releases, release: dataclasses.replace(
        rendered.releases[release], objects=objects)})


def _controller_args(*args: str) -> Callable[[dict[str, Any]], None]:
    def change(obj: dict[str, Any]) -> None:
        if obj.get("kind") == "Deployment":
            for container in obj["spec"]["template"]["spec"]["containers"]:
                container["args"] = [*(container.get("args") or []), *args]
    return change


def _operator_config(key: str, value: str) -> Callable[[dict[str, Any]], None]:
    def change(obj: dict[str, Any]) -> None:
        if obj.get("kind") == "ConfigMap" and key in (obj.get("data") or {}):
            obj["data"][key] = value
    return change


def test_the_node_overlay_gate_is_the_one_the_rendered_controller_runs_with(fleet: StackPlan) -> None:
    records = fleet.recording.resources
    assert cluster_state(records, fleet.rendered).overlay_gate is True  # FEATURE_GATES: ...,NodeOverlay=true,...
    # The values still turn it on; a `--feature-gates` flag wins over FEATURE_GATES (options.go).
    off = _edited(fleet.rendered, "karpenter", _controller_args("--feature-gates=NodeOverlay=false"))
    assert cluster_state(records, off).overlay_gate is False
    on = _edited(off, "karpenter", _controller_args("--feature-gates=NodeOverlay=True,NodeRepair=1"))
    assert cluster_state(records, on).overlay_gate is True


def test_the_agent_not_ready_taint_goes_only_while_the_rendered_operator_removes_it(fleet: StackPlan) -> None:
    def tainted(rendered: RenderedStack) -> set[str]:
        return {pool.name for pool in cluster_state(fleet.recording.resources, rendered).pools
                if any(t.key == CILIUM_AGENT_NOT_READY_TAINT_KEY for t in pool.taints)}

    groups = {str(r.inputs.get("nodeGroupName")) for r in fleet.recording.resources
              if r.type == "aws:eks/nodeGroup:NodeGroup"
              and any(t.get("key") == CILIUM_AGENT_NOT_READY_TAINT_KEY for t in r.inputs.get("taints") or ())}
    assert groups  # EKS node groups join tainted until Cilium's agent runs
    assert tainted(fleet.rendered) == set()
    kept = _edited(fleet.rendered, "cilium", _operator_config("remove-cilium-node-taints", "false"))
    assert tainted(kept) == groups  # the values still say true
    yes = _edited(kept, "cilium", _operator_config("remove-cilium-node-taints", "True"))
    assert tainted(yes) == set()
    # Without `patch nodes` (the chart grants it only with operator.removeNodeTaints) the operator cannot remove it.
    denied = _edited(fleet.rendered, "cilium", _without_node_patch)
    assert tainted(denied) == groups


def _without_node_patch(obj: dict[str, Any]) -> None:
    if obj.get("kind") == "ClusterRole":
        for rule in obj.get("rules") or ():
            if "nodes" in (rule.get("resources") or ()):
                rule["verbs"] = [v for v in rule.get("verbs") or () if v != "patch"]
