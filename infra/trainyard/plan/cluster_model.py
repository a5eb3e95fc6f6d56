"""The rehearsal's model of a cluster: node pools, what pods need of them, storage classes, and matching.

Everything here is a frozen value built from plain data; nothing reads a recording (that is `cluster_state`).
The matching follows the Kubernetes scheduler's predicates that decide placement at bring-up: node selectors and
required node affinity against node labels, tolerations against taints, requested resources against what a
node offers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from trainyard.config.quantity import parse_quantity

# Taint effects that keep a pod off a node; PreferNoSchedule only lowers the score
# (kubernetes.io/docs/concepts/scheduling-eviction/taint-and-toleration).
_BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
# EKS's API spells effects in upper snake case (eks CreateNodegroup Taint.effect).
_EKS_EFFECTS = {"NO_SCHEDULE": "NoSchedule", "NO_EXECUTE": "NoExecute", "PREFER_NO_SCHEDULE": "PreferNoSchedule"}

GIB = 2.0**30


def quantity(value: Any) -> float:
    """A resource amount of a rendered object ("500m", "64Gi", 8) as a number (cores, bytes, devices)."""
    return float(parse_quantity(str(value).strip()))


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str
    effect: str

    @staticmethod
    def of(raw: Mapping[str, Any]) -> Taint:
        effect = str(raw.get("effect", "NoSchedule"))
        return Taint(str(raw.get("key", "")), str(raw.get("value", "") or ""), _EKS_EFFECTS.get(effect, effect))

    def __str__(self) -> str:
        return f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    @staticmethod
    def of(raw: Mapping[str, Any]) -> Toleration:
        return Toleration(str(raw.get("key", "") or ""), str(raw.get("operator", "Equal") or "Equal"),
                          str(raw.get("value", "") or ""), str(raw.get("effect", "") or ""))

    def tolerates(self, taint: Taint) -> bool:
        # An empty key with Exists tolerates every taint; an empty effect matches every effect.
        if self.effect and self.effect != taint.effect:
            return False
        if not self.key:
            return self.operator == "Exists"
        if self.key != taint.key:
            return False
        return self.operator == "Exists" or self.value == taint.value


@dataclass(frozen=True, slots=True)
class Requirement:
    """One `matchExpressions` entry of a required node affinity term (or a NodePool requirement)."""

    key: str
    operator: str
    values: frozenset[str] = frozenset()

    @staticmethod
    def of(raw: Mapping[str, Any]) -> Requirement:
        return Requirement(str(raw["key"]), str(raw["operator"]), frozenset(str(v) for v in raw.get("values") or ()))


@dataclass(frozen=True)
class PodNeeds:
    """What one kind of pod needs of a node: labels, taints it tolerates, resources, how many distinct nodes."""

    name: str
    node_selector: Mapping[str, str] = field(default_factory=dict)
    # Required node affinity: the node must satisfy every requirement of at least one term (none: any node).
    affinity_terms: tuple[tuple[Requirement, ...], ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    requests: Mapping[str, float] = field(default_factory=dict)
    # Replicas kept apart by a required pod anti-affinity on kubernetes.io/hostname need that many nodes.
    distinct_nodes: int = 1

    @property
    def extended_resources(self) -> tuple[str, ...]:
        return tuple(sorted(r for r in self.requests if "/" in r))


@dataclass(frozen=True)
class InstanceOffer:
    """What one instance type gives a pod: resources by name (cpu in cores, memory in bytes, devices)."""

    instance_type: str
    resources: Mapping[str, float]


@dataclass(frozen=True)
class Pool:
    """Nodes the cluster has (a managed node group) or can launch (a Karpenter NodePool)."""

    name: str
    # Label key -> values its nodes may carry (one for a fixed label; several for an open requirement).
    labels: Mapping[str, frozenset[str]]
    taints: tuple[Taint, ...]
    offers: tuple[InstanceOffer, ...]
    nodes: int  # nodes present without autoscaling (a managed group's desired size; 0 for Karpenter)
    autoscaled: bool = False  # Karpenter launches nodes for pending pods that fit
    limits: Mapping[str, float] = field(default_factory=dict)  # a NodePool's spec.limits (resource -> total)
    unknown_labels: bool = False  # an existing cluster (local/kind) whose node labels the plan cannot see

    @property
    def has_accelerators(self) -> bool:
        return any(amount > 0 for offer in self.offers for name, amount in offer.resources.items()
                   if name.startswith("nvidia.com/"))


@dataclass(frozen=True)
class StorageClass:
    """A StorageClass and whether its backend can serve a claim; `problem` says why not."""

    name: str
    backend: str
    immediate: bool  # volumeBindingMode Immediate (the default) vs WaitForFirstConsumer
    default: bool = False  # the class a claim without storageClassName gets
    problem: str | None = None


# ------------------------------------------------------------------------------------------------ matching


def untolerated(pod: PodNeeds, pool: Pool, also: tuple[Taint, ...] = ()) -> list[Taint]:
    """The pool's blocking taints (and `also`: a new node's startup taints) the pod does not tolerate."""
    return [t for t in (*pool.taints, *also)
            if t.effect in _BLOCKING_EFFECTS and not any(tol.tolerates(t) for tol in pod.tolerations)]


def satisfies(requirement: Requirement, labels: Mapping[str, AbstractSet[str]]) -> bool:
    """Whether nodes with these labels (key -> the values they may carry) meet the requirement."""
    present = labels.get(requirement.key)
    if requirement.operator == "In":
        return present is not None and bool(present & requirement.values)
    if requirement.operator == "NotIn":
        return present is None or bool(present - requirement.values)
    if requirement.operator == "Exists":
        return present is not None
    if requirement.operator == "DoesNotExist":
        return present is None
    # Gt/Lt compare integers; no trainyard pool or chart uses them, so they never exclude a pool here.
    return True


def label_mismatch(pod: PodNeeds, pool: Pool) -> str | None:
    """Why the pool's nodes fail the pod's node selector or required affinity; None when they match."""
    if pool.unknown_labels:
        return None
    for key, value in sorted(pod.node_selector.items()):
        if value not in pool.labels.get(key, frozenset()):
            return f"nodeSelector {key}={value}"
    if pod.affinity_terms and not any(all(satisfies(r, pool.labels) for r in term) for term in pod.affinity_terms):
        first = pod.affinity_terms[0]
        return "node affinity " + ", ".join(f"{r.key} {r.operator} {sorted(r.values)}" for r in first)
    return None


def short_resources(pod: PodNeeds, offer: InstanceOffer) -> list[str]:
    """Requested resources one instance type cannot give the pod (cpu and memory ignore system reservations)."""
    return [name for name, amount in sorted(pod.requests.items()) if offer.resources.get(name, 0.0) < amount]


def admits(pod: PodNeeds, pool: Pool, also: tuple[Taint, ...] = ()) -> bool:
    """The pool's nodes accept the pod by labels and taints (resources aside); `also`: taints a new node carries
    until something removes them (a NodePool's startupTaints)."""
    return label_mismatch(pod, pool) is None and not untolerated(pod, pool, also)


def fits_some_offer(pod: PodNeeds, pool: Pool) -> bool:
    """Some instance type of the pool gives the pod all it requests (an unseen cluster: no extended resource)."""
    if not pool.offers:
        return not pod.extended_resources
    return any(not short_resources(pod, offer) for offer in pool.offers)


def can_run_now(pod: PodNeeds, pools: Iterable[Pool]) -> bool:
    """Enough present nodes (no autoscaling) accept and fit the pod, counting its anti-affinity spread."""
    nodes = sum(p.nodes for p in pools if admits(pod, p) and fits_some_offer(pod, p))
    return nodes >= pod.distinct_nodes


def can_launch(pod: PodNeeds, pools: Iterable[Pool]) -> bool:
    """Karpenter can launch a node for the pod: some autoscaled pool admits it and offers all it requests."""
    return any(p.autoscaled and admits(pod, p) and fits_some_offer(pod, p) for p in pools)


def frozen_labels(labels: Mapping[str, Iterable[str]]) -> Mapping[str, frozenset[str]]:
    return MappingProxyType({k: frozenset(v) for k, v in labels.items()})
