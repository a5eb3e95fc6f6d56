"""The EC2 instance types trainyard supports, with the facts validation and cost estimates need.

Figures are from the AWS instance-type pages (accelerated computing and storage optimized families).
Hourly prices are us-east-1 Linux on-demand list prices, see ``PRICE_SOURCE``; spot is estimated from them
with the stack's configured discount.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

PRICE_SOURCE = "AWS EC2 on-demand pricing, us-east-1, Linux, list prices as published 2026-06 (check before budgeting)"


class GpuModel(StrEnum):
    A100_40GB = "A100-40GB"
    A100_80GB = "A100-80GB"
    H100_80GB = "H100-80GB"
    H200_141GB = "H200-141GB"
    A10G = "A10G-24GB"
    L4 = "L4-24GB"
    L40S = "L40S-48GB"

    @property
    def mig_capable(self) -> bool:
        return self in _MIG_CAPABLE


_MIG_CAPABLE = frozenset({GpuModel.A100_40GB, GpuModel.A100_80GB, GpuModel.H100_80GB, GpuModel.H200_141GB})


@dataclass(frozen=True, slots=True)
class InstanceType:
    name: str
    vcpu: int
    memory_gib: int
    on_demand_hourly_usd: float
    gpu: GpuModel | None = None
    gpu_count: int = 0
    gpu_memory_gib: int = 0
    nvme_devices: int = 0
    nvme_device_gb: int = 0
    efa_interfaces: int = 0
    # Layers of network nodes EC2's DescribeInstanceTopology reports for the type (0: none, so no
    # topology.k8s.aws/network-node-layer-* labels and no Volcano HyperNode): the EC2 User Guide's
    # ec2-instance-topology-prerequisites.html lists p4d, p4de, p5, p5e, p5en and g6e with 3; g5 and g6 are absent.
    network_layers: int = 0

    @property
    def family(self) -> str:
        return self.name.split(".", 1)[0]


def _gpu(name: str, gpu: GpuModel, count: int, mem: int, vcpu: int, ram: int, nvme: tuple[int, int], efa: int,
         price: float, layers: int = 0) -> InstanceType:
    return InstanceType(name=name, vcpu=vcpu, memory_gib=ram, on_demand_hourly_usd=price, gpu=gpu, gpu_count=count,
                        gpu_memory_gib=mem, nvme_devices=nvme[0], nvme_device_gb=nvme[1], efa_interfaces=efa,
                        network_layers=layers)


def _cpu(name: str, vcpu: int, ram: int, price: float, nvme: tuple[int, int] = (0, 0)) -> InstanceType:
    return InstanceType(name=name, vcpu=vcpu, memory_gib=ram, on_demand_hourly_usd=price,
                        nvme_devices=nvme[0], nvme_device_gb=nvme[1])


INSTANCE_TYPES: dict[str, InstanceType] = {
    it.name: it
    for it in (
        # Training: SXM parts with NVSwitch, EFA and NVMe instance store.
        _gpu("p4d.24xlarge", GpuModel.A100_40GB, 8, 40, 96, 1152, (8, 1000), 4, 21.96, layers=3),
        _gpu("p4de.24xlarge", GpuModel.A100_80GB, 8, 80, 96, 1152, (8, 1000), 4, 27.45, layers=3),
        _gpu("p5.48xlarge", GpuModel.H100_80GB, 8, 80, 192, 2048, (8, 3840), 32, 55.04, layers=3),
        _gpu("p5e.48xlarge", GpuModel.H200_141GB, 8, 141, 192, 2048, (8, 3840), 32, 61.39, layers=3),
        _gpu("p5en.48xlarge", GpuModel.H200_141GB, 8, 141, 192, 2048, (8, 3840), 16, 63.30, layers=3),
        # Development and small jobs.
        _gpu("g5.xlarge", GpuModel.A10G, 1, 24, 4, 16, (1, 250), 0, 1.006),
        _gpu("g5.12xlarge", GpuModel.A10G, 4, 24, 48, 192, (1, 3800), 0, 5.672),
        _gpu("g5.48xlarge", GpuModel.A10G, 8, 24, 192, 768, (2, 3800), 1, 16.288),
        _gpu("g6.xlarge", GpuModel.L4, 1, 24, 4, 16, (1, 250), 0, 0.805),
        _gpu("g6.12xlarge", GpuModel.L4, 4, 24, 48, 192, (4, 940), 0, 4.602),
        _gpu("g6e.xlarge", GpuModel.L40S, 1, 48, 4, 32, (1, 250), 0, 1.861, layers=3),
        _gpu("g6e.12xlarge", GpuModel.L40S, 4, 48, 48, 384, (2, 1900), 0, 10.493, layers=3),
        # System pool: controllers, Prometheus, Ceph mons and mgrs.
        _cpu("m7i.xlarge", 4, 16, 0.2016),
        _cpu("m7i.2xlarge", 8, 32, 0.4032),
        _cpu("m7i.4xlarge", 16, 64, 0.8064),
        # Storage pool: raw NVMe instance store for Ceph OSDs.
        _cpu("i4i.2xlarge", 8, 64, 0.686, (1, 1875)),
        _cpu("i4i.4xlarge", 16, 128, 1.373, (1, 3750)),
        _cpu("i4i.8xlarge", 32, 256, 2.746, (2, 3750)),
    )
}


# --- The fabric check (`python -m trainyard_train.commcheck`, one Volcano job per EFA pool) ---
# It all-reduces up to 1 GiB across two nodes of a pool and fails when the bus bandwidth there (nccl-tests' busbw,
# GB/s = 10^9 bytes/s) is below the pool's threshold. The threshold is a fraction of a published two-node figure
# where one exists; otherwise of the instance's EFA link rate. It is set to catch a broken fabric (NCCL on TCP
# sockets: single-digit GB/s; EFA interfaces missing; GPUDirect RDMA off), not to grade a healthy one: NCCL and
# plugin versions, and torch's in-place all-reduce instead of nccl-tests' binary, move a healthy result by tens
# of percent.
PUBLISHED_FRACTION = 0.75
# Lower where nothing was measured: the link rate is a ceiling for the network part only, and no published run
# shows how close two nodes of that type come to it.
LINK_FRACTION = 0.6
# aws-samples/awsome-distributed-training, micro-benchmarks/nccl-tests/README.md ("Results", commit 0162aac):
# all_reduce_perf float sum on 2 nodes, busbw at 1073741824 B, out-of-place.
_AWSOME = "aws-samples/awsome-distributed-training micro-benchmarks/nccl-tests/README.md@0162aac, 2 nodes, 1 GiB"


@dataclass(frozen=True, slots=True)
class FabricBaseline:
    """What two nodes of one EFA instance type are expected to reach, and where that figure comes from."""

    efa_gbps: int  # the instance's EFA network bandwidth, Gbit/s (AWS instance-type page)
    published_busbw_gbps: float | None  # all_reduce_perf busbw at 1 GiB on 2 nodes, GB/s; None: none found
    source: str

    @property
    def min_busbw_gbps(self) -> float:
        if self.published_busbw_gbps is not None:
            return round(PUBLISHED_FRACTION * self.published_busbw_gbps, 1)
        return round(LINK_FRACTION * self.efa_gbps / 8, 1)


FABRIC_BASELINES: dict[str, FabricBaseline] = {
    "p4de.24xlarge": FabricBaseline(400, 76.79, _AWSOME),
    # No p4d run published there; p4d has the same 4 x 100 Gbit/s EFA, A100 NVSwitch and GPUDirect RDMA as p4de
    # (only GPU memory differs), so p4de's figure applies. NVIDIA/nccl#527 shows 57.2 GB/s on two p4d reported
    # as slow: the threshold sits right at it.
    "p4d.24xlarge": FabricBaseline(400, 76.79, f"{_AWSOME} (measured on p4de, same fabric)"),
    "p5.48xlarge": FabricBaseline(3200, 436.95, _AWSOME),
    # None found for these: LINK_FRACTION of 3200 Gbit/s (400 GB/s) = 240 GB/s, about 55% of what two p5 nodes
    # reach on the same link rate (p5e: 32 EFAv2 interfaces like p5; p5en: 16 EFAv3).
    "p5e.48xlarge": FabricBaseline(3200, None, "none published found; fraction of the link rate"),
    "p5en.48xlarge": FabricBaseline(3200, None, "none published found; fraction of the link rate"),
    # One 100 Gbit/s EFA and no GPUDirect RDMA (buffers are staged through host memory): none published found.
    "g5.48xlarge": FabricBaseline(100, None, "none published found; fraction of the link rate"),
}


def fabric_threshold(instance_types: Sequence[str], efa_interfaces: int) -> float:
    """The busbw a pool's check must reach with `efa_interfaces` EFA devices per pod.

    The lowest over the pool's types, since Karpenter may launch any of them; a type's threshold shrinks in
    proportion when the pod gets fewer of its interfaces than it has (a pool mixing p5e's 32 and p5en's 16
    requests 16, so on a p5e node NCCL has half of that node's EFA bandwidth).
    """
    missing = [name for name in instance_types if name not in FABRIC_BASELINES]
    if missing:
        raise ValueError(f"no fabric baseline for {', '.join(missing)}; known: {', '.join(sorted(FABRIC_BASELINES))}")
    return min(
        round(FABRIC_BASELINES[name].min_busbw_gbps * min(1.0, efa_interfaces / INSTANCE_TYPES[name].efa_interfaces), 1)
        for name in instance_types
    )


# Left to the kubelet, the system reservation and the DaemonSets every GPU node runs (Cilium, DCGM exporter,
# device plugins, Alluxio FUSE, Ceph CSI): a tenth of the node, at least 2 cores and 8 GiB.
HEADROOM_FRACTION = 0.1
MIN_HEADROOM_MILLICPU = 2000
MIN_HEADROOM_BYTES = 8 * 1024**3
# A CPU-only pod (the local stack) has no node share to derive from; the tiny config trains in this.
CPU_ONLY_MILLICPU = 2000
CPU_ONLY_MEMORY_BYTES = 4 * 1024**3


def pod_share(instance: InstanceType, fraction: float) -> tuple[int, int]:
    """(millicpu, memory bytes) of a pod that takes `fraction` of the node, after the headroom: the training pod's
    requests and limits (workloads/sizing.py), and what config rules check a job's /dev/shm against."""
    millicpu = instance.vcpu * 1000
    memory = instance.memory_gib * 1024**3
    usable_cpu = millicpu - max(MIN_HEADROOM_MILLICPU, int(millicpu * HEADROOM_FRACTION))
    usable_memory = memory - max(MIN_HEADROOM_BYTES, int(memory * HEADROOM_FRACTION))
    # Whole cores keep the pod eligible for exclusive CPUs; whole MiB keep the quantity readable.
    cpu = max(1000, int(usable_cpu * fraction) // 1000 * 1000)
    return cpu, int(usable_memory * fraction) // 1024**2 * 1024**2


def smallest(instance_types: Sequence[str]) -> InstanceType:
    """The type with the fewest vCPUs (then memory): a pod sized for it fits on every type Karpenter may pick."""
    known = [INSTANCE_TYPES[name] for name in instance_types if name in INSTANCE_TYPES]
    if not known:
        raise ValueError(f"no known instance type among {', '.join(instance_types) or 'none'}")
    return min(known, key=lambda it: (it.vcpu, it.memory_gib))


# The check's pods (workloads/fabric.py) take every GPU of a node and every EFA device pods get; their ranks mostly
# wait on the network, so a pair of cores and 4 GiB (torch and a CUDA context) per GPU, not a trainer's node share,
# plus /dev/shm for NCCL's shared-memory transport and proxy buffers (the container default, 64 MiB, is too small).
# The platform sizes the checks' own queue from the same shape (platform/tenants.py).
FABRIC_CHECK_NODES = 2
FABRIC_CHECK_MILLICPU_PER_GPU = 2000
FABRIC_CHECK_MEMORY_PER_GPU = 4 * 2**30
FABRIC_CHECK_SHM = "8Gi"
_FABRIC_CHECK_SHM_BYTES = 8 * 2**30


@dataclass(frozen=True, slots=True)
class FabricCheckPod:
    """What one fabric-check pod of a pool requests (and is limited to)."""

    gpus: int
    millicpu: int
    memory_bytes: int  # /dev/shm included: it is memory-backed and counts against the limit


def fabric_check_pod(instance_types: Sequence[str]) -> FabricCheckPod:
    gpus = smallest(instance_types).gpu_count
    return FabricCheckPod(gpus=gpus, millicpu=gpus * FABRIC_CHECK_MILLICPU_PER_GPU,
                          memory_bytes=gpus * FABRIC_CHECK_MEMORY_PER_GPU + _FABRIC_CHECK_SHM_BYTES)
