"""Rules on Fluid datasets: where a runtime's cache workers land, whether a job's dataset claim ever appears, and
whether the trainer's data path lies where the claim shows the data."""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from typing import Any

from trainyard.plan.cluster_model import admits
from trainyard.plan.pods import lookup, pod_needs
from trainyard.plan.recording import ResourceRecord
from trainyard.plan.resource_types import ALLUXIO_RUNTIME, DATASET, VOLCANO_JOB
from trainyard.plan.rules.base import Moment, of_type, placement_problem, ready_pools, rule
from trainyard.platform.alluxio import REFERENCE_SCHEME, claim_subpath, unified_namespace_path

DATA_PATH = "data.path="


def _named(moment: Moment, kind: str, namespace: str, name: str) -> ResourceRecord | None:
    return next((r for r in moment.records.values() if r.type == kind and lookup(r.inputs, "metadata.name") == name
                 and lookup(r.inputs, "metadata.namespace") == namespace), None)


# Fluid places an AlluxioRuntime's cache workers by the runtime's worker nodeSelector and its Dataset's
# nodeAffinity and tolerations (data.fluid.io CRDs: AlluxioRuntime spec.worker, Dataset spec.nodeAffinity). A
# worker that can only land on a GPU pool makes Karpenter launch GPU nodes for the cache alone, and WhenEmpty
# consolidation never reclaims a node that runs a non-DaemonSet pod (karpenter.sh/docs/concepts/disruption).
@rule("cache-off-gpu-nodes", of_type(ALLUXIO_RUNTIME),
      "Karpenter disruption docs (WhenEmpty); Fluid AlluxioRuntime/Dataset placement")
def cache_off_gpu_nodes(record: ResourceRecord, moment: Moment) -> str | None:
    spec = lookup(record.inputs, "spec", {}) or {}
    replicas = int(spec.get("replicas", 1) or 0)
    if replicas == 0 or lookup(spec, "worker.enabled") is False:
        return None
    found = _named(moment, DATASET, lookup(record.inputs, "metadata.namespace"), lookup(record.inputs, "metadata.name"))
    dataset = (lookup(found.inputs, "spec", {}) or {}) if found is not None else {}
    worker = pod_needs(f"{record.name} worker", {
        "nodeSelector": lookup(spec, "worker.nodeSelector", {}),
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                                      lookup(dataset, "nodeAffinity.required")}} if dataset.get("nodeAffinity") else {},
        "tolerations": dataset.get("tolerations") or (),
    })
    ready = ready_pools(moment.after)
    pools = [p for p in ready if admits(worker, p)]
    if not pools:
        return f"its {replicas} cache workers fit no node pool ({placement_problem(worker, ready, launch=True)})"
    if all(p.has_accelerators for p in pools):
        names = ", ".join(p.name for p in pools)
        return (f"its {replicas} cache workers can only run on GPU pools ({names}): Karpenter launches GPU nodes "
                f"for the cache alone and WhenEmpty consolidation never reclaims them")
    return None


def _unbound(dataset: ResourceRecord, moment: Moment) -> str | None:
    """Why Fluid never makes the claim of a Dataset, or None. It makes one, named after the Dataset, once a runtime
    of its name binds it (fluid v1.0.8 pkg/utils/dataset/volume CreatePersistentVolumeClaimForRuntime); a
    `dataset://` reference is bound through the source Dataset it names."""
    mounts: list[Mapping[str, Any]] = list(lookup(dataset.inputs, "spec.mounts", ()) or ())
    namespace, name = lookup(dataset.inputs, "metadata.namespace"), lookup(dataset.inputs, "metadata.name")
    point = str(mounts[0].get("mountPoint", "")) if len(mounts) == 1 else ""
    if not point.startswith(REFERENCE_SCHEME):
        if _named(moment, ALLUXIO_RUNTIME, namespace, name) is None:
            return f"Dataset {namespace}/{name} has no AlluxioRuntime of its name, so Fluid never binds it"
        return None
    source_ns, _, rest = point.removeprefix(REFERENCE_SCHEME).strip("/").partition("/")
    source = _named(moment, DATASET, source_ns, rest.split("/")[0])
    if source is None:
        return f"Dataset {namespace}/{name} references {point}, which is no Dataset"
    return _unbound(source, moment)


# A job's dataset is a chain: its volume's claim is the PVC Fluid makes for the Dataset of that name, and that
# Dataset is bound (its runtime, or the source a `dataset://` reference names). A missing link leaves every pod
# Pending on a claim that never appears. Where in the claim the data shows is dataset-path-served's.
@rule("dataset-chain", of_type(VOLCANO_JOB),
      "fluid v1.0.8 pkg/utils/dataset/volume (a Dataset's claim, made once a runtime binds it)")
def dataset_chain(record: ResourceRecord, moment: Moment) -> str | None:
    namespace = lookup(record.inputs, "metadata.namespace")
    for task in lookup(record.inputs, "spec.tasks", ()) or ():
        spec = lookup(task, "template.spec", {}) or {}
        for volume in spec.get("volumes") or ():
            claim = lookup(volume, "persistentVolumeClaim.claimName")
            dataset = _named(moment, DATASET, namespace, str(claim)) if claim else None
            if dataset is not None and (why := _unbound(dataset, moment)):
                return f"its claim {claim} never appears: {why}"
    return None


# A job reads its dataset through a claim Fluid makes for a Dataset of the same name. A `dataset://<ns>/<name>[/<sub>]`
# reference shows the source's mount at its Alluxio namespace path below <sub>, a plain Dataset each mount at its
# own (ufs_path_builder.go, referencedataset/volume.go; alluxio.claim_subpath). A trainer whose data.path lies
# elsewhere finds no manifest and stops with a config error on every pod.
@rule("dataset-path-served", of_type(VOLCANO_JOB),
      "fluid v1.0.8 pkg/utils/ufs_path_builder.go, pkg/ddc/thin/referencedataset/volume.go")
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
