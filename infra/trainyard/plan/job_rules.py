"""Readiness rules on what a Volcano job meets once the job controller has created its pods (issue 19): the
demand its queue is handed and the dataset its trainer reads, applied by the rehearsal beside `readiness.RULES`."""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from typing import Any

from trainyard.plan.cluster_model import GIB, quantity
from trainyard.plan.pods import lookup
from trainyard.plan.readiness import DATASET, QUEUES, VOLCANO_JOB, Moment, Rule, task_pods
from trainyard.plan.recording import ResourceRecord
from trainyard.platform.alluxio import REFERENCE_SCHEME, claim_subpath, unified_namespace_path

DATA_PATH = "data.path="


def _queue(record: ResourceRecord) -> str:
    return str(lookup(record.inputs, "spec.queue", "default") or "default")


def job_demand(record: ResourceRecord) -> dict[str, float]:
    """What every pod of a Volcano job requests in all, at the job's full replicas."""
    wanted: dict[str, float] = {}
    for pod, replicas in task_pods(record):
        for resource, amount in pod.requests.items():
            wanted[resource] = wanted.get(resource, 0.0) + replicas * amount
    return wanted


# Once a PodGroup leaves Pending the job controller creates every pod of the job, whatever its queue may hold, and
# the scheduler marks each unplaced one Unschedulable, so Karpenter launches nodes for all of them (Volcano 1.15
# job_controller_actions.go, api/job_info.go; volcano-sh/volcano issue 4710): the jobs of a queue at their full
# replicas must fit its capability, or nodes are bought for pods the queue never admits. Named once per queue,
# on its first job by name.
def queue_demand_fits(record: ResourceRecord, moment: Moment) -> str | None:
    name = _queue(record)
    queues = [r for r in moment.records.values() if r.type in QUEUES and lookup(r.inputs, "metadata.name") == name]
    capability = (lookup(queues[0].inputs, "spec.capability", {}) or {}) if queues else {}
    jobs = sorted((r for r in moment.records.values() if r.type == VOLCANO_JOB and _queue(r) == name),
                  key=lambda r: r.name)
    if not capability or jobs[0].urn != record.urn:
        return None
    wanted: dict[str, float] = {}
    for job in jobs:
        for resource, amount in job_demand(job).items():
            wanted[resource] = wanted.get(resource, 0.0) + amount
    over = [f"{_amount(r, wanted[r])} {r} (capability {limit})" for r, limit in sorted(capability.items())
            if wanted.get(r, 0.0) > quantity(limit)]
    if not over:
        return None
    return (f"queue {name}'s jobs ({', '.join(j.name for j in jobs)}) ask at their full replicas for "
            f"{', '.join(over)}: Volcano creates every pod whatever the queue holds, and Karpenter buys nodes for "
            "the ones it never admits")


# A job reads its dataset through a claim Fluid makes for a Dataset of the same name. A `dataset://<ns>/<name>[/<sub>]`
# reference shows the source's mount at its Alluxio namespace path below <sub>, a plain Dataset each mount at its
# own (fluid v1.0.8 pkg/utils/ufs_path_builder.go, pkg/ddc/thin/referencedataset/volume.go; alluxio.claim_subpath).
# A trainer whose data.path lies elsewhere finds no manifest and stops with a config error on every pod.
def dataset_path_served(record: ResourceRecord, moment: Moment) -> str | None:
    namespace = lookup(record.inputs, "metadata.namespace")
    datasets = {(lookup(r.inputs, "metadata.namespace"), lookup(r.inputs, "metadata.name")): r.inputs
                for r in moment.records.values() if r.type == DATASET}
    for task in lookup(record.inputs, "spec.tasks", ()) or ():
        spec = lookup(task, "template.spec", {}) or {}
        claims = {v.get("name"): lookup(v, "persistentVolumeClaim.claimName") for v in spec.get("volumes") or ()}
        for container in spec.get("containers") or ():
            for path in (str(a).removeprefix(DATA_PATH) for a in container.get("args") or () if
                         str(a).startswith(DATA_PATH)):
                for mount in container.get("volumeMounts") or ():
                    claim = claims.get(mount.get("name"))
                    dataset, root = datasets.get((namespace, claim)), str(mount.get("mountPath", "")).rstrip("/")
                    if dataset is None or not _under(path, root):
                        continue
                    try:
                        served = _served_at(dataset, datasets, root)
                    except ValueError as exc:
                        return f"its dataset claim {claim}: {exc}"
                    if served is not None and not _under(path, served):
                        return (f"{container.get('name')} reads {DATA_PATH}{path}, but its claim {claim} shows the "
                                f"dataset's prefix at {served}: the trainer finds no manifest there and stops with "
                                "a config error")
    return None


def _under(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _served_at(dataset: Mapping[str, Any], datasets: Mapping[tuple[Any, Any], Mapping[str, Any]],
               root: str) -> str | None:
    """Where the claim of `dataset`, mounted at `root`, shows the data of its (first) mount."""
    mounts = lookup(dataset, "spec.mounts", ()) or ()
    if not mounts:
        return None
    point = str(mounts[0].get("mountPoint", ""))
    if not point.startswith(REFERENCE_SCHEME):
        return posixpath.join(root, unified_namespace_path(mounts[0]).strip("/")).rstrip("/")
    namespace, _, rest = point.removeprefix(REFERENCE_SCHEME).partition("/")
    source = datasets.get((namespace, rest.split("/", 1)[0]))
    source_mounts = lookup(source, "spec.mounts", ()) if source is not None else ()
    if not source_mounts:
        return None
    return posixpath.join(root, claim_subpath(source_mounts[0], point)).rstrip("/")


def _amount(resource: str, value: float) -> str:
    return f"{value / GIB:.1f}Gi" if resource == "memory" else f"{value:g}"


RULES: tuple[Rule, ...] = (
    Rule("queue-demand-fits", lambda record: record.type == VOLCANO_JOB, queue_demand_fits,
         "volcano-sh/volcano issue 4710; Volcano 1.15 job_controller_actions.go"),
    Rule("dataset-path-served", lambda record: record.type == VOLCANO_JOB, dataset_path_served,
         "fluid v1.0.8 pkg/utils/ufs_path_builder.go, pkg/ddc/thin/referencedataset/volume.go"),
)
