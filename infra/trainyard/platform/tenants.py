"""Tenants: a namespace per team with quota, defaults, a trainer identity, a Volcano queue and network policy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import pulumi
import pulumi_kubernetes as k8s

from trainyard.cloud.context import ClusterContext
from trainyard.config.model import Tenant, TenantResources
from trainyard.names import TRAINER_SERVICE_ACCOUNT
from trainyard.platform import network_policy
from trainyard.platform.context import TenantFacts
from trainyard.platform.kube import k8s_options, labels
from trainyard.platform.objects import custom_resource

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


def resource_list(resources: TenantResources) -> dict[str, str]:
    """Kubernetes resource names -> quantities, leaving out zero (= not limited)."""
    values = {"cpu": resources.cpu, "memory": resources.memory, "nvidia.com/gpu": str(resources.gpu)}
    return {key: value for key, value in values.items() if value != "0"}


def queue_name(tenant: Tenant) -> str:
    return VOLCANO_DEFAULT_QUEUE if tenant.default else tenant.name


def queue_manifest(tenant: Tenant) -> dict[str, Any]:
    return {
        "apiVersion": QUEUE_API_VERSION,
        "kind": "Queue",
        "metadata": {"name": queue_name(tenant), "labels": labels("volcano-queue", "scheduling",
                                                                    **{TENANT_LABEL: tenant.name})},
        "spec": {
            "weight": tenant.weight,
            # Idle share lent to other queues is taken back (by preemption) when this tenant needs it.
            "reclaimable": True,
            "capability": resource_list(tenant.capability),
        },
    }


def quota_spec(tenant: Tenant) -> dict[str, Any] | None:
    if tenant.quota is None:
        return None
    hard = {f"requests.{key}": value for key, value in resource_list(tenant.quota).items()}
    hard["pods"] = str(tenant.quota.pods)
    return {"hard": hard}


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
        self.register_outputs({"tenants": sorted(self.facts)})

    def _tenant(self, name: str, tenant: Tenant, args: TenantsArgs) -> TenantFacts:
        cluster, prefix, ns_name = args.cluster, f"{name}-{tenant.name}", tenant.namespace_name
        tenant_labels = labels("tenant", "tenancy", **{TENANT_LABEL: tenant.name})
        namespace = k8s.core.v1.Namespace(
            f"{prefix}-namespace",
            metadata={"name": ns_name, "labels": {
                **tenant_labels,
                # Training pods need no privileges; baseline still allows the shm emptyDir and CSI volumes.
                "pod-security.kubernetes.io/enforce": "baseline",
            }},
            opts=k8s_options(cluster, self),
        )
        in_namespace = k8s_options(cluster, self, [namespace])
        quota = quota_spec(tenant)
        if quota is not None:
            k8s.core.v1.ResourceQuota(
                f"{prefix}-quota",
                metadata=k8s.meta.v1.ObjectMetaArgs(name="tenant-quota", namespace=ns_name, labels=tenant_labels),
                spec=k8s.core.v1.ResourceQuotaSpecArgs(hard=quota["hard"]), opts=in_namespace)
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
        ready.append(self._policy(prefix, ns_name, tenant_labels, namespace, args))
        if args.volcano is not None:
            ready.append(self._queue(prefix, tenant, args))
        return TenantFacts(name=tenant.name, namespace=ns_name, queue=queue_name(tenant), ready=tuple(ready))

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

    def _queue(self, prefix: str, tenant: Tenant, args: TenantsArgs) -> pulumi.Resource:
        assert args.volcano is not None
        manifest = queue_manifest(tenant)
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
