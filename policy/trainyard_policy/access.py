"""Access hygiene: instance metadata only through IMDSv2 tokens, and no allow-everything IAM statements."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from trainyard_policy.resources import Resource, Violation, kind_of

_POLICY_DOCUMENT_TYPES = frozenset({"aws:iam/rolePolicy:RolePolicy", "aws:iam/policy:Policy",
                                    "aws:iam/userPolicy:UserPolicy", "aws:iam/groupPolicy:GroupPolicy",
                                    "aws:s3/bucketPolicy:BucketPolicy", "aws:sqs/queuePolicy:QueuePolicy",
                                    "aws:kms/key:Key"})
_ADMIN_POLICY_SUFFIX = ":policy/AdministratorAccess"


def imdsv2_required(resources: Sequence[Resource]) -> list[Violation]:
    found = []
    for r in resources:
        if r.type == "aws:ec2/launchTemplate:LaunchTemplate":
            options = r.inputs.get("metadataOptions") or {}
        elif kind_of(r) == "EC2NodeClass":
            options = (r.inputs.get("spec") or {}).get("metadataOptions") or {}
        else:
            continue
        if options.get("httpTokens") != "required":
            found.append(Violation(r.urn, f"metadataOptions.httpTokens is {options.get('httpTokens')!r}, "
                                          "not 'required' (IMDSv2)"))
    return found


def _statements(document: Any) -> Iterator[Mapping[str, Any]]:
    if isinstance(document, str):
        try:
            document = json.loads(document)
        except ValueError:
            return  # a secret or an unknown in preview: nothing to read
    if not isinstance(document, Mapping):
        return
    statements = document.get("Statement") or []
    yield from [statements] if isinstance(statements, Mapping) else statements


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def no_wildcard_iam(resources: Sequence[Resource]) -> list[Violation]:
    found = []
    for r in resources:
        if r.type == "aws:iam/rolePolicyAttachment:RolePolicyAttachment":
            if str(r.inputs.get("policyArn", "")).endswith(_ADMIN_POLICY_SUFFIX):
                found.append(Violation(r.urn, "attaches AdministratorAccess"))
            continue
        if r.type not in _POLICY_DOCUMENT_TYPES:
            continue
        for statement in _statements(r.inputs.get("policy")):
            if statement.get("Effect") != "Allow":
                continue
            if "*" in _as_list(statement.get("Action")) and "*" in _as_list(statement.get("Resource")):
                found.append(Violation(r.urn, "IAM statement allows Action '*' on Resource '*'"))
    return found
