"""A real MLflow Tracking Server with its basic-auth app and workspaces, as the platform runs it: `mlflow server`
3.17.2 from .venv-mlflow (requirements-mlflow.txt; `make test` installs it, or $MLFLOW names the binary) with the
command line platform/mlflow.py builds for `local` (or an AWS stack) and the auth config platform/mlflow_auth.py
writes, on SQLite files under a temporary folder instead of PostgreSQL."""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from trainer_launch import free_port
from trainyard.paths import REPO_ROOT
from trainyard.platform import mlflow_auth
from trainyard.platform.mlflow import FLASK_SECRET_KEY, server_args
from trainyard_train.mlflow_rest import WORKSPACE_HEADER

ADMIN_PASSWORD = "admin0password0for0tests0only0123456789"
STARTUP_S = 600.0  # uvicorn imports the whole of mlflow; on a loaded machine that took 4 minutes


def mlflow_binary() -> str:
    binary = os.environ.get("MLFLOW") or str(REPO_ROOT / ".venv-mlflow" / "bin" / "mlflow")
    if not Path(binary).exists():
        pytest.fail(f"{binary}: no mlflow server here; `make test` installs requirements-mlflow.lock in .venv-mlflow")
    return binary


def _option(args: list[str], flag: str, value: str) -> list[str]:
    changed = list(args)
    changed[changed.index(flag) + 1] = value
    return changed


@dataclass
class AuthServer:
    uri: str
    folder: Path
    log: Path

    def status(self, method: str, path: str, user: tuple[str, str] | None = None,
               body: bytes | None = None, workspace: str | None = None) -> int:
        """The HTTP status the server answers `path` with, as `user` (in `workspace`)."""
        request = urllib.request.Request(self.uri + path, data=body, method=method,
                                         headers={"Content-Type": "application/json"})
        if workspace is not None:
            request.add_header(WORKSPACE_HEADER, workspace)
        if user is not None:
            token = base64.b64encode(f"{user[0]}:{user[1]}".encode()).decode()
            request.add_header("Authorization", f"Basic {token}")
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)


@contextmanager
def auth_server(folder: Path, artifact_bucket: str | None = None) -> Iterator[AuthServer]:
    """`local`'s command line, or with `artifact_bucket` the AWS stacks' (the server writes no artifacts there)."""
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / mlflow_auth.CONFIG_KEY
    config.write_text(mlflow_auth.auth_config(f"sqlite:///{folder / 'auth.db'}"))
    port = free_port()
    args = _option(_option(server_args(artifact_bucket=artifact_bucket, workers=1), "--host", "127.0.0.1"),
                   "--port", str(port))
    if artifact_bucket is None:
        args = _option(args, "--artifacts-destination", str(folder / "artifacts"))
    env = {**os.environ, "MLFLOW_BACKEND_STORE_URI": f"sqlite:///{folder / 'mlflow.db'}",
           FLASK_SECRET_KEY: "flask0secret0for0tests", mlflow_auth.CONFIG_PATH_ENV: str(config),
           mlflow_auth.ADMIN_PASSWORD_ENV: ADMIN_PASSWORD, "MLFLOW_DISABLE_TELEMETRY": "true", "HOME": str(folder)}
    log = folder / "server.log"
    with log.open("wb") as out:
        process = subprocess.Popen([mlflow_binary(), *args], env=env, stdout=out, stderr=subprocess.STDOUT,
                                   cwd=folder, start_new_session=True)
    server = AuthServer(f"http://127.0.0.1:{port}", folder, log)
    try:
        deadline = time.monotonic() + STARTUP_S
        while not _healthy(server):
            if process.poll() is not None:
                raise AssertionError(f"mlflow server exited {process.returncode}:\n{log.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"mlflow server not up after {STARTUP_S} s:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        yield server
    finally:
        os.killpg(process.pid, signal.SIGTERM)  # the server and the uvicorn process it starts: its own session
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _healthy(server: AuthServer) -> bool:
    try:
        return server.status("GET", "/health") == 200
    except (urllib.error.URLError, OSError):
        return False
