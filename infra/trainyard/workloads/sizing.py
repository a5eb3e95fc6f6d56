"""How much of a node one training pod asks for: its GPU (or MIG slice) share of the node's CPU and memory.

Requests equal limits for every resource, so training pods get the Guaranteed QoS class: the kubelet evicts
them last under memory pressure, and the static CPU manager can give them exclusive cores.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainyard.cloud.context import PoolFacts
from trainyard.config.instance_types import (
    CPU_ONLY_MEMORY_BYTES,
    CPU_ONLY_MILLICPU,
    INSTANCE_TYPES,
    InstanceType,
    pod_share,
    smallest,
)
from trainyard.config.mig import WHOLE_GPU_RESOURCE, load_mig_catalog, mig_resource_name

EFA_RESOURCE = "vpc.amazonaws.com/efa"
GIB = 1024**3
MIB = 1024**2

# A CPU-only pod (the local stack) has no node share to derive from (its CPU and memory: config/instance_types.py).
CPU_ONLY_PROCESSES = 2

@dataclass(frozen=True, slots=True)
class PodResources:
    """What one training pod requests (and is limited to)."""

    accelerators: dict[str, int]
    millicpu: int
    memory_bytes: int
    processes: int  # torchrun --nproc-per-node

    def as_k8s(self) -> dict[str, dict[str, str]]:
        cpu = str(self.millicpu // 1000) if self.millicpu % 1000 == 0 else f"{self.millicpu}m"
        amounts = {"cpu": cpu, "memory": f"{self.memory_bytes // MIB}Mi",
                   **{name: str(count) for name, count in self.accelerators.items()}}
        return {"requests": amounts, "limits": dict(amounts)}


def smallest_instance(pool: PoolFacts) -> InstanceType:
    """The pool's instance type with the fewest vCPUs: a pod sized for it fits on every type Karpenter picks."""
    if not any(name in INSTANCE_TYPES for name in pool.instance_types):
        raise ValueError(f"pool {pool.name!r} lists no known instance type: {', '.join(pool.instance_types)}")
    return smallest(pool.instance_types)


def whole_gpus(pool: PoolFacts, gpus: int, *, efa: bool) -> PodResources:
    """gpus whole GPUs and the same fraction of the node's CPU and memory; with efa, the node's EFA devices."""
    instance = smallest_instance(pool)
    cpu, memory = pod_share(instance, gpus / instance.gpu_count)
    accelerators = {WHOLE_GPU_RESOURCE: gpus}
    if efa and pool.efa_interfaces:
        # Only traffic between nodes uses EFA; the pod of a multi-node job takes all of the node's interfaces.
        accelerators[EFA_RESOURCE] = pool.efa_interfaces
    return PodResources(accelerators=accelerators, millicpu=cpu, memory_bytes=memory, processes=gpus)


def mig_slice(pool: PoolFacts, profile: str) -> PodResources:
    """One MIG slice and the node's CPU and memory divided by the number of slices the layout carves."""
    if pool.gpu is None or pool.mig_layout is None:
        raise ValueError(f"pool {pool.name!r} has no MIG layout; a 'mig' job needs one")
    instance = smallest_instance(pool)
    per_gpu = load_mig_catalog().slices(pool.mig_layout, pool.gpu)
    if profile not in per_gpu:
        raise ValueError(f"MIG layout {pool.mig_layout!r} of pool {pool.name!r} has no {profile} slice")
    slices_per_node = instance.gpu_count * sum(per_gpu.values())
    cpu, memory = pod_share(instance, 1 / slices_per_node)
    return PodResources(accelerators={mig_resource_name(profile): 1}, millicpu=cpu, memory_bytes=memory,
                        processes=1)


def numa_binding(pool: PoolFacts | None, resources: PodResources) -> str | None:
    """torchrun's --numa-binding for this pod, or None.

    torch 2.13's `socket` mode (torch/numa/binding.py) runs local rank i on the CPUs of GPU i's socket that the pod's
    cpuset holds, and fails the worker's start when it holds none. Only a pod with every GPU of its node and more
    CPUs than half the node can count on exclusive CPUs in both sockets of the two-socket 8-GPU hosts (the static CPU
    manager's cpuset is all the pod gets; more than one socket's CPUs cannot fit in one). Any smaller pod relies on
    the kubelet's best-effort NUMA alignment instead, which binds its cpuset near its GPUs when it can
    (cloud/userdata.py). `socket` rather than `node`: it holds for any number of NUMA nodes per socket.
    """
    if pool is None:
        return None
    gpus = resources.accelerators.get(WHOLE_GPU_RESOURCE, 0)
    types = [INSTANCE_TYPES[name] for name in pool.instance_types if name in INSTANCE_TYPES]
    whole = bool(types) and all(t.gpu_count > 1 and gpus == t.gpu_count and 2 * resources.millicpu > t.vcpu * 1000
                                for t in types)
    return "socket" if whole else None


def cpu_only() -> PodResources:
    return PodResources(accelerators={}, millicpu=CPU_ONLY_MILLICPU, memory_bytes=CPU_ONLY_MEMORY_BYTES,
                        processes=CPU_ONLY_PROCESSES)
