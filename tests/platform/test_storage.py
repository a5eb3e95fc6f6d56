"""Ceph as the cluster would run it: CSI drivers on every node that mounts a volume, OSD lifecycle on instance
store, mon stores and checkpoint snapshots (issue 19 findings 11, 14a, 16-18, 25)."""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest
from trainyard.plan.runtime import read_stack, render
from trainyard.plan.writers import HELM_RELEASE, release_of

CEPH_STACKS = ["prod", "staging", "dev"]
DRIVERS = ("rbd", "cephfs")


@cache
def _values(stack: str, chart: str) -> dict[str, Any]:
    (values,) = [release_of(r)["values"] for r in render(read_stack(stack)).resources
                 if r.type == HELM_RELEASE and release_of(r)["chart"] == chart]
    return values


@pytest.mark.parametrize("stack", CEPH_STACKS)
def test_csi_node_plugins_reach_every_node_and_controllers_run_two(stack: str) -> None:
    """ceph-csi-drivers 1.0.4 renders each Driver CR with its own `nodePlugin.tolerations: []` and
    `controllerPlugin.replicas: 1`, and ceph-csi-operator v1.0.4 mergeDriverSpecs fills only nil fields from the
    OperatorConfig: both must be set per driver, or GPU pods never mount a Ceph volume."""
    values = _values(stack, "ceph-csi-drivers")
    for name in DRIVERS:
        driver = values["drivers"][name]
        assert driver["enabled"] is True
        assert driver["nodePlugin"]["tolerations"] == [{"operator": "Exists"}], name
        assert driver["controllerPlugin"]["replicas"] == 2, name
    # The OperatorConfig defaults cannot carry them (they would never apply).
    defaults = values["operatorConfig"]["driverSpecDefaults"]
    assert "tolerations" not in defaults.get("nodePlugin", {})
    assert "replicas" not in defaults.get("controllerPlugin", {})
