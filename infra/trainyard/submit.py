"""`python -m trainyard submit`: a tenant's own training job, rendered by the code `pulumi up` runs, checked offline,
written out or applied with the tenant's own kubeconfig.

    python -m trainyard submit --stack dev --job my-job.yaml --dry-run           # print the manifests
    python -m trainyard submit --stack dev --job my-job.yaml --out build/my-job  # write them
    python -m trainyard submit --stack dev --job my-job.yaml                     # server-side apply them
    python -m trainyard submit status --stack dev --job my-job.yaml              # then follow it (job_control.py)
    python -m trainyard submit logs --stack dev --job my-job.yaml --follow
    python -m trainyard submit cancel --stack dev --job my-job.yaml

The job file holds one entry of a stack's ``trainyard:workloads`` list, the same keys (name, kind, tenant, nodePool,
minNodes, maxNodes, gpusPerNode, image, trainerConfig, ...). The stack's program runs under the mock runtime with
that entry as its only job, so the config validation and the component code are the stack's own: the manifests are
exactly the ConfigMap, checkpoint PVC, Volcano Job (and PodMonitor) that jobs.py renders for it. Before anything is
written or sent: every problem with the job file, one line each naming its key; the stack's own job names are
refused (the platform deploys those); and the trainer's own check on the rendered job (plan/trainer_check.py: its
config at every world size of the node range, the model in the GPUs' memory).

Applying is Kubernetes server-side apply (field manager ``trainyard-submit``) through the Kubernetes Python client
and the kubeconfig's credentials (cluster_api.py), into the tenant's namespace only; the tenant-user Role allows
exactly these kinds. `status`, `logs` and `cancel` find the job from the same file and stack (its name, its
tenant's namespace), after the same checks of its keys, without rendering it.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from trainyard import job_control
from trainyard.cluster_api import TIMEOUT, answered, connect
from trainyard.config import ConfigError
from trainyard.config.model import Settings
from trainyard.config.yaml_input import InputError, load_yaml
from trainyard.escape import escaped
from trainyard.pipeline import to_yaml, workflow_template
from trainyard.plan.cluster_state import cluster_state
from trainyard.plan.recording import ResourceRecord
from trainyard.plan.rendering import render_releases
from trainyard.plan.runtime import PROJECT, StackFile, render, settings_of
from trainyard.plan.trainer_check import trainer_problem
from trainyard.plan.writers import is_kubernetes_object, manifest_filename, manifest_of
from trainyard.safe_paths import UnsafePathError, write_file
from trainyard.workloads.pod import JOB_LABEL

WORKLOADS_KEY = f"{PROJECT}:workloads"
FIELD_MANAGER = "trainyard-submit"
VOLCANO_JOB = "kubernetes:batch.volcano.sh/v1alpha1:Job"
APPLY_ORDER = ("ConfigMap", "PersistentVolumeClaim", "Job", "PodMonitor")
# The kinds a job is made of, and where the API serves each (namespaced collections).
COLLECTIONS = {
    ("v1", "ConfigMap"): "api/v1/namespaces/{namespace}/configmaps",
    ("v1", "PersistentVolumeClaim"): "api/v1/namespaces/{namespace}/persistentvolumeclaims",
    ("batch.volcano.sh/v1alpha1", "Job"): "apis/batch.volcano.sh/v1alpha1/namespaces/{namespace}/jobs",
    ("monitoring.coreos.com/v1", "PodMonitor"): "apis/monitoring.coreos.com/v1/namespaces/{namespace}/podmonitors",
    ("argoproj.io/v1alpha1", "WorkflowTemplate"): "apis/argoproj.io/v1alpha1/namespaces/{namespace}/workflowtemplates",
}


class SubmitError(InputError):
    """InputError over several lines: each line escaped on its own (one problem per line)."""

    def __init__(self, message: str) -> None:
        ValueError.__init__(self, "\n".join(escaped(line) for line in message.split("\n")))


def read_job(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise InputError(f"--job {path}: no such file")
    spec = load_yaml(path, str(path))
    if not isinstance(spec, dict):
        raise InputError(f"{path}: expected a map of job keys (one entry of trainyard:workloads), got "
                         f"{'nothing' if spec is None else type(spec).__name__}")
    return spec


def _problems(exc: ConfigError, job_file: Path) -> SubmitError:
    """The stack's problems as the job file's: ``workloads[0].key`` is the file's ``key``."""
    lines = []
    for problem in exc.problems:
        path = str(problem.path)
        if path == "workloads[0]" or path.startswith("workloads[0]."):
            where = f"{job_file}: {path.removeprefix('workloads[0]').removeprefix('.') or '(the job)'}"
        else:
            where = f"{job_file}: (stack {PROJECT}:{path})"
        lines.append(f"  - {where}: {problem.message}")
    noun = "problem" if len(lines) == 1 else "problems"
    return SubmitError(f"{len(lines)} {noun}; nothing was written or sent:\n" + "\n".join(lines))


def _alone(stack: StackFile, spec: dict[str, Any], job_file: Path) -> tuple[StackFile, Settings]:
    """The stack with ``spec`` as its only job, and its settings validated as the program validates them."""
    own = json.loads(stack.values.get(WORKLOADS_KEY, "[]"))
    if spec.get("name") in {j.get("name") for j in own if isinstance(j, dict)}:
        raise InputError(f"{job_file}: name: {spec['name']!r} is a job of stack {stack.stack!r} itself, deployed "
                         "by the platform: pick another name")
    alone = StackFile(stack.stack, {**stack.values, WORKLOADS_KEY: json.dumps([spec])}, stack.secret_keys)
    try:
        return alone, settings_of(alone)
    except ConfigError as exc:
        raise _problems(exc, job_file) from None


def job_target(stack: StackFile, spec: dict[str, Any], job_file: Path) -> tuple[str, str]:
    """The (namespace, name) the job file's job has on the stack's cluster, after the same checks of its keys."""
    _, settings = _alone(stack, spec, job_file)
    job = settings.workloads[0]
    return settings.tenant(job.tenant).namespace_name, job.name


def render_job(stack: StackFile, spec: dict[str, Any], job_file: Path) -> list[dict[str, Any]]:
    """The job's Kubernetes objects as `pulumi up` would create them on ``stack``, or InputError."""
    alone, settings = _alone(stack, spec, job_file)
    recording = render(alone)
    rendered = render_releases(recording, settings.cluster.kubernetes_version)
    name = settings.workloads[0].name
    records = {r.urn: r for r in recording.resources}
    mine: list[ResourceRecord] = [r for r in recording.resources if is_kubernetes_object(r) and
                                  (r.inputs.get("metadata") or {}).get("labels", {}).get(JOB_LABEL) == name]
    pools = {p.name: p for p in cluster_state(recording.resources, rendered).pools}  # as the rehearsal sees them
    for record in mine:
        if record.type == VOLCANO_JOB and (problem := trainer_problem(record, records, pools)):
            raise InputError(f"{job_file}: trainerConfig: {problem}")
    # What the Job mounts first, so an apply never starts pods on a missing ConfigMap or claim (the program's
    # registration order varies from run to run).
    return sorted((manifest_of(r) for r in mine), key=lambda m: APPLY_ORDER.index(m["kind"]))


def dump(manifests: Sequence[dict[str, Any]]) -> str:
    return "".join("---\n" + to_yaml(m) for m in manifests)


def write(manifests: Sequence[dict[str, Any]], out: Path) -> list[Path]:
    """One file per object in ``out``, never through a link or outside it."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise InputError(f"--out {out}: must be a folder (not a link or a file)")
    try:
        return [write_file(out, manifest_filename(m), to_yaml(m).encode()) for m in manifests]
    except (UnsafePathError, OSError) as exc:
        raise InputError(f"--out {out}: {exc}") from None


def apply_requests(manifests: Sequence[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """The server-side apply PATCH each object takes: (path, body)."""
    requests = []
    for manifest in manifests:
        metadata = manifest["metadata"]
        collection = COLLECTIONS[(manifest["apiVersion"], manifest["kind"])].format(namespace=metadata["namespace"])
        requests.append((f"/{collection}/{metadata['name']}", manifest))
    return requests


def apply(manifests: Sequence[dict[str, Any]], kubeconfig: Path | None, context: str | None) -> None:
    """Server-side apply through the Kubernetes Python client, with the kubeconfig's credentials."""
    api = connect(kubeconfig, context)
    with api:
        for path, body in apply_requests(manifests):
            meta = body["metadata"]
            with answered(api, f"{body['kind']} {meta['namespace']}/{meta['name']}"):
                api.call_api(
                    path, "PATCH", query_params=[("fieldManager", FIELD_MANAGER), ("force", "true")],
                    header_params={"Content-Type": "application/apply-patch+yaml", "Accept": "application/json"},
                    body=body, auth_settings=["BearerToken"], response_types_map={200: "object", 201: "object"},
                    _return_http_data_only=True, _request_timeout=TIMEOUT)


def main(stack: StackFile, job_file: Path, *, dry_run: bool, out: Path | None, kubeconfig: Path | None,
         context: str | None, pipeline: bool = False, model_name: str | None = None,
         stacks_dir: Path | None = None) -> int:
    manifests = render_job(stack, read_job(job_file), job_file)
    job = next(m for m in manifests if m["kind"] == "Job")
    namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
    if pipeline:  # the workflow creates the Job itself, after preparing its data (pipeline.py)
        manifests = [*(m for m in manifests if m["kind"] != "Job"), workflow_template(manifests, model_name)]
    if dry_run:
        print(dump(manifests), end="")
        return 0
    if out is not None:
        for path in write(manifests, out):
            print(path)
        return 0
    apply(manifests, kubeconfig, context)
    if pipeline:
        print(f"applied the pipeline {namespace}/{name}-pipeline ({len(manifests)} objects). Run it:\n"
              f"  argo submit -n {namespace} --from workflowtemplate/{name}-pipeline -p data-version=v1 --watch")
        return 0
    again = _same_job(stack, job_file, kubeconfig, context, stacks_dir)
    print(f"submitted {namespace}/{name} ({len(manifests)} objects). Follow it:\n"
          f"  {again('status')}\n"
          f"  {again('logs', '--follow')}\n"
          f"  kubectl -n {namespace} get vcjob {name} -w\n"
          f"Cancel it (the checkpoint claim stays): {again('cancel')}")
    return 0


def _same_job(stack: StackFile, job_file: Path, kubeconfig: Path | None, context: str | None,
              stacks_dir: Path | None) -> Callable[..., str]:
    """The command line of a `submit` action on the same job, as the member would type it here."""
    python = Path(sys.executable)
    with contextlib.suppress(ValueError):
        python = python.relative_to(Path.cwd())
    options = ["--stack", stack.stack, *(["--stacks-dir", str(stacks_dir)] if stacks_dir else []),
               "--job", str(job_file), *(["--kubeconfig", str(kubeconfig)] if kubeconfig else []),
               *(["--context", context] if context else [])]
    return lambda action, *more: shlex.join([str(python), "-m", "trainyard", "submit", action, *options, *more])


def control(action: str, stack: StackFile, job_file: Path, *, kubeconfig: Path | None, context: str | None,
            task: str | None = None, index: int = 0, follow: bool = False, previous: bool = False) -> int:
    """`submit status|logs|cancel`: the job file's job on the stack's cluster, with the member's kubeconfig."""
    namespace, name = job_target(stack, read_job(job_file), job_file)
    with connect(kubeconfig, context) as api:
        if action == "status":
            print(job_control.status(api, namespace, name))
        elif action == "cancel":
            print(job_control.cancel(api, namespace, name))
        else:
            try:
                job_control.logs(api, namespace, name, task=task, index=index, follow=follow, previous=previous,
                                 out=sys.stdout.buffer)
            except KeyboardInterrupt:  # the end of a followed log
                return 130
    return 0
