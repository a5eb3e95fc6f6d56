"""The pipeline's gate and register steps (trainyard_train/evaluate.py, register.py) on a tiny model trained here on a
prepared corpus and tracked in a local MLflow server (mlflow_server.py): the numbers, the gate's verdict, and the
registered version read back over the REST API."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from mlflow_server import mlflow_server
from owned_stacks import OWNED_STACKS
from test_prepare import SIZES, corpus
from test_prepare import prepare as prepare_corpus
from trainer_launch import TINY, WORKLOADS, run, subprocess_env
from trainyard.pipeline import workflow_template
from trainyard.plan.runtime import read_stack
from trainyard.submit import WORKLOADS_KEY, render_job
from trainyard.workloads.launch import CHECKPOINT_DIR
from trainyard_train import evaluate, register
from trainyard_train.checkpoint import read_commit, write_commit
from trainyard_train.evaluate import GATE_FAILED, Measured, Thresholds, failures
from trainyard_train.exitcodes import CONFIG_ERROR
from trainyard_train.mlflow_rest import MlflowClient
from trainyard_train.tracking import RUN_FILE

TRAIN = [*SIZES, "data.generate=false", "train.steps=40", "checkpoint.interval_steps=20", "train.log_every=10"]
LOOSE = ["--min-accuracy", "0.05", "--max-latency-ms", "5000", "--max-memory-gb", "64"]


def test_each_missed_threshold_is_named_with_its_number() -> None:
    limits = Thresholds()  # the seed design's example gate
    assert (limits.min_accuracy, limits.max_latency_ms, limits.max_memory_gb) == (0.85, 50.0, 2.0)
    assert failures(Measured(0.9, 0.3, 12.0, 10**9, 64), limits) == []
    assert failures(Measured(0.84, 0.3, 50.0, 2 * 10**9, 64), limits) == [
        "accuracy 0.8400 < min_accuracy 0.85", "latency_ms 50.00 >= max_latency_ms 50.0",
        "memory_bytes 2000000000 >= max_memory_gb 2.0 GB"]


def step(module: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """A pipeline step as the WorkflowTemplate runs it: its own process."""
    return subprocess.run([sys.executable, "-m", f"trainyard_train.{module}", *args], capture_output=True, text=True,
                          env={**subprocess_env(), **(env or {})}, timeout=300, check=False)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("pipeline")
    data, held_out = root / "data", root / "held-out"
    assert prepare_corpus(data, "--input", str(corpus(root / "corpus"))) == 0
    tokenizer = str(data / "tokenizer.json")  # the held-out text in the training data's tokens
    assert prepare_corpus(held_out, "--input", str(corpus(root / "other", seed=1)), "--tokenizer", tokenizer) == 0
    with mlflow_server() as server:
        env = {"MLFLOW_TRACKING_URI": server.uri, "MLFLOW_EXPERIMENT_NAME": "pipeline",
               "TRAINYARD_MLFLOW_ARTIFACT_ROOT": "mlflow-artifacts:/research"}
        run(root / "run", [*TRAIN, f"data.path={data}"], nproc=1, torchrun=False, env=env)
        yield root, server, env


def config_args(root: Path) -> list[str]:
    return ["--config", str(TINY), *TRAIN, f"data.path={root / 'data'}", f"run_dir={root / 'run'}"]


@pytest.mark.slow
def test_the_gate_measures_the_checkpoint_and_passes_or_stops_with_the_numbers(trained: Any) -> None:
    root, _server, _env = trained
    out = root / "evaluation.json"
    passed = step("evaluate", *config_args(root), "--data", str(root / "held-out"), "--out", str(out), *LOOSE)
    assert passed.returncode == 0, passed.stderr
    result = json.loads(out.read_text())
    assert result["passed"] and result["failures"] == []
    assert result["checkpoint"]["step"] == 40 and result["checkpoint"]["path"].endswith("step-00000040")
    assert result["data_sha256"] == json.loads((root / "held-out" / "manifest.json").read_text())["content_sha256"]
    metrics = result["metrics"]
    vocab = 320
    assert 5 / vocab < metrics["accuracy"] <= 1  # it learned something: well above chance
    assert metrics["loss"] < math.log(vocab)
    assert 0 < metrics["latency_ms"] < 5000 and metrics["memory_bytes"] > 0
    assert f"accuracy={metrics['accuracy']:.4g}" in passed.stdout

    # The same checkpoint against the seed design's gate on accuracy: stopped, with the numbers.
    strict = step("evaluate", *config_args(root), "--data", str(root / "held-out"), "--out", str(root / "x.json"),
                  *LOOSE, "--min-accuracy", "0.999")
    assert strict.returncode == GATE_FAILED
    assert strict.stderr.startswith("gate failed: accuracy ") and "< min_accuracy 0.999" in strict.stderr
    assert json.loads((root / "x.json").read_text())["passed"] is False


@pytest.mark.slow
def test_bad_gate_inputs_are_one_line(trained: Any, tmp_path: Path) -> None:
    root, _server, _env = trained
    out = ["--out", str(tmp_path / "e.json")]
    empty = step("evaluate", *config_args(root), "--checkpoints", str(tmp_path), *out)
    assert empty.returncode == CONFIG_ERROR and empty.stderr.strip().count("\n") == 0
    assert "--checkpoints: no committed checkpoint under" in empty.stderr
    other_model = step("evaluate", *config_args(root), "model.d_model=32", *out)
    assert other_model.returncode == CONFIG_ERROR and "does not load into model.*" in other_model.stderr
    assert "Traceback" not in empty.stderr + other_model.stderr


@pytest.mark.slow
def test_a_passing_model_is_registered_with_its_evaluation(trained: Any) -> None:
    root, server, env = trained
    out = root / "evaluation-register.json"
    assert evaluate.main([*config_args(root), "--data", str(root / "held-out"), "--out", str(out), *LOOSE]) == 0
    evaluation = json.loads(out.read_text())
    done = step("register", "--evaluation", str(out), "--model-name", "tiny-lm", "--run-dir", str(root / "run"),
                env=env)
    assert done.returncode == 0, done.stderr
    run_id = json.loads((root / "run" / RUN_FILE).read_text())["run_id"]
    assert done.stdout.strip() == f"registered tiny-lm version 1 from run {run_id}"
    version = server.state.models["tiny-lm"]["versions"][0]
    run_info = server.state.runs[run_id]["info"]
    assert version["run_id"] == run_id
    assert version["source"] == f"{run_info['artifact_uri']}/checkpoints/step-00000040.json"
    tags = {t["key"]: t["value"] for t in version["tags"]}
    assert tags["eval.accuracy"] == str(evaluation["metrics"]["accuracy"])
    assert tags["gate.min_accuracy"] == "0.05" and tags["checkpoint.step"] == "40"
    assert tags["data_sha256"] == evaluation["data_sha256"]
    # The run carries the evaluation too: metrics at the checkpoint's step, and the file.
    (accuracy,) = server.state.metric_history(run_id, "eval.accuracy")
    assert f"{prefix_of(run_info)}/checkpoints/step-00000040.json" in server.state.artifacts  # the tracker's
    assert accuracy["step"] == 40 and accuracy["value"] == evaluation["metrics"]["accuracy"]
    assert json.loads(server.state.artifacts[f"{prefix_of(run_info)}/evaluation.json"]) == evaluation
    # The training run saw the training data: its hash is on the run (tracking.py).
    assert server.state.runs[run_id]["tags"]["trainyard.data_sha256"] == json.loads(
        (root / "data" / "manifest.json").read_text())["content_sha256"]
    # The pipeline retries the step: the same run and step give the same version, the metrics once.
    again = step("register", "--evaluation", str(out), "--model-name", "tiny-lm", "--run-dir", str(root / "run"),
                 env=env)
    assert again.returncode == 0 and again.stdout.startswith("registered tiny-lm version 1 ")
    assert len(server.state.models["tiny-lm"]["versions"]) == 1
    assert len(server.state.metric_history(run_id, "eval.accuracy")) == 1


def prefix_of(run_info: dict[str, Any]) -> str:
    return str(run_info["artifact_uri"]).removeprefix("mlflow-artifacts:/")


def test_register_writes_the_checkpoint_reference_the_tracker_missed(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    checkpoint = tmp_path / "checkpoints" / "step-00000007"
    checkpoint.mkdir(parents=True)
    (checkpoint / "__0_0.distcp").write_bytes(b"weights")
    write_commit(checkpoint, {"step": 7})
    evaluation = tmp_path / "evaluation.json"
    evaluation.write_text(json.dumps({"passed": True, "metrics": {"accuracy": 0.9}, "thresholds": {},
                                      "checkpoint": {"step": 7, "path": str(checkpoint)}}))
    with mlflow_server() as server:
        client = MlflowClient(server.uri)
        run = client.create_run(client.experiment_id("e", "mlflow-artifacts:/research/e"), "r", 0, {})
        (tmp_path / RUN_FILE).write_text(json.dumps({"run_id": run["info"]["run_id"]}))
        monkeypatch.setenv("MLFLOW_TRACKING_URI", server.uri)
        args = ["--evaluation", str(evaluation), "--model-name", "m", "--run-dir", str(tmp_path)]
        assert register.main(args) == 0
        reference = json.loads(server.state.artifacts[f"{prefix_of(run['info'])}/checkpoints/step-00000007.json"])
        assert reference["path"] == str(checkpoint) and reference["commit"] == read_commit(checkpoint)
        (version,) = server.state.models["m"]["versions"]
        assert version["source"] == f"{run['info']['artifact_uri']}/checkpoints/step-00000007.json"


def test_register_refuses_what_did_not_pass_and_bad_inputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    with mlflow_server() as server:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", server.uri)
        failed = tmp_path / "failed.json"
        failed.write_text(json.dumps({"passed": False, "failures": ["accuracy 0.5 < min_accuracy 0.85"],
                                      "metrics": {}, "thresholds": {}, "checkpoint": {"step": 1}}))
        args = ["--model-name", "m", "--run-dir", str(tmp_path)]
        assert register.main(["--evaluation", str(failed), *args]) == register.NOT_PASSED
        assert "did not pass the gate (accuracy 0.5 < min_accuracy 0.85): not registered" in capsys.readouterr().err
        assert server.state.models == {}

        passed = tmp_path / "passed.json"
        passed.write_text(json.dumps({"passed": True, "metrics": {}, "thresholds": {}, "checkpoint": {"step": 1}}))
        assert register.main(["--evaluation", str(passed), *args]) == CONFIG_ERROR
        assert f"--run-dir: {tmp_path / RUN_FILE} names no tracked run" in capsys.readouterr().err

        (tmp_path / "junk.json").write_text("{}")
        assert register.main(["--evaluation", str(tmp_path / "junk.json"), *args]) == CONFIG_ERROR
        assert "is not an evaluate.py result (no 'metrics')" in capsys.readouterr().err
        monkeypatch.delenv("MLFLOW_TRACKING_URI")
        assert register.main(["--evaluation", str(passed), *args]) == CONFIG_ERROR
        assert capsys.readouterr().err.startswith("register: MLFLOW_TRACKING_URI: not set")



def _local(value: str, root: Path, parameters: dict[str, str], workflow: str) -> str:
    """A WorkflowTemplate argument as it runs here: its parameters substituted, the pod's paths mapped."""
    for name, given in parameters.items():
        value = value.replace("{{workflow.parameters." + name + "}}", given)
    value = value.replace("{{workflow.name}}", workflow)
    return value.replace("/etc/trainyard/", f"{WORKLOADS}/configs/").replace(CHECKPOINT_DIR, str(root))


@pytest.mark.slow
def test_the_workflow_templates_steps_run_as_written(tmp_path: Path) -> None:
    """The first job of the tests' own local stack as a pipeline (`submit --pipeline`), each step's command taken
    from the WorkflowTemplate and run here: prepare data, train on it, gate, register in MLflow."""
    stack = read_stack("laptop", OWNED_STACKS)
    spec = {**json.loads(stack.values[WORKLOADS_KEY])[0], "name": "pipeline"}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(spec))
    template = workflow_template(render_job(stack, spec, tmp_path / "job.yaml"))
    steps = {t["name"]: t for t in template["spec"]["templates"]}
    assert [s[0]["template"] for s in steps["pipeline"]["steps"]] == [
        "prepare", "clear-previous-run", "train", "evaluate", "register"]
    parameters = {p["name"]: p["value"] for p in template["spec"]["arguments"]["parameters"]}
    # Registered-model names are one namespace for the whole server: the default carries the tenant's.
    assert parameters["model-name"] == f"{template['metadata']['namespace']}.pipeline"
    # The synthetic corpus (corpus empty): the laptop job's tiny model has no room for a BPE vocabulary;
    # a prepared corpus through evaluate and register is the tests above.
    parameters |= {"min-accuracy": "0.05", "max-latency-ms": "5000", "max-memory-gb": "64",
                   "model-name": "pipeline-lm"}
    claim = tmp_path / "claim"

    def command(step: str) -> list[str]:
        container = steps[step]["container"]
        argv = [_local(a, claim, parameters, "wf-1") for a in container["command"] + container["args"]]
        return [sys.executable if a == "python" else a for a in argv]

    def environment(step: str) -> dict[str, str]:
        return {e["name"]: _local(e["value"], claim, parameters, "wf-1") for e in steps[step]["container"]["env"]}

    prepare = command("prepare")
    assert prepare[:2] == ["sh", "-c"]
    prepared = subprocess.run([*prepare[:2], prepare[2].replace("python", sys.executable, 1), *prepare[3:]],
                              env={**subprocess_env(), **environment("prepare")}, capture_output=True, text=True,
                              timeout=300, check=False)
    assert prepared.returncode == 0, prepared.stderr
    data = claim / "data" / parameters["data-version"]
    manifest = json.loads((data / "manifest.json").read_text())
    assert manifest["record_len"] == 33  # the job's model: tiny.yaml's seq_len 32, plus the next token

    with mlflow_server() as server:
        env = {"MLFLOW_TRACKING_URI": server.uri, "TRAINYARD_MLFLOW_ARTIFACT_ROOT": "mlflow-artifacts:/research"}
        job = yaml.safe_load(steps["train"]["resource"]["manifest"])
        (container,) = job["spec"]["tasks"][0]["template"]["spec"]["containers"]
        trainer = [_local(a, claim, parameters, "wf-1") for a in container["args"]]
        trainer = trainer[trainer.index("-m") + 2:]  # the trainer's own arguments, after torchrun's
        assert trainer[0] == "--config" and f"data.path={data}" in trainer and "data.generate=false" in trainer
        assert trainer[1] == str(TINY)  # the job's config file, from its ConfigMap (tests run the same file)
        launched = run(claim, trainer[2:], nproc=1, torchrun=False, env=env)
        assert launched.events()[-1]["event"] == "done"
        gate = subprocess.run(command("evaluate"), env={**subprocess_env(), **environment("evaluate")},
                              capture_output=True, text=True, timeout=300, check=False)
        assert gate.returncode == 0, gate.stderr
        assert gate.stdout.startswith("gate passed: accuracy=")
        registered = subprocess.run(command("register"), env={**subprocess_env(), **environment("register"), **env},
                                    capture_output=True, text=True, timeout=300, check=False)
        assert registered.returncode == 0, registered.stderr
        (version,) = server.state.models["pipeline-lm"]["versions"]
        run_id = json.loads((claim / "mlflow-run.json").read_text())["run_id"]
        assert version["run_id"] == run_id and version["source"].endswith(
            f"checkpoints/step-{int(parameters['steps']):08d}.json")
    # The tracking server and the tenant's MLflow user, from the Secret the platform puts in the namespace.
    assert steps["register"]["container"]["envFrom"] == [{"secretRef": {"name": "mlflow-client"}}]
