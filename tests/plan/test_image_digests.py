"""An image pulled by digest is the release its tag names (issue 18 item 10).

`repository:tag@digest` is pulled by the digest alone. Karpenter's chart source at tag v1.14.1 is the unstamped tree
(its values carry 1.13.0's tag and digest; aws/karpenter-provider-aws hack/release/common.sh stamps both at
publish), so a plan that pinned only the tag would say 1.14.1 and run 1.13.0.
"""

from __future__ import annotations

import dataclasses

import pytest
import trainyard.__main__ as cli
from owned_stacks import planned
from trainyard.config.release_check import recorded_digests
from trainyard.plan import rendering
from trainyard.plan.images import digest_mismatches, images
from trainyard.plan.recording import Recording, ResourceRecord
from trainyard.plan.rendering import render_releases
from trainyard.plan.runtime import STACKS_DIR, StackPlan, available_stacks

KARPENTER = "public.ecr.aws/karpenter/controller"


def _planned(stack: str) -> StackPlan:
    return planned((stack, STACKS_DIR))


def _karpenter_stack() -> tuple[str, ResourceRecord]:
    for stack in available_stacks():
        for record in _planned(stack).recording.resources:
            if record.type == rendering.RELEASE and rendering.chart_name(str(record.inputs["chart"])) == "karpenter":
                return stack, record
    raise AssertionError("no stack installs Karpenter")


def _karpenter_with(values: dict[str, object]) -> list[str]:
    stack, record = _karpenter_stack()
    changed = dataclasses.replace(record, inputs={**record.inputs, "values": values})
    rendered = render_releases(Recording(resources=[changed]), _planned(stack).settings.cluster.kubernetes_version)
    return digest_mismatches(rendered, recorded_digests())


def test_every_stack_pulls_the_digest_release_data_records_for_its_tag() -> None:
    for stack in available_stacks():
        assert digest_mismatches(_planned(stack).rendered, recorded_digests()) == [], stack


def test_karpenter_renders_tag_and_digest_of_one_release() -> None:
    stack, _ = _karpenter_stack()
    rendered = _planned(stack).rendered.releases["karpenter"]
    (reference,) = {ref for obj in rendered.objects for _, ref in images(obj) if ref.startswith(f"{KARPENTER}:")}
    tag = reference.split("@")[0].rsplit(":", 1)[1]
    assert tag == rendered.version and reference.endswith(f"@{recorded_digests()[KARPENTER][tag]}")


def test_the_chart_default_digest_beside_a_pinned_tag_is_named() -> None:
    # The plan before the digest pin: controller.image.tag 1.14.1 over the tree's 1.13.0 digest.
    _, record = _karpenter_stack()
    values = dict(record.inputs["values"])
    controller = dict(values["controller"])
    controller["image"] = {k: v for k, v in controller["image"].items() if k != "digest"}
    values["controller"] = controller
    (line,) = _karpenter_with(values)
    assert "Deployment/karpenter" in line and recorded_digests()[KARPENTER][controller["image"]["tag"]] in line


def test_a_tag_moved_without_its_digest_is_named() -> None:
    _, record = _karpenter_stack()
    values = dict(record.inputs["values"])
    image = dict(values["controller"]["image"])
    unrecorded = next(v for v in ("1.14.0", "1.13.1", "1.13.0") if v not in recorded_digests()[KARPENTER])
    values["controller"] = {**values["controller"], "image": {**image, "tag": unrecorded}}
    (line,) = _karpenter_with(values)
    assert f"none recorded for tag {unrecorded}" in line


def test_the_plan_refuses_a_digest_release_data_does_not_record(monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    stack, _ = _karpenter_stack()
    monkeypatch.setattr(cli, "recorded_digests", lambda: {KARPENTER: {_planned(stack).rendered.releases[
        "karpenter"].version: "sha256:" + "0" * 64}})
    assert cli.main(["plan", "--stack", stack, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "release data records for their tag" in err and "Deployment/karpenter" in err
