"""A model of the kubelet topology manager's admission decision, for the pods trainyard renders.

Ported in outline from kubernetes pkg/kubelet/cm/topologymanager (policy.go mergePermutation and HintMerger,
policy_best_effort.go, policy_restricted.go) and the hint providers it merges (cpumanager/policy_static.go
generateCPUTopologyHints, devicemanager/topology_hints.go generateDeviceTopologyHints). Documentation grade: the
kubelet is the truth; this is what the tests reason with.

- A provider offers one hint per NUMA mask whose *free* resources cover the request; a hint is preferred when its
  mask has the minimal width any mask could have on this node (counting all of the node's resources).
- A merged hint ANDs one hint per resource; it is preferred only if every hint is and all masks are equal.
- The best merged hint is preferred over non-preferred, then narrower. restricted and single-numa-node admit only
  a preferred best hint (single-numa-node also only one NUMA node wide); best-effort and none admit all.
- Exclusive CPUs (so CPU hints) only for a Guaranteed pod's integer CPU request: trainyard's pods are Guaranteed.

The node model: NUMA nodes with an even split of the instance type's vCPUs and devices (p4d: aws-ofi-nccl
topology/p4d-24xl-topo.xml has two sockets with four A100s and two EFA NICs each; the same split is assumed for the
p5 family, whose layout AWS does not publish).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass

from trainyard.config.instance_types import InstanceType

Mask = frozenset[int]


@dataclass(frozen=True)
class NumaNode:
    """What one NUMA node holds (`total`) and what is still free on it (`free`), by resource name."""

    total: Mapping[str, int]
    free: Mapping[str, int]


@dataclass(frozen=True)
class Hint:
    mask: Mask | None  # None: any NUMA node (no preference)
    preferred: bool


def two_socket(instance: InstanceType, device_names: Mapping[str, int]) -> list[NumaNode]:
    """An empty node of `instance`: every resource split evenly over two NUMA nodes (one when it has one GPU)."""
    sockets = 2 if instance.gpu_count > 1 else 1
    totals = {"cpu": instance.vcpu, **device_names}
    return [NumaNode(total={k: v // sockets for k, v in totals.items()},
                     free={k: v // sockets for k, v in totals.items()}) for _ in range(sockets)]


def _masks(count: int) -> list[Mask]:
    return [frozenset(c) for width in range(1, count + 1) for c in itertools.combinations(range(count), width)]


def provider_hints(nodes: list[NumaNode], resource: str, request: int) -> list[Hint]:
    masks = _masks(len(nodes))
    widths = [len(m) for m in masks if sum(nodes[i].total.get(resource, 0) for i in m) >= request]
    minimal = min(widths, default=len(nodes))
    hints = [Hint(m, len(m) == minimal) for m in masks if sum(nodes[i].free.get(resource, 0) for i in m) >= request]
    # No mask has enough free: the provider reports "no possible affinity", one non-preferred any-NUMA hint.
    return hints or [Hint(None, False)]


def best_hint(nodes: list[NumaNode], requests: Mapping[str, int]) -> Hint:
    everything = frozenset(range(len(nodes)))
    best: Hint | None = None
    per_resource = [provider_hints(nodes, r, n) for r, n in requests.items() if n > 0]
    for permutation in itertools.product(*per_resource):
        masks = [h.mask for h in permutation if h.mask is not None]
        merged = everything.intersection(*masks) if masks else everything
        preferred = all(h.preferred for h in permutation) and len(set(masks)) <= 1
        if not merged:
            continue
        candidate = Hint(merged, preferred)
        if (best is None or (candidate.preferred and not best.preferred)
                or (candidate.preferred == best.preferred and len(merged) < len(best.mask or everything))):
            best = candidate
    return best or Hint(everything, False)


def admits(policy: str, nodes: list[NumaNode], requests: Mapping[str, int]) -> bool:
    """Whether the kubelet admits a pod requesting `requests` (exclusive CPUs as "cpu") under `policy`."""
    if policy in ("none", "best-effort"):
        return True
    hint = best_hint(nodes, requests)
    if policy == "restricted":
        return hint.preferred
    if policy == "single-numa-node":
        return hint.preferred and hint.mask is not None and len(hint.mask) == 1
    raise ValueError(f"unknown topology manager policy {policy!r}")
