"""GPU node admission: a DaemonSet that checks every new GPU node before anything may run on it.

Each GPU NodePool starts its nodes with the startup taint `trainyard.io/gpu-health` (cloud layer, PoolFacts).
The DaemonSet runs on GPU nodes not yet labelled `trainyard.io/gpu-health=passed` and runs
`platform/gpu-health/gpu-health-check.sh` in three containers: wait for the GPU Operator's validation (and the
MIG layout on MIG pools), run the pool's DCGM check (diagnostics on whole GPUs; health watches and the MIG devices
against the layout on MIG pools, where dcgmi diag refuses to run), count GPUs, GPU memory and EFA devices and, where
the dataset cache runs, look for the NVMe cache filesystem prepare-node.sh mounts, then compare with the pool's
expectations rendered here from the instance-type and MIG tables. A pass removes the
startup taint and labels the node passed, which takes the node out of the DaemonSet; a failure adds the
`trainyard.io/gpu-health-failed` taint (reason as value), labels the reason and records an Event.

Karpenter never disrupts a node that is not initialized (kubernetes-sigs/karpenter v1.14.1
pkg/controllers/state/statenode.go ValidateNodeDisruptable) and its liveness check has no initialization timeout
(pkg/controllers/nodeclaim/lifecycle/liveness.go), so a failed node would run until someone deletes it: the
`gpu-health-reaper` CronJob runs the same script's `reap` step, which fails a node left without a verdict for
`stuckMinutes` and deletes the NodeClaim of a node failed for `failedHoldHours` or beyond its pool's newest
`maxFailedNodesPerPool`. See the README, "GPU node health".

The add-on `gpuHealth` of platform/addons.yaml: no chart, this component (`COMPONENT`), on when the stack has GPU
pools and `addons.gpuHealth.enabled`.
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import yaml

from trainyard import names
from trainyard.cloud.context import ClusterContext, PoolFacts
from trainyard.cloud.userdata import CACHE_MOUNT
from trainyard.config import Settings
from trainyard.config.instance_types import INSTANCE_TYPES
from trainyard.config.mig import MigCatalog, load_mig_catalog
from trainyard.config.model import GpuHealthSettings
from trainyard.paths import PLATFORM_DIR
from trainyard.platform.addon import AddonCode, AddonContext
from trainyard.platform.kube import checkov_skips, k8s_options, labels
from trainyard.platform.scheduling import startup_tolerations, tolerations_for

SCRIPT = PLATFORM_DIR / "gpu-health" / "gpu-health-check.sh"
NAMESPACE = names.GPU_HEALTH_NAMESPACE
NAME = "gpu-health-check"
REAPER = "gpu-health-reaper"
# Often enough that a node outlives its hold by at most this much.
REAPER_SCHEDULE = "*/10 * * * *"
SCRIPT_KEY = "gpu-health-check.sh"
EXPECTED_KEY = "expected.tsv"
SCRIPT_DIR = "/opt/gpu-health"
STATE_DIR = "/run/gpu-health"
# Pinned, with their sources, in platform/gpu-health/images.yaml.
IMAGES = yaml.safe_load((PLATFORM_DIR / "gpu-health" / "images.yaml").read_text(encoding="utf-8"))
DCGM_IMAGE: str = IMAGES["dcgm"]
KUBECTL_IMAGE: str = IMAGES["kubectl"]
UNPRIVILEGED_USER = 65532
# Written by the GPU Operator's validator (NVIDIA/gpu-operator validator, /run/nvidia/validations).
VALIDATIONS_HOST_PATH = "/run/nvidia/validations"
# The probe sees host paths under /host: the cache's parent, submounts included (CRI bind mounts are recursive), to
# find the NVMe cache mount. Not the cache itself: a missing hostPath is created (empty type) or blocks the pod.
HOST_ROOT = "/host"
CACHE_PARENT = posixpath.dirname(CACHE_MOUNT)


# Why the DaemonSet does not pass these Checkov checks (checkov.io/skip<N> annotations, tests/review).
_PRIVILEGED = "the probe container runs DCGM diagnostics on the GPUs, which needs a privileged container"
CHECKOV_SKIPS = checkov_skips((
    ("CKV_K8S_8", "a run-once check with nothing to probe: its outcome is the node's taint and label"),
    ("CKV_K8S_9", "a run-once check with nothing to probe: its outcome is the node's taint and label"),
    ("CKV_K8S_43", "tags taken from upstream release data; no digest could be verified offline"),
    ("CKV_K8S_16", _PRIVILEGED), ("CKV_K8S_20", _PRIVILEGED), ("CKV_K8S_22", _PRIVILEGED),
    ("CKV_K8S_28", _PRIVILEGED), ("CKV_K8S_37", _PRIVILEGED),
    ("CKV_K8S_38", "the wait and admit steps read and patch the node through the API server"),
))


# Why the reaper CronJob does not pass these.
REAPER_CHECKOV_SKIPS = {
    "checkov.io/skip1": "CKV_K8S_43=tags taken from upstream release data; no digest could be verified offline",
    "checkov.io/skip2": "CKV_K8S_38=it lists and patches nodes and deletes NodeClaims through the API server",
}


# A check pod stays in its init steps for up to waitMinutes plus the diagnostic on a node that joins during an
# update: `pulumi up` must not wait for (or time out on) a rollout whose pace is the nodes' (pulumi-kubernetes
# honours pulumi.com/skipAwait on every kind it awaits).
SKIP_AWAIT = {"pulumi.com/skipAwait": "true"}


@dataclass(frozen=True)
class GpuHealthArgs:
    cluster: ClusterContext
    gpu_pools: tuple[PoolFacts, ...]
    settings: GpuHealthSettings
    # platform/gpu-health/gpu-health-check.sh, verbatim.
    script: str
    # Whether the dataset cache runs: its FUSE pods mount the NVMe cache of every GPU node that has instance store
    # (platform/alluxio.py, hostPath of type Directory), so a node without it must not be admitted.
    dataset_cache: bool = False
    depends_on: Sequence[pulumi.Resource] = ()


# The DCGM check of a node: the diagnostic on whole GPUs; on MIG-partitioned GPUs DCGM refuses it ("MIG
# configuration is incompatible with the diagnostic": NVIDIA/DCGM v4.6.0 nvvs/src/Gpu.cpp IsMigModeDiagCompatible,
# nvvs/src/NvidiaValidationSuite.cpp BuildCommonGpusList), so there its health watches and the partition decide.
DIAG_CHECK = "dcgm-diag"
HEALTH_CHECK = "dcgm-health"


def mig_devices(pool: PoolFacts, instance_type: str, mig: MigCatalog) -> dict[str, int]:
    """MIG profile -> devices a node of this pool and type shows once mig-manager applied its layout; empty for
    whole GPUs (no layout, or a layout that leaves MIG off)."""
    if pool.mig_layout is None or pool.gpu is None:
        return {}
    gpus = INSTANCE_TYPES[instance_type].gpu_count
    return {profile: per_gpu * gpus for profile, per_gpu in mig.slices(pool.mig_layout, pool.gpu).items()}


def admission_check(pool: PoolFacts, instance_type: str, mig: MigCatalog) -> str:
    return HEALTH_CHECK if mig_devices(pool, instance_type, mig) else DIAG_CHECK


def expectations(pools: Sequence[PoolFacts], mig: MigCatalog | None = None, dataset_cache: bool = False) -> str:
    """One row per pool and instance type: GPUs, nominal MiB per GPU, EFA devices required, MIG layout, the MIG
    devices it must show (profile=count, byte order, as the script lists them), the DCGM check and the NVMe cache
    mount it must carry ("-": none)."""
    mig = mig or load_mig_catalog()
    rows = ["# pool instance-type gpus gpu-memory-mib efa-devices mig-layout mig-devices check nvme-cache"]
    for pool in pools:
        for name in pool.instance_types:
            it = INSTANCE_TYPES[name]
            # An EFA pool's node class gives every type the pool's efa_interfaces efa-only interfaces
            # (platform/karpenter.py); the check requires them when the node's NodeClaim requested EFA.
            efa = pool.efa_interfaces
            devices = ",".join(f"{p}={n}" for p, n in sorted(mig_devices(pool, name, mig).items())) or "-"
            # prepare-node.sh builds the cache from the instance store of every GPU node that has one, and refuses
            # (leaving no mount) when the devices hold foreign data.
            cache = CACHE_MOUNT if dataset_cache and it.nvme_devices else "-"
            rows.append(f"{pool.name} {name} {it.gpu_count} {it.gpu_memory_gib * 1024} {efa} "
                        f"{pool.mig_layout or '-'} {devices} {admission_check(pool, name, mig)} {cache}")
    return "\n".join(rows) + "\n"


def _restricted() -> dict[str, Any]:
    return {"runAsNonRoot": True, "runAsUser": UNPRIVILEGED_USER, "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}}


def daemonset_spec(args: GpuHealthArgs) -> dict[str, Any]:
    settings = args.settings
    selector = {"app.kubernetes.io/name": NAME}
    env = [
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "STATE_DIR", "value": STATE_DIR},
        {"name": "EXPECTED", "value": f"{SCRIPT_DIR}/{EXPECTED_KEY}"},
        {"name": "WAIT_SECONDS", "value": str(settings.wait_minutes * 60)},
        {"name": "DIAG_LEVEL", "value": str(settings.diag_level)},
        {"name": "MIN_MEMORY_PERCENT", "value": str(settings.min_memory_percent)},
        {"name": "HOST_ROOT", "value": HOST_ROOT},
        # kubectl keeps its discovery cache under $HOME; the root filesystem is read-only.
        {"name": "HOME", "value": STATE_DIR},
    ]
    script_mount = {"name": "script", "mountPath": SCRIPT_DIR, "readOnly": True}
    state_mount = {"name": "state", "mountPath": STATE_DIR}
    run = ["bash", f"{SCRIPT_DIR}/{SCRIPT_KEY}"]
    small = {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"cpu": "200m", "memory": "128Mi"}}
    return {
        "selector": {"matchLabels": selector},
        "template": {
            "metadata": {"labels": {**labels(NAME, "gpu-health"), **selector}},
            "spec": {
                "serviceAccountName": NAME,
                "priorityClassName": "system-node-critical",
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [
                        {"key": names.ROLE_LABEL, "operator": "In", "values": ["gpu"]},
                        # The DaemonSet controller removes the pod once the node is labelled passed.
                        {"key": names.GPU_HEALTH_LABEL, "operator": "NotIn", "values": ["passed"]},
                    ]}]}}},
                "tolerations": [
                    *tolerations_for(args.gpu_pools), *startup_tolerations(args.gpu_pools),
                    {"key": names.GPU_HEALTH_FAILED_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"},
                ],
                "terminationGracePeriodSeconds": 5,
                "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
                "initContainers": [
                    {"name": "wait", "image": KUBECTL_IMAGE, "imagePullPolicy": "Always", "command": [*run, "wait"],
                     "env": env, "resources": small, "securityContext": _restricted(),
                     "volumeMounts": [script_mount, state_mount,
                                      {"name": "validations", "mountPath": VALIDATIONS_HOST_PATH,
                                       "readOnly": True}]},
                    {"name": "probe", "image": DCGM_IMAGE, "imagePullPolicy": "Always", "command": [*run, "probe"],
                     # The AMI makes the NVIDIA runtime containerd's default; these select every GPU and the
                     # driver's utilities (nvidia-smi) without holding a device-plugin allocation.
                     "env": [*env, {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
                             {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "compute,utility"}],
                     # DCGM diagnostics run stress and memory tests on the devices: as privileged as the node
                     # monitoring agent's own DCGM host engine.
                     "securityContext": {"privileged": True},
                     "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "4", "memory": "8Gi"}},
                     "volumeMounts": [script_mount, state_mount,
                                      {"name": "sys-class", "mountPath": "/host/sys/class", "readOnly": True},
                                      {"name": "cache-parent", "mountPath": HOST_ROOT + CACHE_PARENT, "readOnly": True,
                                       "mountPropagation": "HostToContainer"}]},
                ],
                "containers": [
                    # Stays up after deciding: a failed node keeps its pod (and logs) for inspection.
                    {"name": "admit", "image": KUBECTL_IMAGE, "imagePullPolicy": "Always",
                     "command": ["bash", "-c", f"{' '.join(run)} admit && exec sleep infinity"], "env": env,
                     "resources": small, "securityContext": _restricted(),
                     "volumeMounts": [script_mount, state_mount]},
                ],
                "volumes": [
                    {"name": "script", "configMap": {"name": NAME, "defaultMode": 0o555}},
                    {"name": "state", "emptyDir": {"sizeLimit": "64Mi"}},
                    {"name": "validations", "hostPath": {"path": VALIDATIONS_HOST_PATH,
                                                         "type": "DirectoryOrCreate"}},
                    # /sys/class/infiniband exists only with EFA devices: mount its parent.
                    {"name": "sys-class", "hostPath": {"path": "/sys/class", "type": "Directory"}},
                    {"name": "cache-parent", "hostPath": {"path": CACHE_PARENT, "type": "DirectoryOrCreate"}},
                ],
            },
        },
    }


def reaper_spec(args: GpuHealthArgs) -> dict[str, Any]:
    """The CronJob that bounds the life of nodes admission failed or never decided (the script's `reap` step)."""
    settings = args.settings
    env: list[dict[str, Any]] = [
        {"name": "NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "STUCK_SECONDS", "value": str(settings.stuck_minutes * 60)},
        {"name": "FAILED_HOLD_SECONDS", "value": str(settings.failed_hold_hours * 3600)},
        {"name": "MAX_FAILED_PER_POOL", "value": str(settings.max_failed_nodes_per_pool)},
        # Reserved-only pools have no fallback capacity: a held failure keeps a reserved instance and the pool's
        # node limit (kubernetes-sigs/karpenter v1.14.1 scheduling/scheduler.go counts every NodeClaim against it).
        {"name": "UNHELD_POOLS", "value": " ".join(sorted(p.name for p in args.gpu_pools
                                                          if p.capacity_types == ("reserved",)))},
        # kubectl keeps its discovery cache under $HOME; the root filesystem is read-only.
        {"name": "HOME", "value": STATE_DIR},
    ]
    pod: dict[str, Any] = {
        "serviceAccountName": REAPER,
        "restartPolicy": "Never",
        # On the managed system nodes, next to the controllers: never on a GPU node it may reclaim.
        "nodeSelector": {names.ROLE_LABEL: "system"},
        "tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"}],
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{
            "name": "reap", "image": KUBECTL_IMAGE, "imagePullPolicy": "Always",
            "command": ["bash", f"{SCRIPT_DIR}/{SCRIPT_KEY}", "reap"],
            "env": env, "securityContext": _restricted(),
            "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"cpu": "200m", "memory": "128Mi"}},
            "volumeMounts": [{"name": "script", "mountPath": SCRIPT_DIR, "readOnly": True},
                             {"name": "state", "mountPath": STATE_DIR}],
        }],
        "volumes": [{"name": "script", "configMap": {"name": NAME, "defaultMode": 0o555}},
                    {"name": "state", "emptyDir": {"sizeLimit": "64Mi"}}],
    }
    return {
        "schedule": REAPER_SCHEDULE,
        "concurrencyPolicy": "Forbid",
        "startingDeadlineSeconds": 300,
        "successfulJobsHistoryLimit": 1,
        "failedJobsHistoryLimit": 3,
        "jobTemplate": {"spec": {"backoffLimit": 1, "activeDeadlineSeconds": 300,
                                 "template": {"metadata": {"labels": labels(REAPER, "gpu-health")}, "spec": pod}}},
    }


class GpuHealth(pulumi.ComponentResource):
    """Namespace, least-privilege RBAC, the script as a ConfigMap, the admission DaemonSet and the reaper."""

    daemonset: k8s.apps.v1.DaemonSet
    reaper: k8s.batch.v1.CronJob
    # What dependants of an add-on wait for (platform.addon.Installed): here the DaemonSet.
    release: pulumi.Resource

    def __init__(self, name: str, args: GpuHealthArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("trainyard:platform:GpuHealth", name, None, opts)
        cluster = args.cluster
        meta = labels(NAME, "gpu-health")
        namespace = k8s.core.v1.Namespace(
            f"{name}-namespace",
            # The probe container runs DCGM privileged and mounts host paths.
            metadata={"name": NAMESPACE, "labels": {**meta, "pod-security.kubernetes.io/enforce": "privileged"}},
            opts=k8s_options(cluster, self, args.depends_on))
        # Plain manifest-shaped bodies (camelCase keys, as the provider sends them).
        in_namespace: Any = {"name": NAME, "namespace": NAMESPACE, "labels": meta}
        cluster_meta: Any = {"name": NAME, "labels": meta}
        subject: Any = [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}]
        reaper_subject: Any = [{"kind": "ServiceAccount", "name": REAPER, "namespace": NAMESPACE}]
        event_subjects: Any = [*subject, *reaper_subject]
        # Labels and taints are patches on the node; RBAC cannot narrow it to the pod's own node.
        node_rules: Any = [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]},
                           # Whether Karpenter launched the node with EFA interfaces (its NodeClaim's requests).
                           {"apiGroups": ["karpenter.sh"], "resources": ["nodeclaims"], "verbs": ["list"]}]
        # The reaper lists GPU nodes, marks stuck ones failed, and deletes the NodeClaims of expired failures.
        reaper_rules: Any = [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "patch"]},
                             {"apiGroups": ["karpenter.sh"], "resources": ["nodeclaims"], "verbs": ["list", "delete"]}]
        event_rules: Any = [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]
        deny_ingress: Any = {"podSelector": {}, "policyTypes": ["Ingress"]}
        daemonset_meta: Any = {**in_namespace, "annotations": {**CHECKOV_SKIPS, **SKIP_AWAIT}}
        spec: Any = daemonset_spec(args)

        after_namespace = k8s_options(cluster, self, [namespace])
        account = k8s.core.v1.ServiceAccount(f"{name}-account", metadata=in_namespace, opts=after_namespace)
        node_role = k8s.rbac.v1.ClusterRole(f"{name}-nodes", metadata=cluster_meta, rules=node_rules,
                                            opts=k8s_options(cluster, self, args.depends_on))
        node_binding = k8s.rbac.v1.ClusterRoleBinding(
            f"{name}-nodes", metadata=cluster_meta, role_ref=_role_ref("ClusterRole"), subjects=subject,
            opts=k8s_options(cluster, self, [node_role, account]))
        reaper_meta: Any = {"name": REAPER, "labels": meta}
        reaper_in_namespace: Any = {**reaper_meta, "namespace": NAMESPACE}
        reaper_account = k8s.core.v1.ServiceAccount(f"{name}-reaper-account", metadata=reaper_in_namespace,
                                                    opts=after_namespace)
        reaper_role = k8s.rbac.v1.ClusterRole(f"{name}-reaper", metadata=reaper_meta, rules=reaper_rules,
                                              opts=k8s_options(cluster, self, args.depends_on))
        reaper_binding = k8s.rbac.v1.ClusterRoleBinding(
            f"{name}-reaper", metadata=reaper_meta, role_ref=_role_ref("ClusterRole", REAPER),
            subjects=reaper_subject, opts=k8s_options(cluster, self, [reaper_role, reaper_account]))
        event_role = k8s.rbac.v1.Role(f"{name}-events", metadata=in_namespace, rules=event_rules,
                                      opts=after_namespace)
        event_binding = k8s.rbac.v1.RoleBinding(
            f"{name}-events", metadata=in_namespace, role_ref=_role_ref("Role"), subjects=event_subjects,
            opts=k8s_options(cluster, self, [event_role, account, reaper_account]))
        script = k8s.core.v1.ConfigMap(
            f"{name}-script", metadata=in_namespace,
            data={SCRIPT_KEY: args.script,
                  EXPECTED_KEY: expectations(args.gpu_pools, dataset_cache=args.dataset_cache)},
            opts=after_namespace)
        # Nothing connects to the check: all ingress denied; egress (the API server) stays open.
        k8s.networking.v1.NetworkPolicy(f"{name}-deny-ingress", metadata=in_namespace, spec=deny_ingress,
                                        opts=after_namespace)
        self.daemonset = k8s.apps.v1.DaemonSet(
            f"{name}-daemonset", metadata=daemonset_meta, spec=spec,
            opts=k8s_options(cluster, self, [script, node_binding, event_binding]))
        cron_spec: Any = reaper_spec(args)
        cron_meta: Any = {**reaper_in_namespace, "annotations": REAPER_CHECKOV_SKIPS}
        self.reaper = k8s.batch.v1.CronJob(
            f"{name}-reaper", metadata=cron_meta, spec=cron_spec,
            opts=k8s_options(cluster, self, [script, reaper_binding, event_binding]))
        self.release = self.daemonset
        self.register_outputs({"daemonset": self.daemonset.metadata["name"], "reaper": self.reaper.metadata["name"]})


def _role_ref(kind: str, name: str = NAME) -> Any:
    return {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name}


def build(ctx: AddonContext) -> GpuHealth:
    return GpuHealth(ctx.addon.resource_name, GpuHealthArgs(
        cluster=ctx.cluster, gpu_pools=ctx.cluster.pools_with("gpu"), settings=ctx.settings(GpuHealthSettings),
        script=SCRIPT.read_text(encoding="utf-8"), dataset_cache=any(a.name == "alluxio" for a in ctx.enabled),
        depends_on=ctx.after))


def _has_gpu_pools(stack: Settings) -> bool:
    return bool(stack.pools("gpu"))


COMPONENT = AddonCode(build=build, applies=_has_gpu_pools)
