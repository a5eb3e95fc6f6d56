"""A local stand-in for an MLflow Tracking Server: exactly the REST calls trainyard_train.mlflow_rest makes, with the
server's answers and refusals for them (MLflow REST API 2.0; error codes and LogBatch limits as
mlflow/utils/validation.py and mlflow/store/tracking/sqlalchemy_store.py give them).

Why not the real ``mlflow server``: the ``mlflow`` wheel 3.17.2 brings ~50 packages (pandas, pyarrow, scipy,
scikit-learn, matplotlib, SQLAlchemy, alembic, gunicorn, ...) into the dev environment for a few tests; this file
keeps the semantics those tests rely on: run state, immutable parameters, metric histories, the model registry and
the artifact proxy.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

API = "/api/2.0/mlflow/"
ARTIFACTS = "/api/2.0/mlflow-artifacts/artifacts/"


class RefusedError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code = status, code


def _missing(what: str) -> RefusedError:
    return RefusedError(404, "RESOURCE_DOES_NOT_EXIST", f"{what} not found")


@dataclass
class State:
    experiments: dict[str, dict[str, Any]] = field(default_factory=dict)
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)
    models: dict[str, dict[str, Any]] = field(default_factory=dict)
    artifacts: dict[str, bytes] = field(default_factory=dict)
    requests: list[str] = field(default_factory=list)
    received: list[float] = field(default_factory=list)
    """When each request came (time.monotonic()), as `requests` lists them."""
    refused: list[int] = field(default_factory=list)
    """The indices in `requests` of those answered with `fail_with`."""
    fail_with: int = 0
    """While non-zero, every request is answered with this HTTP status (a server in trouble)."""

    def run(self, run_id: str) -> dict[str, Any]:
        if run_id not in self.runs:
            raise _missing(f"Run '{run_id}'")
        return self.runs[run_id]

    def metric_history(self, run_id: str, key: str) -> list[dict[str, Any]]:
        return [m for m in self.run(run_id)["metrics"] if m["key"] == key]

    def run_json(self, run_id: str) -> dict[str, Any]:
        run = self.run(run_id)
        latest: dict[str, dict[str, Any]] = {}
        for metric in run["metrics"]:
            latest[metric["key"]] = metric
        return {"info": run["info"], "data": {
            "metrics": list(latest.values()),
            "params": [{"key": k, "value": v} for k, v in run["params"].items()],
            "tags": [{"key": k, "value": v} for k, v in run["tags"].items()]}}

    # -- endpoints --------------------------------------------------------------------------------------------

    def handle(self, method: str, endpoint: str, query: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
        route = getattr(self, f"{method.lower()}_{endpoint.replace('/', '_').replace('-', '_')}", None)
        if route is None:
            raise RefusedError(404, "ENDPOINT_NOT_FOUND", f"{method} {endpoint}")
        answer: dict[str, Any] = route(query if method == "GET" else body)
        return answer

    def get_experiments_get_by_name(self, q: dict[str, str]) -> dict[str, Any]:
        for experiment in self.experiments.values():
            if experiment["name"] == q["experiment_name"]:
                return {"experiment": experiment}
        raise _missing(f"Experiment '{q['experiment_name']}'")

    def post_experiments_create(self, b: dict[str, Any]) -> dict[str, Any]:
        if any(e["name"] == b["name"] for e in self.experiments.values()):
            raise RefusedError(400, "RESOURCE_ALREADY_EXISTS", f"Experiment '{b['name']}' already exists.")
        experiment_id = str(len(self.experiments) + 1)
        self.experiments[experiment_id] = {"experiment_id": experiment_id, "name": b["name"],
                                           "artifact_location": b.get("artifact_location")
                                           or f"mlflow-artifacts:/{experiment_id}"}
        return {"experiment_id": experiment_id}

    def post_runs_create(self, b: dict[str, Any]) -> dict[str, Any]:
        experiment = self.experiments.get(str(b["experiment_id"]))
        if experiment is None:
            raise _missing(f"Experiment '{b['experiment_id']}'")
        run_id = uuid.uuid4().hex
        info = {"run_id": run_id, "experiment_id": experiment["experiment_id"], "run_name": b.get("run_name", ""),
                "status": "RUNNING", "start_time": b.get("start_time"),
                "artifact_uri": f"{experiment['artifact_location']}/{run_id}/artifacts"}
        self.runs[run_id] = {"info": info, "params": {}, "tags": {t["key"]: t["value"] for t in b.get("tags", [])},
                             "metrics": []}
        return {"run": self.run_json(run_id)}

    def get_runs_get(self, q: dict[str, str]) -> dict[str, Any]:
        return {"run": self.run_json(q["run_id"])}

    def post_runs_update(self, b: dict[str, Any]) -> dict[str, Any]:
        info = self.run(b["run_id"])["info"]
        if b["status"] not in ("RUNNING", "SCHEDULED", "FINISHED", "FAILED", "KILLED"):
            raise RefusedError(400, "INVALID_PARAMETER_VALUE", f"status {b['status']}")
        info["status"] = b["status"]
        if "end_time" in b:
            info["end_time"] = b["end_time"]
        return {"run_info": info}

    def post_runs_log_batch(self, b: dict[str, Any]) -> dict[str, Any]:
        run = self.run(b["run_id"])
        metrics, params, tags = b.get("metrics", []), b.get("params", []), b.get("tags", [])
        for items, limit, kind in ((metrics, 1000, "metrics"), (params, 100, "params"), (tags, 100, "tags")):
            if len(items) > limit:
                raise RefusedError(400, "INVALID_PARAMETER_VALUE",
                              f"A batch logging request can contain at most {limit} {kind}. Got {len(items)}.")
        if len(metrics) + len(params) + len(tags) > 1000:
            raise RefusedError(400, "INVALID_PARAMETER_VALUE", "at most 1000 metrics, params and tags in total")
        for param in params:
            old = run["params"].get(param["key"])
            if len(param["value"]) > 6000:
                raise RefusedError(400, "INVALID_PARAMETER_VALUE", f"Param value for {param['key']} is over 6000")
            if old is not None and old != param["value"]:
                raise RefusedError(400, "INVALID_PARAMETER_VALUE",
                              f"Changing param values is not allowed. Param with key='{param['key']}' was "
                              f"already logged with value='{old}' for run ID='{b['run_id']}'.")
        for metric in metrics:
            if not {"key", "value", "timestamp", "step"} <= metric.keys():
                raise RefusedError(400, "INVALID_PARAMETER_VALUE", f"metric {metric}")
        run["params"] |= {p["key"]: p["value"] for p in params}
        run["tags"] |= {t["key"]: t["value"] for t in tags}
        run["metrics"].extend(metrics)
        return {}

    def post_registered_models_create(self, b: dict[str, Any]) -> dict[str, Any]:
        if b["name"] in self.models:
            raise RefusedError(400, "RESOURCE_ALREADY_EXISTS", f"Registered Model (name={b['name']}) already exists.")
        self.models[b["name"]] = {"name": b["name"], "description": b.get("description", ""), "versions": []}
        return {"registered_model": {"name": b["name"]}}

    def get_model_versions_search(self, q: dict[str, str]) -> dict[str, Any]:
        key, _, value = q["filter"].partition("=")
        if key.strip() != "run_id" or not (value.startswith("'") and value.endswith("'")):
            raise RefusedError(400, "INVALID_PARAMETER_VALUE", f"unsupported filter {q['filter']!r}")
        run_id = value[1:-1]
        return {"model_versions": [v for m in self.models.values() for v in m["versions"] if v["run_id"] == run_id]}

    def post_model_versions_create(self, b: dict[str, Any]) -> dict[str, Any]:
        if b["name"] not in self.models:
            raise _missing(f"Registered Model with name={b['name']}")
        self.run(b["run_id"])
        versions = self.models[b["name"]]["versions"]
        version = {"name": b["name"], "version": str(len(versions) + 1), "source": b["source"],
                   "run_id": b["run_id"], "description": b.get("description", ""), "status": "READY",
                   "tags": b.get("tags", [])}
        versions.append(version)
        return {"model_version": version}


class _Handler(BaseHTTPRequestHandler):
    state: State

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def _answer(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _serve(self, method: str) -> None:
        url = urllib.parse.urlsplit(self.path)
        self.state.requests.append(f"{method} {url.path}")
        self.state.received.append(time.monotonic())
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if self.state.fail_with:
            self.state.refused.append(len(self.state.requests) - 1)
            self._answer(self.state.fail_with, b'{"error_code": "INTERNAL_ERROR", "message": "unavailable"}')
            return
        try:
            if url.path.startswith(ARTIFACTS):
                path = urllib.parse.unquote(url.path[len(ARTIFACTS):])
                if method == "PUT":
                    self.state.artifacts[path] = raw
                    self._answer(200, b"{}")
                elif path in self.state.artifacts:
                    self._answer(200, self.state.artifacts[path], "application/octet-stream")
                else:
                    raise _missing(f"artifact {path}")
                return
            if not url.path.startswith(API):
                raise RefusedError(404, "ENDPOINT_NOT_FOUND", url.path)
            query = dict(urllib.parse.parse_qsl(url.query))
            body = json.loads(raw) if raw else {}
            answer = self.state.handle(method, url.path[len(API):], query, body)
            self._answer(200, json.dumps(answer).encode())
        except RefusedError as exc:
            self._answer(exc.status, json.dumps({"error_code": exc.code, "message": str(exc)}).encode())

    def do_GET(self) -> None:  # noqa: N802 - http.server's names
        self._serve("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._serve("POST")

    def do_PUT(self) -> None:  # noqa: N802
        self._serve("PUT")


@dataclass
class Server:
    uri: str
    state: State


@contextmanager
def mlflow_server() -> Iterator[Server]:
    state = State()
    handler = type("Handler", (_Handler,), {"state": state})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield Server(f"http://127.0.0.1:{httpd.server_address[1]}", state)
    finally:
        httpd.shutdown()
        httpd.server_close()


def wait_until(predicate: Any, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.05)
