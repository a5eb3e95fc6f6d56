"""Whether the kubelet of the nodes a pool launches admits each training pod: the topology manager (issue 22).

A GPU node's kubelet takes its CPU and topology manager settings from the NodeConfig in its EC2NodeClass's
userData (nodeadm merges it into the kubelet configuration). Under `restricted` or `single-numa-node` the topology
manager admits a pod only with a preferred NUMA alignment; any other pod fails with TopologyAffinityError, and a
failed pod restarts its whole Volcano job.

The model follows kubernetes pkg/kubelet/cm/topologymanager (policy.go mergePermutation, policy_best_effort.go,
policy_restricted.go, policy_single_numa_node.go, scope_pod.go) and the hint providers it merges
(cpumanager/policy_static.go generateCPUTopologyHints, devicemanager/topology_hints.go generateDeviceTopologyHints):

- a provider offers one hint per NUMA mask whose *free* resources cover the request, preferred when the mask has
  the minimal width any mask could have on the node (counting all of the node's resources);
- a merged hint ANDs one hint per resource; it is preferred only if every hint is and all masks are equal;
- the best merged hint is preferred over non-preferred, then narrower; restricted and single-numa-node admit only
  a preferred best hint (single-numa-node also only one NUMA node wide); best-effort and none admit every pod;
- CPUs are aligned only under the static CPU manager, for the integer CPUs of a Guaranteed pod (exclusive cores).

The node: NUMA nodes with an even split of the instance type's vCPUs and devices, two when it has several GPUs
(p4d: aws-ofi-nccl topology/p4d-24xl-topo.xml, two sockets of four A100s and two EFA NICs; the same split is
assumed for the p5 family, whose layout AWS does not publish). The kubelet is the truth; this is what the
rehearsal reasons with.
"""

from __future__ import annotations

import email
import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from trainyard.cloud.userdata import NODECONFIG_CONTENT_TYPE
from trainyard.plan.cluster_model import InstanceOffer, Pool, admits, quantity, short_resources
from trainyard.plan.pods import lookup, pod_needs
from trainyard.plan.recording import ResourceRecord
from trainyard.plan.resource_types import VOLCANO_JOB
from trainyard.plan.rules.base import Moment, of_type, pool_records, ready_pools, rule

Mask = frozenset[int]
ALIGNING_POLICIES = ("restricted", "single-numa-node")


@dataclass(frozen=True)
class NumaNode:
    """What one NUMA node holds (`total`) and what is still free on it (`free`), by resource name."""

    total: Mapping[str, int]
    free: Mapping[str, int]


@dataclass(frozen=True)
class Hint:
    mask: Mask | None  # None: any NUMA node (no preference)
    preferred: bool


@dataclass(frozen=True)
class KubeletTopology:
    """The KubeletConfiguration fields the topology manager's admission depends on, with the kubelet's defaults."""

    cpu_manager_policy: str = "none"
    topology_manager_policy: str = "none"
    topology_manager_scope: str = "container"

    @staticmethod
    def of(config: Mapping[str, Any]) -> KubeletTopology:
        defaults = KubeletTopology()
        return KubeletTopology(
            cpu_manager_policy=str(config.get("cpuManagerPolicy") or defaults.cpu_manager_policy),
            topology_manager_policy=str(config.get("topologyManagerPolicy") or defaults.topology_manager_policy),
            topology_manager_scope=str(config.get("topologyManagerScope") or defaults.topology_manager_scope))


def user_data_kubelet(user_data: object) -> Mapping[str, Any]:
    """The kubelet config of the NodeConfig documents in an EC2NodeClass's userData: MIME multipart, or one
    NodeConfig as plain YAML (Karpenter docs, EC2NodeClass userData for AL2023); later documents win."""
    if not isinstance(user_data, str):
        return {}
    message = email.message_from_string(user_data)
    if message.is_multipart():
        bodies = [str(part.get_payload()) for part in message.walk()
                  if part.get_content_type() == NODECONFIG_CONTENT_TYPE]
    else:
        bodies = [user_data]
    config: dict[str, Any] = {}
    for body in bodies:
        document = yaml.safe_load(body)
        if isinstance(document, dict) and document.get("kind") == "NodeConfig":
            config.update(lookup(document, "spec.kubelet.config") or {})
    return config


def pool_kubelet(pool: Pool, moment: Moment) -> KubeletTopology:
    """A Karpenter pool's kubelet settings from its node class; a managed node group's are the kubelet's defaults
    (trainyard's managed groups are the system and storage nodes, whose NodeConfig sets no CPU or topology
    manager: cloud/userdata.py default_kubelet)."""
    _node_pool, node_class = pool_records(pool.name, moment)
    if node_class is None:
        return KubeletTopology()
    return KubeletTopology.of(user_data_kubelet(lookup(node_class.inputs, "spec.userData")))


def numa_nodes(offer: InstanceOffer) -> list[NumaNode]:
    """An empty node of the offer's instance type: its CPUs and devices split evenly over its NUMA nodes."""
    sockets = 2 if offer.resources.get("nvidia.com/gpu", 0) > 1 else 1
    split = {name: int(amount) // sockets for name, amount in offer.resources.items() if name == "cpu" or "/" in name}
    return [NumaNode(total=split, free=split) for _ in range(sockets)]


def cross_fragmented(nodes: list[NumaNode], requests: Mapping[str, int]) -> list[NumaNode] | None:
    """The node with just enough CPUs free on the first NUMA node and just enough devices on the last one; None
    where that cannot be (one NUMA node, or a request larger than one NUMA node holds)."""
    first, last = 0, len(nodes) - 1
    socket_of = {resource: first if resource == "cpu" else last for resource in requests}
    if first == last or any(amount > nodes[socket_of[r]].total.get(r, 0) for r, amount in requests.items()):
        return None
    free: list[dict[str, int]] = [dict.fromkeys(n.total, 0) for n in nodes]
    for resource, amount in requests.items():
        free[socket_of[resource]][resource] = amount
    return [NumaNode(total=n.total, free=f) for n, f in zip(nodes, free, strict=True)]


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


def admitted(policy: str, nodes: list[NumaNode], requests: Mapping[str, int]) -> bool:
    """Whether the topology manager admits a pod (or container) aligning `requests` (exclusive CPUs as "cpu")."""
    if policy not in ALIGNING_POLICIES:
        return True
    hint = best_hint(nodes, requests)
    if policy == "single-numa-node":
        return hint.preferred and hint.mask is not None and len(hint.mask) == 1
    return hint.preferred


def _guaranteed(containers: list[Mapping[str, Any]]) -> bool:
    """Kubernetes QoS Guaranteed: every container limits cpu and memory, and requests (if set) equal the limits."""
    for container in containers:
        resources = container.get("resources") or {}
        limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
        for name in ("cpu", "memory"):
            if name not in limits or quantity(requests.get(name, limits[name])) != quantity(limits[name]):
                return False
    return True


def _aligned(container: Mapping[str, Any], exclusive_cpus: bool) -> dict[str, int]:
    resources = container.get("resources") or {}
    wanted = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    aligned = {str(name): int(quantity(amount)) for name, amount in wanted.items() if "/" in str(name)}
    cpu = quantity(wanted.get("cpu", 0))
    if exclusive_cpus and cpu > 0 and float(cpu).is_integer():
        aligned["cpu"] = int(cpu)
    return aligned


def aligned_requests(spec: Mapping[str, Any], kubelet: KubeletTopology) -> list[dict[str, int]]:
    """What each alignment the topology manager makes asks for: one per container in container scope, the pod's
    whole request in pod scope (per resource the larger of the app containers' sum and any init container)."""
    init = list(spec.get("initContainers") or ())
    apps = list(spec.get("containers") or ())
    exclusive = kubelet.cpu_manager_policy == "static" and _guaranteed([*init, *apps])
    per_init = [_aligned(c, exclusive) for c in init]
    per_app = [_aligned(c, exclusive) for c in apps]
    if kubelet.topology_manager_scope != "pod":
        return [r for r in (*per_init, *per_app) if r]
    names = {name for r in (*per_init, *per_app) for name in r}
    pod = {name: max([sum(r.get(name, 0) for r in per_app), *(r.get(name, 0) for r in per_init)])
           for name in names}
    return [pod] if pod else []


def _refusals(record: ResourceRecord, moment: Moment) -> Iterator[str]:
    for task in lookup(record.inputs, "spec.tasks") or ():
        spec = lookup(task, "template.spec") or {}
        pod = pod_needs(f"{record.name}/{task.get('name', 'task')}", spec)
        for pool in ready_pools(moment.after):
            kubelet = pool_kubelet(pool, moment)
            if kubelet.topology_manager_policy not in ALIGNING_POLICIES or not admits(pod, pool):
                continue
            for offer in (o for o in pool.offers if not short_resources(pod, o)):
                empty = numa_nodes(offer)
                for requests in aligned_requests(spec, kubelet):
                    states = (("an empty node", empty),
                              ("a node whose free CPUs and devices sit on different NUMA nodes",
                               cross_fragmented(empty, requests)))
                    for state, nodes in states:
                        if nodes is not None and not admitted(kubelet.topology_manager_policy, nodes, requests):
                            yield (f"{pod.name} fails kubelet admission (TopologyAffinityError) on {state} of "
                                   f"{offer.instance_type} in pool {pool.name}: topologyManagerPolicy "
                                   f"{kubelet.topology_manager_policy} (scope {kubelet.topology_manager_scope}) "
                                   f"finds no preferred NUMA alignment for {requests}, and a failed pod restarts "
                                   "its Volcano job")


@rule("kubelet-admits-pod", of_type(VOLCANO_JOB),
      "kubernetes pkg/kubelet/cm/topologymanager policy.go, policy_restricted.go; cpumanager, devicemanager hints")
def kubelet_admits_pod(record: ResourceRecord, moment: Moment) -> str | None:
    return next(_refusals(record, moment), None)
