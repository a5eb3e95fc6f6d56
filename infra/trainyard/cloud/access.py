"""Tenant members' way into the cluster: an EKS access entry per IAM principal a stack names for a tenant.

An entry only maps the principal to Kubernetes groups (no EKS access policy): what the group may do is the tenant's
Role in its namespace (platform/tenant_access.py), nothing cluster-wide (EKS user guide, "Create an access entry using
Kubernetes groups"). EKS keeps one entry per principal, so a principal of several tenants gets one entry with all
their groups.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pulumi
import pulumi_aws as aws

from trainyard.config.model import Tenant


def principal_groups(tenants: Sequence[Tenant]) -> dict[str, tuple[str, ...]]:
    """IAM principal ARN -> the groups of every tenant that lists it, in tenant order."""
    groups: dict[str, list[str]] = {}
    for tenant in tenants:
        for arn in tenant.access.principal_arns:
            if tenant.group not in groups.setdefault(arn, []):
                groups[arn].append(tenant.group)
    return {arn: tuple(names) for arn, names in groups.items()}


def entry_name(arn: str) -> str:
    """A logical name that stays with its principal (`<account>-<kind>-<path>-<name>`), so adding or removing one
    principal never renames, and so replaces, another's entry."""
    return re.sub(r"[^A-Za-z0-9-]+", "-", arn.split(":", 4)[-1])


@dataclass(frozen=True)
class TenantAccessArgs:
    cluster_name: pulumi.Input[str]
    principals: Mapping[str, tuple[str, ...]]
    tags: dict[str, str] = field(default_factory=dict)


class TenantAccess(pulumi.ComponentResource):
    """One STANDARD access entry per principal, carrying its tenants' groups."""

    entries: list[aws.eks.AccessEntry]

    def __init__(self, name: str, args: TenantAccessArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("trainyard:cloud:TenantAccess", name, None, opts)
        self.entries = [
            aws.eks.AccessEntry(f"{name}-{entry_name(arn)}", cluster_name=args.cluster_name, principal_arn=arn,
                                type="STANDARD", kubernetes_groups=list(groups), tags=args.tags,
                                opts=pulumi.ResourceOptions(parent=self))
            for arn, groups in sorted(args.principals.items())
        ]
        self.register_outputs({"principals": sorted(args.principals)})
