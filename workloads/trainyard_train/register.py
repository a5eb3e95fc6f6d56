"""The pipeline's last step: register a model that passed the gate in MLflow's model registry.

    python -m trainyard_train.register --evaluation evaluation.json --model-name NAME --run-dir DIR

The training run is the one the trainer tracked (``run_dir/mlflow-run.json``, tracking.py); the server is
``MLFLOW_TRACKING_URI`` and the workspace ``MLFLOW_WORKSPACE`` (the namespace's own). The step logs the evaluation
to that run (metrics ``eval.*`` at the checkpoint's step and ``evaluation.json`` as an artifact), creates the
registered model if it is new, and adds a version whose source is the checkpoint's reference artifact in the run
(``checkpoints/step-NNNNNNNN.json``: the claim path and the exported copy's URI; written here if the tracker did
not) and whose tags carry every measured number, the thresholds and the dataset's manifest hash. It prints the
version; run again for the same run and step, it returns that version.
An evaluation that did not pass is refused: the gate stops the workflow first, and this step never registers a
model on its own judgement.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .checkpoint import CheckpointRef
from .config import ConfigError
from .exitcodes import CONFIG_ERROR
from .export import ExportTarget
from .mlflow_rest import Metric, MlflowClient, MlflowError, credentials, workspace
from .tracking import RUN_FILE, TRACKING_URI_ENV, checkpoint_reference, reference_name

NOT_PASSED = 3  # as evaluate.GATE_FAILED: final, the workflow stops


class InputError(Exception):
    """An unusable input, named in the message."""


def _evaluation(path: Path) -> dict[str, Any]:
    try:
        raw: dict[str, Any] = json.loads(path.read_text())
        raw["metrics"], raw["thresholds"], raw["checkpoint"]["step"], raw["passed"]  # noqa: B018 - the keys we use
    except (OSError, ValueError) as exc:
        raise InputError(f"--evaluation: {path}: {exc}") from exc
    except (KeyError, TypeError) as exc:
        raise InputError(f"--evaluation: {path} is not an evaluate.py result (no {exc})") from exc
    return raw


def _run_id(run_dir: Path) -> str:
    path = run_dir / RUN_FILE
    try:
        return str(json.loads(path.read_text())["run_id"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(f"--run-dir: {path} names no tracked run ({exc}); was MLFLOW_TRACKING_URI set for "
                         "the training job?") from exc


def register(client: MlflowClient, evaluation: dict[str, Any], model_name: str, run_id: str) -> dict[str, Any]:
    """Idempotent, since the pipeline retries it: a version of this model for this run and step is returned, not
    made again; the evaluation's metrics are logged once; the checkpoint's reference is written if the tracker
    (best effort) did not."""
    run = client.get_run(run_id)
    artifact_uri = run["info"]["artifact_uri"]
    step = int(evaluation["checkpoint"]["step"])
    for version in client.model_versions_of_run(run_id):
        tags = {t["key"]: t["value"] for t in version.get("tags", [])}
        if version["name"] == model_name and tags.get("checkpoint.step") == str(step):
            return version
    now = int(time.time() * 1000)
    measured = {k: v for k, v in evaluation["metrics"].items() if isinstance(v, int | float)}
    logged = {(m["key"], m.get("step")) for m in run.get("data", {}).get("metrics", [])}
    client.log_batch(run_id, [Metric(f"eval.{k}", float(v), step, now) for k, v in measured.items()
                              if (f"eval.{k}", step) not in logged])
    client.upload_artifact(artifact_uri, "evaluation.json", json.dumps(evaluation, indent=2).encode())
    source = reference_name(step)
    if not client.artifact_exists(artifact_uri, source):
        reference = checkpoint_reference(CheckpointRef(step, Path(evaluation["checkpoint"]["path"])),
                                         ExportTarget.from_env())
        client.upload_artifact(artifact_uri, source, json.dumps(reference, indent=2, default=str).encode())
    tags = {f"eval.{k}": str(v) for k, v in measured.items()}
    tags |= {f"gate.{k}": str(v) for k, v in evaluation["thresholds"].items()}
    tags |= {"checkpoint.step": str(step), "checkpoint.path": str(evaluation["checkpoint"]["path"])}
    if evaluation.get("data_sha256"):
        tags["data_sha256"] = str(evaluation["data_sha256"])
    client.ensure_registered_model(model_name, "registered by the trainyard pipeline (trainyard_train.register)")
    return client.create_model_version(model_name, f"{artifact_uri}/{source}", run_id, tags,
                                       description=f"step {step}: " + ", ".join(f"{k}={v}" for k, v in tags.items()
                                                                                if k.startswith("eval.")))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m trainyard_train.register", description=__doc__.split("\n")[0])
    parser.add_argument("--evaluation", required=True, type=Path, help="evaluate.py's --out")
    parser.add_argument("--model-name", required=True, help="the registered model's name")
    parser.add_argument("--run-dir", required=True, type=Path, help="the training job's run_dir (its claim)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        uri = os.environ.get(TRACKING_URI_ENV, "").strip()
        if not uri:
            raise InputError(f"{TRACKING_URI_ENV}: not set (the namespace's mlflow-client Secret provides it)")
        evaluation = _evaluation(args.evaluation)
        if not evaluation["passed"]:
            print(f"register: {args.evaluation} did not pass the gate ({'; '.join(evaluation.get('failures', []))})"
                  ": not registered", file=sys.stderr)
            return NOT_PASSED
        client = MlflowClient(uri, timeout_s=30.0, auth=credentials(), workspace=workspace())
        version = register(client, evaluation, args.model_name, _run_id(args.run_dir))
    except (InputError, ConfigError, ValueError, OSError) as exc:  # OSError: the checkpoint is gone from the claim
        print(f"register: {exc}", file=sys.stderr)
        return CONFIG_ERROR
    except MlflowError as exc:
        print(f"register: {uri}: {exc}", file=sys.stderr)
        return 1  # the server: a retry may succeed (the pipeline retries exit 1 only)
    print(f"registered {version['name']} version {version['version']} from run {version['run_id']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
