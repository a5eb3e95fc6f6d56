"""The workload layer's entry: PlatformContext in, training jobs and the fabric check of each EFA pool out."""

from __future__ import annotations

from trainyard.config import Settings
from trainyard.config.instance_types import fabric_threshold
from trainyard.config.model import Job
from trainyard.paths import TRAINER_CONFIGS_DIR
from trainyard.platform.context import PlatformContext
from trainyard.workloads.args import TrainingJobArgs
from trainyard.workloads.fabric import FabricCheck, FabricCheckArgs
from trainyard.workloads.jobs import COMPONENTS


def build(settings: Settings, platform: PlatformContext) -> None:
    for job in settings.workloads:
        COMPONENTS[job.kind](job.name, job_args(job, platform, protect=settings.protect))
    for pool in settings.fabric_checked_pools:
        args = fabric_check_args(settings, pool.name, platform)
        FabricCheck(args.name, args)


def fabric_check_args(settings: Settings, pool_name: str, platform: PlatformContext) -> FabricCheckArgs:
    """One EFA pool's check: the pool's facts, the checks' own namespace and queue, the threshold of its types."""
    check = settings.fabric_check
    pool = next((p for p in platform.cluster.pools if p.name == pool_name), None)
    if platform.fabric_checks is None or pool is None or check.image is None:
        raise ValueError(f"fabric check of pool {pool_name!r}: the platform lacks the checks' namespace or the pool, "
                         "or fabricCheck.image is unset")
    return FabricCheckArgs(
        pool=pool,
        tenant=platform.fabric_checks,
        cluster=platform.cluster,
        image=check.image,
        min_busbw_gbps=fabric_threshold(pool.instance_types, pool.efa_interfaces),
        priority_class=platform.training_priority_class,
        volcano=platform.volcano,
    )


def job_args(job: Job, platform: PlatformContext, *, protect: bool) -> TrainingJobArgs:
    """Join a job's settings with the platform facts it runs on; fails naming what the platform lacks."""
    tenant = platform.tenants.get(job.tenant)
    if tenant is None:
        raise ValueError(f"job {job.name!r}: the platform has no tenant {job.tenant!r} "
                         f"(tenants: {', '.join(sorted(platform.tenants)) or 'none'})")
    pools = {pool.name: pool for pool in platform.cluster.pools}
    if job.node_pool is not None and job.node_pool not in pools:
        raise ValueError(f"job {job.name!r}: the cluster has no node pool {job.node_pool!r}")
    return TrainingJobArgs(
        job=job,
        tenant=tenant,
        cluster=platform.cluster,
        pool=pools[job.node_pool] if job.node_pool is not None else None,
        trainer_config=(TRAINER_CONFIGS_DIR / job.trainer_config).read_text(encoding="utf-8"),
        priority_class=platform.training_priority_class,
        checkpoint_storage_class=platform.checkpoint_storage_class,
        checkpoint_storage=platform.checkpoint_storage,
        dataset_claim=platform.dataset_claim,
        dataset_subpath=platform.dataset_subpath,
        volcano=platform.volcano,
        monitoring=platform.monitoring,
        protect=protect,
    )
