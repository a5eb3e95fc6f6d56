"""The fabric check: `trainyard_train.commcheck` on a gang of two whole nodes of one EFA pool, once.

Pulumi creates the Volcano Job once per EFA pool; Volcano runs it as soon as Karpenter has launched two nodes of
the pool, and it ends Completed (bus bandwidth at the largest size reached the pool's threshold, every result
correct) or Failed. Nothing retries it: a failed check is the finding. It is created again only when its spec
changes (a new threshold, image or pool shape) or on `pulumi up --replace` of its URN; the README says how to
read it. It does not hold up `pulumi up`: the nodes it needs may take minutes to come.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from trainyard.cloud.context import ClusterContext, PoolFacts
from trainyard.config.instance_types import FABRIC_CHECK_NODES, FABRIC_CHECK_SHM, fabric_check_pod
from trainyard.config.mig import WHOLE_GPU_RESOURCE
from trainyard.names import NETWORK_LAYER_LABELS, POOL_LABEL, fabric_check_job
from trainyard.platform.context import TenantFacts
from trainyard.platform.kube import k8s_options, labels
from trainyard.platform.network_policy import CILIUM_API_VERSION
from trainyard.platform.objects import custom_resource
from trainyard.workloads import launch, sizing, volcano
from trainyard.workloads.pod import (
    CONTAINER_SECURITY,
    EFA_ENV,
    JOB_LABEL,
    POD_SECURITY,
    TENANT_LABEL,
    ZONE_KEY,
    pool_tolerations,
)

CHECK_LABEL = "trainyard.io/check"
# NCCL logs which network and plugin it initialised ("NET/OFI Initializing aws-ofi-nccl 1.21.1", "Using network
# Libfabric"): the lines that tell EFA from a fallback (NCCL env docs: NCCL_DEBUG, NCCL_DEBUG_SUBSYS).
NCCL_LOGGING = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}
# A check that hangs (NCCL stuck on a broken fabric, a peer that never joins) must not hold two GPU nodes forever:
# the kubelet fails each pod this long after it starts on its node (pod activeDeadlineSeconds), which fails the
# job. Room for pulling the trainer image onto fresh nodes, the rendezvous, NCCL's setup and the sweep (minutes).
DEADLINE_SECONDS = 2700
# Room for torchrun's per-run logs: the root filesystem is read-only.
TMP_SIZE = "1Gi"


@dataclass(frozen=True)
class FabricCheckArgs:
    pool: PoolFacts
    tenant: TenantFacts
    cluster: ClusterContext
    # The trainer image: it carries trainyard_train.commcheck, libfabric and aws-ofi-nccl.
    image: str
    # config/instance_types.py: fabric_threshold of the pool's types, with the EFA devices its pods get.
    min_busbw_gbps: float
    priority_class: str
    volcano: pulumi.Resource | None = None

    @property
    def name(self) -> str:
        return fabric_check_job(self.pool.name)


def command(args: FabricCheckArgs, processes: int) -> tuple[list[str], list[str]]:
    """(command, args): torchrun over c10d on exactly two nodes, no restarts, around the commcheck module."""
    name, namespace = args.name, args.tenant.namespace
    torchrun = [
        f"--nnodes={FABRIC_CHECK_NODES}",
        f"--nproc-per-node={processes}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={launch.rendezvous_endpoint(name, namespace)}",
        f"--rdzv-id={namespace}-{name}",
        "--max-restarts=0",
    ]
    module = ["-m", "trainyard_train.commcheck", f"--min-busbw-gbps={args.min_busbw_gbps}",
              f"--node-labels={','.join(NETWORK_LAYER_LABELS)}"]
    return ["sh", "-c", launch.ELASTIC_WRAPPER, "torchrun"], [*torchrun, *module]


class FabricCheck(pulumi.ComponentResource):
    """One Volcano Job: a gang of two pods, each on its own node of the pool with all its GPUs and EFA devices."""

    TYPE = "trainyard:workloads:FabricCheck"

    volcano_job: k8s.apiextensions.CustomResource

    def __init__(self, name: str, args: FabricCheckArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(self.TYPE, name, None, opts)
        metadata = {"name": args.name, "namespace": args.tenant.namespace, "labels": _labels(args),
                    "annotations": dict(volcano.CHECKOV_SKIPS)}
        spec = {
            "schedulerName": volcano.SCHEDULER,
            "queue": args.tenant.queue,
            "priorityClassName": args.priority_class,
            # Both pods or neither: one node alone measures nothing between nodes.
            "minAvailable": FABRIC_CHECK_NODES,
            "minSuccess": FABRIC_CHECK_NODES,
            "maxRetry": 0,
            "plugins": {"svc": list(volcano.SVC_PLUGIN), "env": []},
            "policies": [dict(volcano.TERMINATE_ON_FAILED_POD)],
            "tasks": [{"name": launch.WORKER_TASK, "replicas": FABRIC_CHECK_NODES, "template": pod_template(args)}],
            # Two nodes as close as the pool has them, never a wait for closer ones: the check reports which
            # network layers its nodes share, so its figure can be read against where it ran.
            "networkTopology": dict(volcano.SOFT_TOPOLOGY),
        }
        crds = [args.volcano] if args.volcano is not None else []
        node_reader = self._node_reader(name, args)
        self.volcano_job = k8s.apiextensions.CustomResource(
            name, api_version=volcano.API_VERSION, kind=volcano.KIND, metadata=metadata, spec=spec,
            opts=pulumi.ResourceOptions.merge(
                k8s_options(args.cluster, self, [*args.tenant.ready, *crds, *node_reader]),
                volcano.REPLACE_ON_SPEC_CHANGE),
        )
        self.register_outputs({"job_name": args.name, "min_busbw_gbps": args.min_busbw_gbps})

    def _node_reader(self, name: str, args: FabricCheckArgs) -> list[pulumi.Resource]:
        """Lets the check's pods read their nodes' topology labels: a service account that may get nodes, and
        egress to the API server, which the tenant namespace's default deny otherwise closes."""
        ready = k8s_options(args.cluster, self, args.tenant.ready)
        meta: Any = {"name": args.name, "namespace": args.tenant.namespace, "labels": _labels(args)}
        account = k8s.core.v1.ServiceAccount(f"{name}-account", metadata=meta, opts=ready)
        cluster_meta: Any = {"name": f"trainyard-{args.name}-nodes", "labels": _labels(args)}
        rules: Any = [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]
        role = k8s.rbac.v1.ClusterRole(f"{name}-nodes", metadata=cluster_meta, rules=rules, opts=ready)
        role_ref: Any = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_meta["name"]}
        subjects: Any = [{"kind": "ServiceAccount", "name": args.name, "namespace": args.tenant.namespace}]
        binding = k8s.rbac.v1.ClusterRoleBinding(
            f"{name}-nodes", metadata=cluster_meta, role_ref=role_ref, subjects=subjects,
            opts=k8s_options(args.cluster, self, [role, account]))
        # Cilium adds allow rules up: this opens port 443 to the API server for the check's pods only (Cilium
        # docs, Policy Language, Entities: kube-apiserver).
        api = custom_resource(f"{name}-api-egress", {
            "apiVersion": CILIUM_API_VERSION, "kind": "CiliumNetworkPolicy",
            "metadata": {"name": f"{args.name}-api", "namespace": args.tenant.namespace, "labels": _labels(args)},
            "spec": {"endpointSelector": {"matchLabels": {JOB_LABEL: args.name}},
                     "egress": [{"toEntities": ["kube-apiserver"],
                                 "toPorts": [{"ports": [{"port": "443", "protocol": "TCP"}]}]}]},
        }, ready)
        return [account, binding, api]


def _labels(args: FabricCheckArgs) -> dict[str, str]:
    return labels(args.name, "fabric-check", **{JOB_LABEL: args.name, TENANT_LABEL: args.tenant.name,
                                               CHECK_LABEL: "fabric", POOL_LABEL: args.pool.name})


def check_resources(pool: PoolFacts) -> sizing.PodResources:
    """All of the smallest node's GPUs (NVLink inside, EFA between the nodes) and every EFA device pods get, in the
    shape the platform sized the checks' queue for (config/instance_types.py, fabric_check_pod)."""
    pod = fabric_check_pod(pool.instance_types)
    return sizing.PodResources(
        accelerators={WHOLE_GPU_RESOURCE: pod.gpus, sizing.EFA_RESOURCE: pool.efa_interfaces},
        millicpu=pod.millicpu, memory_bytes=pod.memory_bytes, processes=pod.gpus)


def pod_template(args: FabricCheckArgs) -> dict[str, Any]:
    pool = args.pool
    resources = check_resources(pool)
    cmd, arguments = command(args, resources.processes)
    # HOME on the writable /tmp: the root filesystem is read-only (CUDA's JIT cache defaults to ~/.nv).
    plain = {**EFA_ENV, **NCCL_LOGGING, "HOME": "/tmp"}
    env: list[dict[str, Any]] = [{"name": key, "value": value} for key, value in plain.items()]
    # commcheck --node-labels reads this node's labels (downward API: the node the pod runs on).
    env.append({"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}})
    container = {
        "name": "commcheck",
        "image": args.image,
        "command": cmd,
        "args": arguments,
        "env": env,
        "ports": [{"name": "c10d", "containerPort": launch.RDZV_PORT, "protocol": "TCP"}],
        "resources": resources.as_k8s(),
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}, {"name": "tmp", "mountPath": "/tmp"}],
        "securityContext": dict(CONTAINER_SECURITY),
    }
    spec = {
        # A failed check is a result: the pod is not restarted in place (and the job has no retries).
        "restartPolicy": "Never",
        "activeDeadlineSeconds": DEADLINE_SECONDS,
        # Its own account, which may only get nodes: commcheck reads the topology labels of its node.
        "serviceAccountName": args.name,
        "automountServiceAccountToken": True,
        "securityContext": dict(POD_SECURITY),
        "priorityClassName": args.priority_class,
        "nodeSelector": {POOL_LABEL: pool.name},
        "tolerations": pool_tolerations(pool, resources),
        # Both pods in one zone (a pool without a placement group may span several). Each takes all of a node's
        # GPUs, so they never share one.
        "affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
            "labelSelector": {"matchLabels": {JOB_LABEL: args.name}}, "topologyKey": ZONE_KEY,
        }]}},
        "containers": [container],
        "volumes": [
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": FABRIC_CHECK_SHM}},
            {"name": "tmp", "emptyDir": {"sizeLimit": TMP_SIZE}},
        ],
    }
    return {"metadata": {"labels": _labels(args)}, "spec": spec}
