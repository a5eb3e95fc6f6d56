"""What the cloud layer hands to the platform layer: one typed context, like pulumi-eks' CoreData."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pulumi
import pulumi_kubernetes as k8s

from trainyard.config.instance_types import GpuModel
from trainyard.config.model import PoolRole, Taint


@dataclass(frozen=True)
class PoolFacts:
    """A node pool as add-ons and jobs see it: how to land on it and what each node offers."""

    name: str
    role: PoolRole
    node_labels: dict[str, str]
    taints: tuple[Taint, ...]
    zones: tuple[str, ...]
    # Karpenter startup taints beyond Cilium's: the GPU health admission taint when the stack turns it on.
    startup_taints: tuple[Taint, ...] = ()
    gpu: GpuModel | None = None
    gpus_per_node: int = 0
    mig_layout: str | None = None
    # nodePools[].gpuSharing: "time-sliced" pools advertise nvidia.com/gpu.shared replicas.
    gpu_sharing: str | None = None
    efa_interfaces: int = 0
    nvme_devices: int = 0
    # GPU pools are launched by Karpenter from these; managed node groups need none of them here.
    instance_types: tuple[str, ...] = ()
    capacity_types: tuple[str, ...] = ()
    max_nodes: int = 0
    root_volume_gib: int = 100
    user_data: str = ""
    placement_group: pulumi.Input[str] | None = None
    # EC2 capacity reservation ids (ODCRs, Capacity Blocks) Karpenter launches the pool's `reserved` nodes into.
    capacity_reservations: tuple[str, ...] = ()
    # Every node is a Capacity Block's (capacity type reserved only, every reservation a block).
    capacity_blocks_only: bool = False

    @property
    def karpenter(self) -> bool:
        return self.role == "gpu"


@dataclass(frozen=True)
class KarpenterFacts:
    """What Karpenter's chart and node classes need from AWS."""

    interruption_queue: pulumi.Input[str]
    node_role: pulumi.Input[str]
    # Subnets and security groups carry `karpenter.sh/discovery=<this>`; EC2NodeClasses select by it.
    discovery_tag: pulumi.Input[str]
    ami_alias: str


@dataclass(frozen=True)
class DatabaseFacts:
    """A PostgreSQL database the platform connects to (cloud/database.py on AWS)."""

    host: pulumi.Input[str]
    port: int
    name: str
    username: str
    # A secret Output: it only ever reaches a Kubernetes Secret.
    password: pulumi.Output[str]
    # The PEM of the root CA the server's certificate chains to, which clients verify it and its host name against
    # (RDS); None: TLS without verification (`local`'s CloudNativePG, whose CA is its own namespace's Secret).
    root_certificate: str | None = None


@dataclass(frozen=True)
class ClusterContext:
    name: pulumi.Input[str]
    provider: k8s.Provider
    # Everything in-cluster is `deleted_with` this resource (the EKS cluster); None on the local target.
    cluster: pulumi.Resource | None
    # API server host and port for Cilium's kube-proxy replacement (no kube-proxy to find it otherwise).
    api_server_host: pulumi.Input[str] | None
    api_server_port: int
    pools: tuple[PoolFacts, ...]
    region: str | None = None
    kubeconfig: pulumi.Output[str] | None = None
    dataset_bucket: pulumi.Input[str] | None = None
    checkpoint_bucket: pulumi.Input[str] | None = None
    # IRSA role of the dataset cache's service account (names.ALLUXIO), annotated on it by the platform.
    dataset_cache_role_arn: pulumi.Input[str] | None = None
    # MLflow's backend store on AWS (RDS, outside the cluster); None on the local target or with MLflow off.
    tracking_database: DatabaseFacts | None = None
    karpenter: KarpenterFacts | None = None
    # The AWS provider every AWS resource uses (made from the validated region); None on the local target.
    aws_provider: pulumi.ProviderResource | None = None
    # In-cluster work waits for these: access entries, pod identity agent and associations, the dataset cache's
    # IRSA grants; after `ControlPlane.join_nodes`, the managed node groups too.
    ready: tuple[pulumi.Resource, ...] = field(default_factory=tuple)

    def pools_with(self, role: PoolRole) -> tuple[PoolFacts, ...]:
        return tuple(p for p in self.pools if p.role == role)


@dataclass(frozen=True)
class ControlPlane:
    """The cloud layer's first step: the cluster with no node yet, and the step that adds its node groups.

    Nodes only turn Ready once a CNI is installed, so the program installs the CNI on `context` and passes it to
    `join_nodes`, which creates the managed node groups after it and returns the context the add-ons use.
    """

    context: ClusterContext
    join_nodes: Callable[[Sequence[pulumi.Resource]], ClusterContext]
