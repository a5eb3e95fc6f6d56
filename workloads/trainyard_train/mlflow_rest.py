"""The few MLflow Tracking Server REST calls the trainer and the pipeline steps make, on the standard library.

Why not the ``mlflow`` client: the full package pulls a data-science stack into the training image (pandas, pyarrow,
scipy, scikit-learn, matplotlib), and its HTTP layer retries each call with backoff for minutes
(MLFLOW_HTTP_REQUEST_MAX_RETRIES), which must never hold a training step. Here one request is one attempt with a
short timeout; callers decide when to try again.

Endpoints and limits: MLflow REST API 2.0 (https://mlflow.org/docs/latest/api_reference/rest-api.html): experiments
get-by-name/create, runs create/get/update/log-batch, registered-models create, model-versions create/search,
and the artifact proxy ``PUT /api/2.0/mlflow-artifacts/artifacts/<path>`` the server runs with --serve-artifacts
(mlflow/store/artifact/mlflow_artifacts_repo.py resolves ``mlflow-artifacts:/<path>`` against the tracking URI).
Every request carries HTTP basic auth when MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD are set (MLflow's
own client variables: mlflow/environment_variables.py @ 3.17.2), which the server's basic-auth app checks, and the
workspace MLFLOW_WORKSPACE names as the X-MLFLOW-WORKSPACE header, as MLflow's client sends it
(mlflow/utils/rest_utils.py): the server keeps names, runs and artifacts apart per workspace.
"""

from __future__ import annotations

import base64
import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

# LogBatch request limits (mlflow/utils/validation.py MAX_METRICS_PER_BATCH, MAX_PARAMS_TAGS_PER_BATCH,
# MAX_ENTITIES_PER_BATCH); param values up to 6000 characters (MAX_PARAM_VAL_LENGTH), tag values up to 8000.
MAX_METRICS_PER_BATCH = 1000
MAX_PARAMS_PER_BATCH = 100
MAX_TAGS_PER_BATCH = 100
MAX_ENTITIES_PER_BATCH = 1000
MAX_PARAM_VALUE = 6000
MAX_TAG_VALUE = 8000
_ARTIFACT_URI = re.compile(r"mlflow-artifacts:(?://[^/]+)?/(.*)")
_S3_URI = re.compile(r"s3://([^/]+)/(.*)")
USERNAME_ENV = "MLFLOW_TRACKING_USERNAME"
PASSWORD_ENV = "MLFLOW_TRACKING_PASSWORD"
WORKSPACE_ENV = "MLFLOW_WORKSPACE"
WORKSPACE_HEADER = "X-MLFLOW-WORKSPACE"  # mlflow/utils/workspace_utils.py WORKSPACE_HEADER_NAME @ 3.17.2


def credentials(env: dict[str, str] | None = None) -> tuple[str, str] | None:
    """The basic-auth user and password from the environment; None unless both are set."""
    env = dict(os.environ) if env is None else env
    username, password = env.get(USERNAME_ENV, ""), env.get(PASSWORD_ENV, "")
    return (username, password) if username and password else None


def workspace(env: dict[str, str] | None = None) -> str | None:
    """The MLflow workspace from the environment; None: the server's default (or a server without workspaces)."""
    env = dict(os.environ) if env is None else env
    return env.get(WORKSPACE_ENV, "").strip() or None


class MlflowError(Exception):
    """A request the server answered with an error (``code`` is MLflow's error_code), or did not answer."""

    def __init__(self, message: str, code: str = "", status: int = 0) -> None:
        super().__init__(message)
        self.code = code
        self.status = status

    @property
    def retriable(self) -> bool:
        """Unreachable, timed out, or a server-side failure: the same request may succeed later."""
        return self.status == 0 or self.status >= 500 or self.status == 429


@dataclass(frozen=True)
class Metric:
    key: str
    value: float
    step: int
    timestamp_ms: int

    def as_json(self) -> dict[str, Any]:
        return {"key": self.key, "value": self.value, "step": self.step, "timestamp": self.timestamp_ms}


def _pairs(values: dict[str, str], limit: int) -> list[dict[str, str]]:
    return [{"key": k, "value": v[:limit]} for k, v in values.items()]


def batches(metrics: Sequence[Metric], params: dict[str, str], tags: dict[str, str]) -> Iterator[dict[str, Any]]:
    """LogBatch bodies within the server's limits, in order (params first: they fail fast on a conflict)."""
    param_list = _pairs(params, MAX_PARAM_VALUE)
    tag_list = _pairs(tags, MAX_TAG_VALUE)
    metric_list = [m.as_json() for m in metrics]
    while param_list or tag_list or metric_list:
        body: dict[str, Any] = {"params": param_list[:MAX_PARAMS_PER_BATCH], "tags": tag_list[:MAX_TAGS_PER_BATCH]}
        param_list, tag_list = param_list[MAX_PARAMS_PER_BATCH:], tag_list[MAX_TAGS_PER_BATCH:]
        room = min(MAX_METRICS_PER_BATCH, MAX_ENTITIES_PER_BATCH - len(body["params"]) - len(body["tags"]))
        body["metrics"], metric_list = metric_list[:room], metric_list[room:]
        yield body


class MlflowClient:
    def __init__(self, tracking_uri: str, timeout_s: float = 5.0, auth: tuple[str, str] | None = None,
                 workspace: str | None = None) -> None:
        parsed = urllib.parse.urlsplit(tracking_uri)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"expected an http(s):// tracking server URI, got {tracking_uri!r}")
        self.base = tracking_uri.rstrip("/")
        self.timeout_s = timeout_s
        self.headers: dict[str, str] = {}
        if auth is not None:
            token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
            self.headers["Authorization"] = f"Basic {token}"
        if workspace is not None:
            self.headers[WORKSPACE_HEADER] = workspace

    def _send(self, method: str, path: str, data: bytes | None, content_type: str) -> bytes:
        request = urllib.request.Request(self.base + path, data=data, method=method,
                                         headers={**self.headers, "Content-Type": content_type})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:  # noqa: S310 - http(s) only
                body: bytes = response.read()
                return body
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                error = json.loads(raw)
                raise MlflowError(error.get("message", raw.decode()), error.get("error_code", ""), exc.code) from None
            except ValueError:
                raise MlflowError(f"{method} {path}: HTTP {exc.code} {raw[:200]!r}", status=exc.code) from None
        except (urllib.error.URLError, OSError) as exc:  # refused, unresolvable, timed out, reset
            raise MlflowError(f"{method} {path}: {exc}") from None

    def call(self, method: str, endpoint: str, body: dict[str, Any] | None = None,
             query: dict[str, str] | None = None) -> dict[str, Any]:
        path = f"/api/2.0/mlflow/{endpoint}"
        if query:
            path += "?" + urllib.parse.urlencode(query)
        data = json.dumps(body).encode() if body is not None else None
        raw = self._send(method, path, data, "application/json")
        answer: dict[str, Any] = json.loads(raw) if raw.strip() else {}
        return answer

    # -- tracking -------------------------------------------------------------------------------------------------

    def experiment_id(self, name: str, artifact_location: str | None) -> str:
        """The experiment's id, created (with its artifact location) if it does not exist yet."""
        try:
            found = self.call("GET", "experiments/get-by-name", query={"experiment_name": name})
            return str(found["experiment"]["experiment_id"])
        except MlflowError as exc:
            if exc.code != "RESOURCE_DOES_NOT_EXIST":
                raise
        body: dict[str, Any] = {"name": name}
        if artifact_location:
            body["artifact_location"] = artifact_location
        try:
            return str(self.call("POST", "experiments/create", body)["experiment_id"])
        except MlflowError as exc:
            if exc.code != "RESOURCE_ALREADY_EXISTS":  # another rank-0 (a concurrent job) created it first
                raise
            found = self.call("GET", "experiments/get-by-name", query={"experiment_name": name})
            return str(found["experiment"]["experiment_id"])

    def create_run(self, experiment_id: str, run_name: str, start_ms: int, tags: dict[str, str]) -> dict[str, Any]:
        run: dict[str, Any] = self.call("POST", "runs/create", {
            "experiment_id": experiment_id, "run_name": run_name, "start_time": start_ms,
            "tags": _pairs(tags, MAX_TAG_VALUE)})["run"]
        return run

    def get_run(self, run_id: str) -> dict[str, Any]:
        run: dict[str, Any] = self.call("GET", "runs/get", query={"run_id": run_id})["run"]
        return run

    def update_run(self, run_id: str, status: str, end_ms: int | None = None) -> None:
        body: dict[str, Any] = {"run_id": run_id, "status": status}
        if end_ms is not None:
            body["end_time"] = end_ms
        self.call("POST", "runs/update", body)

    def log_batch(self, run_id: str, metrics: Sequence[Metric] = (), params: dict[str, str] | None = None,
                  tags: dict[str, str] | None = None) -> None:
        for body in batches(metrics, params or {}, tags or {}):
            self.call("POST", "runs/log-batch", {"run_id": run_id, **body})

    # -- artifacts ------------------------------------------------------------------------------------------------

    def upload_artifact(self, artifact_uri: str, relative_path: str, data: bytes, s3: Any = None) -> str:
        """Write one file under a run's artifact URI: through the server's proxy for ``mlflow-artifacts:``, or
        straight to the bucket with this pod's own credentials for ``s3://`` (``s3``: a boto3 client)."""
        target = f"{artifact_uri.rstrip('/')}/{relative_path}"
        if match := _ARTIFACT_URI.fullmatch(artifact_uri.rstrip("/")):
            path = "/api/2.0/mlflow-artifacts/artifacts/" + urllib.parse.quote(f"{match.group(1)}/{relative_path}")
            self._send("PUT", path, data, "application/octet-stream")
        elif match := _S3_URI.fullmatch(artifact_uri.rstrip("/")):
            if s3 is None:
                import boto3  # only runs whose artifacts live in S3 pay for the import

                s3 = boto3.client("s3")
            try:
                s3.put_object(Bucket=match.group(1), Key=f"{match.group(2)}/{relative_path}", Body=data)
            except Exception as exc:  # noqa: BLE001 - botocore's errors share no base with OSError
                raise MlflowError(f"{target}: {exc}") from None
        else:
            raise MlflowError(f"artifact URI {artifact_uri!r}: only mlflow-artifacts:/ and s3:// are written here",
                              code="INVALID_PARAMETER_VALUE", status=400)
        return target

    def artifact_exists(self, artifact_uri: str, relative_path: str, s3: Any = None) -> bool:
        if match := _ARTIFACT_URI.fullmatch(artifact_uri.rstrip("/")):
            path = "/api/2.0/mlflow-artifacts/artifacts/" + urllib.parse.quote(f"{match.group(1)}/{relative_path}")
            try:
                self._send("GET", path, None, "application/octet-stream")
            except MlflowError as exc:
                if exc.status == 404:
                    return False
                raise
            return True
        if match := _S3_URI.fullmatch(artifact_uri.rstrip("/")):
            if s3 is None:
                import boto3

                s3 = boto3.client("s3")
            try:
                s3.head_object(Bucket=match.group(1), Key=f"{match.group(2)}/{relative_path}")
            except Exception as exc:  # noqa: BLE001 - botocore's ClientError carries the status
                if getattr(exc, "response", {}).get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                    return False
                raise MlflowError(f"{artifact_uri}/{relative_path}: {exc}") from None
            return True
        raise MlflowError(f"artifact URI {artifact_uri!r}: only mlflow-artifacts:/ and s3:// are read here",
                          code="INVALID_PARAMETER_VALUE", status=400)

    # -- model registry -------------------------------------------------------------------------------------------

    def ensure_registered_model(self, name: str, description: str = "") -> None:
        try:
            self.call("POST", "registered-models/create", {"name": name, "description": description})
        except MlflowError as exc:
            if exc.code != "RESOURCE_ALREADY_EXISTS":
                raise

    def model_versions_of_run(self, run_id: str) -> list[dict[str, Any]]:
        found = self.call("GET", "model-versions/search", query={"filter": f"run_id='{run_id}'"})
        versions: list[dict[str, Any]] = found.get("model_versions", [])
        return versions

    def create_model_version(self, name: str, source: str, run_id: str, tags: dict[str, str],
                             description: str = "") -> dict[str, Any]:
        version: dict[str, Any] = self.call("POST", "model-versions/create", {
            "name": name, "source": source, "run_id": run_id, "description": description,
            "tags": _pairs(tags, MAX_TAG_VALUE)})["model_version"]
        return version
