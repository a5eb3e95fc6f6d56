"""The Volcano `batch.volcano.sh/v1alpha1` Job around a pod template: gang size, queue, retries, plugins.

Restart semantics. torchrun's elastic agents already survive the loss of a pod: the survivors' workers fail
their collective, the agents re-rendezvous with whoever is left (down to --nnodes MIN) and resume from the
last checkpoint. So a lost pod must *not* take the others down: PodEvicted (spot reclaim, node drain, pod
deletion) has no policy on purpose, and Volcano's default for it, SyncJob, recreates the missing pod under the
same name; it rejoins the rendezvous when a node is back.

Training pods run with restartPolicy Never, so that a container that exits non-zero makes its pod Failed:
Volcano reads the exit code only then (``updatePod`` in pkg/controllers/job/job_controller_handler.go,
v1.15.1); under OnFailure the kubelet would restart a config error in place forever. The first policy ends
the job on the trainer's config-error code, which no retry can fix; it comes first because Volcano tries
policies in order and a PodFailed policy would match that pod too (``applyPolicies``, job_controller_util.go). Any other
failure (torchrun out of restarts, the rendezvous host lost) restarts the job from its checkpoint; maxRetry
bounds those restarts and is sized for a spot pool. The job completes when `minSuccess` pods exit 0, which
the trainer only does once the configured steps are done (a stopped trainer exits non-zero).
"""

from __future__ import annotations

from typing import Any

from trainyard.workloads.args import TrainingJobArgs
from trainyard.workloads.launch import CONFIG_ERROR_EXIT_CODE, WORKER_TASK
from trainyard.workloads.pod import job_labels

API_VERSION = "batch.volcano.sh/v1alpha1"
KIND = "Job"
SCHEDULER = "volcano"
# Checkov reads a batch/v1 Job's spec.template; a Volcano Job keeps its pods in spec.tasks[].template, where
# these settings are made (pod.POD_SECURITY and the container securityContext), so Checkov cannot see them.
_UNSEEN = "set in spec.tasks[].template, which checkov does not read for Volcano Jobs"
CHECKOV_SKIPS = {
    f"checkov.io/skip{i}": f"{check}={_UNSEEN}"
    for i, check in enumerate(("CKV_K8S_23", "CKV_K8S_29", "CKV_K8S_31", "CKV_K8S_38", "CKV_K8S_40"), start=1)
}
# Job restarts (PodFailed -> RestartJob) allowed before Volcano marks the job Failed; spot pools lose nodes often.
ELASTIC_MAX_RETRY = 16
SINGLE_NODE_MAX_RETRY = 4

# svc: headless Service `<job>` and pod hostnames `<job>-worker-<i>`, published while pods are not ready (the
# rendezvous runs before readiness). Its per-job NetworkPolicy is disabled: it would also block Prometheus
# scraping port 9108; the tenant namespace's policies govern ingress instead.
SVC_PLUGIN = ["--publish-not-ready-addresses=true", "--disable-network-policy=true"]
Policy = dict[str, str | int]
RESTART_ON_FAILED_POD: Policy = {"event": "PodFailed", "action": "RestartJob"}
# A config error is final: end the job (TerminateJob keeps the failed pod and its one-line message).
TERMINATE_ON_CONFIG_ERROR: Policy = {"exitCode": CONFIG_ERROR_EXIT_CODE, "action": "TerminateJob"}
# A smoke run proves the platform works; retrying would hide the failure it exists to show.
TERMINATE_ON_FAILED_POD: Policy = {"event": "PodFailed", "action": "TerminateJob"}


def job_manifest(
    args: TrainingJobArgs,
    template: dict[str, Any],
    *,
    min_available: int,
    replicas: int,
    max_retry: int,
    policies: list[Policy],
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(metadata, spec) of the Volcano Job; one task, `worker`, whose pods run the template."""
    metadata = {"name": args.job.name, "namespace": args.namespace, "labels": job_labels(args),
                "annotations": dict(CHECKOV_SKIPS)}
    spec = {
        "schedulerName": SCHEDULER,
        "queue": args.tenant.queue,
        "priorityClassName": args.priority_class,
        # Gang: nothing starts until MIN pods can all be placed; the rest join as capacity appears.
        "minAvailable": min_available,
        "minSuccess": min_available,
        "maxRetry": max_retry,
        "plugins": {"svc": list(SVC_PLUGIN), "env": []},
        "policies": [dict(policy) for policy in policies],
        "tasks": [{"name": WORKER_TASK, "replicas": replicas, "template": template}],
    }
    return metadata, spec
