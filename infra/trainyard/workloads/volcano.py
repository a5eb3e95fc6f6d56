"""The Volcano `batch.volcano.sh/v1alpha1` Job around a pod template: gang size, queue, retries, plugins.

Restart semantics (Volcano v1.15.1, pkg/controllers/job). torchrun's elastic agents already survive the loss of a
pod: the survivors' workers fail their collective, the agents re-rendezvous with whoever is left (down to --nnodes
MIN) and resume from the last checkpoint. So a lost pod must *not* take the others down.

- A pod that ends reaches the job controller as `PodFailed`, with its container's exit code, whenever its phase
  turns Failed (`updatePod`, job_controller_handler.go). Since Kubernetes 1.27 a deleted or evicted pod turns
  Failed before it goes (spot reclaim, drain, Karpenter, a Volcano eviction: the trainer commits its checkpoint on
  the SIGTERM and exits 143), so graceful pod loss is `PodFailed` too; `PodEvicted` (`deletePod`) comes after.
- Policies are tried in order, each by its events, then its exit code (`applyPolicies`, job_controller_util.go);
  the exit code is only read from pods that run with restartPolicy Never (under OnFailure the kubelet would
  restart a config error in place forever).
- `exitCode: 2 → TerminateJob` comes first: the trainer's config-error code (also an incompatible or unloadable
  run in run_dir, a diverged loss) is final; TerminateJob keeps the failed pod and its one-line message.
- `exitCode: 75 → RestartJob` next: the agent's code for an unreachable rendezvous store (launch.py). The store is
  hosted by worker-0's agent, so its loss fails every other agent; as RestartPod each survivor would cost a retry
  (up to `replicas` per loss). RestartJob costs one and kills every pod, whose later failures arrive while the job
  is Restarting (free: state/restarting.go) or from the previous job version (ignored: killJob bumps
  status.version, applyPolicies syncs outdated requests). A worker-0 loss thus costs at most two retries: its own
  pod's RestartPod, then one RestartJob.
- `PodFailed → RestartPod` for everything else (143 stopped by a signal, 124 grace expired, 1 crash): only that pod
  is killed and recreated under its name (`killTarget` with TargetTypePod, job_controller_actions.go; the running
  state's RestartPodAction, state/running.go) and rejoins the rendezvous when it is scheduled again; the other pods
  keep training. RestartJob would kill every pod on each loss.
- Every RestartPod adds one to the job's RetryCount (state/running.go, state/pending.go), which never goes down;
  at maxRetry the job is Failed (state/restarting.go). maxRetry is thus a budget of pod losses over the job's whole
  life, sized for a spot pool; a job that exhausts it resumes from its retained checkpoint claim when re-created.
- Every kill (RestartPod included) runs the plugins' OnJobDelete (`killPods`): the svc plugin deletes the headless
  Service and re-creates it on the next sync, so pod DNS names drop out for a moment; the agents keep their open
  store connection to worker-0, and a worker that cannot resolve a peer in that window fails and is restarted by
  its agent.

The job completes when `minSuccess` pods exit 0, which the trainer only does once the configured steps are done
(a stopped trainer exits non-zero, so graceful stops never count toward it).
"""

from __future__ import annotations

from typing import Any

import pulumi

from trainyard.config.model import Job
from trainyard.platform.kube import checkov_skips
from trainyard.workloads.args import TrainingJobArgs
from trainyard.workloads.launch import CONFIG_ERROR_EXIT_CODE, STORE_LOST_EXIT_CODE, WORKER_TASK
from trainyard.workloads.pod import job_labels

API_VERSION = "batch.volcano.sh/v1alpha1"
KIND = "Job"
SCHEDULER = "volcano"
# Checkov reads a batch/v1 Job's spec.template; a Volcano Job keeps its pods in spec.tasks[].template, where
# these settings are made (pod.POD_SECURITY and the container securityContext), so Checkov cannot see them.
_UNSEEN = "set in spec.tasks[].template, which checkov does not read for Volcano Jobs"
CHECKOV_SKIPS = checkov_skips((check, _UNSEEN) for check in ("CKV_K8S_23", "CKV_K8S_29", "CKV_K8S_31", "CKV_K8S_38",
                                                              "CKV_K8S_40"))
# Volcano's admission webhook refuses any change to a Job's spec but minAvailable, tasks[*].replicas and
# priorityClassName (validateJobUpdate, pkg/webhooks/admission/jobs/validate/admit_job.go @v1.15.1): an update in
# place (a new image, a networkTopology) would fail `pulumi up`. Pulumi replaces the Job instead, deleting the old
# one first (same name); the run resumes from its checkpoint volume, which is a separate, retained resource.
REPLACE_ON_SPEC_CHANGE = pulumi.ResourceOptions(replace_on_changes=["spec"], delete_before_replace=True)
# Retries over the job's life before Volcano marks it Failed: one per lost pod (PodFailed -> RestartPod), two for a
# lost worker-0 (its RestartPod, then the survivors' one RestartJob); spot pools lose nodes often.
ELASTIC_MAX_RETRY = 16
SINGLE_NODE_MAX_RETRY = 4

# svc: headless Service `<job>` and pod hostnames `<job>-worker-<i>`, published while pods are not ready (the
# rendezvous runs before readiness). Its per-job NetworkPolicy is disabled: it would also block Prometheus
# scraping port 9108; the tenant namespace's policies govern ingress instead.
SVC_PLUGIN = ["--publish-not-ready-addresses=true", "--disable-network-policy=true"]
Policy = dict[str, str | int]
# A pod that failed (crash, torchrun out of restarts) or was stopped (eviction, deletion: exit 143): recreate it alone.
RESTART_FAILED_POD: Policy = {"event": "PodFailed", "action": "RestartPod"}
# The rendezvous store went with worker-0: restart the whole job once rather than each survivor on its own.
RESTART_JOB_ON_STORE_LOSS: Policy = {"exitCode": STORE_LOST_EXIT_CODE, "action": "RestartJob"}
# A config error is final: end the job (TerminateJob keeps the failed pod and its one-line message).
TERMINATE_ON_CONFIG_ERROR: Policy = {"exitCode": CONFIG_ERROR_EXIT_CODE, "action": "TerminateJob"}
# A smoke run proves the platform works; retrying would hide the failure it exists to show.
TERMINATE_ON_FAILED_POD: Policy = {"event": "PodFailed", "action": "TerminateJob"}
# A multi-node gang that may spread over the whole cluster but is packed into the lowest HyperNode tier that holds
# it: Volcano turns soft into hard at the cluster-top tier, which every node belongs to, so it never waits
# (pkg/scheduler/framework/session.go adjustNetworkTopologySpec @v1.15.1).
SOFT_TOPOLOGY: dict[str, Any] = {"mode": "soft"}


def network_topology(job: Job) -> dict[str, Any] | None:
    """spec.networkTopology: the stack's setting, soft for any other multi-node job, none for one node."""
    if job.network_topology is None:
        return dict(SOFT_TOPOLOGY) if job.max_nodes > 1 else None
    if job.network_topology.mode == "soft":
        return dict(SOFT_TOPOLOGY)
    return {"mode": "hard", "highestTierAllowed": job.network_topology.highest_tier}


def job_manifest(
    args: TrainingJobArgs,
    template: dict[str, Any],
    *,
    min_available: int,
    replicas: int,
    max_retry: int,
    policies: list[Policy],
    topology: dict[str, Any] | None = None,
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
    if topology is not None:
        spec["networkTopology"] = topology
    return metadata, spec
