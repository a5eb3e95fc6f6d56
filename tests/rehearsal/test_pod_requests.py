"""What the rehearsal reads a pod as asking for: the API server's defaulting (a limit stands in for a missing
request, resource by resource) and sidecars (restartable init containers) counted like app containers."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

from owned_stacks import FLEET, recording
from rehearsal_records import rehearsed
from trainyard.plan.pods import operated, requests_of
from trainyard.plan.recording import Recording
from trainyard.plan.resource_types import VOLCANO_JOB
from trainyard.plan.volcano_jobs import task_pods

ACCELERATORS = ("nvidia.com/", "vpc.amazonaws.com/efa")
GiB = 2**30


def test_a_limit_stands_in_for_the_request_it_lacks_one_resource_at_a_time() -> None:
    container = {"resources": {"requests": {"cpu": "4", "memory": "8Gi"},
                               "limits": {"cpu": "8", "nvidia.com/gpu": "8", "vpc.amazonaws.com/efa": "4"}}}
    assert requests_of({"containers": [container]}) == {
        "cpu": 4.0, "memory": 8 * GiB, "nvidia.com/gpu": 8.0, "vpc.amazonaws.com/efa": 4.0}


def test_sidecars_run_beside_the_app_and_the_init_containers_after_them() -> None:
    def asks(cpu: str, **more: Any) -> dict[str, Any]:
        return {"resources": {"requests": {"cpu": cpu}}, **more}

    spec = {"initContainers": [asks("1", restartPolicy="Always"), asks("3")], "containers": [asks("1")]}
    assert requests_of(spec) == {"cpu": 4.0}  # the init container (3) starts after the sidecar (1)
    spec = {"initContainers": [asks("2", restartPolicy="Always"), asks("1")], "containers": [asks("1")]}
    assert requests_of(spec) == {"cpu": 3.0}  # the app (1) beside the sidecar (2)


def _limits_only(recording: Recording, gpus: int | None = None) -> Recording:
    """Every job container asks for its accelerators by limits alone (the request defaulted from the limit)."""
    resources = []
    for record in recording.resources:
        if record.type == VOLCANO_JOB:
            inputs = copy.deepcopy(record.inputs)
            for task in inputs["spec"]["tasks"]:
                for container in task["template"]["spec"]["containers"]:
                    resources_ = container.get("resources") or {}
                    requests, limits = resources_.get("requests") or {}, resources_.setdefault("limits", {})
                    for name in [n for n in requests if n.startswith(ACCELERATORS)]:
                        limits[name] = requests.pop(name)
                        if gpus is not None and name.startswith("nvidia.com/"):
                            limits[name] = str(gpus)
            record = replace(record, inputs=inputs)
        resources.append(record)
    return Recording(resources=resources)


def test_the_rehearsal_reads_accelerators_asked_for_by_limits() -> None:
    fleet = recording(FLEET)
    jobs = [r for r in fleet.resources if r.type == VOLCANO_JOB]
    moved = {r.urn: r for r in _limits_only(fleet).resources if r.type == VOLCANO_JOB}
    assert any(r for job in jobs for pod, _ in task_pods(job) for r in pod.requests if r.startswith(ACCELERATORS))
    assert all([p.requests for p, _ in task_pods(job)] == [p.requests for p, _ in task_pods(moved[job.urn])]
               for job in jobs)
    # A GPU count no pool offers, given as a limit only, is named as it would be as a request.
    findings = {f.urn for f in rehearsed(_limits_only(fleet, gpus=1000)).findings if f.rule == "karpenter-can-launch"}
    gpu_jobs = {job.urn for job in jobs if any(r.startswith("nvidia.com/") for p, _ in task_pods(job)
                                               for r in p.requests)}
    assert gpu_jobs and gpu_jobs <= findings


def test_a_sharded_prometheus_runs_replicas_times_shards_pods() -> None:
    """prometheus-operator makes one StatefulSet of spec.replicas pods per shard (shards-and-replicas.md)."""
    def prometheus(kind: str, **spec: int) -> dict[str, Any]:
        return {"apiVersion": "monitoring.coreos.com/v1", "kind": kind, "metadata": {"name": "p"}, "spec": spec}

    made = [operated(prometheus("Prometheus", replicas=2, shards=3)), operated(prometheus("Prometheus", replicas=2)),
            operated(prometheus("Prometheus", replicas=2, shards=-2)), operated(prometheus("Alertmanager", replicas=2))]
    assert [w.replicas for w in made if w is not None] == [6, 2, 2, 2]
