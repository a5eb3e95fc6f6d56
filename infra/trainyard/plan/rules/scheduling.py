"""Rules on scheduling a Volcano job: the scheduler admits its gang, its queue can hold it, Karpenter can launch its
nodes within the pools' limits, and a queue's jobs at full replicas fit what the queue admits."""

from __future__ import annotations

from trainyard.plan.cluster_model import GIB, Pool, admits, can_launch, can_run_now, fits_some_offer, quantity
from trainyard.plan.pods import lookup
from trainyard.plan.recording import ResourceRecord
from trainyard.plan.resource_types import QUEUES, VOLCANO_JOB
from trainyard.plan.rules.base import Moment, of_type, placement_problem, ready_pools, rule
from trainyard.plan.volcano_jobs import gang_needs, job_demand, task_pods


def _amount(resource: str, value: float) -> str:
    return f"{value / GIB:.1f}Gi" if resource == "memory" else f"{value:g}"


def _queue(record: ResourceRecord) -> str:
    return str(lookup(record.inputs, "spec.queue", "default") or "default")


# With the `enqueue` action, Volcano admits a PodGroup only into resources the cluster has now (proportion's
# queue capacity and overcommit's idle x factor); a job for a pool at zero stays Pending, its pods are never
# created, and no autoscaler sees them. Without `enqueue`, allocate moves a Pending PodGroup to Inqueue itself
# (pkg/scheduler/actions/allocate/allocate.go, "no enqueue action").
@rule("gang-admitted", of_type(VOLCANO_JOB), "volcano-sh/volcano issue 3910")
def gang_admitted(record: ResourceRecord, moment: Moment) -> str | None:
    scheduler = moment.after.scheduler
    if scheduler is None:
        return "no Volcano scheduler is installed to run this job"
    if "enqueue" not in scheduler.actions or not scheduler.plugins & {"proportion", "overcommit"}:
        return None
    wanted = gang_needs(record)
    present: dict[str, float] = {}
    for pool in ready_pools(moment.after):
        for resource, amount in (pool.offers[0].resources if pool.offers else {}).items():
            present[resource] = present.get(resource, 0.0) + amount * pool.nodes
    short = sorted(r for r, amount in wanted.items() if amount > present.get(r, 0.0) * scheduler.overcommit_factor)
    if not short:
        return None
    return (f"the scheduler's enqueue action keeps its PodGroup Pending: {', '.join(short)} are not in the "
            f"cluster until Karpenter adds nodes, and no pod is created for Karpenter to see")


# The proportion plugin never allocates a queue more than its `capability` (volcano.sh docs, "Queue":
# capability is a hard limit), so a gang asking more than its queue's capability never starts.
@rule("queue-fits", of_type(VOLCANO_JOB), "Volcano proportion plugin: queue capability")
def queue_fits(record: ResourceRecord, moment: Moment) -> str | None:
    queue_name = lookup(record.inputs, "spec.queue", "default")
    queues = [r for r in moment.records.values()
              if r.type in QUEUES and lookup(r.inputs, "metadata.name") == queue_name]
    if not queues:
        return None if queue_name == "default" else f"its queue {queue_name} does not exist"
    capability = lookup(queues[0].inputs, "spec.capability", {}) or {}
    wanted = gang_needs(record)
    over = [f"{_amount(r, wanted[r])} {r} (capability {limit})" for r, limit in sorted(capability.items())
            if wanted.get(r, 0.0) > quantity(limit)]
    if not over:
        return None
    return f"its gang (minAvailable pods) needs more than queue {queue_name} may hold: {', '.join(over)}"


# A pending pod makes Karpenter launch a node only if some NodePool's requirements and labels match its
# selectors, it tolerates the pool's taints, and an instance type offers every resource it requests;
# Karpenter knows nvidia.com/gpu and vpc.amazonaws.com/efa per instance type, MIG slices only from a NodeOverlay
# with the NodeOverlay feature gate on (karpenter.sh/docs/concepts/scheduling).
@rule("karpenter-can-launch", of_type(VOLCANO_JOB),
      "Karpenter scheduling docs and NodePool limits; aws/karpenter-provider-aws PR 8710 (NodeOverlay)")
def karpenter_can_launch(record: ResourceRecord, moment: Moment) -> str | None:
    pools = ready_pools(moment.after)
    for pod, _replicas in task_pods(record):
        if can_run_now(pod, pools) or can_launch(pod, pools):
            continue
        problem = placement_problem(pod, pools, launch=True)
        mig = [r for r in pod.extended_resources if r.startswith("nvidia.com/mig-")]
        if mig and not moment.after.overlay_gate:
            problem += " (Karpenter's nodeOverlay feature gate is off, so no NodeOverlay counts)"
        elif mig:
            problem += f" (no NodeOverlay gives {', '.join(mig)} to the pool; overlays: " \
                       f"{', '.join(moment.after.overlays) or 'none'})"
        return f"{pod.name} stays Pending, Karpenter launches no node for it: {problem}"
    return _within_pool_limits(record, pools)


# Karpenter launches no node past a NodePool's spec.limits (karpenter.sh/docs/concepts/nodepools, "Limits"): a
# gang needing more of a limited resource than its pools may hold never gets all its nodes.
def _within_pool_limits(record: ResourceRecord, pools: tuple[Pool, ...]) -> str | None:
    pods = [pod for pod, _ in task_pods(record)]
    if any(can_run_now(pod, pools) for pod in pods):
        return None
    candidates = {p.name: p for p in pools
                  if p.autoscaled and any(admits(pod, p) and fits_some_offer(pod, p) for pod in pods)}
    for resource, amount in sorted(gang_needs(record).items()):
        limits = [pool.limits.get(resource) for pool in candidates.values()]
        if not limits or any(limit is None for limit in limits):
            continue  # some pool sets no limit on it
        allowed = sum(limit for limit in limits if limit is not None)
        if amount > allowed:
            return (f"its gang needs {amount:g} {resource}, more than the limits of NodePool(s) "
                    f"{', '.join(candidates)} allow ({allowed:g})")
    return None


# A queue marked reclaimable gives resources back only through the `reclaim` action (volcano.sh docs, "Actions":
# reclaim); without it the flag promises something the scheduler never does.
@rule("reclaim-configured", of_type(*QUEUES), "volcano.sh docs, actions: reclaim")
def reclaim_configured(record: ResourceRecord, moment: Moment) -> str | None:
    if not lookup(record.inputs, "spec.reclaimable"):
        return None
    scheduler = moment.after.scheduler
    if scheduler is not None and "reclaim" not in scheduler.actions:
        return "the queue is reclaimable but the scheduler runs no reclaim action"
    return None


# Once a PodGroup leaves Pending the job controller creates every pod of the job, whatever its queue may hold, and
# the scheduler marks each unplaced one Unschedulable, so Karpenter launches nodes for all of them (api/job_info.go):
# the jobs of a queue at their full replicas must fit its capability, or nodes are bought for pods the queue never
# admits. Named once per queue, on its first job by name.
@rule("queue-demand-fits", of_type(VOLCANO_JOB),
      "volcano-sh/volcano issue 4710; Volcano 1.15 job_controller_actions.go")
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
