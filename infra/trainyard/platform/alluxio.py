"""Alluxio through Fluid: an S3 dataset cached in three tiers and shared read-only with tenants.

The tiers, as a training pod's read meets them (README, "The data path"):
- warm, on the reader's node: Alluxio's client-side page cache inside the FUSE pod, on the GPU node's NVMe
  instance store (prepare-node.sh's array at `userdata.CACHE_MOUNT`). FUSE is a DaemonSet Fluid schedules only
  onto nodes where a pod mounts the dataset; Karpenter neither launches nodes for DaemonSet pods nor counts them
  against emptiness (karpenter `IsProvisionable`, `IsReschedulable`), so the tier never buys or keeps a GPU node.
  The cache dies with its node; the dataset is read-only and stays in the tiers below.
- hot, shared: the Alluxio workers, in memory (MEM at /dev/shm), one per storage node. Storage nodes always run
  (a managed group), have the memory, and their NVMe belongs to Ceph. A worker on a GPU node would make Karpenter
  launch one for the cache alone, and `WhenEmpty` never reclaims a node running a non-DaemonSet pod.
- cold: S3, read by the workers through IRSA (cloud/aws.py says why not Pod Identity).
The master holds only metadata and runs on system nodes; Fluid's controllers tolerate exactly the system pools'
taints, so none of them can land on (and pin) a GPU or storage node.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import yaml

from trainyard.cloud.context import ClusterContext, PoolFacts
from trainyard.cloud.iam import IRSA_ROLE_ANNOTATION
from trainyard.cloud.userdata import CACHE_MOUNT
from trainyard.config.instance_types import INSTANCE_TYPES
from trainyard.config.model import AlluxioSettings, Settings
from trainyard.config.quantity import quantity_bytes
from trainyard.names import ALLUXIO, DATASET_NAMESPACE, ROLE_LABEL
from trainyard.paths import PLATFORM_DIR
from trainyard.platform.addon import AddonCode, AddonContext
from trainyard.platform.kube import HelmChart, helm_release, k8s_options, labels
from trainyard.platform.objects import custom_resource
from trainyard.platform.scheduling import role_affinity, taint_tolerations

FLUID_API_VERSION = "data.fluid.io/v1alpha1"
# Source Dataset, its AlluxioRuntime (Fluid pairs them by name), and each tenant's referencing Dataset, whose
# PVC Fluid names after it: jobs mount the claim `training-data`.
DATASET_NAME = "training-data"
# The S3 mount of the source Dataset; its `path` "/" makes the S3 prefix the root of Alluxio's namespace.
S3_MOUNT = "s3"
REFERENCE_SCHEME = "dataset://"
ROOT_READONLY = "alluxio.master.mount.table.root.readonly"
# Tiers are filled top down and evicted between these watermarks.
_HIGH, _LOW = "0.95", "0.7"
_DEFAULT_ACCOUNT_IN_USE = ("the AlluxioRuntime CRD (Fluid 1.0.8) has no service-account field, so the cache runs "
                           "as this namespace's default account, which carries its IRSA role; nothing else runs here")
# The release image the runtime runs (platform/fluid/images.yaml), instead of the controller's default, the
# `alluxio/alluxio-dev:2.9.0` development image (fluid 1.0.8 values.yaml runtime.alluxio.runtime/fuse).
IMAGE = yaml.safe_load((PLATFORM_DIR / "fluid" / "images.yaml").read_text(encoding="utf-8"))["alluxio"]
# The warm tier's share of the smallest GPU node's instance store: room for XFS and the cache's own page files.
NVME_CACHE_FRACTION = 0.8
NVME_VOLUME = "nvme-cache"
NVME_CACHE_DIR = f"{CACHE_MOUNT}/alluxio"
# Fluid's FUSE defaults are -Xmx16G -Xms16G -XX:MaxDirectMemorySize=32g (pkg/ddc/alluxio/transform_optimization.go,
# optimizeDefaultFuse @ v1.0.8); setting jvmOptions replaces them all, so the heap is restated, starting small.
FUSE_HEAP = ["-Xmx16G", "-Xms4G", "-XX:+UseG1GC", "-XX:MaxDirectMemorySize=32g"]
# Requests, no limits: the MEM tier's tmpfs pages are charged to the worker's memory cgroup, so a limit would
# OOM-kill a full cache; requests make the scheduler reserve what the pods use next to the OSDs and trainers.
# A worker reserves all it may hold (worker_memory); FUSE reserves the heap it starts with.
_MASTER_REQUESTS = {"cpu": "500m", "memory": "4Gi"}
_WORKER_CPU = "2"
_FUSE_REQUESTS = {"cpu": "1", "memory": "4Gi"}
# Fluid chart values keyed by the component whose Deployment (or hook Job) takes `tolerations`.
_CONTROL_PLANE = ("dataset", "fluidapp", "webhook", "crdUpgrade")
# Every runtime controller: the idle ones (0 replicas) are scaled out by the dataset controller as soon as a runtime
# of their kind appears (pkg/controllers/deploy/runtime_controllers.go), and would then land anywhere.
_RUNTIME_CONTROLLERS = ("alluxio", "thin", "jindo", "goosefs", "juicefs", "efc", "vineyard")


@dataclass(frozen=True)
class AlluxioArgs:
    chart: HelmChart
    cluster: ClusterContext
    settings: AlluxioSettings
    bucket: pulumi.Input[str]
    region: str
    # GPU pools (FUSE and its NVMe cache run there, next to the readers), storage pools (the cache workers) and
    # system pools (master and Fluid's controllers).
    gpu_pools: tuple[PoolFacts, ...]
    storage_pools: tuple[PoolFacts, ...]
    system_pools: tuple[PoolFacts, ...]
    # One cache worker per storage node that always runs (the storage pools' minimum size).
    workers: int
    # IRSA role the dataset namespace's service account is annotated with (the cache's S3 credentials).
    role_arn: pulumi.Input[str]
    # Tenant namespace -> what must exist before a Dataset can go in it.
    tenant_namespaces: Mapping[str, Sequence[pulumi.Resource]]
    depends_on: Sequence[pulumi.Resource] = ()


def s3_mount_point(bucket: str, prefix: str) -> str:
    return f"s3://{bucket}/{prefix.strip('/')}" if prefix.strip("/") else f"s3://{bucket}"


def reference_mount_point(subpath: str = "") -> str:
    """A tenant Dataset's mount: the source Dataset, or a directory of it."""
    return posixpath.join(f"{REFERENCE_SCHEME}{DATASET_NAMESPACE}/{DATASET_NAME}", subpath.strip("/")).rstrip("/")


def unified_namespace_path(mount: Mapping[str, Any]) -> str:
    """Where Fluid puts one Dataset mount in Alluxio's namespace: its `path` when absolute, else `/<name>`
    (fluid v1.0.8 pkg/utils/ufs_path_builder.go, GenUFSPathInUnifiedNamespace). A single mount at "/" becomes
    the namespace root (`alluxio.master.mount.table.root.ufs`, GenAlluxioUFSRootPath)."""
    path = str(mount.get("path") or "")
    return path if path.startswith("/") else "/" + str(mount.get("name", "")).lstrip("/")


def claim_subpath(source_mount: Mapping[str, Any], mount_point: str) -> str:
    """The directory inside a referencing Dataset's claim where the source mount's data appears ("" = its root).

    A `dataset://<ns>/<name>[/<sub>]` reference's PV is the source's PV with `<sub>` as its subpath
    (fluid v1.0.8 pkg/ddc/thin/referencedataset/volume.go, GetPhysicalDatasetSubPath), and the source's FUSE
    mounts the root of Alluxio's namespace, so the mount shows at its namespace path below `<sub>`.
    """
    if not mount_point.startswith(REFERENCE_SCHEME):
        raise ValueError(f"{mount_point!r} is not a {REFERENCE_SCHEME} reference")
    parts = mount_point.removeprefix(REFERENCE_SCHEME).strip("/").split("/", 2)
    if len(parts) < 2:
        raise ValueError(f"{mount_point!r} names no <namespace>/<dataset>")
    sub = "/" + (parts[2].strip("/") if len(parts) == 3 else "")
    location = unified_namespace_path(source_mount)
    relative = posixpath.relpath(location, sub)
    if relative == ".." or relative.startswith("../"):
        raise ValueError(f"{mount_point!r} exposes {sub}, which does not hold mount {source_mount.get('name')!r} "
                         f"at {location}")
    return "" if relative == "." else relative


def source_mount(mount_point: pulumi.Input[str], region: str) -> dict[str, Any]:
    # No access keys: Alluxio's S3 client (AWS SDK v1) reads the web identity token EKS projects into pods of the
    # IRSA-annotated service account (names.ALLUXIO). `path: "/"` mounts the prefix at the namespace root, so a
    # tenant sees `<claim>/<dataset>` (unified_namespace_path); without it the data would sit under `/s3`.
    return {"name": S3_MOUNT, "mountPoint": mount_point, "path": "/", "readOnly": True,
            "options": {"alluxio.underfs.s3.region": region}}


def source_dataset(mount_point: pulumi.Input[str], args: AlluxioArgs) -> dict[str, Any]:
    return {
        "apiVersion": FLUID_API_VERSION,
        "kind": "Dataset",
        "metadata": {"name": DATASET_NAME, "namespace": DATASET_NAMESPACE, "labels": labels(DATASET_NAME, "data")},
        "spec": {
            "mounts": [source_mount(mount_point, args.region)],
            "accessModes": ["ReadOnlyMany"],
            # Placement of the cache workers: the storage pool only (see the module docstring).
            "nodeAffinity": {"required": role_affinity("storage")["nodeAffinity"]
                             ["requiredDuringSchedulingIgnoredDuringExecution"]},
            # Fluid gives these to the master and the workers (transform_resources.go, transformTolerations): the
            # storage and system taints, never the GPU's. FUSE tolerates every taint by itself (charts/alluxio
            # templates/fuse/daemonset.yaml @ v1.0.8).
            "tolerations": taint_tolerations((*args.storage_pools, *args.system_pools)),
            "placement": "Exclusive",
        },
    }


def nvme_cache_bytes(gpu_pools: Sequence[PoolFacts]) -> int:
    """The warm tier's size per node: a share of the instance store of the smallest GPU node any pool launches."""
    stores = [INSTANCE_TYPES[name].nvme_devices * INSTANCE_TYPES[name].nvme_device_gb * 10**9
              for pool in gpu_pools for name in pool.instance_types if name in INSTANCE_TYPES]
    if not stores or min(stores) == 0:
        raise ValueError("Alluxio's NVMe tier needs instance store on every GPU instance type: "
                         f"pools {', '.join(p.name for p in gpu_pools) or 'none'}")
    return int(min(stores) * NVME_CACHE_FRACTION)


def fuse_options(cache_bytes: int) -> list[str]:
    # Alluxio's userspace data cache for FUSE (docs/en/api/POSIX-API.md, "Userspace Data Cache Configuration",
    # Alluxio 2.9): pages read through FUSE are kept in this directory. As JVM options, not `fuse.properties`:
    # Fluid 1.0.8 also merges those into the runtime-wide properties (transform_fuse.go), i.e. the workers'.
    return [*FUSE_HEAP,
            "-Dalluxio.user.client.cache.enabled=true",
            f"-Dalluxio.user.client.cache.dirs={NVME_CACHE_DIR}",
            f"-Dalluxio.user.client.cache.size={cache_bytes // 2**20}MB"]


def worker_jvm_options(cache: AlluxioSettings) -> list[str]:
    # Setting jvmOptions replaces Fluid's worker defaults (optimizeDefaultForWorker @ v1.0.8), so the ceilings the
    # request counts are the ones the JVM runs with. In MiB: the JVM's own suffixes are binary (g = 2^30).
    return [f"-Xmx{quantity_bytes(cache.worker_heap) // 2**20}m", "-XX:+UnlockExperimentalVMOptions",
            f"-XX:MaxDirectMemorySize={quantity_bytes(cache.worker_direct_memory) // 2**20}m"]


def worker_memory(cache: AlluxioSettings) -> int:
    """Bytes a cache worker may hold: its MEM tier (tmpfs pages on /dev/shm, charged to its cgroup), its heap and its
    direct buffers."""
    return sum(quantity_bytes(q) for q in (cache.memory_cache, cache.worker_heap, cache.worker_direct_memory))


def alluxio_runtime(args: AlluxioArgs) -> dict[str, Any]:
    cache = args.settings
    repository, _, tag = IMAGE.rpartition(":")
    return {
        "apiVersion": FLUID_API_VERSION,
        "kind": "AlluxioRuntime",
        "metadata": {"name": DATASET_NAME, "namespace": DATASET_NAMESPACE, "labels": labels(DATASET_NAME, "data")},
        "spec": {
            "replicas": args.workers,
            "alluxioVersion": {"image": repository, "imageTag": tag},
            # The S3 root mount is read-only in Alluxio too: for a single mount at "/" Fluid only sets the root UFS
            # (pkg/ddc/alluxio/transform.go @ v1.0.8), so the mount's readOnly never applies, and Fluid's own
            # readonly default is commented out (transform_optimization.go l.62). Key: Alluxio 2.9
            # core/common/src/main/java/alluxio/conf/PropertyKey.java MASTER_MOUNT_TABLE_ROOT_READONLY.
            "properties": {ROOT_READONLY: "true"},
            "tieredstore": {"levels": [
                {"mediumtype": "MEM", "path": "/dev/shm", "quota": cache.memory_cache, "high": _HIGH, "low": _LOW},
            ]},
            # Pod network, not the host's: with IMDSv2 limited to one hop a pod cannot reach the node role, so a
            # credential problem fails loudly instead of silently reading S3 as the node (which has no right on
            # the bucket). Set explicitly (AlluxioRuntime `networkMode`, enum HostNetwork | ContainerNetwork in the
            # 1.0.8 CRD) rather than left to Fluid's default, which the review reports as the host network.
            "master": {"nodeSelector": {ROLE_LABEL: "system"}, "networkMode": "ContainerNetwork",
                       "resources": {"requests": dict(_MASTER_REQUESTS)}},
            "worker": {"nodeSelector": {ROLE_LABEL: "storage"}, "networkMode": "ContainerNetwork",
                       "jvmOptions": worker_jvm_options(cache),
                       "resources": {"requests": {"cpu": _WORKER_CPU,
                                                  "memory": f"{-(-worker_memory(cache) // 2**20)}Mi"}}},
            # The FUSE hostPath exists on GPU nodes only (prepare-node.sh mounts the array there; `Directory`, not
            # `DirectoryOrCreate`: a node without its array must not fill the root volume with cache pages).
            "volumes": [{"name": NVME_VOLUME, "hostPath": {"path": CACHE_MOUNT, "type": "Directory"}}],
            "fuse": {"image": repository, "imageTag": tag, "networkMode": "ContainerNetwork",
                     "nodeSelector": {ROLE_LABEL: "gpu"},
                     "volumeMounts": [{"name": NVME_VOLUME, "mountPath": CACHE_MOUNT}],
                     "jvmOptions": fuse_options(nvme_cache_bytes(args.gpu_pools)),
                     "resources": {"requests": dict(_FUSE_REQUESTS)}},
        },
    }


def tenant_dataset(namespace: str) -> dict[str, Any]:
    """Fluid's cross-namespace sharing: a Dataset pointing at the source one; one cache serves every tenant."""
    return {
        "apiVersion": FLUID_API_VERSION,
        "kind": "Dataset",
        "metadata": {"name": DATASET_NAME, "namespace": namespace, "labels": labels(DATASET_NAME, "data")},
        "spec": {
            "mounts": [{"mountPoint": reference_mount_point(), "readOnly": True}],
            "accessModes": ["ReadOnlyMany"],
        },
    }


def chart_values(system_pools: Sequence[PoolFacts]) -> dict[str, Any]:
    """Fluid's controllers, webhook and CRD-upgrade Job tolerate the system pools' taints and nothing else.

    The chart defaults them to every taint and offers no nodeSelector (fluid 1.0.8 values.yaml; `_helpers.tpl`
    fluid.controlplane.affinity only excludes virtual-kubelet), so a taint-free list keeps them on system nodes;
    on a GPU node a Deployment's pod would keep Karpenter from ever consolidating it.
    """
    tolerations = taint_tolerations(system_pools)
    values: dict[str, Any] = {key: {"tolerations": tolerations} for key in _CONTROL_PLANE}
    values["runtime"] = {key: {"tolerations": tolerations} for key in _RUNTIME_CONTROLLERS}
    return values


class Alluxio(pulumi.ComponentResource):
    def __init__(self, name: str, args: AlluxioArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("trainyard:platform:Alluxio", name, None, opts)
        cluster = args.cluster
        self.release = helm_release(f"{name}-fluid", args.chart, cluster, self, values=chart_values(args.system_pools),
                                    depends_on=args.depends_on)
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
        # Where the source's data sits inside each tenant's claim: jobs read `<mount>/<subpath>/<dataset>`.
        self.claim_subpath = claim_subpath(source_mount("", args.region), reference_mount_point())
        self.register_outputs({"release": self.release.id, "claim": self.claim})


def build(ctx: AddonContext) -> Alluxio:
    cluster = ctx.cluster
    if cluster.dataset_bucket is None or cluster.region is None or cluster.dataset_cache_role_arn is None:
        raise ValueError("Alluxio needs the AWS target's dataset bucket, region and cache role (ClusterContext)")
    return Alluxio(ctx.addon.resource_name, AlluxioArgs(
        chart=ctx.chart("fluid"), cluster=cluster, settings=ctx.settings(AlluxioSettings),
        bucket=cluster.dataset_bucket, region=cluster.region, gpu_pools=cluster.pools_with("gpu"),
        storage_pools=cluster.pools_with("storage"), system_pools=cluster.pools_with("system"),
        workers=max(1, sum(pool.min_size for pool in ctx.stack.pools("storage"))),
        role_arn=cluster.dataset_cache_role_arn,
        tenant_namespaces={facts.namespace: facts.ready for facts in ctx.tenants.values()},
        depends_on=ctx.after))


def _gpu_pools_on_aws(stack: Settings) -> bool:
    # The cache serves GPU jobs from the AWS dataset bucket.
    return stack.is_aws and bool(stack.pools("gpu"))


COMPONENT = AddonCode(build=build, applies=_gpu_pools_on_aws)
