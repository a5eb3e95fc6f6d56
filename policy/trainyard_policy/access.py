"""Access hygiene: instance metadata only through IMDSv2 tokens, and no allow-everything IAM statements."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from trainyard_policy.resources import Resource, Violation, kind_of, metadata
from trainyard_policy.tenancy import TENANT_LABEL

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


_POD_IDENTITY_ASSOCIATION = "aws:eks/podIdentityAssociation:PodIdentityAssociation"
# IAM resolves this to the calling pod's namespace (EKS Pod Identity session tag, on by default:
# docs.aws.amazon.com/eks/latest/userguide/pod-id-abac.html).
NAMESPACE_VARIABLE = "${aws:PrincipalTag/kubernetes-namespace}"
_S3_WRITES = ("s3:*", "s3:put*", "s3:delete*", "s3:putobject", "s3:deleteobject", "s3:deleteobjectversion")


def _writes(actions: list[Any]) -> bool:
    return any(str(a).lower() in _S3_WRITES for a in actions) or "*" in actions


def _object_grants(document: Any) -> Iterator[tuple[str, bool, bool]]:
    """(bucket or '*', writes, scoped to the caller's namespace) per object resource of each Allow statement."""
    for statement in _statements(document):
        if statement.get("Effect") != "Allow":
            continue
        actions = _as_list(statement.get("Action"))
        if not any(str(a).lower().startswith("s3:") or a == "*" for a in actions):
            continue
        for resource in map(str, _as_list(statement.get("Resource"))):
            if resource == "*":
                yield "*", _writes(actions), False
            elif resource.startswith("arn:aws:s3:::") and "/" in resource:
                bucket, _, key = resource.removeprefix("arn:aws:s3:::").partition("/")
                yield bucket, _writes(actions), key.startswith(f"{NAMESPACE_VARIABLE}/")


def _tenant_namespaces(resources: Sequence[Resource]) -> set[str]:
    return {str(metadata(r).get("name")) for r in resources
            if kind_of(r) == "Namespace" and TENANT_LABEL in (metadata(r).get("labels") or {})}


def tenant_objects_scoped(resources: Sequence[Resource]) -> list[Violation]:
    """A role a tenant (or several namespaces) assumes may write to a bucket only under `<bucket>/<own namespace>/`,
    and may then read that bucket only there too: otherwise one tenant reads or deletes another's objects."""
    tenants = _tenant_namespaces(resources)
    namespaces: dict[str, set[str]] = {}
    for r in resources:
        if r.type == _POD_IDENTITY_ASSOCIATION and r.parent:
            namespaces.setdefault(r.parent, set()).add(str(r.inputs.get("namespace")))
    found = []
    for r in resources:
        assumed_by = namespaces.get(r.parent or "", set())
        if r.type != "aws:iam/rolePolicy:RolePolicy" or not (len(assumed_by) > 1 or assumed_by & tenants):
            continue
        grants = list(_object_grants(r.inputs.get("policy")))
        written = {bucket for bucket, writes, _ in grants if writes}
        for bucket in sorted({b for b, _, scoped in grants if not scoped and (b in written or b == "*"
                                                                              or "*" in written)}):
            found.append(Violation(r.urn, f"objects of {bucket!r} are granted to every namespace that assumes this "
                                          f"role; scope them to {bucket}/{NAMESPACE_VARIABLE}/*"))
    return found


# GitHub Actions' OIDC subject claim: `repo:<owner>/<name>:pull_request` for a pull_request job, `...:environment:
# <name>` in an environment (docs.github.com, "About security hardening with OpenID Connect").
_GITHUB_SUBJECT = "token.actions.githubusercontent.com:sub"
_READ_ONLY_POLICIES = frozenset({"arn:aws:iam::aws:policy/job-function/ViewOnlyAccess",
                                 "arn:aws:iam::aws:policy/ReadOnlyAccess"})
# EKS access policies that only read (docs.aws.amazon.com/eks/latest/userguide/access-policy-permissions.html).
_VIEW_ACCESS_POLICIES = frozenset({"arn:aws:eks::aws:cluster-access-policy/AmazonEKSViewPolicy",
                                   "arn:aws:eks::aws:cluster-access-policy/AmazonEKSAdminViewPolicy"})


def _subjects(statement: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """(operator, value) of every condition on GitHub's subject claim in an Allow statement."""
    for operator, conditions in (statement.get("Condition") or {}).items():
        if isinstance(conditions, Mapping) and _GITHUB_SUBJECT in conditions:
            for value in _as_list(conditions[_GITHUB_SUBJECT]):
                yield str(operator), str(value)


def _pull_requests_assume(role: Resource) -> bool:
    """Whether a pull_request job's token (of some repository) satisfies the role's trust: an exact
    `...:pull_request` subject, or a pattern ending in `*` (which admits it)."""
    for statement in _statements(role.inputs.get("assumeRolePolicy")):
        if statement.get("Effect") != "Allow":
            continue
        for operator, value in _subjects(statement):
            if value.endswith(":pull_request") or ("Like" in operator and value.endswith("*")):
                return True
    return False


def preview_read_only(resources: Sequence[Resource]) -> list[Violation]:
    """A role that pull-request code can assume only reads: AWS's read-only managed policies and no inline grant,
    and an EKS access policy that views. Pull requests run unreviewed code, so cluster admin or IAM rights there
    bypass the deploy environment's reviewers."""
    found = []
    for role in (r for r in resources if r.type == "aws:iam/role:Role" and _pull_requests_assume(r)):
        name = str(role.inputs.get("name", role.name))
        for r in resources:
            if r.type == "aws:iam/rolePolicy:RolePolicy" and r.inputs.get("role") == name:
                found.append(Violation(r.urn, f"grants inline permissions to {name}, which pull requests assume"))
            elif r.type == "aws:iam/rolePolicyAttachment:RolePolicyAttachment" and r.inputs.get("role") == name \
                    and r.inputs.get("policyArn") not in _READ_ONLY_POLICIES:
                found.append(Violation(r.urn, f"attaches {r.inputs.get('policyArn')} to {name}, which pull requests "
                                              "assume; only read-only policies may be"))
            elif r.type == "aws:eks/accessPolicyAssociation:AccessPolicyAssociation" \
                    and str(r.inputs.get("principalArn", "")).endswith(f":role/{name}") \
                    and r.inputs.get("policyArn") not in _VIEW_ACCESS_POLICIES:
                found.append(Violation(r.urn, f"gives {name}, which pull requests assume, the cluster access policy "
                                              f"{r.inputs.get('policyArn')}; only a view policy may be"))
    return found
