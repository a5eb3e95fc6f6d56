"""Per-tenant access to MLflow, against a real `mlflow server --app-name basic-auth --enable-workspaces`
(mlflow_auth_server.py) with the platform's own command line and auth config: the users Job's program makes the
tenants' users and workspaces (and re-running it changes nothing but a rotated or member-changed password, and takes
back a membership another tenant gave), a tenant's trainer and register step work with its credentials in its
workspace, another tenant reads none of it and can neither take nor share its names, and a server that refuses the
credentials never stops training."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from mlflow_auth_server import ADMIN_PASSWORD, AuthServer, auth_server
from trainer_launch import TINY, launch
from trainyard import names
from trainyard.paths import PLATFORM_DIR
from trainyard.platform import mlflow_auth
from trainyard_train import register
from trainyard_train.checkpoint import write_commit
from trainyard_train.config import load_config
from trainyard_train.mlflow_rest import MlflowClient, MlflowError
from trainyard_train.tracking import RUN_FILE, Tracker, TrackingTarget

pytestmark = pytest.mark.slow

USERS_PROGRAM = PLATFORM_DIR / "mlflow" / mlflow_auth.USERS_SCRIPT
PASSWORDS = {"research": "research0password0000000000000000000001",
             "vision": "vision0password00000000000000000000000002"}


def make_users(server: AuthServer, passwords: dict[str, str], folder: Path, admin_password: str = ADMIN_PASSWORD,
               roots: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the users Job's program as the Job does: the users Secret and the workspace roots ConfigMap as files,
    the admin's password as a file."""
    users, root_files = folder / "users", folder / "roots"
    for files in (users, root_files):
        files.mkdir(parents=True, exist_ok=True)
        for old in files.iterdir():
            old.unlink()
    for user, password in passwords.items():
        (users / user).write_text(password)
    for user, root in (roots or {}).items():
        (root_files / user).write_text(root)
    (users / "..data").mkdir()  # what a Secret volume holds besides the keys
    admin = folder / mlflow_auth.ADMIN_PASSWORD_KEY
    admin.write_text(admin_password)
    env = {"PATH": os.environ["PATH"], "MLFLOW_TRACKING_URI": server.uri, "USERS_DIR": str(users),
           "ROOTS_DIR": str(root_files),
           mlflow_auth.USERNAME_ENV: mlflow_auth.ADMIN_USERNAME, "ADMIN_PASSWORD_FILE": str(admin),
           "ATTEMPTS": "3", "DELAY_SECONDS": "1"}
    try:
        return subprocess.run([sys.executable, str(USERS_PROGRAM)], env=env, capture_output=True, text=True,
                              timeout=600, check=False)
    finally:
        (users / "..data").rmdir()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthServer]:
    folder = tmp_path_factory.mktemp("mlflow-auth")
    with auth_server(folder) as running:
        made = make_users(running, PASSWORDS, folder / "job")
        assert made.returncode == 0, made.stdout + made.stderr
        assert sorted(made.stdout.split("\n")[:-1]) == ["research: created, workspace research created, member",
                                                       "vision: created, workspace vision created, member"]
        yield running


def client(server: AuthServer, user: str, password: str | None = None, workspace: str | None = None) -> MlflowClient:
    """`user`'s client, in its own workspace unless told another."""
    return MlflowClient(server.uri, timeout_s=30.0, auth=(user, password or PASSWORDS[user]),
                        workspace=workspace or user)


def tenant_env(server: AuthServer, user: str) -> dict[str, str]:
    """What the tenant's `mlflow-client` Secret gives its pods, with the test's server."""
    env = {k: str(v) for k, v in mlflow_auth.client_data(user, PASSWORDS[user]).items()}
    return env | {"MLFLOW_TRACKING_URI": server.uri}  # the test's port, not the cluster's Service


def _step(tracker: Tracker, step: int) -> None:
    tracker.record({"event": "step", "time": time.time(), "step": step, "loss": 1.0 / step, "seconds": 0.1,
                    "grad_bytes": 10, "samples": 16 * step})


def tracked_run(server: AuthServer, tmp_path: Path, user: str, experiment: str, s3: Any = None) -> str:
    """A tenant's trainer tracker, its target read from the environment its Secret gives its pods (`s3`: the
    client its artifacts go to when they are in S3)."""
    target = TrackingTarget.from_env(tenant_env(server, user) | {"MLFLOW_EXPERIMENT_NAME": experiment})
    assert target is not None and target.auth == (user, PASSWORDS[user]) and target.workspace == user
    cfg = load_config(TINY, [f"run_dir={tmp_path}"])
    # The target's own credentials, with the tests' request timeout: the pods' 5 s is short for a loaded CI machine.
    tracker = Tracker(target, cfg, client=target.client(timeout_s=30.0), flush_s=0.05, retry_s=0.5, s3=s3).start()
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
    research = client(server, "research")

    # The trainer logged with its credentials: the run, its parameters and metrics read back as the tenant.
    run = research.get_run(run_id)
    assert run["info"]["status"] == "FINISHED"
    assert {p["key"] for p in run["data"]["params"]} >= {"train.steps", "run_dir"}
    assert {m["key"] for m in run["data"]["metrics"]} >= {"loss", "step_seconds"}
    model = research.call("POST", "registered-models/create", {"name": "research.tiny"})
    assert model["registered_model"]["name"] == "research.tiny"

    # Another tenant reads, changes and deletes none of it, from its own workspace (where experiment names are its
    # own: research's is not there) or naming research's, where it is no member.
    experiment_id = run["info"]["experiment_id"]
    for workspace in ("vision", "research"):
        for what, call in foreign_calls(client(server, "vision", workspace=workspace), run_id, experiment_id).items():
            with pytest.raises(MlflowError) as refused:
                call()
            expected = 404 if workspace == "vision" and what == "get it by name" else 403
            assert refused.value.status == expected, (workspace, what, refused.value)
    # Searches leave out what it may not read.
    vision = client(server, "vision")
    experiments = vision.call("POST", "experiments/search", {"max_results": 100}).get("experiments", [])
    assert "research/tiny" not in {e["name"] for e in experiments}
    runs = vision.call("POST", "runs/search", {"experiment_ids": [experiment_id]}).get("runs", [])
    assert runs == []
    models = vision.call("GET", "registered-models/search", query={"max_results": "100"})
    assert "research.tiny" not in {m["name"] for m in models.get("registered_models", [])}
    # And the artifacts the server's proxy holds for the run (the `local` stack's).
    artifact = f"/api/2.0/mlflow-artifacts/artifacts/{_proxy_path(run)}/config.yaml"
    assert server.status("GET", artifact, ("research", PASSWORDS["research"]), workspace="research") == 200
    for workspace in ("vision", "research"):
        assert server.status("GET", artifact, ("vision", PASSWORDS["vision"]), workspace=workspace) == 403, workspace
    assert research.get_run(run_id)["info"]["lifecycle_stage"] == "active"


def foreign_calls(vision: MlflowClient, run_id: str, experiment_id: str) -> dict[str, Callable[[], object]]:
    """What `vision` might try on `research`'s run, experiment and model `research.tiny`."""
    return {
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
    }


def _proxy_path(run: dict[str, Any]) -> str:
    uri = run["info"]["artifact_uri"]
    assert uri.startswith("mlflow-artifacts:/"), uri  # no artifact root on `local`: the server's, by experiment id
    return str(uri.removeprefix("mlflow-artifacts:").lstrip("/"))


def test_making_the_users_again_changes_nothing_but_a_rotated_password(server: AuthServer, tmp_path: Path) -> None:
    again = make_users(server, PASSWORDS, tmp_path)
    assert again.returncode == 0, again.stderr
    assert sorted(again.stdout.split("\n")[:-1]) == ["research: updated, workspace research kept",
                                                       "vision: updated, workspace vision kept"]
    assert client(server, "vision").call("POST", "experiments/search", {"max_results": 1}) is not None
    # A member changes its tenant's password (it knows the current one: the Secret): the next run puts it back.
    changed = {"username": "vision", "password": "vision0changed0by0a0member00000000000004",
               "current_password": PASSWORDS["vision"]}
    client(server, "vision").call("PATCH", "users/update-password", changed)
    with pytest.raises(MlflowError) as locked_out:
        client(server, "vision").call("POST", "experiments/search", {"max_results": 1})
    assert locked_out.value.status == 401
    assert make_users(server, PASSWORDS, tmp_path).returncode == 0
    client(server, "vision").call("POST", "experiments/search", {"max_results": 1})
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


def test_another_tenant_can_neither_take_nor_share_a_tenants_names(server: AuthServer, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """review-ml-2 B1: `vision` makes the experiment and model `research`'s job will use (the names are predictable:
    `<namespace>/<job>`, `<namespace>.<job>`) and grants `research` EDIT on both; `research`'s trainer and register
    step must use neither."""
    vision = client(server, "vision")
    squatted = vision.experiment_id("research/squat", None)
    vision.ensure_registered_model("research.squat")
    for resource_type, resource_id in (("experiment", squatted), ("registered_model", "research.squat")):
        grant = {"username": "research", "resource_type": resource_type, "resource_id": resource_id,
                 "permission": "EDIT"}
        assert server.status("POST", "/api/3.0/mlflow/users/permissions/grant", ("vision", PASSWORDS["vision"]),
                             json.dumps(grant).encode(), workspace="vision") == 200
    # Nor can it make them in `research`'s workspace, or in the `default` one a client without a workspace uses.
    for workspace, name in (("research", "research/squat2"), ("default", "research/squat3")):
        with pytest.raises(MlflowError) as refused:
            client(server, "vision", workspace=workspace).experiment_id(name, None)
        assert refused.value.status == 403, (workspace, refused.value)

    run_id = tracked_run(server, tmp_path / "run", "research", "research/squat")
    research = client(server, "research")
    run = research.get_run(run_id)
    assert run["info"]["experiment_id"] != squatted
    assert vision.call("POST", "runs/search", {"experiment_ids": [squatted]}).get("runs", []) == []
    with pytest.raises(MlflowError) as unseen:
        vision.get_run(run_id)
    assert unseen.value.status in (403, 404), unseen.value

    # The pipeline's register step, as its pod runs it (the Secret's environment).
    checkpoint = tmp_path / "checkpoints" / "step-00000003"
    checkpoint.mkdir(parents=True)
    write_commit(checkpoint, {"step": 3})
    evaluation = tmp_path / "evaluation.json"
    evaluation.write_text(json.dumps({"passed": True, "metrics": {"accuracy": 0.9}, "thresholds": {},
                                      "checkpoint": {"step": 3, "path": str(checkpoint)}}))
    for key, value in tenant_env(server, "research").items():
        monkeypatch.setenv(key, value)
    args = ["--evaluation", str(evaluation), "--model-name", "research.squat", "--run-dir", str(tmp_path / "run")]
    assert register.main(args) == 0
    ours = research.call("GET", "registered-models/get", query={"name": "research.squat"})["registered_model"]
    assert [v["run_id"] for v in ours.get("latest_versions", [])] == [run_id]
    theirs = vision.call("GET", "registered-models/get", query={"name": "research.squat"})["registered_model"]
    assert theirs.get("latest_versions", []) == []

    # The grant made `research` a member of `vision`'s workspace: the users Job takes that back.
    again = make_users(server, PASSWORDS, tmp_path / "job")
    assert again.returncode == 0, again.stderr
    assert "research: updated, workspace research kept, left vision" in again.stdout.split("\n"), again.stdout


class Bucket:
    """The S3 client's one call the tracker makes (put_object), kept."""

    def __init__(self) -> None:
        self.keys: list[str] = []

    def put_object(self, Bucket: str, Key: str, Body: bytes) -> None:  # noqa: N803 - boto3's names
        self.keys.append(f"s3://{Bucket}/{Key}")


BUCKET = "trainyard-tests-checkpoints"


@pytest.fixture(scope="module")
def aws_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthServer]:
    """The AWS stacks' command line: no artifacts served, the default root a prefix no tenant writes."""
    with auth_server(tmp_path_factory.mktemp("mlflow-auth-aws"), artifact_bucket=BUCKET) as running:
        yield running


def test_on_aws_a_tenants_artifacts_are_in_its_own_prefix(aws_server: AuthServer, tmp_path: Path) -> None:
    """The workspace's root places them (MLflow refuses a client's artifact_location in a workspace)."""
    roots = {user: f"s3://{BUCKET}/{user}/{names.MLFLOW_ARTIFACT_DIR}" for user in PASSWORDS}  # namespace = tenant
    made = make_users(aws_server, PASSWORDS, tmp_path / "job", roots=roots)
    assert made.returncode == 0, made.stdout + made.stderr
    assert "research: created, workspace research created, member" in made.stdout.split("\n"), made.stdout
    bucket = Bucket()
    run_id = tracked_run(aws_server, tmp_path / "run", "research", "research/aws", s3=bucket)
    artifact_uri = client(aws_server, "research").get_run(run_id)["info"]["artifact_uri"]
    assert artifact_uri.startswith(roots["research"] + "/"), artifact_uri
    assert f"{artifact_uri}/config.yaml" in bucket.keys and all(k.startswith(roots["research"]) for k in bucket.keys)
    again = make_users(aws_server, PASSWORDS, tmp_path / "job", roots=roots)
    assert "research: updated, workspace research kept" in again.stdout.split("\n"), again.stdout + again.stderr


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
