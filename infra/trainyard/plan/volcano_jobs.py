"""What a Volcano job's tasks ask of the cluster: their pods, the gang that must start together, the whole job."""

from __future__ import annotations

from trainyard.plan.cluster_model import PodNeeds
from trainyard.plan.pods import lookup, pod_needs
from trainyard.plan.recording import ResourceRecord


def task_pods(record: ResourceRecord) -> list[tuple[PodNeeds, int]]:
    """Each task's pod and its replicas."""
    tasks = lookup(record.inputs, "spec.tasks", ()) or ()
    return [(pod_needs(f"{record.name}/{t.get('name', 'task')}", lookup(t, "template.spec", {}) or {}),
             int(t.get("replicas", 1))) for t in tasks]


def gang_needs(record: ResourceRecord) -> dict[str, float]:
    """What a Volcano job's gang (its first minAvailable pods) requests in all."""
    pods = [pod for pod, replicas in task_pods(record) for _ in range(replicas)]
    wanted: dict[str, float] = {}
    for pod in pods[: int(lookup(record.inputs, "spec.minAvailable", len(pods)) or len(pods))]:
        for resource, amount in pod.requests.items():
            wanted[resource] = wanted.get(resource, 0.0) + amount
    return wanted


def job_demand(record: ResourceRecord) -> dict[str, float]:
    """What every pod of a Volcano job requests in all, at the job's full replicas."""
    wanted: dict[str, float] = {}
    for pod, replicas in task_pods(record):
        for resource, amount in pod.requests.items():
            wanted[resource] = wanted.get(resource, 0.0) + replicas * amount
    return wanted
