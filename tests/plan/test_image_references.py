"""Images the plan finds beyond container `image` fields: the image sets Ceph CSI's operator runs its drivers with,
and the runtime images Fluid's controllers are given by environment; and tags that move."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from owned_stacks import FLEET, recording
from trainyard.plan.images import is_pinned, unpinned
from trainyard.plan.recording import Recording
from trainyard.plan.rendering import RELEASE, RenderedStack, chart_name, render_releases


def fleet() -> Recording:
    return recording(FLEET)


def _rendered(chart: str, change: Callable[[dict[str, Any]], None]) -> RenderedStack:
    """The fleet's releases with `change` made to the values of `chart`'s."""
    recording = fleet()
    resources = []
    for record in recording.resources:
        if record.type == RELEASE and chart_name(str(record.inputs.get("chart"))) == chart:
            inputs = copy.deepcopy(record.inputs)
            change(inputs["values"])
            record = replace(record, inputs=inputs)
        resources.append(record)
    version = next(str(r.inputs["version"]) for r in resources if r.type == "aws:eks/cluster:Cluster")
    return render_releases(Recording(resources=resources), version)


@pytest.mark.parametrize("tag", ["dev", "devel", "v1.0.0-devel", "stable", "canary", "snapshot", "1.2-develop"])
def test_channel_and_development_tags_move(tag: str) -> None:
    assert not is_pinned(f"quay.io/example/app:{tag}")


def test_a_moving_tag_in_the_ceph_csi_image_set_is_refused() -> None:
    """Rook renders the Ceph CSI images into the ConfigMap the OperatorConfig names as its imageSet."""
    def latest_plugin(values: dict[str, Any]) -> None:
        values.setdefault("csi", {}).setdefault("cephcsi", {})["tag"] = "latest"

    found = unpinned(_rendered("rook-ceph", latest_plugin))
    assert found == ["release rook-ceph: ConfigMap/rook-csi-operator-image-set-configmap data.plugin runs "
                     "quay.io/cephcsi/cephcsi:latest"]


def test_a_moving_runtime_image_given_to_fluid_by_environment_is_refused() -> None:
    def latest_alluxio(values: dict[str, Any]) -> None:
        values.setdefault("runtime", {}).setdefault("alluxio", {}).setdefault("runtime", {})["imageTag"] = "latest"

    found = unpinned(_rendered("fluid", latest_alluxio))
    assert found and all("env[ALLUXIO_RUNTIME_IMAGE_ENV] runs alluxio/alluxio-dev:latest" in line for line in found)
    assert any(line.startswith("release fluid: Deployment/alluxioruntime-controller ") for line in found)
