"""Every AWS resource and call goes through the program's one AWS provider, made from the validated region."""

from __future__ import annotations

import json

import pytest
from review_support import rendered
from trainyard.plan.recording import Recording
from trainyard.plan.runtime import available_stacks, read_stack, render, settings_of

AWS_STACKS = tuple(s for s in available_stacks() if settings_of(read_stack(s)).is_aws)  # as stacks/ holds them


def _provider_urns(recording: Recording, region: str) -> set[str]:
    providers = [r for r in recording.resources if r.type == "pulumi:providers:aws"]
    assert [p.inputs["region"] for p in providers] == [region]
    return {p.urn for p in providers}


def _off_provider(recording: Recording, urns: set[str]) -> list[str]:
    return [r.urn for r in recording.resources if r.type.startswith("aws:") and r.provider not in urns]


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_every_aws_resource_uses_the_stacks_region(stack: str) -> None:
    recording = rendered(stack)
    region = json.loads(read_stack(stack).values["trainyard:aws"])["region"]
    assert _off_provider(recording, _provider_urns(recording, region)) == []


def test_another_region_moves_every_resource_with_it() -> None:
    base = read_stack("staging")
    aws = json.loads(base.values["trainyard:aws"])
    aws.update(region="eu-west-1", availabilityZones=["eu-west-1a", "eu-west-1b", "eu-west-1c"])
    values = {**base.values, "trainyard:aws": json.dumps(aws)}
    pools = json.loads(values["trainyard:nodePools"])
    for pool in pools:
        pool.pop("zones", None)
        pool["placementGroup"] = False
    values["trainyard:nodePools"] = json.dumps(pools)
    recording = render(type(base)(stack="staging", values=values, secret_keys=base.secret_keys))
    assert _off_provider(recording, _provider_urns(recording, "eu-west-1")) == []


def test_the_local_stack_makes_no_aws_provider() -> None:
    assert not [r for r in rendered("local").resources if r.type.startswith(("aws:", "pulumi:providers:aws"))]
