"""The training pipeline for a tenant's job, as an Argo WorkflowTemplate: data version -> train -> gate -> register.

    python -m trainyard submit --stack dev --job my-job.yaml --pipeline --out build/my-job

Built from the job's own manifests (submit.render_job: what jobs.py renders), so every step runs the job's image,
config, claim and security settings:

1. ``prepare``: the trainer's ``prepare`` writes a content-hashed dataset (manifest.json records the corpus's
   SHA-256) to ``/checkpoints/data/<data-version>`` on the job's claim, from the text at ``corpus`` (a path the pod
   can read) or, with ``corpus`` empty, the synthetic corpus at the config's sizes.
2. ``train``: a resource step creates the job's Volcano Job, reading that dataset (``data.path``,
   ``data.generate=false``) for ``steps`` steps; it succeeds when Volcano reports the job ``Completed`` and fails on
   ``Failed``, ``Terminated`` or ``Aborted``. The previous run's Job of the same name is deleted first; the claim,
   and so the run's checkpoints, stay: a second workflow continues the run up to its ``steps``.
3. ``evaluate``: ``trainyard_train.evaluate`` on the newest committed checkpoint, on the job's own pod shape (its
   GPUs measure latency and memory); a model below ``min-accuracy`` or over ``max-latency-ms``/``max-memory-gb``
   stops the workflow here, the numbers in the step's message and in ``/checkpoints/evaluations/<workflow>.json``.
4. ``register``: ``trainyard_train.register`` adds a version of ``model-name`` to MLflow's model registry with the
   evaluation, from the run the trainer tracked (the namespace's ``mlflow-client`` Secret names the server and the
   tenant's MLflow user). The model's name defaults to ``<namespace>.<job>``: registered-model names are one
   namespace for the whole server.

Results pass through the job's claim, not Argo artifacts: the `local` stack has no artifact repository.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import yaml
from trainyard_train.config import ConfigError, parse_config
from trainyard_train.safe_yaml import load

from trainyard.names import MLFLOW_CLIENT_CONFIG
from trainyard.workloads.launch import CHECKPOINT_DIR

# The account every tenant's workflow pods run as, with Role workflow-executor (platform/argo_workflows.py).
WORKFLOW_SERVICE_ACCOUNT = "workflow"
API_VERSION = "argoproj.io/v1alpha1"  # the CRDs of argo-workflows v4.0.6 (../shared/upstream/crds/argoproj.io)
TRAINER_MODULE = "trainyard_train"
EVALUATIONS = f"{CHECKPOINT_DIR}/evaluations"
DATA_ROOT = f"{CHECKPOINT_DIR}/data"
# Volcano Job phases (volcano pkg/apis/batch/v1alpha1 JobPhase); Argo reads these conditions as Kubernetes label
# selectors over the object (argo-workflows workflow/executor/resource.go, docs "Kubernetes Resources").
SUCCESS = "status.state.phase == Completed"
FAILURE = "status.state.phase in (Failed,Terminated,Aborted)"
_SMALL = {"cpu": "500m", "memory": "1Gi"}
SMALL_STEP = {"requests": _SMALL, "limits": _SMALL}  # prepare and register: no GPU
# The seed design's example gate (issue 21): accuracy >= 0.85, latency < 50 ms, memory < 2 GB.
GATE_DEFAULTS = {"min-accuracy": "0.85", "max-latency-ms": "50", "max-memory-gb": "2"}


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True  # a manifest spells every value out: no &anchors for the objects steps share


def to_yaml(obj: Any) -> str:
    return yaml.dump(obj, Dumper=_Dumper, sort_keys=False)


def _param(name: str) -> str:
    return "{{workflow.parameters." + name + "}}"


def trainer_overrides(container: dict[str, Any]) -> tuple[str, list[str]]:
    """The job's trainer config file and the KEY=VALUE overrides its launch line passes (after ``--config F``)."""
    args = list(container["args"])
    trainer = args[args.index(TRAINER_MODULE) + 1:]
    return trainer[1], trainer[2:]


def _steps(manifests: Sequence[dict[str, Any]], config_file: str, overrides: Sequence[str]) -> int:
    """train.steps as the job's trainer resolves it: its ConfigMap's file under its overrides."""
    (config_map,) = [m for m in manifests if m["kind"] == "ConfigMap"]
    text = config_map["data"][config_file.rsplit("/", 1)[-1]]
    try:
        steps: int = parse_config(load(text) or {}, overrides).train.steps
        return steps
    except ConfigError as exc:  # submit checked it already (trainer_check); say so if not
        raise ValueError(f"the job's trainer config does not parse: {exc}") from exc


def _job_parts(manifests: Sequence[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    (job,) = [m for m in manifests if m["kind"] == "Job"]
    pod = job["spec"]["tasks"][0]["template"]["spec"]
    (container,) = pod["containers"]
    return job, pod, container


def _step_container(container: dict[str, Any], command: list[str], *, env: list[dict[str, Any]] | None = None,
                    resources: dict[str, Any] | None = None, mounts: Sequence[str]) -> dict[str, Any]:
    """A pipeline step in the trainer's image, with its security context and the named mounts of its pod."""
    step: dict[str, Any] = {
        "image": container["image"],
        "command": command[:1],
        "args": command[1:],
        "env": [e for e in container.get("env", []) if e["name"] == "HOME"] + (env or []),
        "resources": resources if resources is not None else container["resources"],
        "securityContext": container["securityContext"],
        "volumeMounts": [m for m in container["volumeMounts"] if m["name"] in mounts],
    }
    return copy.deepcopy(step)  # nothing shared between steps (or with the job)


def workflow_template(manifests: Sequence[dict[str, Any]], model_name: str | None = None) -> dict[str, Any]:
    job, pod, container = _job_parts(manifests)
    name, namespace = job["metadata"]["name"], job["metadata"]["namespace"]
    config_file, overrides = trainer_overrides(container)
    data = f"{DATA_ROOT}/{_param('data-version')}"
    evaluation = f"{EVALUATIONS}/{{{{workflow.name}}}}.json"

    trained = copy.deepcopy(job)
    trained["metadata"].pop("annotations", None)  # checkov's skips are for the plan, not the cluster
    (train_container,) = trained["spec"]["tasks"][0]["template"]["spec"]["containers"]
    train_container["args"] = [*container["args"], f"data.path={data}", "data.generate=false",
                               f"train.steps={_param('steps')}"]
    evaluate = ["python", "-m", f"{TRAINER_MODULE}.evaluate", "--config", config_file, *overrides,
                "--data", data, "--out", evaluation,
                *(arg for key in GATE_DEFAULTS for arg in (f"--{key}", _param(key)))]
    register = ["python", "-m", f"{TRAINER_MODULE}.register", "--evaluation", evaluation,
                "--model-name", _param("model-name"), "--run-dir", CHECKPOINT_DIR]
    # The job's overrides too: the records must fit the model the job trains (seq_len, vocab_size).
    prepare = ["sh", "-c", f'config="$1" out="$2"; shift 2; exec python -m {TRAINER_MODULE}.prepare '
               '--config "$config" --out "$out" ${CORPUS:+--input "$CORPUS"} "$@"', "prepare", config_file, data,
               *overrides]
    volumes = [v for v in pod["volumes"] if v["name"] in ("trainer-config", "checkpoints", "tmp")]
    # Every step runs where the job's pods run: its pool's nodes (and, for an RWO claim, where the claim can attach).
    pod_fields = {k: pod[k] for k in ("nodeSelector", "tolerations") if k in pod}
    job_ref = {"apiVersion": job["apiVersion"], "kind": job["kind"], "metadata": {"name": name, "namespace": namespace}}
    return {
        "apiVersion": API_VERSION,
        "kind": "WorkflowTemplate",
        "metadata": {"name": f"{name}-pipeline", "namespace": namespace, "labels": dict(job["metadata"]["labels"])},
        "spec": copy.deepcopy({
            "entrypoint": "pipeline",
            "serviceAccountName": WORKFLOW_SERVICE_ACCOUNT,
            "securityContext": copy.deepcopy(pod["securityContext"]),
            "volumes": volumes,
            "arguments": {"parameters": [
                {"name": "data-version", "value": "v1"},
                {"name": "corpus", "value": ""},
                {"name": "steps", "value": str(_steps(manifests, config_file, overrides))},
                *({"name": key, "value": value} for key, value in GATE_DEFAULTS.items()),
                {"name": "model-name", "value": model_name or f"{namespace}.{name}"},
            ]},
            "templates": [
                {"name": "pipeline", "steps": [
                    [{"name": "prepare", "template": "prepare"}],
                    [{"name": "clear-previous-run", "template": "clear-previous-run"}],
                    [{"name": "train", "template": "train"}],
                    [{"name": "evaluate", "template": "evaluate"}],
                    [{"name": "register", "template": "register"}],
                ]},
                {"name": "prepare", **pod_fields, "container": _step_container(
                    container, prepare, env=[{"name": "CORPUS", "value": _param("corpus")}],
                    resources=copy.deepcopy(SMALL_STEP), mounts=("trainer-config", "checkpoints", "tmp"))},
                {"name": "clear-previous-run", "resource": {
                    "action": "delete", "flags": ["--ignore-not-found"], "manifest": to_yaml(job_ref)}},
                {"name": "train", "resource": {
                    "action": "create", "setOwnerReference": True, "successCondition": SUCCESS,
                    "failureCondition": FAILURE, "manifest": to_yaml(trained)}},
                {"name": "evaluate", **pod_fields, "container": _step_container(
                    container, evaluate, mounts=("trainer-config", "checkpoints", "tmp"))},
                # Retried only when the tracking server failed (register's exit 1), never on a refusal (2, 3):
                # Argo's retryStrategy.expression (docs "Retries", lastRetry.exitCode).
                {"name": "register", "retryStrategy": {"limit": "3", "retryPolicy": "Always",
                                                       "expression": "asInt(lastRetry.exitCode) == 1"},
                 "container": _step_container(container, register, resources=copy.deepcopy(SMALL_STEP),
                                              mounts=("checkpoints", "tmp"))
                 | {"envFrom": [{"secretRef": {"name": MLFLOW_CLIENT_CONFIG}}]}, **pod_fields},
            ],
        }),
    }

