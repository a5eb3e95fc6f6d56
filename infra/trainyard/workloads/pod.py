"""The pod template every training job shares: trainer container, volumes, placement and shutdown timing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import pulumi

from trainyard.cloud.context import PoolFacts
from trainyard.config.quantity import quantity_bytes
from trainyard.names import GPU_TAINT_KEY, MLFLOW_CLIENT_CONFIG, POOL_LABEL, TRAINER_SERVICE_ACCOUNT
from trainyard.platform.kube import labels
from trainyard.workloads import launch
from trainyard.workloads.args import TrainingJobArgs
from trainyard.workloads.sizing import EFA_RESOURCE, PodResources

# The trainer's variable for the export prefix (workloads/trainyard_train/export.py EXPORT_ENV).
EXPORT_ENV = "TRAINYARD_CHECKPOINT_EXPORT"
JOB_LABEL = "trainyard.io/job"
TENANT_LABEL = "trainyard.io/tenant"
ZONE_KEY = "topology.kubernetes.io/zone"
# After the trainer's own grace: torchrun tears down its workers and the kubelet stops the container.
GRACE_MARGIN_SECONDS = 30
# No karpenter.sh/do-not-disrupt: Karpenter's drain on a spot interruption, AWS maintenance or a Capacity Block's
# end evicts only pods without it (pkg/utils/pod/scheduling.go IsEvictable, kubernetes-sigs/karpenter v1.14.1), so
# with it the trainer got no SIGTERM before the instance went and lost everything since its last checkpoint. GPU
# NodePools never disrupt a non-empty node voluntarily anyway (platform/karpenter.py: WhenEmpty, no drift or
# underutilization budget, expireAfter Never).
# NCCL/libfabric environment of pods that request EFA, checked against aws-ofi-nccl's doc/efa-env-var.md for the
# plugin the image carries (workloads/Dockerfile: aws-ofi-nccl 1.21.1, libfabric 2.6.0amzn1.0).
# - NCCL_NET: use this network or fail (NCCL env docs, NCCL_NET). Without it a plugin that cannot start (no EFA
#   device, wrong libfabric) leaves NCCL silently on TCP sockets. "Libfabric" is the plugin's name after 1.11.0
#   (src/nccl_ofi_interface_nvidia.cpp, nvidia_plugin_name_fixup; the old "AWS Libfabric" is still accepted).
# - FI_PROVIDER=efa: libfabric loads no other provider (the doc lists it for plugins <= 1.5.0; harmless after).
# - FI_EFA_USE_HUGE_PAGE=0: the data loader forks, and forked children fail to allocate with EFA's hugepage-backed
#   buffers (the doc's fix for "OSError: Cannot allocate memory" from os.fork()).
# FI_EFA_USE_DEVICE_RDMA and NCCL_PROTO are deliberately unset: the doc says not to set them for libfabric >= 1.18
# and aws-ofi-nccl >= 1.7 (GPUDirect RDMA is on by default on p4d/p5), and NCCL_PROTO=simple costs bandwidth.
EFA_ENV = {"NCCL_NET": "Libfabric", "FI_PROVIDER": "efa", "FI_EFA_USE_HUGE_PAGE": "0"}
# The trainer image's unprivileged user (workloads/Dockerfile). Nothing in a training pod needs root, extra
# capabilities or the Kubernetes API (EKS Pod Identity injects its own token for S3).
TRAINER_UID = 10001
POD_SECURITY = {
    "runAsNonRoot": True,
    "runAsUser": TRAINER_UID,
    "runAsGroup": TRAINER_UID,
    "fsGroup": TRAINER_UID,
    # Checkpoint volumes are large: chown them only when their root is not ours yet.
    "fsGroupChangePolicy": "OnRootMismatch",
    "seccompProfile": {"type": "RuntimeDefault"},
}

CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                      "capabilities": {"drop": ["ALL"]}}


def config_map_name(args: TrainingJobArgs) -> str:
    return f"{args.job.name}-trainer-config"


def checkpoint_claim_name(args: TrainingJobArgs) -> str:
    return f"{args.job.name}-checkpoints"


def job_labels(args: TrainingJobArgs) -> dict[str, str]:
    return labels(args.job.name, "training", **{JOB_LABEL: args.job.name, TENANT_LABEL: args.tenant.name})


@dataclass(frozen=True, slots=True)
class PodShape:
    """What differs between job kinds; everything else in the template is common."""

    command: list[str]
    args: list[str]
    resources: PodResources
    restart_policy: Literal["OnFailure", "Never"]
    # Multi-node jobs keep all their pods in one zone: NCCL across zones is slow and costs cross-AZ traffic.
    same_zone: bool = False


def termination_grace_seconds(args: TrainingJobArgs) -> int:
    return args.job.checkpoint_grace_seconds + GRACE_MARGIN_SECONDS


def pod_template(args: TrainingJobArgs, shape: PodShape) -> dict[str, Any]:
    job = args.job
    if quantity_bytes(job.shm_size) >= shape.resources.memory_bytes:
        # /dev/shm is memory-backed and counts against the container's memory limit.
        raise ValueError(f"job {job.name!r}: shmSize {job.shm_size} leaves no memory in the pod's "
                         f"{shape.resources.memory_bytes // 2**20}Mi limit")
    spec: dict[str, Any] = {
        "restartPolicy": shape.restart_policy,
        "serviceAccountName": TRAINER_SERVICE_ACCOUNT,
        "automountServiceAccountToken": False,
        "securityContext": dict(POD_SECURITY),
        "priorityClassName": args.priority_class,
        "terminationGracePeriodSeconds": termination_grace_seconds(args),
        "containers": [_container(args, shape)],
        "volumes": _volumes(args),
    }
    if args.pool is not None:
        spec["nodeSelector"] = {POOL_LABEL: args.pool.name}
        spec["tolerations"] = _tolerations(args, shape)
    if shape.same_zone:
        spec["affinity"] = {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
            "labelSelector": {"matchLabels": {JOB_LABEL: job.name}},
            "topologyKey": ZONE_KEY,
        }]}}
    return {"metadata": {"labels": job_labels(args)}, "spec": spec}


def checkpoint_export(args: TrainingJobArgs) -> pulumi.Output[str] | None:
    """Where the trainer copies committed checkpoints (and restores from when its claim is empty): the job's
    prefix under its namespace's in the checkpoint bucket, the only prefix its role may write
    (cloud/iam.py namespace_read_write; trainyard_train/export.py reads it)."""
    bucket = args.cluster.checkpoint_bucket
    if bucket is None:
        return None
    return pulumi.Output.concat("s3://", bucket, f"/{args.namespace}/{args.job.name}/")


def _container(args: TrainingJobArgs, shape: PodShape) -> dict[str, Any]:
    env: dict[str, pulumi.Input[str]] = {
        "TRAINYARD_METRICS_PORT": str(launch.METRICS_PORT),
        # A fresh rendezvous store per round: restarted workers must not dial their predecessors' addresses.
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        # The root filesystem is read-only: caches that default to $HOME (Triton's ~/.triton, CUDA's ~/.nv,
        # ~/.cache) go to the writable /tmp instead of failing on the image's /home/trainer.
        "HOME": "/tmp",
        # One MLflow experiment per job (MLflow's own variable; trainyard_train/tracking.py reads it), under the
        # namespace: experiment names are one namespace for the whole server.
        "MLFLOW_EXPERIMENT_NAME": f"{args.namespace}/{args.job.name}",
    }
    if (export := checkpoint_export(args)) is not None:
        env[EXPORT_ENV] = export
        # boto3 takes its region from here; Pod Identity injects credentials only (AWS_CONTAINER_CREDENTIALS_*).
        env |= {"AWS_REGION": str(args.cluster.region), "AWS_DEFAULT_REGION": str(args.cluster.region)}
    if EFA_RESOURCE in shape.resources.accelerators:
        # EFA pins NCCL's buffers; no IPC_LOCK (tenant namespaces enforce Pod Security "baseline", which refuses
        # it): the node bootstrap gives containerd, and so every container, an unlimited RLIMIT_MEMLOCK.
        env |= EFA_ENV
    mounts = [
        {"name": "trainer-config", "mountPath": launch.CONFIG_DIR, "readOnly": True},
        {"name": "checkpoints", "mountPath": launch.CHECKPOINT_DIR},
        {"name": "dshm", "mountPath": "/dev/shm"},
        # The root filesystem is read-only; torchrun keeps its per-run logs under /tmp.
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    if args.dataset_claim is not None:
        # HostToContainer: when Fluid's CSI plugin remounts a restarted FUSE pod (FuseRecovery), the new mount
        # propagates into this container (fluid docs/en/samples/fuse_recover.md @ v1.0.8); without it the trainer
        # keeps a dead mount (ENOTCONN) until its pod is recreated.
        mounts.append({"name": "dataset", "mountPath": launch.DATASET_DIR, "readOnly": True,
                       "mountPropagation": "HostToContainer"})
    return {
        "name": "trainer",
        "image": args.job.image,
        "command": shape.command,
        "args": shape.args,
        "env": [{"name": name, "value": value} for name, value in env.items()],
        # The namespace's tracking server, user and artifact root, when the platform runs MLflow; optional, so a job
        # on a stack without it starts all the same and tracks nothing (Kubernetes docs, "Distribute Credentials
        # Securely Using Secrets": envFrom secretRef, optional).
        "envFrom": [{"secretRef": {"name": MLFLOW_CLIENT_CONFIG, "optional": True}}],
        "ports": [
            {"name": "c10d", "containerPort": launch.RDZV_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": launch.METRICS_PORT, "protocol": "TCP"},
        ],
        "resources": shape.resources.as_k8s(),
        "volumeMounts": mounts,
        "securityContext": dict(CONTAINER_SECURITY),
    }


def _volumes(args: TrainingJobArgs) -> list[dict[str, Any]]:
    volumes: list[dict[str, Any]] = [
        {"name": "trainer-config", "configMap": {"name": config_map_name(args)}},
        {"name": "checkpoints", "persistentVolumeClaim": {"claimName": checkpoint_claim_name(args)}},
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": args.job.shm_size}},
        {"name": "tmp", "emptyDir": {"sizeLimit": "10Gi"}},
    ]
    if args.dataset_claim is not None:
        volumes.append({"name": "dataset",
                        "persistentVolumeClaim": {"claimName": args.dataset_claim, "readOnly": True}})
    return volumes


def _tolerations(args: TrainingJobArgs, shape: PodShape) -> list[dict[str, str]]:
    assert args.pool is not None
    return pool_tolerations(args.pool, shape.resources)


def pool_tolerations(pool: PoolFacts, resources: PodResources) -> list[dict[str, str]]:
    """The pool's own taints, and the GPU taint when the pod takes GPUs."""
    tolerations = [{"key": t.key, "operator": "Equal", "value": t.value, "effect": t.effect}
                   for t in pool.taints if t.key != GPU_TAINT_KEY]
    if resources.accelerators.keys() - {EFA_RESOURCE}:
        # Whole GPUs and MIG slices alike sit on nodes tainted nvidia.com/gpu, whatever its value.
        tolerations.append({"key": GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"})
    return tolerations

