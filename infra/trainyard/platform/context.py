"""What the platform layer hands to the workload layer."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi

from trainyard.cloud.context import ClusterContext


@dataclass(frozen=True)
class TenantFacts:
    name: str
    namespace: str
    queue: str
    # Resources a job in this namespace must wait for: namespace, queue, network policy, service account.
    ready: tuple[pulumi.Resource, ...] = ()
    # The Kubernetes group of the tenant's members (None: the fabric checks', which has none).
    group: str | None = None


@dataclass(frozen=True)
class PlatformContext:
    cluster: ClusterContext
    tenants: dict[str, TenantFacts]
    # The fabric checks' own namespace and queue, when a pool is checked.
    fabric_checks: TenantFacts | None = None
    # Releases that install CRDs; a custom resource depends on the one that owns its kind.
    volcano: pulumi.Resource | None = None
    monitoring: pulumi.Resource | None = None
    # StorageClass for ReadWriteMany checkpoint volumes (CephFS), or the cluster default when None.
    checkpoint_storage_class: str | None = None
    # What a checkpoint PVC waits for: the release creating the Ceph cluster, CephFS and its StorageClass
    # (pulumi-kubernetes waits for a PVC to bind, which only a serving CephFS can do).
    checkpoint_storage: tuple[pulumi.Resource, ...] = ()
    # Name of the read-only dataset PVC Fluid creates in each tenant namespace, when Alluxio is on.
    dataset_claim: str | None = None
    # The directory of that claim the cache's data shows at ("" = its root; alluxio.claim_subpath).
    dataset_subpath: str = ""
    training_priority_class: str = "trainyard-training"
    # The MLflow server's in-cluster URL (names.MLFLOW_TRACKING_URI) when the add-on is on; tenants' pods also get it
    # from the `mlflow-client` ConfigMap of their namespace.
    tracking_uri: str | None = None
    # The argo-workflows release: WorkflowTemplates (argoproj.io CRDs it installs) depend on it; None when off.
    workflows: pulumi.Resource | None = None
