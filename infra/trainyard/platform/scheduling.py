"""Where add-on pods land: tolerations and node affinity derived from the pools the cloud layer made."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from trainyard.cloud.context import PoolFacts
from trainyard.names import GPU_TAINT_KEY, ROLE_LABEL


def tolerations_for(pools: Iterable[PoolFacts]) -> list[dict[str, str]]:
    """One toleration per distinct taint of `pools`, plus the GPU taint (always on GPU nodes), sorted."""
    return _tolerations(pools, gpu=True)


def taint_tolerations(pools: Iterable[PoolFacts]) -> list[dict[str, str]]:
    """Exactly the taints of `pools`, sorted: for pods that must land on those pools and no tainted other."""
    return _tolerations(pools, gpu=False)


def _tolerations(pools: Iterable[PoolFacts], *, gpu: bool) -> list[dict[str, str]]:
    seen: dict[tuple[str, str, str], dict[str, str]] = {}
    if gpu:
        seen[(GPU_TAINT_KEY, "", "NoSchedule")] = {"key": GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}
    for pool in pools:
        for taint in pool.taints:
            toleration = {"key": taint.key, "effect": taint.effect}
            # Exists tolerates any value; Equal pins the value the pool actually sets.
            toleration.update({"operator": "Equal", "value": taint.value} if taint.value else {"operator": "Exists"})
            seen.setdefault((taint.key, taint.value, taint.effect), toleration)
    return [seen[key] for key in sorted(seen)]


def startup_tolerations(pools: Iterable[PoolFacts]) -> list[dict[str, str]]:
    """Tolerations for the startup taints of `pools`: for node agents that must run before a node is admitted."""
    keys = sorted({(t.key, t.effect) for pool in pools for t in pool.startup_taints})
    return [{"key": key, "operator": "Exists", "effect": effect} for key, effect in keys]


def role_affinity(*roles: str) -> dict[str, Any]:
    """Required node affinity to nodes whose trainyard.io/role is one of `roles`."""
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": ROLE_LABEL, "operator": "In", "values": sorted(roles)}]},
                ],
            },
        },
    }
