"""Per-tenant access to MLflow, against a real `mlflow server --app-name basic-auth` (mlflow_auth_server.py) with the
platform's own command line and auth config: the users Job's program makes the tenants' users (and re-running it
changes nothing but a rotated password), a tenant's trainer logs with its credentials, another tenant's credentials
read none of it, and a server that refuses the credentials never stops training."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mlflow_auth_server import ADMIN_PASSWORD, AuthServer, auth_server
from trainer_launch import TINY, launch
from trainyard.paths import PLATFORM_DIR
from trainyard.platform import mlflow_auth
from trainyard_train.config import load_config
from trainyard_train.mlflow_rest import MlflowClient, MlflowError
from trainyard_train.tracking import RUN_FILE, Tracker, TrackingTarget

pytestmark = pytest.mark.slow

USERS_PROGRAM = PLATFORM_DIR / "mlflow" / mlflow_auth.USERS_SCRIPT
PASSWORDS = {"research": "research0password0000000000000000000001",
             "vision": "vision0password00000000000000000000000002"}


def make_users(server: AuthServer, passwords: dict[str, str], folder: Path,
               admin_password: str = ADMIN_PASSWORD) -> subprocess.CompletedProcess[str]:
    """Run the users Job's program as the Job does: the users Secret as files, the admin's password as a file."""
    users = folder / "users"
    users.mkdir(parents=True, exist_ok=True)
    for old in users.iterdir():
        old.unlink()
    for user, password in passwords.items():
        (users / user).write_text(password)
    (users / "..data").mkdir()  # what a Secret volume holds besides the keys
    admin = folder / mlflow_auth.ADMIN_PASSWORD_KEY
    admin.write_text(admin_password)
    env = {"PATH": os.environ["PATH"], "MLFLOW_TRACKING_URI": server.uri, "USERS_DIR": str(users),
           mlflow_auth.USERNAME_ENV: mlflow_auth.ADMIN_USERNAME, "ADMIN_PASSWORD_FILE": str(admin),
           "ATTEMPTS": "3", "DELAY_SECONDS": "1"}
    try:
        return subprocess.run([sys.executable, str(USERS_PROGRAM)], env=env, capture_output=True, text=True,
                              timeout=120, check=False)
    finally:
        (users / "..data").rmdir()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthServer]:
    folder = tmp_path_factory.mktemp("mlflow-auth")
    with auth_server(folder) as running:
        made = make_users(running, PASSWORDS, folder / "job")
        assert made.returncode == 0, made.stdout + made.stderr
        assert sorted(made.stdout.split("\n")[:-1]) == ["research: created", "vision: created"]
        yield running


def client(server: AuthServer, user: str, password: str | None = None) -> MlflowClient:
    return MlflowClient(server.uri, timeout_s=30.0, auth=(user, password or PASSWORDS[user]))


def _step(tracker: Tracker, step: int) -> None:
    tracker.record({"event": "step", "time": time.time(), "step": step, "loss": 1.0 / step, "seconds": 0.1,
                    "grad_bytes": 10, "samples": 16 * step})


def tracked_run(server: AuthServer, tmp_path: Path, user: str, experiment: str) -> str:
    """A tenant's trainer tracker, its target read from the environment its Secret gives its pods."""
    env = mlflow_auth.client_data(user, PASSWORDS[user], None) | {"MLFLOW_EXPERIMENT_NAME": experiment}
    env["MLFLOW_TRACKING_URI"] = server.uri  # the test's port, not the cluster's Service
    target = TrackingTarget.from_env({k: str(v) for k, v in env.items()})
    assert target is not None and target.auth == (user, PASSWORDS[user])
    cfg = load_config(TINY, [f"run_dir={tmp_path}"])
    # The target's own credentials, with the tests' request timeout: the pods' 5 s is short for a loaded CI machine.
    tracker = Tracker(target, cfg, client=MlflowClient(target.uri, timeout_s=30.0, auth=target.auth), flush_s=0.05,
                      retry_s=0.5).start()
    for step in (1, 2, 3):
        _step(tracker, step)
    tracker.record({"event": "done", "time": time.time(), "step": 3, "samples": 48})
    tracker.close(timeout_s=60)
    return str(json.loads((tmp_path / RUN_FILE).read_text())["run_id"])


def test_nobody_without_credentials_and_nothing_by_default(server: AuthServer) -> None:
    assert server.status("POST", "/api/2.0/mlflow/experiments/search", body=b'{"max_results": 10}') == 401
    assert server.status("GET", "/api/2.0/mlflow/experiments/search?max_results=10",
                         ("vision", "not-its-password")) == 401
    # An experiment nobody granted: the default permission opens nothing (the admin's own).
    admin = MlflowClient(server.uri, timeout_s=30.0, auth=(mlflow_auth.ADMIN_USERNAME, ADMIN_PASSWORD))
    experiment_id = admin.experiment_id("platform/private", None)
    path = "/api/2.0/mlflow/experiments/get?" + urllib.parse.urlencode({"experiment_id": experiment_id})
    assert server.status("GET", path, ("research", PASSWORDS["research"])) == 403


def test_a_tenants_runs_and_models_are_its_own(server: AuthServer, tmp_path: Path) -> None:
    run_id = tracked_run(server, tmp_path / "research", "research", "research/tiny")
    research, vision = client(server, "research"), client(server, "vision")

    # The trainer logged with its credentials: the run, its parameters and metrics read back as the tenant.
    run = research.get_run(run_id)
    assert run["info"]["status"] == "FINISHED"
    assert {p["key"] for p in run["data"]["params"]} >= {"train.steps", "run_dir"}
    assert {m["key"] for m in run["data"]["metrics"]} >= {"loss", "step_seconds"}
    model = research.call("POST", "registered-models/create", {"name": "research.tiny"})
    assert model["registered_model"]["name"] == "research.tiny"

    # Another tenant reads, changes and deletes none of it.
    experiment_id = run["info"]["experiment_id"]
    for what, call in {
        "get the run": lambda: vision.get_run(run_id),
        "get the experiment": lambda: vision.call("GET", "experiments/get", query={"experiment_id": experiment_id}),
        "get it by name": lambda: vision.call("GET", "experiments/get-by-name",
                                              query={"experiment_name": "research/tiny"}),
        "log to the run": lambda: vision.log_batch(run_id, tags={"x": "y"}),
        "delete the run": lambda: vision.call("POST", "runs/delete", {"run_id": run_id}),
        "delete the experiment": lambda: vision.call("POST", "experiments/delete", {"experiment_id": experiment_id}),
        "read the model": lambda: vision.call("GET", "registered-models/get", query={"name": "research.tiny"}),
        "version the model": lambda: vision.call("POST", "model-versions/create", {
            "name": "research.tiny", "source": "s3://elsewhere/model", "run_id": run_id}),
        "delete the model": lambda: vision.call("DELETE", "registered-models/delete", {"name": "research.tiny"}),
    }.items():
        with pytest.raises(MlflowError) as refused:
            call()
        assert refused.value.status == 403, (what, refused.value)
    # Searches leave out what it may not read.
    experiments = vision.call("POST", "experiments/search", {"max_results": 100}).get("experiments", [])
    assert "research/tiny" not in {e["name"] for e in experiments}
    runs = vision.call("POST", "runs/search", {"experiment_ids": [experiment_id]}).get("runs", [])
    assert runs == []
    models = vision.call("GET", "registered-models/search", query={"max_results": "100"})
    assert "research.tiny" not in {m["name"] for m in models.get("registered_models", [])}
    # And the artifacts the server's proxy holds for the run (the `local` stack's).
    artifact = f"/api/2.0/mlflow-artifacts/artifacts/{_proxy_path(run)}/config.yaml"
    assert server.status("GET", artifact, ("research", PASSWORDS["research"])) == 200
    assert server.status("GET", artifact, ("vision", PASSWORDS["vision"])) == 403
    assert research.get_run(run_id)["info"]["lifecycle_stage"] == "active"


def _proxy_path(run: dict[str, Any]) -> str:
    uri = run["info"]["artifact_uri"]
    assert uri.startswith("mlflow-artifacts:/"), uri  # no artifact root on `local`: the server's, by experiment id
    return str(uri.removeprefix("mlflow-artifacts:").lstrip("/"))


def test_making_the_users_again_changes_nothing_but_a_rotated_password(server: AuthServer, tmp_path: Path) -> None:
    again = make_users(server, PASSWORDS, tmp_path)
    assert again.returncode == 0, again.stderr
    assert sorted(again.stdout.split("\n")[:-1]) == ["research: updated", "vision: updated"]
    assert client(server, "vision").call("POST", "experiments/search", {"max_results": 1}) is not None
    rotated = {**PASSWORDS, "vision": "vision0rotated0password000000000000000003"}
    assert make_users(server, rotated, tmp_path).returncode == 0
    with pytest.raises(MlflowError) as old:
        client(server, "vision").call("POST", "experiments/search", {"max_results": 1})
    assert old.value.status == 401
    client(server, "vision", rotated["vision"]).call("POST", "experiments/search", {"max_results": 1})
    assert make_users(server, PASSWORDS, tmp_path).returncode == 0  # back, for the other tests
    # A wrong admin password is a failure the Job reports, not a success.
    refused = make_users(server, PASSWORDS, tmp_path, admin_password="not-the-admins")
    assert refused.returncode == 1 and "HTTP 401" in refused.stderr, refused.stdout + refused.stderr


def test_a_server_that_refuses_the_credentials_never_stops_training(server: AuthServer, tmp_path: Path) -> None:
    env = {"MLFLOW_TRACKING_URI": server.uri, "MLFLOW_EXPERIMENT_NAME": "research/refused",
           mlflow_auth.USERNAME_ENV: "research", mlflow_auth.PASSWORD_ENV: "a-password-the-server-never-set"}
    launched = launch(tmp_path / "run", ["train.steps=10"], nproc=1, torchrun=False, env=env)
    assert launched.wait() == 0, launched.output()
    output = launched.output()
    assert output.count("tracking_unavailable") == 1, output  # one warning, not one per step
    assert "401" in output
    assert [e["event"] for e in launched.events()][-1] == "done"
    assert not (tmp_path / "run" / RUN_FILE).exists()
