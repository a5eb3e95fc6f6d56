"""Experiment tracking (trainyard_train/tracking.py): what a training run records in MLflow, read back over the
REST API from a local tracking server (mlflow_server.py), and a server that is down or failing never stopping it."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
import yaml
from mlflow_server import Server, mlflow_server, wait_until
from trainer_launch import TINY, launch, run, steps
from trainyard_train.checkpoint import complete_checkpoints
from trainyard_train.config import load_config
from trainyard_train.logs import LOGGER_NAME
from trainyard_train.mlflow_rest import (
    MAX_ENTITIES_PER_BATCH,
    MAX_METRICS_PER_BATCH,
    MAX_PARAMS_PER_BATCH,
    Metric,
    MlflowClient,
    MlflowError,
    batches,
)
from trainyard_train.tracking import RUN_FILE, Tracker, TrackingTarget, flatten

NAMESPACE_ROOT = "mlflow-artifacts:/research"  # an artifact root such as the mlflow-client Secret gives on AWS


def tracking_env(server: Server | str, experiment: str = "tiny") -> dict[str, str]:
    uri = server if isinstance(server, str) else server.uri
    return {"MLFLOW_TRACKING_URI": uri, "MLFLOW_EXPERIMENT_NAME": experiment,
            "TRAINYARD_MLFLOW_ARTIFACT_ROOT": NAMESPACE_ROOT}


def the_run(server: Server, run_dir: Path) -> dict[str, Any]:
    run_id = json.loads((run_dir / RUN_FILE).read_text())["run_id"]
    answer: dict[str, Any] = MlflowClient(server.uri).get_run(run_id)
    return answer


def history(server: Server, run_id: str, key: str) -> list[dict[str, Any]]:
    return server.state.metric_history(run_id, key)


def artifact(server: Server, artifact_uri: str, name: str) -> bytes:
    assert artifact_uri.startswith("mlflow-artifacts:/")
    return server.state.artifacts[f"{artifact_uri.removeprefix('mlflow-artifacts:/')}/{name}"]


def test_the_target_comes_from_the_environment() -> None:
    assert TrackingTarget.from_env({}) is None
    assert TrackingTarget.from_env({"MLFLOW_TRACKING_URI": " "}) is None
    target = TrackingTarget.from_env({"MLFLOW_TRACKING_URI": "http://mlflow.mlflow.svc.cluster.local:5000",
                                      "TRAINYARD_MLFLOW_ARTIFACT_ROOT": "s3://bucket/research/mlflow/"})
    assert target is not None
    assert target.experiment == "trainyard"
    assert target.artifact_location == "s3://bucket/research/mlflow/trainyard"
    assert TrackingTarget.from_env({"MLFLOW_TRACKING_URI": "http://x"}).artifact_location is None  # type: ignore[union-attr]
    # In a workspace the server places artifacts (its root) and refuses a location of the client's.
    in_workspace = TrackingTarget.from_env({"MLFLOW_TRACKING_URI": "http://x", "MLFLOW_WORKSPACE": "research",
                                            "TRAINYARD_MLFLOW_ARTIFACT_ROOT": "s3://bucket/research/mlflow/"})
    assert in_workspace is not None and in_workspace.workspace == "research"
    assert in_workspace.artifact_location is None


def test_the_config_becomes_dotted_parameters() -> None:
    flat = flatten({"optim": {"lr": 0.003, "betas": [0.9, 0.95]}, "run_dir": "/checkpoints", "data": {"generate": True},
                    "extra": {}})
    assert flat == {"optim.lr": "0.003", "optim.betas": "[0.9, 0.95]", "run_dir": "/checkpoints",
                    "data.generate": "true", "extra": "{}"}


def test_batches_stay_within_the_servers_limits() -> None:
    metrics = [Metric("loss", float(i), i, 0) for i in range(2500)]
    params = {f"p{i}": "v" * 7000 for i in range(250)}
    tags = {f"t{i}": "v" for i in range(150)}
    bodies = list(batches(metrics, params, tags))
    for body in bodies:
        assert len(body["metrics"]) <= MAX_METRICS_PER_BATCH and len(body["params"]) <= MAX_PARAMS_PER_BATCH
        assert len(body["metrics"]) + len(body["params"]) + len(body["tags"]) <= MAX_ENTITIES_PER_BATCH
        assert all(len(p["value"]) == 6000 for p in body["params"])
    assert [m["step"] for body in bodies for m in body["metrics"]] == list(range(2500))  # all, in order
    assert sum(len(b["params"]) for b in bodies) == 250 and sum(len(b["tags"]) for b in bodies) == 150


def test_an_unknown_artifact_scheme_is_refused_not_guessed() -> None:
    with mlflow_server() as server, pytest.raises(Exception, match="only mlflow-artifacts:/ and s3://"):
        MlflowClient(server.uri).upload_artifact("file:///tmp/x", "a.json", b"{}")


@pytest.mark.slow
def test_a_training_run_is_tracked_and_a_restart_continues_the_same_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    overrides = ["train.steps=12", "train.log_every=2", "checkpoint.interval_steps=6"]
    with mlflow_server() as server:
        launched = run(run_dir, overrides, nproc=2, env=tracking_env(server))
        run_json = the_run(server, run_dir)
        info, data = run_json["info"], run_json["data"]
        assert info["status"] == "FINISHED"
        assert len(server.state.runs) == 1 and len(server.state.experiments) == 1  # rank 0 only: one run
        experiment = next(iter(server.state.experiments.values()))
        assert experiment["name"] == "tiny" and experiment["artifact_location"] == f"{NAMESPACE_ROOT}/tiny"

        # The resolved config, as parameters and as a file.
        resolved = yaml.safe_load(artifact(server, info["artifact_uri"], "config.yaml"))
        assert resolved["run_dir"] == str(run_dir) and resolved["train"]["steps"] == 12
        params = {p["key"]: p["value"] for p in data["params"]}
        assert params == flatten(resolved)

        # Per-step metrics at the log interval, equal to what the trainer wrote in its progress file.
        events = launched.events()
        logged = [(e["step"], e["loss"]) for e in steps(events)]
        assert [s for s, _ in logged] == [2, 4, 6, 8, 10, 12]
        run_id = info["run_id"]
        assert [(m["step"], m["value"]) for m in history(server, run_id, "loss")] == logged
        assert {m["key"] for m in server.state.runs[run_id]["metrics"]} == {
            "loss", "step_seconds", "grad_bytes", "samples_per_second", "world_size", "restarts"}
        assert [m["value"] for m in history(server, run_id, "world_size")] == [2.0]

        # The data it saw, its world and layout; each committed checkpoint as a reference.
        tags = {t["key"]: t["value"] for t in data["tags"]}
        assert events[0]["data_sha256"] is None and "trainyard.data_sha256" not in tags  # generated data: no hash
        assert tags["trainyard.world_size"] == "2" and tags["trainyard.layout"] == events[0]["layout"]
        committed = complete_checkpoints(run_dir / "checkpoints")
        assert [c.step for c in committed] == [6, 12]
        for ref in committed:
            reference = json.loads(artifact(server, info["artifact_uri"], f"checkpoints/{ref.path.name}.json"))
            assert reference["step"] == ref.step and reference["path"] == str(ref.path)
            assert reference["export"] is None  # no TRAINYARD_CHECKPOINT_EXPORT here
            assert reference["commit"]["step"] == ref.step
        assert tags["trainyard.checkpoint.latest"].endswith("checkpoints/step-00000012.json")

        # A restart (here: at another world size) reopens the run; its parameters stay the first attempt's.
        run(run_dir, ["train.steps=16", "train.log_every=2", "checkpoint.interval_steps=6"], nproc=1,
            env=tracking_env(server))
        assert len(server.state.runs) == 1
        again = the_run(server, run_dir)
        assert again["info"]["status"] == "FINISHED"
        assert [m["step"] for m in history(server, run_id, "loss")] == [2, 4, 6, 8, 10, 12, 14, 16]
        assert [(m["step"], m["value"]) for m in history(server, run_id, "world_size")] == [(0, 2.0), (12, 1.0)]
        assert {p["key"]: p["value"] for p in again["data"]["params"]}["train.steps"] == "12"


@pytest.mark.slow
def test_a_server_that_is_down_never_stops_training(tmp_path: Path) -> None:
    with socket.socket() as bound:  # bound, never listening: nothing listens there while it is held
        bound.bind(("127.0.0.1", 0))
        nobody = f"http://127.0.0.1:{bound.getsockname()[1]}"
        started = time.monotonic()
        launched = launch(tmp_path / "run", ["train.steps=10"], nproc=1, torchrun=False, env=tracking_env(nobody))
        assert launched.wait() == 0, launched.output()
    output = launched.output()
    assert output.count("tracking_unavailable") == 1, output  # one warning, not one per step
    assert [e["event"] for e in launched.events()][-1] == "done"
    assert not (tmp_path / "run" / RUN_FILE).exists()
    assert time.monotonic() - started < 90


@pytest.fixture
def caplog(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """The trainer's logger, whether or not a trainer in this process turned its propagation off (logs.py)."""
    logger = logging.getLogger(LOGGER_NAME)
    level, propagate = logger.level, logger.propagate
    logger.addHandler(caplog.handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False  # the handler sees each record once
    yield caplog
    logger.removeHandler(caplog.handler)
    logger.setLevel(level)
    logger.propagate = propagate


def test_a_failing_server_is_retried_later_and_gets_everything(tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    cfg = load_config(TINY, [f"run_dir={tmp_path}"])
    with mlflow_server() as server:
        server.state.fail_with = 503
        tracker = Tracker(TrackingTarget(server.uri, "retry", None), cfg, flush_s=0.05, retry_s=0.5).start()
        now = time.time()
        for step in range(1, 6):
            tracker.record({"event": "step", "time": now, "step": step, "loss": 1.0 / step, "seconds": 0.1,
                            "grad_bytes": 10, "samples": 16 * step})
        wait_until(lambda: "tracking_unavailable" in caplog.text)
        server.state.fail_with = 0
        wait_until(lambda: (tmp_path / RUN_FILE).exists())
        # Backing off, not hammering the server: each attempt after a refused one came retry_s later or more (a
        # lower bound a slow machine only widens).
        attempts = [*server.state.refused, server.state.refused[-1] + 1]
        received = server.state.received
        assert all(received[b] - received[a] >= 0.5 for a, b in pairwise(attempts))
        tracker.record({"event": "done", "time": now, "step": 5, "samples": 80})
        tracker.close(timeout_s=60)
        run_id = json.loads((tmp_path / RUN_FILE).read_text())["run_id"]
        assert [m["step"] for m in server.state.metric_history(run_id, "loss")] == [1, 2, 3, 4, 5]
        assert server.state.runs[run_id]["info"]["status"] == "FINISHED"
        assert caplog.text.count("tracking_unavailable") == 1 and "tracking_reconnected" in caplog.text


def test_data_the_server_refuses_is_dropped_not_resent(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cfg = load_config(TINY, [f"run_dir={tmp_path}"])
    with mlflow_server() as server:
        tracker = Tracker(TrackingTarget(server.uri, "refused", None), cfg, flush_s=0.05).start()
        wait_until(lambda: (tmp_path / RUN_FILE).exists())
        run_id = json.loads((tmp_path / RUN_FILE).read_text())["run_id"]
        tracker.record({"event": "step", "time": time.time(), "step": 1, "loss": 1.0, "seconds": 0.1,
                        "grad_bytes": 10, "samples": 16})
        wait_until(lambda: server.state.metric_history(run_id, "loss"))
        server.state.runs.pop(run_id)  # the run vanishes: every later log-batch is refused with a 404
        tracker.record({"event": "step", "time": time.time(), "step": 2, "loss": 0.5, "seconds": 0.1,
                        "grad_bytes": 10, "samples": 32})
        wait_until(lambda: "tracking_refused" in caplog.text)
        sent = len(server.state.requests)
        time.sleep(0.3)
        tracker.close(timeout_s=5)
        assert all("log-batch" not in r for r in server.state.requests[sent:])  # nothing sent twice


class _FlakyClient(MlflowClient):
    """Raises something other than MlflowError once: a bug or an OS error in the thread's path."""

    failed = False

    def log_batch(self, *args: Any, **kwargs: Any) -> None:
        if not self.failed:
            self.failed = True
            raise RuntimeError("unexpected")
        super().log_batch(*args, **kwargs)


def test_an_unreadable_run_file_or_an_unexpected_error_never_ends_tracking(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cfg = load_config(TINY, [f"run_dir={tmp_path}"])
    (tmp_path / RUN_FILE).write_text("")  # a claim restored half-way
    with mlflow_server() as server:
        tracker = Tracker(TrackingTarget(server.uri, "robust", None), cfg, client=_FlakyClient(server.uri),
                          flush_s=0.05, retry_s=0.2).start()
        tracker.record({"event": "step", "time": time.time(), "step": 1, "loss": 1.0, "seconds": 0.1,
                        "grad_bytes": 10, "samples": 16})
        wait_until(lambda: any(r["metrics"] for r in server.state.runs.values()))
        tracker.record({"event": "done", "time": time.time(), "step": 1, "samples": 16})
        tracker.close(timeout_s=60)
    assert "tracking_run_file_unreadable" in caplog.text
    assert "tracking_error uri=" in caplog.text and "error=RuntimeError" in caplog.text
    (run,) = server.state.runs.values()
    assert run["info"]["status"] == "FINISHED" and run["params"]  # a new run, whole
    assert json.loads((tmp_path / RUN_FILE).read_text())["run_id"] == run["info"]["run_id"]


class _SlowFailingClient(MlflowClient):
    """Its first request is still in flight when the trainer closes the tracker, then times out."""

    def __init__(self, uri: str, stopping: Any) -> None:
        super().__init__(uri)
        self.stopping = stopping
        self.failed = threading.Event()

    def experiment_id(self, *args: Any, **kwargs: Any) -> str:
        if not self.failed.is_set():
            self.failed.set()
            wait_until(self.stopping.is_set)
            raise MlflowError("timed out")
        return super().experiment_id(*args, **kwargs)


def test_closing_while_a_request_fails_still_makes_the_last_attempt(tmp_path: Path) -> None:
    cfg = load_config(TINY, [f"run_dir={tmp_path}"])
    with mlflow_server() as server:
        tracker = Tracker(TrackingTarget(server.uri, "closing", None), cfg, flush_s=0.05, retry_s=600.0)
        tracker.client = client = _SlowFailingClient(server.uri, tracker._stop)
        tracker.start()
        tracker.record({"event": "step", "time": time.time(), "step": 1, "loss": 1.0, "seconds": 0.1,
                        "grad_bytes": 10, "samples": 16})
        tracker.record({"event": "done", "time": time.time(), "step": 1, "samples": 16})
        wait_until(client.failed.is_set)  # the first attempt is in flight
        tracker.close(timeout_s=30)
    (run,) = server.state.runs.values()  # the failure backed off for 600 s, but closing tried once more
    assert run["info"]["status"] == "FINISHED" and run["metrics"]
