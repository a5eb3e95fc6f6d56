"""A submitted job on the cluster, as `submit status`, `submit logs` and `submit cancel` read and end it with the
member's own credentials (cluster_api.py), in the job's namespace only: each request is one the tenant-user Role
allows (platform/tenant_access.py; tests/workloads_infra/test_submit_access.py runs these against it).

Names and labels are Volcano's (volcano-sh/volcano @ v1.15.1): a Job's pods are `<job>-<task>-<index>`
(pkg/controllers/job/helpers/helpers.go PodNameFmt) labelled `volcano.sh/job-name`, `volcano.sh/task-spec` and
`volcano.sh/task-index`, and its PodGroup is `<job>-<job uid>` (job_controller_actions.go
generateRelatedPodGroupName; staging/src/volcano.sh/apis/pkg/apis/batch/v1alpha1/labels.go).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import IO, TYPE_CHECKING, Any

from trainyard.cluster_api import TIMEOUT, NotFoundError, answered
from trainyard.config.yaml_input import InputError
from trainyard.workloads.launch import CHECKPOINT_DIR

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

JOBS = ("batch.volcano.sh", "v1alpha1", "jobs")
PODGROUPS = ("scheduling.volcano.sh", "v1beta1", "podgroups")
JOB_NAME_LABEL = "volcano.sh/job-name"
TASK_LABEL = "volcano.sh/task-spec"
INDEX_LABEL = "volcano.sh/task-index"
EVENTS_SHOWN = 10
# What a member reads first when a job does not start: the scheduler's reason, not the kubelet's routine.
ROUTINE_REASONS = {"Scheduled", "Pulling", "Pulled", "Created", "Started"}


def _custom(api: ApiClient) -> Any:
    from kubernetes import client

    return client.CustomObjectsApi(api)


def _core(api: ApiClient) -> Any:
    from kubernetes import client

    return client.CoreV1Api(api)


def get_job(api: ApiClient, namespace: str, name: str) -> dict[str, Any]:
    what = f"Volcano Job {namespace}/{name}"
    try:
        with answered(api, what):
            job: dict[str, Any] = _custom(api).get_namespaced_custom_object(*JOBS[:2], namespace, JOBS[2], name,
                                                                            _request_timeout=TIMEOUT)
    except NotFoundError:
        raise InputError(f"{what}: no such job (not submitted yet, or cancelled)") from None
    return job


def _listed(api: ApiClient, what: str, call: Any, namespace: str, **selectors: str) -> list[dict[str, Any]]:
    with answered(api, what):
        answer = call(namespace, _preload_content=False, _request_timeout=TIMEOUT, **selectors)
        items: list[dict[str, Any]] = json.loads(answer.data).get("items") or []
    return items


def status(api: ApiClient, namespace: str, name: str) -> str:
    """The Job's phase and counts, its PodGroup's phase and scheduling conditions, each task's pods, and the last
    events of all of them."""
    job = get_job(api, namespace, name)
    lines = [_job_line(job)]
    group_name = f"{name}-{job['metadata'].get('uid', '')}"
    try:
        with answered(api, f"PodGroup {namespace}/{group_name}"):
            group = _custom(api).get_namespaced_custom_object(*PODGROUPS[:2], namespace, PODGROUPS[2], group_name,
                                                              _request_timeout=TIMEOUT)
        lines += _group_lines(group)
    except NotFoundError:
        lines.append("PodGroup: not created yet (Volcano's job controller makes it)")
    pods = _listed(api, f"pods of {namespace}/{name}", _core(api).list_namespaced_pod, namespace,
                   label_selector=f"{JOB_NAME_LABEL}={name}")
    lines += _pod_lines(job, pods)
    events = _listed(api, f"events in {namespace}", _core(api).list_namespaced_event, namespace)
    objects = {("Job", name), ("PodGroup", group_name), *(("Pod", p["metadata"]["name"]) for p in pods)}
    lines += _event_lines(e for e in events if (e.get("involvedObject", {}).get("kind"),
                                                 e.get("involvedObject", {}).get("name")) in objects)
    return "\n".join(lines)


def _job_line(job: dict[str, Any]) -> str:
    meta, spec, state = job["metadata"], job.get("spec", {}), job.get("status", {})
    phase = state.get("state", {})
    counts = ", ".join(f"{key} {state.get(key, 0)}" for key in ("pending", "running", "succeeded", "failed"))
    line = (f"Volcano Job {meta['namespace']}/{meta['name']}: {phase.get('phase', 'no phase yet')} "
            f"(min available {spec.get('minAvailable', '-')}; {counts}; retries {state.get('retryCount', 0)} of "
            f"{spec.get('maxRetry', '-')})")
    if detail := " ".join(filter(None, (phase.get("reason"), phase.get("message")))):
        line += f"\n  {detail}"
    return line


def _group_lines(group: dict[str, Any]) -> list[str]:
    state = group.get("status", {})
    lines = [f"PodGroup {group['metadata']['name']}: {state.get('phase', 'no phase yet')} "
             f"(min member {group.get('spec', {}).get('minMember', '-')})"]
    for condition in state.get("conditions") or []:
        if condition.get("status") == "True" and condition.get("type") != "Scheduled":
            lines.append(f"  {condition.get('type')}: {condition.get('reason') or ''} {condition.get('message') or ''}"
                         .rstrip())
    return lines


def _pod_lines(job: dict[str, Any], pods: list[dict[str, Any]]) -> list[str]:
    lines = []
    for task in job.get("spec", {}).get("tasks") or []:
        mine = sorted((p for p in pods if p["metadata"].get("labels", {}).get(TASK_LABEL) == task["name"]),
                      key=lambda p: int(p["metadata"].get("labels", {}).get(INDEX_LABEL, "0")))
        lines.append(f"Task {task['name']}: {len(mine)} of {task.get('replicas', '-')} pods")
        lines += [f"  {_pod_line(p)}" for p in mine]
    return lines


def _pod_line(pod: dict[str, Any]) -> str:
    state = pod.get("status", {})
    containers = state.get("containerStatuses") or []
    restarts = sum(c.get("restartCount", 0) for c in containers)
    why = [reason for c in containers for s in (c.get("state") or {}).values()
           if isinstance(s, dict) and (reason := s.get("reason")) and reason != "Completed"]
    return (f"{pod['metadata']['name']}  {state.get('phase', 'Unknown')}{f' ({why[0]})' if why else ''}  "
            f"restarts {restarts}  node {pod.get('spec', {}).get('nodeName') or '-'}")


def _event_lines(events: Iterable[dict[str, Any]]) -> list[str]:
    def when(event: dict[str, Any]) -> str:
        return str(event.get("lastTimestamp") or event.get("eventTime") or
                   event.get("metadata", {}).get("creationTimestamp") or "")

    worth = [e for e in events if e.get("type") == "Warning" or e.get("reason") not in ROUTINE_REASONS]
    shown = sorted(worth, key=when)[-EVENTS_SHOWN:]
    if not shown:
        return ["Events: none worth showing"]
    lines = [f"Events (last {len(shown)}):"]
    for event in shown:
        target = event.get("involvedObject", {})
        count = f" (x{event['count']})" if event.get("count", 1) > 1 else ""
        lines.append(f"  {when(event)}  {event.get('type', '')}  {event.get('reason', '')}  "
                     f"{target.get('kind', '').lower()}/{target.get('name', '')}: "
                     f"{' '.join((event.get('message') or '').split())}{count}")
    return lines


def pod_of(job: dict[str, Any], task: str | None, index: int) -> tuple[str, str]:
    """The pod (and its first container) of task ``task`` (default: the job's first task) at ``index``."""
    tasks = {t["name"]: t for t in job.get("spec", {}).get("tasks") or []}
    meta = job["metadata"]
    if not tasks:
        raise InputError(f"Volcano Job {meta['namespace']}/{meta['name']}: has no tasks")
    chosen = tasks.get(task or next(iter(tasks)))
    if chosen is None:
        raise InputError(f"--task {task!r}: job {meta['name']} has tasks {', '.join(tasks)}")
    replicas = int(chosen.get("replicas", 1))
    if not 0 <= index < replicas:
        raise InputError(f"--index {index}: task {chosen['name']} has {replicas} pods (indexes 0 to {replicas - 1})")
    container = chosen["template"]["spec"]["containers"][0]["name"]
    return f"{meta['name']}-{chosen['name']}-{index}", container


def logs(api: ApiClient, namespace: str, name: str, *, task: str | None, index: int, follow: bool, previous: bool,
         out: IO[bytes]) -> None:
    """Write the pod's log to ``out`` as it arrives (``follow``: until the container ends)."""
    pod, container = pod_of(get_job(api, namespace, name), task, index)
    what = f"log of pod {namespace}/{pod}{' (previous container)' if previous else ''}"
    try:
        with answered(api, what):
            # Only the flags that are on: the client would send `follow=False` (kubectl leaves them out too).
            flags = {k: True for k, on in (("follow", follow), ("previous", previous)) if on}
            answer = _core(api).read_namespaced_pod_log(
                pod, namespace, container=container, _preload_content=False,
                _request_timeout=(TIMEOUT[0], None) if follow else TIMEOUT, **flags)
            for chunk in answer.stream(decode_content=True):
                out.write(chunk)
                out.flush()
    except NotFoundError:
        raise InputError(f"{what}: pod {pod} does not exist now (see `submit status`: pending or restarting)") from None


def checkpoint_claim(job: dict[str, Any]) -> str | None:
    """The claim the job's trainer writes its checkpoints to (mounted at launch.CHECKPOINT_DIR)."""
    for task in job.get("spec", {}).get("tasks") or []:
        pod = task["template"]["spec"]
        mounted = {m["name"] for c in pod.get("containers") or [] for m in c.get("volumeMounts") or []
                   if m.get("mountPath") == CHECKPOINT_DIR}
        for volume in pod.get("volumes") or []:
            if volume["name"] in mounted and "persistentVolumeClaim" in volume:
                return str(volume["persistentVolumeClaim"]["claimName"])
    return None


def cancel(api: ApiClient, namespace: str, name: str) -> str:
    """Delete the Volcano Job with foreground propagation: its pods and PodGroup go first, then the Job."""
    from kubernetes import client

    job = get_job(api, namespace, name)
    claim = checkpoint_claim(job)
    with answered(api, f"Volcano Job {namespace}/{name}"):
        _custom(api).delete_namespaced_custom_object(
            *JOBS[:2], namespace, JOBS[2], name, body=client.V1DeleteOptions(propagation_policy="Foreground"),
            _request_timeout=TIMEOUT)
    kept = (f"Kept: its checkpoints in claim {claim} (submitting the same job again resumes from the last committed "
            f"one; `kubectl -n {namespace} delete pvc {claim}` frees its quota), " if claim else "Kept: ")
    return (f"cancelled Volcano Job {namespace}/{name}: its pods get SIGTERM and their grace period to commit a "
            f"checkpoint, then go with its PodGroup before the Job (foreground deletion).\n{kept}the job's ConfigMap "
            "and PodMonitor.")

