"""The typed, frozen input of a training-job component: one job's settings joined with what the platform offers."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi

from trainyard.cloud.context import ClusterContext, PoolFacts
from trainyard.config.model import Job
from trainyard.platform.context import TenantFacts
from trainyard.workloads import launch


@dataclass(frozen=True)
class TrainingJobArgs:
    job: Job
    tenant: TenantFacts
    cluster: ClusterContext
    # None on the local target: CPU pods on whatever nodes the cluster has.
    pool: PoolFacts | None
    # Text of workloads/configs/<job.trainer_config>, shipped to the pod in a ConfigMap.
    trainer_config: str
    priority_class: str
    # ReadWriteMany class for checkpoints (CephFS); None means the cluster default class, ReadWriteOnce.
    checkpoint_storage_class: str | None = None
    # The checkpoint claim waits for these (the Ceph storage release): it binds only once CephFS serves.
    checkpoint_storage: tuple[pulumi.Resource, ...] = ()
    dataset_claim: str | None = None
    # The directory of that claim the cache's data shows at (Fluid's mount-path rule; "" = its root).
    dataset_subpath: str = ""
    volcano: pulumi.Resource | None = None
    # The kube-prometheus-stack release; a PodMonitor is only created when it is set.
    monitoring: pulumi.Resource | None = None
    # The checkpoint volume holds the run: protected unless the stack turns protection off to be destroyed.
    protect: bool = True

    @property
    def namespace(self) -> str:
        return self.tenant.namespace

    @property
    def datasets(self) -> str:
        """Where the trainer finds datasets in its pod."""
        return launch.dataset_root(self.dataset_subpath)
