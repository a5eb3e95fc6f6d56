"""Every tenant namespace is closed by default and has a Volcano queue (checked over the whole stack)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from trainyard_policy.resources import Resource, Violation, kind_of, metadata

TENANT_LABEL = "trainyard.io/tenant"
_BOTH = {"Ingress", "Egress"}


def _selects_all(spec: Mapping[str, Any], key: str) -> bool:
    return key in spec and spec[key] in ({}, None)


def is_default_deny(resource: Resource) -> bool:
    """A policy that selects every pod of its namespace in both directions: only what it allows gets through.

    (A Cilium policy that selects an endpoint turns on default deny for each direction it has rules for.)"""
    spec = resource.inputs.get("spec") or {}
    kind = kind_of(resource)
    if kind == "NetworkPolicy":
        return _selects_all(spec, "podSelector") and set(spec.get("policyTypes") or []) >= _BOTH
    if kind == "CiliumNetworkPolicy":
        directions = {"Ingress" for k in ("ingress", "ingressDeny") if k in spec}
        directions |= {"Egress" for k in ("egress", "egressDeny") if k in spec}
        return _selects_all(spec, "endpointSelector") and directions == _BOTH
    return False


def tenants_isolated(resources: Sequence[Resource]) -> list[Violation]:
    namespaces = {str(metadata(r).get("name")): r for r in resources
                  if kind_of(r) == "Namespace" and TENANT_LABEL in (metadata(r).get("labels") or {})}
    denied = {metadata(r).get("namespace") for r in resources if is_default_deny(r)}
    queued = {(metadata(r).get("labels") or {}).get(TENANT_LABEL) for r in resources
              if kind_of(r) in ("Queue", "QueuePatch")}
    found = []
    for name, namespace in sorted(namespaces.items()):
        tenant = metadata(namespace)["labels"][TENANT_LABEL]
        if name not in denied:
            found.append(Violation(namespace.urn, f"tenant namespace {name!r} has no default-deny network policy"))
        if tenant not in queued:
            found.append(Violation(namespace.urn, f"tenant {tenant!r} has no Volcano queue"))
    return found
