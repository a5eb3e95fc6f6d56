"""Alluxio through Fluid: an S3 dataset cached in storage-node memory, shared read-only with tenants.

The cache workers live on the storage pool, never on GPU nodes: GPU pools scale from zero through Karpenter, a
worker pinned there makes Karpenter launch a GPU node for the cache alone, and `WhenEmpty` consolidation never
reclaims a node running a non-DaemonSet pod (Karpenter docs, Disruption: "Consolidation"). Storage nodes are
always there (a managed group) and have the memory; their NVMe belongs to Ceph, so the cache is one memory tier.
FUSE still runs where the readers are (Fluid places it next to the pods that mount the dataset).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from trainyard.cloud.context import ClusterContext, PoolFacts
from trainyard.cloud.iam import IRSA_ROLE_ANNOTATION
from trainyard.config.model import AlluxioSettings, Settings
from trainyard.names import ALLUXIO, DATASET_NAMESPACE, ROLE_LABEL
from trainyard.platform.addon import AddonCode, AddonContext
from trainyard.platform.kube import HelmChart, helm_release, k8s_options, labels
from trainyard.platform.objects import custom_resource
from trainyard.platform.scheduling import role_affinity, tolerations_for

FLUID_API_VERSION = "data.fluid.io/v1alpha1"
# Source Dataset, its AlluxioRuntime (Fluid pairs them by name), and each tenant's referencing Dataset, whose
# PVC Fluid names after it: jobs mount the claim `training-data`.
DATASET_NAME = "training-data"
# Tiers are filled top down and evicted between these watermarks.
_HIGH, _LOW = "0.95", "0.7"
_DEFAULT_ACCOUNT_IN_USE = ("the AlluxioRuntime CRD (Fluid 1.0.8) has no service-account field, so the cache runs "
                           "as this namespace's default account, which carries its IRSA role; nothing else runs here")


@dataclass(frozen=True)
class AlluxioArgs:
    chart: HelmChart
    cluster: ClusterContext
    settings: AlluxioSettings
    bucket: pulumi.Input[str]
    region: str
    # GPU pools (FUSE runs there, next to the readers) and storage pools (the cache workers).
    gpu_pools: tuple[PoolFacts, ...]
    storage_pools: tuple[PoolFacts, ...]
    # One cache worker per storage node that always runs (the storage pools' minimum size).
    workers: int
    # IRSA role the dataset namespace's service account is annotated with (the cache's S3 credentials).
    role_arn: pulumi.Input[str]
    # Tenant namespace -> what must exist before a Dataset can go in it.
    tenant_namespaces: Mapping[str, Sequence[pulumi.Resource]]
    depends_on: Sequence[pulumi.Resource] = ()


def s3_mount_point(bucket: str, prefix: str) -> str:
    return f"s3://{bucket}/{prefix.strip('/')}" if prefix.strip("/") else f"s3://{bucket}"


def source_dataset(mount_point: pulumi.Input[str], args: AlluxioArgs) -> dict[str, Any]:
    return {
        "apiVersion": FLUID_API_VERSION,
        "kind": "Dataset",
        "metadata": {"name": DATASET_NAME, "namespace": DATASET_NAMESPACE, "labels": labels(DATASET_NAME, "data")},
        "spec": {
            # No access keys: Alluxio's S3 client (AWS SDK v1) reads the web identity token EKS projects into pods
            # of the IRSA-annotated service account (names.ALLUXIO); see cloud/aws.py for why not Pod Identity.
            "mounts": [{"name": "s3", "mountPoint": mount_point, "readOnly": True,
                        "options": {"alluxio.underfs.s3.region": args.region}}],
            "accessModes": ["ReadOnlyMany"],
            # The cache goes to the storage pool only (never a GPU node, see the module docstring); the
            # tolerations cover the storage taint for the workers and the GPU taints for FUSE next to readers.
            "nodeAffinity": {"required": role_affinity("storage")["nodeAffinity"]
                             ["requiredDuringSchedulingIgnoredDuringExecution"]},
            "tolerations": tolerations_for((*args.storage_pools, *args.gpu_pools)),
            "placement": "Exclusive",
        },
    }


def alluxio_runtime(args: AlluxioArgs) -> dict[str, Any]:
    cache = args.settings
    return {
        "apiVersion": FLUID_API_VERSION,
        "kind": "AlluxioRuntime",
        "metadata": {"name": DATASET_NAME, "namespace": DATASET_NAMESPACE, "labels": labels(DATASET_NAME, "data")},
        "spec": {
            "replicas": args.workers,
            "tieredstore": {"levels": [
                {"mediumtype": "MEM", "path": "/dev/shm", "quota": cache.memory_cache, "high": _HIGH, "low": _LOW},
            ]},
            # Pod network, not the host's: with IMDSv2 limited to one hop a pod cannot reach the node role, so a
            # credential problem fails loudly instead of silently reading S3 as the node (which has no right on
            # the bucket). Set explicitly (AlluxioRuntime `networkMode`, enum HostNetwork | ContainerNetwork in the
            # 1.0.8 CRD) rather than left to Fluid's default, which the review reports as the host network.
            "master": {"networkMode": "ContainerNetwork"},
            "worker": {"nodeSelector": {ROLE_LABEL: "storage"}, "networkMode": "ContainerNetwork"},
            "fuse": {"networkMode": "ContainerNetwork"},
        },
    }


def tenant_dataset(namespace: str) -> dict[str, Any]:
    """Fluid's cross-namespace sharing: a Dataset pointing at the source one; one cache serves every tenant."""
    return {
        "apiVersion": FLUID_API_VERSION,
        "kind": "Dataset",
        "metadata": {"name": DATASET_NAME, "namespace": namespace, "labels": labels(DATASET_NAME, "data")},
        "spec": {
            "mounts": [{"mountPoint": f"dataset://{DATASET_NAMESPACE}/{DATASET_NAME}", "readOnly": True}],
            "accessModes": ["ReadOnlyMany"],
        },
    }


class Alluxio(pulumi.ComponentResource):
    def __init__(self, name: str, args: AlluxioArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("trainyard:platform:Alluxio", name, None, opts)
        cluster = args.cluster
        self.release = helm_release(f"{name}-fluid", args.chart, cluster, self, depends_on=args.depends_on)
        namespace = k8s.core.v1.Namespace(
            f"{name}-namespace", metadata={"name": DATASET_NAMESPACE, "labels": labels("dataset", "data")},
            opts=k8s_options(cluster, self, args.depends_on))
        mount_point = pulumi.Output.from_input(args.bucket).apply(
            lambda bucket: s3_mount_point(bucket, args.settings.dataset_prefix))
        # The runtime's pods run as the namespace's default account (names.ALLUXIO); EKS injects the IRSA token
        # into pods of an account carrying the role annotation, so the annotation comes before any pod.
        account = k8s.core.v1.ServiceAccountPatch(
            f"{name}-service-account",
            metadata={"name": ALLUXIO.name, "namespace": ALLUXIO.namespace,
                      "annotations": {IRSA_ROLE_ANNOTATION: args.role_arn,
                                      "checkov.io/skip1": f"CKV_K8S_41={_DEFAULT_ACCOUNT_IN_USE}"}},
            opts=k8s_options(cluster, self, [namespace]))
        crds = [self.release, namespace]
        runtime = custom_resource(f"{name}-runtime", alluxio_runtime(args),
                                  k8s_options(cluster, self, [*crds, account]))
        source = custom_resource(f"{name}-dataset", source_dataset(mount_point, args),
                                 k8s_options(cluster, self, crds))
        self.tenant_datasets = [
            custom_resource(f"{name}-{namespace_name}-dataset", tenant_dataset(namespace_name),
                            k8s_options(cluster, self, [self.release, source, runtime, *ready]))
            for namespace_name, ready in sorted(args.tenant_namespaces.items())
        ]
        self.claim = DATASET_NAME
        self.register_outputs({"release": self.release.id, "claim": self.claim})


def build(ctx: AddonContext) -> Alluxio:
    cluster = ctx.cluster
    if cluster.dataset_bucket is None or cluster.region is None or cluster.dataset_cache_role_arn is None:
        raise ValueError("Alluxio needs the AWS target's dataset bucket, region and cache role (ClusterContext)")
    return Alluxio(ctx.addon.resource_name, AlluxioArgs(
        chart=ctx.chart("fluid"), cluster=cluster, settings=ctx.settings(AlluxioSettings),
        bucket=cluster.dataset_bucket, region=cluster.region, gpu_pools=cluster.pools_with("gpu"),
        storage_pools=cluster.pools_with("storage"),
        workers=max(1, sum(pool.min_size for pool in ctx.stack.pools("storage"))),
        role_arn=cluster.dataset_cache_role_arn,
        tenant_namespaces={facts.namespace: facts.ready for facts in ctx.tenants.values()},
        depends_on=ctx.after))


def _gpu_pools_on_aws(stack: Settings) -> bool:
    # The cache serves GPU jobs from the AWS dataset bucket.
    return stack.is_aws and bool(stack.pools("gpu"))


COMPONENT = AddonCode(build=build, applies=_gpu_pools_on_aws)
