"""Every AWS resource and call goes through the program's one AWS provider, made from the validated region."""

from __future__ import annotations

import json

import pytest
from owned_stacks import FLEET, Stack, stack_file, stacks_where
from review_support import rendered_stack
from trainyard.plan.recording import Recording
from trainyard.plan.runtime import render


def _provider_urns(recording: Recording, region: str) -> set[str]:
    providers = [r for r in recording.resources if r.type == "pulumi:providers:aws"]
    assert [p.inputs["region"] for p in providers] == [region]
    return {p.urn for p in providers}


def _off_provider(recording: Recording, urns: set[str]) -> list[str]:
    return [r.urn for r in recording.resources if r.type.startswith("aws:") and r.provider not in urns]


@pytest.mark.parametrize("stack", stacks_where(lambda s: s.is_aws))
def test_every_aws_resource_uses_the_stacks_region(stack: Stack) -> None:
    recording = rendered_stack(stack)
    region = json.loads(stack_file(stack).values["trainyard:aws"])["region"]
    assert _off_provider(recording, _provider_urns(recording, region)) == []


def test_another_region_moves_every_resource_with_it() -> None:
    base = stack_file(FLEET)
    aws = json.loads(base.values["trainyard:aws"])
    aws.update(region="eu-west-1", availabilityZones=["eu-west-1a", "eu-west-1b", "eu-west-1c"])
    values = {**base.values, "trainyard:aws": json.dumps(aws)}
    pools = json.loads(values["trainyard:nodePools"])
    for pool in pools:
        pool.pop("zones", None)
        pool["placementGroup"] = False
    values["trainyard:nodePools"] = json.dumps(pools)
    recording = render(type(base)(stack=base.stack, values=values, secret_keys=base.secret_keys))
    assert _off_provider(recording, _provider_urns(recording, "eu-west-1")) == []


@pytest.mark.parametrize("stack", stacks_where(lambda s: not s.is_aws))
def test_a_local_stack_makes_no_aws_provider(stack: Stack) -> None:
    recording = rendered_stack(stack)
    assert recording.resources
    assert not [r for r in recording.resources if r.type.startswith(("aws:", "pulumi:providers:aws"))]
