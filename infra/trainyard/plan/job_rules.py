"""Readiness rules on what a Volcano job meets once the job controller has created its pods (issue 19): the
demand its queue is handed, applied by the rehearsal beside `readiness.RULES`."""

from __future__ import annotations

from trainyard.plan.cluster_model import GIB, quantity
from trainyard.plan.pods import lookup
from trainyard.plan.readiness import QUEUES, VOLCANO_JOB, Moment, Rule, task_pods
from trainyard.plan.recording import ResourceRecord


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


def _amount(resource: str, value: float) -> str:
    return f"{value / GIB:.1f}Gi" if resource == "memory" else f"{value:g}"


RULES: tuple[Rule, ...] = (
    Rule("queue-demand-fits", lambda record: record.type == VOLCANO_JOB, queue_demand_fits,
         "volcano-sh/volcano issue 4710; Volcano 1.15 job_controller_actions.go"),
)
