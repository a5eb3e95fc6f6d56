"""Renders of real stack files with the real config loader and cloud layer, and a platform double.

The double stands in for the platform layer's PlatformContext, so these tests pin the workload layer alone:
each tenant's `ready` resource, the Volcano and monitoring releases are recorded components whose URNs the
tests look for in the jobs' dependencies. The full program is exercised in test_jobs_program.py.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pulumi
from trainyard.cloud import layer as cloud
from trainyard.config import Settings, load_settings
from trainyard.names import FABRIC_CHECK_NAMESPACE, FABRIC_CHECK_QUEUE
from trainyard.plan.conformance import upstream_dir
from trainyard.plan.recording import Recording, ResourceRecord
from trainyard.plan.runtime import STACKS_DIR, read_stack, render
from trainyard.platform.context import PlatformContext, TenantFacts
from trainyard.workloads import layer as workloads

REPO_ROOT = Path(__file__).resolve().parents[2]
VOLCANO_JOB_SCHEMA = upstream_dir(REPO_ROOT) / "crds" / "batch.volcano.sh" / "job_v1alpha1.json"
JOB_TYPE = "kubernetes:batch.volcano.sh/v1alpha1:Job"
FABRIC_CHECK_TYPE = "trainyard:workloads:FabricCheck"
CEPHFS_CLASS = "ceph-filesystem"
DATASET_CLAIM = "dataset"
PRIORITY_CLASS = "trainyard-training"


class Stand(pulumi.CustomResource):
    """A recorded placeholder for a platform resource (a release, a tenant's namespace).

    Custom, not a component: a dependency on a component stands for its children, and this has none."""

    def __init__(self, kind: str, name: str) -> None:
        super().__init__(f"trainyard:test:{kind}", name, {})


def platform_double(settings: Settings, cluster: Any) -> PlatformContext:
    tenants = {
        t.name: TenantFacts(name=t.name, namespace=t.namespace_name, queue=t.name,
                            ready=(Stand("TenantReady", t.name),))
        for t in settings.tenants
    }
    addons = settings.addons
    checks = (TenantFacts(name=FABRIC_CHECK_QUEUE, namespace=FABRIC_CHECK_NAMESPACE, queue=FABRIC_CHECK_QUEUE,
                          ready=(Stand("TenantReady", FABRIC_CHECK_QUEUE),))
              if settings.fabric_checked_pools else None)
    return PlatformContext(
        cluster=cluster,
        tenants=tenants,
        fabric_checks=checks,
        volcano=Stand("Volcano", "volcano"),
        monitoring=Stand("Monitoring", "monitoring") if addons.monitoring.enabled else None,
        checkpoint_storage_class=CEPHFS_CLASS if addons.rook_ceph.enabled and settings.is_aws else None,
        dataset_claim=DATASET_CLAIM if addons.alluxio.enabled else None,
        training_priority_class=PRIORITY_CLASS,
    )


def _entrypoint() -> None:
    settings, _secrets = load_settings()
    workloads.build(settings, platform_double(settings, cloud.build(settings).join_nodes(())))


@functools.cache
def rendered(stack: str, stacks_dir: Path = STACKS_DIR) -> Recording:
    return render(read_stack(stack, stacks_dir), entrypoint=_entrypoint)


def volcano_jobs(recording: Recording) -> dict[str, ResourceRecord]:
    """Every Volcano Job: the training jobs and the fabric checks."""
    return {r.inputs["metadata"]["name"]: r for r in recording.resources if r.type == JOB_TYPE}


def fabric_checks(recording: Recording) -> dict[str, ResourceRecord]:
    return {name: r for name, r in volcano_jobs(recording).items() if FABRIC_CHECK_TYPE in (r.parent or "")}


def training_jobs(recording: Recording) -> dict[str, ResourceRecord]:
    """The Volcano Jobs of the stack's `workloads` (not the fabric checks)."""
    checks = fabric_checks(recording)
    return {name: r for name, r in volcano_jobs(recording).items() if name not in checks}


def volcano_schema_errors(record: ResourceRecord) -> list[str]:
    """Violations of the Volcano Job CRD schema from the upstream data."""
    import jsonschema

    validator = jsonschema.Draft7Validator(json.loads(VOLCANO_JOB_SCHEMA.read_text(encoding="utf-8")))
    return [f"{'/'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(record.inputs)]
