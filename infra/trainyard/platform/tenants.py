"""Tenants: a namespace per team with quota, defaults, a trainer identity, a Volcano queue and network policy.

A tenant's jobs may use its queue only: Volcano 1.15 has no queue ACL (volcano-sh/volcano issue 1475, closed with
"implement it at the application layer"), so a ValidatingAdmissionPolicy binds the `spec.queue` of every Volcano
Job and PodGroup to its namespace's `trainyard.io/queue` label; a namespace without one may use no tenant's queue.
Every tenant has a ResourceQuota (its capability when it sets no quota), MIG slices included: a MIG slice is not
an `nvidia.com/gpu`, so without its own line a tenant could take any number of them. The fabric checks get a
namespace and queue of their own, sized to exactly what they ask for, so they never eat a tenant's share.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import pulumi
import pulumi_kubernetes as k8s

from trainyard.cloud.context import ClusterContext, PoolFacts
from trainyard.config.instance_types import FABRIC_CHECK_NODES, fabric_check_pod
from trainyard.config.mig import load_mig_catalog, mig_resource_name
from trainyard.config.model import Tenant, TenantQuota, TenantResources
from trainyard.names import FABRIC_CHECK_NAMESPACE, FABRIC_CHECK_QUEUE, QUEUE_LABEL, TRAINER_SERVICE_ACCOUNT
from trainyard.platform import monitor_policy, network_policy
from trainyard.platform.context import TenantFacts
from trainyard.platform.kube import k8s_options, labels
from trainyard.platform.objects import custom_resource
from trainyard.platform.tenant_access import RBAC_GROUP, TENANT_ROLE, role_binding_subjects, tenant_rules

TENANT_LABEL = "trainyard.io/tenant"
QUEUE_API_VERSION = "scheduling.volcano.sh/v1beta1"
# Volcano creates this queue itself and puts every job that names no queue in it.
VOLCANO_DEFAULT_QUEUE = "default"
DEFAULT_DENY_POLICY = "default-deny"
TRAINING_PRIORITY_CLASS = "trainyard-training"
SYSTEM_PRIORITY_CLASS = "trainyard-system"
# Training preempts nothing of the platform's: system-ish pods (data cache, exporters) outrank it.
PRIORITIES = {TRAINING_PRIORITY_CLASS: 10_000, SYSTEM_PRIORITY_CLASS: 100_000}
# A pod without requests would slip past a requests-based quota: give containers modest defaults.
DEFAULT_REQUESTS = {"cpu": "250m", "memory": "512Mi"}

NetworkPolicyKind = Literal["cilium", "kubernetes"]


@dataclass(frozen=True)
class TenantsArgs:
    cluster: ClusterContext
    tenants: tuple[Tenant, ...]
    monitoring_namespace: str
    network_policy: NetworkPolicyKind
    # Region for S3 FQDN egress rules; None without AWS.
    region: str | None = None
    # The CNI release: a CiliumNetworkPolicy needs the cilium.io CRDs the Cilium operator registers.
    cilium: pulumi.Resource | None = None
    # Queues are created only when Volcano is on; they need its CRDs and admission webhook.
    volcano: pulumi.Resource | None = None
    # The fabric checks' own namespace and queue (fabric_check_tenant), when any pool is checked.
    fabric_checks: Tenant | None = None
    # MIG profile -> the most slices of it one GPU of the cluster's MIG pools carries (mig_slices_per_gpu).
    mig_slices: Mapping[str, int] = field(default_factory=dict)
    # The storage class of the jobs' checkpoint claims (Rook's CephFS class), which the tenant quota bounds.
    claim_storage_class: str | None = None


def resource_list(resources: TenantResources, mig_slices: Mapping[str, int] | None = None) -> dict[str, str]:
    """Kubernetes resource names -> quantities, leaving out zero (= not limited). A GPU limit also bounds each MIG
    profile, at as many slices as that many GPUs carry."""
    values = {"cpu": resources.cpu, "memory": resources.memory, "nvidia.com/gpu": str(resources.gpu)}
    if resources.gpu:
        values |= {mig_resource_name(profile): str(resources.gpu * per_gpu)
                   for profile, per_gpu in sorted((mig_slices or {}).items())}
    return {key: value for key, value in values.items() if value != "0"}


def mig_slices_per_gpu(pools: Iterable[PoolFacts]) -> dict[str, int]:
    """MIG profile -> the most instances of it one GPU carries in any of these pools' layouts."""
    catalog = load_mig_catalog()
    slices: dict[str, int] = {}
    for pool in pools:
        if pool.mig_layout is None or pool.gpu is None:
            continue
        for profile, count in catalog.slices(pool.mig_layout, pool.gpu).items():
            slices[profile] = max(slices.get(profile, 0), count)
    return slices


def fabric_check_tenant(pools: Sequence[PoolFacts]) -> Tenant | None:
    """The fabric checks' namespace and queue: room for every check at once (two whole-node pods per pool, the
    shape workloads/fabric.py requests), and nothing more."""
    if not pools:
        return None
    shapes = [fabric_check_pod(pool.instance_types) for pool in pools]
    gpu = FABRIC_CHECK_NODES * sum(s.gpus for s in shapes)
    cpu = f"{FABRIC_CHECK_NODES * sum(s.millicpu for s in shapes)}m"
    memory = f"{FABRIC_CHECK_NODES * sum(s.memory_bytes for s in shapes) // 2**20}Mi"
    return Tenant(name=FABRIC_CHECK_QUEUE, namespace=FABRIC_CHECK_NAMESPACE,
                  capability=TenantResources(gpu=gpu, cpu=cpu, memory=memory),
                  quota=TenantQuota(gpu=gpu, cpu=cpu, memory=memory, pods=FABRIC_CHECK_NODES * len(pools)))


def queue_name(tenant: Tenant) -> str:
    return VOLCANO_DEFAULT_QUEUE if tenant.default else tenant.name


def queue_manifest(tenant: Tenant, mig_slices: Mapping[str, int] | None = None, *,
                   reclaimable: bool = True) -> dict[str, Any]:
    return {
        "apiVersion": QUEUE_API_VERSION,
        "kind": "Queue",
        "metadata": {"name": queue_name(tenant), "labels": labels("volcano-queue", "scheduling",
                                                                    **{TENANT_LABEL: tenant.name})},
        "spec": {
            "weight": tenant.weight,
            # Idle share lent to other queues is taken back (the `reclaim` action) when this tenant needs it.
            "reclaimable": reclaimable,
            "capability": resource_list(tenant.capability, mig_slices),
        },
    }


def tenant_quota(tenant: Tenant) -> TenantQuota:
    """The tenant's quota, or its capability as one: no namespace goes without (prod's eval had none)."""
    if tenant.quota is not None:
        return tenant.quota
    capability = tenant.capability
    return TenantQuota(gpu=capability.gpu, cpu=capability.cpu, memory=capability.memory)


def quota_spec(tenant: Tenant, mig_slices: Mapping[str, int] | None = None,
               claim_class: str | None = None) -> dict[str, Any]:
    quota = tenant_quota(tenant)
    # Extended resources are quota'd by requests only (Kubernetes docs, "Resource Quotas": extended resources).
    hard = {f"requests.{key}": value for key, value in resource_list(quota, mig_slices).items()}
    hard["pods"] = str(quota.pods)
    if claim_class is not None:
        # Claims on the class checkpoint claims use, bounded per class (Kubernetes docs, "Resource Quotas": storage
        # resource quota, <class>.storageclass.storage.k8s.io/...): members create them, and they fill the Ceph
        # cluster every tenant shares. Not namespace-wide: that total would also count the dataset claim Fluid makes
        # in each tenant namespace, whose nominal capacity (100Pi) no quota holds, and refuse it.
        per_class = f"{claim_class}.storageclass.storage.k8s.io"
        hard[f"{per_class}/requests.storage"] = quota.storage
        hard[f"{per_class}/persistentvolumeclaims"] = str(quota.claims)
    return {"hard": hard}


PRIORITY_QUOTA = "platform-priority"
# What the platform's own pods may preempt with, and Kubernetes' built-in classes (system-cluster-critical,
# system-node-critical: Kubernetes docs, "Pod Priority and Preemption").
PLATFORM_PRIORITY_CLASSES = ("system-cluster-critical", "system-node-critical", SYSTEM_PRIORITY_CLASS)


def priority_quota_spec() -> dict[str, Any]:
    """No pod of a tenant namespace may run at a platform priority: a quota of zero pods scoped to those classes
    (Kubernetes docs, "Resource Quotas": "Quota scopes", scopeSelector operator In on PriorityClass). It binds
    every creator of pods there (Volcano, Argo), whatever template a member wrote."""
    return {"hard": {"pods": "0"}, "scopeSelector": {"matchExpressions": [
        {"scopeName": "PriorityClass", "operator": "In", "values": list(PLATFORM_PRIORITY_CLASSES)}]}}


QUEUE_POLICY = "trainyard-queue-of-namespace"


def queue_policy(queues: Sequence[str]) -> dict[str, Any]:
    """A ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1, GA in Kubernetes 1.30): a Volcano Job or
    PodGroup may name only its namespace's queue; one in an unlabelled namespace, none of the tenants' queues.

    Volcano's job webhook fills an empty spec.queue with `default` before validation runs (webhooks/admission/jobs/
    mutate/mutate_job.go, patchDefaultQueue), and the podgroup controller copies a plain pod's queue annotation
    (controllers/podgroup/pg_controller_handler.go), so both paths reach this check with the queue they would use.
    """
    queue = "(has(object.spec.queue) ? object.spec.queue : 'default')"
    labelled = f"has(namespaceObject.metadata.labels) && '{QUEUE_LABEL}' in namespaceObject.metadata.labels"
    listed = ", ".join(f"'{q}'" for q in sorted(set(queues)))
    return {
        "failurePolicy": "Fail",
        "matchConstraints": {"resourceRules": [
            {"apiGroups": ["batch.volcano.sh"], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"],
             "resources": ["jobs"]},
            {"apiGroups": ["scheduling.volcano.sh"], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"],
             "resources": ["podgroups"]},
        ]},
        "validations": [{
            "expression": f"{labelled} ? {queue} == namespaceObject.metadata.labels['{QUEUE_LABEL}'] "
                          f": !({queue} in [{listed}])",
            "messageExpression": f"'spec.queue ' + {queue} + ' is not the queue of namespace ' + "
                                 f"namespaceObject.metadata.name + ' (its label {QUEUE_LABEL})'",
            "reason": "Forbidden",
        }],
    }


class Tenants(pulumi.ComponentResource):
    def __init__(self, name: str, args: TenantsArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("trainyard:platform:Tenants", name, None, opts)
        cluster = args.cluster
        self.priority_classes = [
            k8s.scheduling.v1.PriorityClass(
                f"{name}-{class_name}",
                metadata={"name": class_name, "labels": labels(class_name, "scheduling")},
                value=value,
                global_default=False,
                preemption_policy="PreemptLowerPriority",
                description=f"trainyard {class_name.removeprefix('trainyard-')} workloads",
                opts=k8s_options(cluster, self),
            )
            for class_name, value in PRIORITIES.items()
        ]
        self.facts = {tenant.name: self._tenant(name, tenant, args) for tenant in args.tenants}
        # Not a tenant: nothing but the checks runs there (no dataset, no trainer role).
        self.fabric_checks = (self._tenant(name, args.fabric_checks, args, checks=True)
                              if args.fabric_checks is not None else None)
        if args.volcano is not None:
            self._queue_policy(name, args)
        self._pod_monitor_policy(name, args)
        self.register_outputs({"tenants": sorted(self.facts)})

    def _queue_policy(self, name: str, args: TenantsArgs) -> None:
        everyone = [*args.tenants, *([args.fabric_checks] if args.fabric_checks is not None else [])]
        spec: Any = queue_policy([queue_name(t) for t in everyone])
        policy = k8s.admissionregistration.v1.ValidatingAdmissionPolicy(
            f"{name}-queue-policy", metadata={"name": QUEUE_POLICY, "labels": labels(QUEUE_POLICY, "tenancy")},
            spec=spec, opts=k8s_options(args.cluster, self))
        binding: Any = {"policyName": QUEUE_POLICY, "validationActions": ["Deny"]}
        k8s.admissionregistration.v1.ValidatingAdmissionPolicyBinding(
            f"{name}-queue-policy-binding", metadata={"name": QUEUE_POLICY, "labels": labels(QUEUE_POLICY, "tenancy")},
            spec=binding, opts=k8s_options(args.cluster, self, [policy]))

    def _pod_monitor_policy(self, name: str, args: TenantsArgs) -> None:
        meta: Any = {"name": monitor_policy.POD_MONITOR_POLICY,
                     "labels": labels(monitor_policy.POD_MONITOR_POLICY, "tenancy")}
        spec: Any = monitor_policy.pod_monitor_policy()
        policy = k8s.admissionregistration.v1.ValidatingAdmissionPolicy(
            f"{name}-pod-monitor-policy", metadata=meta, spec=spec, opts=k8s_options(args.cluster, self))
        binding: Any = monitor_policy.binding_spec(TENANT_LABEL)
        k8s.admissionregistration.v1.ValidatingAdmissionPolicyBinding(
            f"{name}-pod-monitor-policy-binding", metadata=meta, spec=binding,
            opts=k8s_options(args.cluster, self, [policy]))

    def _tenant(self, name: str, tenant: Tenant, args: TenantsArgs, *, checks: bool = False) -> TenantFacts:
        """A namespace and its queue; the fabric checks' (`checks`) is not reclaimable and takes no MIG slices."""
        cluster, prefix, ns_name = args.cluster, f"{name}-{tenant.name}", tenant.namespace_name
        mig_slices = {} if checks else args.mig_slices
        tenant_labels = labels("tenant", "tenancy", **{TENANT_LABEL: tenant.name})
        namespace_labels: Any = {
            **tenant_labels,
            # The one queue this namespace's jobs may use (queue_policy).
            QUEUE_LABEL: queue_name(tenant),
            # Training pods need no privileges; baseline still allows the shm emptyDir and CSI volumes.
            "pod-security.kubernetes.io/enforce": "baseline",
        }
        namespace = k8s.core.v1.Namespace(
            f"{prefix}-namespace", metadata={"name": ns_name, "labels": namespace_labels},
            opts=k8s_options(cluster, self),
        )
        in_namespace = k8s_options(cluster, self, [namespace])
        quota = quota_spec(tenant, mig_slices, args.claim_storage_class)
        k8s.core.v1.ResourceQuota(
            f"{prefix}-quota",
            metadata=k8s.meta.v1.ObjectMetaArgs(name="tenant-quota", namespace=ns_name, labels=tenant_labels),
            spec=k8s.core.v1.ResourceQuotaSpecArgs(hard=quota["hard"]), opts=in_namespace)
        if not checks:
            priority: Any = priority_quota_spec()
            k8s.core.v1.ResourceQuota(
                f"{prefix}-priority-quota",
                metadata=k8s.meta.v1.ObjectMetaArgs(name=PRIORITY_QUOTA, namespace=ns_name, labels=tenant_labels),
                spec=priority, opts=in_namespace)
        k8s.core.v1.LimitRange(
            f"{prefix}-limits",
            metadata=k8s.meta.v1.ObjectMetaArgs(name="container-defaults", namespace=ns_name, labels=tenant_labels),
            spec=k8s.core.v1.LimitRangeSpecArgs(
                limits=[k8s.core.v1.LimitRangeItemArgs(type="Container", default_request=DEFAULT_REQUESTS)]),
            opts=in_namespace,
        )
        account = k8s.core.v1.ServiceAccount(
            f"{prefix}-trainer",
            metadata={"name": TRAINER_SERVICE_ACCOUNT, "namespace": ns_name, "labels": tenant_labels},
            # The trainer talks to S3 (pod identity), never to the API server: no token in its pods.
            automount_service_account_token=False,
            opts=in_namespace,
        )
        ready: list[pulumi.Resource] = [namespace, account]
        if not checks:
            self._access(prefix, tenant, ns_name, tenant_labels, in_namespace)
        ready.append(self._policy(prefix, ns_name, tenant_labels, namespace, args))
        if args.volcano is not None:
            ready.append(self._queue(prefix, tenant, args, mig_slices, reclaimable=not checks))
        return TenantFacts(name=tenant.name, namespace=ns_name, queue=queue_name(tenant), ready=tuple(ready),
                           group=None if checks else tenant.group)

    def _access(self, prefix: str, tenant: Tenant, ns_name: str, tenant_labels: dict[str, str],
                opts: pulumi.ResourceOptions) -> None:
        """The tenant's members (the group its stack entry names) act in this namespace only."""
        meta: Any = {"name": TENANT_ROLE, "namespace": ns_name, "labels": tenant_labels}
        rules: Any = tenant_rules()
        role = k8s.rbac.v1.Role(f"{prefix}-role", metadata=meta, rules=rules, opts=opts)
        role_ref: Any = {"apiGroup": RBAC_GROUP, "kind": "Role", "name": TENANT_ROLE}
        subjects: Any = role_binding_subjects(tenant.group)
        k8s.rbac.v1.RoleBinding(f"{prefix}-role-binding", metadata=meta, role_ref=role_ref, subjects=subjects,
                                opts=pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(depends_on=[role])))

    def _policy(self, prefix: str, ns_name: str, tenant_labels: dict[str, str], namespace: pulumi.Resource,
                args: TenantsArgs) -> pulumi.Resource:
        if args.network_policy == "cilium":
            manifest = network_policy.cilium_default_deny(
                DEFAULT_DENY_POLICY, ns_name, monitoring_namespace=args.monitoring_namespace, region=args.region,
                labels=tenant_labels)
            deps = [namespace, *([args.cilium] if args.cilium is not None else [])]
            return custom_resource(f"{prefix}-default-deny", manifest, k8s_options(args.cluster, self, deps))
        manifest = network_policy.kubernetes_default_deny(
            DEFAULT_DENY_POLICY, ns_name, monitoring_namespace=args.monitoring_namespace, labels=tenant_labels)
        return k8s.networking.v1.NetworkPolicy(f"{prefix}-default-deny", metadata=manifest["metadata"],
                                               spec=manifest["spec"], opts=k8s_options(args.cluster, self, [namespace]))

    def _queue(self, prefix: str, tenant: Tenant, args: TenantsArgs, mig_slices: Mapping[str, int], *,
               reclaimable: bool) -> pulumi.Resource:
        assert args.volcano is not None
        manifest = queue_manifest(tenant, mig_slices, reclaimable=reclaimable)
        if not tenant.default:
            return custom_resource(f"{prefix}-queue", manifest, k8s_options(args.cluster, self, [args.volcano]))
        # The default tenant takes over Volcano's own `default` queue (jobs naming no queue land there), so
        # Pulumi patches its weight/capability server-side instead of creating a second object.
        return k8s.apiextensions.CustomResourcePatch(
            f"{prefix}-queue",
            api_version=manifest["apiVersion"],
            kind=manifest["kind"],
            metadata={**manifest["metadata"], "annotations": {"pulumi.com/patchForce": "true"}},
            spec=manifest["spec"],
            opts=k8s_options(args.cluster, self, [args.volcano]),
        )
