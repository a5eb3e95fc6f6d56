"""Every name the program generates obeys its target's documented rules (config/name_rules.py), for the shipped
stacks and for a stack with the longest name the config rules accept: the rules and the generators agree."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import cache
from typing import Any

import pytest
from owned_stacks import FLEET, stack_file
from review_support import STACKS, rendered
from trainyard.config import name_rules
from trainyard.plan.recording import Recording
from trainyard.plan.runtime import render

LONGEST_STACK = "a" * 10  # rules._names: the EventBridge rule names bound the stack name to 10 characters

# Resource type -> (input holding the physical name, the rule it must obey).
AWS_NAMES: dict[str, tuple[str, Callable[[str], str | None]]] = {
    "aws:s3/bucket:Bucket": ("bucket", name_rules.s3_bucket_problem),
    "aws:iam/role:Role": ("name", name_rules.IAM_ROLE.problem),
    "aws:eks/nodeGroup:NodeGroup": ("nodeGroupName", name_rules.EKS_NODE_GROUP.problem),
    "aws:cloudwatch/eventRule:EventRule": ("name", name_rules.EVENTBRIDGE_RULE.problem),
    "aws:sqs/queue:Queue": ("name", name_rules.SQS_QUEUE.problem),
    "aws:eks/cluster:Cluster": ("name", name_rules.EKS_CLUSTER.problem),
}
# Kinds whose names are DNS-1123 labels rather than subdomains (they become DNS names or hostnames).
LABEL_KINDS = frozenset({"Namespace", "Service", "Job"})


@cache
def _longest() -> Recording:
    fleet = stack_file(FLEET)
    return render(type(fleet)(stack=LONGEST_STACK, values=fleet.values, secret_keys=fleet.secret_keys))


def _problems(recording: Recording) -> Iterator[str]:
    for record in recording.resources:
        inputs = record.inputs
        if record.type in AWS_NAMES:
            key, rule = AWS_NAMES[record.type]
            assert isinstance(inputs.get(key), str), f"{record.urn}: no {key}"
            if problem := rule(inputs[key]):
                yield f"{record.urn}: {problem}"
        for tag in (inputs.get("tags") or {}) if record.type.startswith("aws:") else ():
            if problem := name_rules.tag_key_problem(tag):
                yield f"{record.urn}: {problem}"
        if record.type.startswith("kubernetes:") and isinstance(inputs.get("metadata"), dict):
            yield from (f"{record.urn}: {p}" for p in _object_problems(inputs))


def _object_problems(obj: dict[str, Any]) -> Iterator[str]:
    metadata = obj["metadata"]
    name, namespace = metadata.get("name"), metadata.get("namespace")
    rule = name_rules.DNS1123_LABEL if obj.get("kind") in LABEL_KINDS else name_rules.DNS1123_SUBDOMAIN
    if isinstance(name, str) and (problem := rule.problem(name)):
        yield problem
    if isinstance(namespace, str) and (problem := name_rules.DNS1123_LABEL.problem(namespace)):
        yield problem
    for value in (metadata.get("labels") or {}).values():
        if isinstance(value, str) and (problem := name_rules.LABEL_VALUE.problem(value)):
            yield problem


@pytest.mark.parametrize("stack", STACKS)
def test_generated_names_obey_their_rules(stack: str) -> None:
    assert list(_problems(rendered(stack))) == []


def test_the_longest_accepted_stack_name_generates_valid_names() -> None:
    recording = _longest()
    assert any(r.type == "aws:s3/bucket:Bucket" for r in recording.resources)
    assert list(_problems(recording)) == []


def test_the_checks_catch_a_bad_name() -> None:
    assert name_rules.s3_bucket_problem("trainyard-Prod_EU-checkpoints") is not None
    assert name_rules.s3_bucket_problem("192.168.5.4") is not None
    assert name_rules.s3_bucket_problem("x" * 64) is not None
    assert name_rules.EKS_NODE_GROUP.problem("n" * 64) is not None
    assert name_rules.IAM_ROLE.problem("r" * 65) is not None
    assert name_rules.LABEL_VALUE.problem("ml platform") is not None
    assert name_rules.tag_key_problem("aws:cloudformation:stack-name") is not None
    assert name_rules.DNS1123_LABEL.problem("Tenant_A") is not None
