"""Experiment tracking: rank 0 records the run in MLflow when ``MLFLOW_TRACKING_URI`` is set.

What a run records: the resolved config as parameters (dotted keys) and as ``config.yaml``; tags for the
dataset's manifest hash (``trainyard.data_sha256``, prepared data), the world size and layout of the latest start;
per-step metrics at the log interval (loss, samples/s, step seconds, gradient bytes sent); ``world_size`` and
``restarts`` as metrics at each start, so elastic resizes show on the run's charts; and each committed checkpoint
as a reference artifact ``checkpoints/step-NNNNNNNN.json`` (where it is on the claim, its export URI, its commit
marker), never the shards themselves: they stay where checkpoint.py and export.py put them.

One run per job across restarts and resizes: its id is kept in ``run_dir/mlflow-run.json`` on the claim, so
whichever pod is rank 0 next reopens it. The job's pods get the tracking URI and the namespace's MLflow user and
workspace from the ``mlflow-client`` Secret (every request carries both: mlflow_rest.py); experiments are created in
that workspace, whose root (on AWS the tenant's S3 prefix, which its pod identity may write: the server does not
write artifacts for tenants there) places their artifacts; on ``local`` the server's proxy does. Against a server
without workspaces, ``TRAINYARD_MLFLOW_ARTIFACT_ROOT`` sets ``artifact_location=<root>/<experiment>``.

Never in the way of training: the loop's events are queued (``record`` does no I/O) and a daemon thread sends
them. A request is one attempt with a short timeout (mlflow_rest.py); when the server is unreachable the tracker
warns once, keeps at most ``MAX_PENDING_METRICS`` points, and tries again every ``retry_s``. Closing sends what it
can within a deadline; a failure there is logged, never raised.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import yaml

from .checkpoint import CheckpointRef, complete_checkpoints, read_commit
from .config import Config
from .export import ExportTarget
from .logs import LOGGER_NAME, kv
from .mlflow_rest import Metric, MlflowClient, MlflowError, credentials, workspace

TRACKING_URI_ENV = "MLFLOW_TRACKING_URI"  # MLflow's own variable names
EXPERIMENT_ENV = "MLFLOW_EXPERIMENT_NAME"
ARTIFACT_ROOT_ENV = "TRAINYARD_MLFLOW_ARTIFACT_ROOT"  # a server without workspaces: where experiments put artifacts
DEFAULT_EXPERIMENT = "trainyard"
RUN_FILE = "mlflow-run.json"
MAX_PENDING_METRICS = 50_000
log = logging.getLogger(LOGGER_NAME)


def flatten(mapping: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """A nested config as MLflow parameters: dotted keys; strings as they are, other values as JSON."""
    flat: dict[str, str] = {}
    for key, value in mapping.items():
        if isinstance(value, dict) and value:
            flat |= flatten(value, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = value if isinstance(value, str) else json.dumps(value)
    return flat


@dataclass(frozen=True)
class TrackingTarget:
    uri: str
    experiment: str
    artifact_root: str | None
    # The namespace's MLflow user (MLFLOW_TRACKING_USERNAME/PASSWORD); None: a server without auth.
    auth: tuple[str, str] | None = None
    # The namespace's MLflow workspace (MLFLOW_WORKSPACE), where its experiments are; None: the server's default.
    workspace: str | None = None

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> TrackingTarget | None:
        env = dict(os.environ) if env is None else env
        uri = env.get(TRACKING_URI_ENV, "").strip()
        if not uri:
            return None
        root = env.get(ARTIFACT_ROOT_ENV, "").strip().rstrip("/") or None
        return cls(uri=uri, experiment=env.get(EXPERIMENT_ENV, "").strip() or DEFAULT_EXPERIMENT, artifact_root=root,
                   auth=credentials(env), workspace=workspace(env))

    def client(self, timeout_s: float = 5.0) -> MlflowClient:
        """A client for this server that sends the target's user and workspace with every request."""
        return MlflowClient(self.uri, timeout_s=timeout_s, auth=self.auth, workspace=self.workspace)

    @property
    def artifact_location(self) -> str | None:
        """Where a new experiment keeps its artifacts, on a server without workspaces; in a workspace its root
        decides (MLflow refuses a location there: mlflow/store/tracking/sqlalchemy_workspace_store.py
        create_experiment @ 3.17.2)."""
        return f"{self.artifact_root}/{self.experiment}" if self.artifact_root and not self.workspace else None


class Tracker:
    """Rank 0's tracker. ``record`` is a ProgressLog listener; ``close`` ends the run."""

    def __init__(self, target: TrackingTarget, cfg: Config, client: MlflowClient | None = None,
                 flush_s: float = 5.0, retry_s: float = 60.0, s3: Any = None) -> None:
        self.target = target
        self.cfg = cfg
        self.client = client if client is not None else target.client()
        self.flush_s = flush_s
        self.retry_s = retry_s
        self.s3 = s3
        self.export = ExportTarget.from_env()
        self.run_file = cfg.run_dir_path / RUN_FILE
        self.run_id: str | None = None
        self.artifact_uri = ""
        self._metrics: deque[tuple[int, Metric]] = deque(maxlen=MAX_PENDING_METRICS)
        self._seq = 0
        self._tags: dict[str, str] = {}
        self._status: str | None = None
        self._done: set[str] = set()
        """What is sent once per attempt: the parameters, config.yaml, each checkpoint's reference."""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._next_try = 0.0
        self._warned = False
        self._thread = threading.Thread(target=self._run, name="mlflow-tracker", daemon=True)

    def start(self) -> Tracker:
        self._thread.start()
        return self

    # -- the loop's side: no I/O ----------------------------------------------------------------------------------

    def record(self, event: dict[str, Any]) -> None:
        kind, step, now_ms = event.get("event"), int(event.get("step", 0)), int(event["time"] * 1000)
        metrics: list[Metric] = []
        tags: dict[str, str] = {}
        if kind == "start":
            tags = {"trainyard.world_size": str(event["world_size"]), "trainyard.layout": str(event["layout"])}
            if event.get("data_sha256"):  # prepared data only (prepare.py); generated data has no manifest hash
                tags["trainyard.data_sha256"] = event["data_sha256"]
            metrics = [Metric("world_size", float(event["world_size"]), step, now_ms),
                       Metric("restarts", float(event["restart_count"]), step, now_ms)]
        elif kind == "step":
            seconds = float(event["seconds"])
            metrics = [Metric("loss", float(event["loss"]), step, now_ms),
                       Metric("step_seconds", seconds, step, now_ms),
                       Metric("grad_bytes", float(event["grad_bytes"]), step, now_ms)]
            if seconds > 0:
                metrics.append(Metric("samples_per_second", self.cfg.train.global_batch_size / seconds, step, now_ms))
        elif kind in ("done", "stopped"):
            with self._lock:
                self._status = "FINISHED" if kind == "done" else "KILLED"
            return
        with self._lock:
            for metric in metrics:
                self._seq += 1
                self._metrics.append((self._seq, metric))  # past the bound, the oldest points go first
            self._tags |= tags

    def close(self, timeout_s: float = 10.0, failed: bool = False) -> None:
        """Send what is left and end the run (FAILED when the trainer raised), within ``timeout_s``."""
        if failed:
            with self._lock:
                self._status = self._status or "FAILED"
        self._stop.set()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.warning(kv("tracking_unfinished", seconds=timeout_s, pending_metrics=len(self._metrics)))

    # -- the thread's side ----------------------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            stopping = self._stop.wait(self.flush_s)
            # Stopping makes one last attempt even while backing off, also when the attempt in flight as close() was
            # called failed (and so set the next try after it).
            if stopping or time.monotonic() >= self._next_try:
                try:
                    self._flush(final=stopping)
                    if self._warned:
                        log.info(kv("tracking_reconnected", uri=self.target.uri, run_id=self.run_id))
                        self._warned = False
                except Exception as exc:  # noqa: BLE001 - the thread must outlive any failure; _sent() settles refusals
                    self._next_try = time.monotonic() + self.retry_s
                    if not self._warned:
                        event = "tracking_unavailable" if isinstance(exc, MlflowError) else "tracking_error"
                        log.warning(kv(event, uri=self.target.uri, error=type(exc).__name__, detail=exc,
                                       retry_s=self.retry_s,
                                       effect="training goes on; metrics are kept and sent when it is back"))
                        self._warned = True
            if stopping:
                return

    def _sent(self, what: str, send: Any) -> None:
        """Run ``send``; a refusal (the data itself is wrong: a 4xx) is logged and counts as done, since sending it
        again cannot help; an unreachable or failing server raises, to be tried again later."""
        try:
            send()
        except MlflowError as exc:
            if exc.retriable:
                raise
            log.warning(kv("tracking_refused", what=what, code=exc.code, detail=exc))

    def _once(self, what: str, send: Any) -> None:
        if what not in self._done:
            self._sent(what, send)
            self._done.add(what)

    def _flush(self, final: bool) -> None:
        if self.run_id is None:
            self._open_run()
        run_id = self.run_id
        assert run_id is not None
        self._once("params", lambda: self.client.log_batch(run_id, params=flatten(yaml.safe_load(self.cfg.to_yaml()))))
        self._once("config.yaml", lambda: self.client.upload_artifact(
            self.artifact_uri, "config.yaml", self.cfg.to_yaml().encode(), self.s3))
        with self._lock:
            pending, tags = list(self._metrics), dict(self._tags)
        if pending or tags:
            self._sent("metrics", lambda: self.client.log_batch(run_id, [m for _, m in pending], tags=tags))
            with self._lock:  # only what was sent: the loop may have queued more meanwhile
                while self._metrics and pending and self._metrics[0][0] <= pending[-1][0]:
                    self._metrics.popleft()
                for key, value in tags.items():
                    if self._tags.get(key) == value:
                        del self._tags[key]
        self._reference_checkpoints(run_id)
        with self._lock:
            status = self._status
        if final and status is not None:
            self.client.update_run(run_id, status, int(time.time() * 1000))

    def _recorded_run(self) -> str | None:
        """The run id an earlier attempt recorded; an unreadable file (a claim restored half-way) counts as none."""
        try:
            return str(json.loads(self.run_file.read_text())["run_id"])
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning(kv("tracking_run_file_unreadable", path=self.run_file, detail=exc,
                           effect="a new run is created"))
            return None

    def _open_run(self) -> None:
        """Reopen the job's run (a restart, a resize) or create it, with the config as its parameters."""
        run_id = self._recorded_run()
        if run_id is not None:
            try:
                run = self.client.get_run(run_id)
            except MlflowError as exc:
                if exc.retriable:
                    raise
                log.warning(kv("tracking_run_missing", run_id=run_id, detail=exc, effect="a new run is created"))
            else:
                self.client.update_run(run_id, "RUNNING")
                self.run_id, self.artifact_uri = run_id, run["info"]["artifact_uri"]
                self._done.add("params")  # parameters are immutable in MLflow: the first attempt's stay
                log.info(kv("tracking_resumed", run_id=run_id, experiment=self.target.experiment))
                return
        experiment_id = self.client.experiment_id(self.target.experiment, self.target.artifact_location)
        run = self.client.create_run(experiment_id, self.cfg.run_dir_path.name or "run", int(time.time() * 1000),
                                     {"trainyard.run_dir": str(self.cfg.run_dir_path)})
        run_id = run["info"]["run_id"]
        self.run_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.run_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"run_id": run_id, "experiment_id": experiment_id}))
        tmp.replace(self.run_file)  # a pod killed mid-write leaves the old file or none, never half of one
        self.run_id, self.artifact_uri = run_id, run["info"]["artifact_uri"]
        log.info(kv("tracking_started", run_id=run_id, experiment=self.target.experiment, uri=self.target.uri))

    def _reference_checkpoints(self, run_id: str) -> None:
        for ref in complete_checkpoints(self.cfg.checkpoint_dir):
            if f"checkpoint {ref.step}" in self._done:
                continue
            try:
                reference = checkpoint_reference(ref, self.export)
            except (OSError, ValueError):  # retention removed it since it was listed: nothing left to point at
                continue

            def send(name: str = reference_name(ref.step), reference: dict[str, Any] = reference) -> None:
                uri = self.client.upload_artifact(self.artifact_uri, name,
                                                  json.dumps(reference, indent=2, default=str).encode(), self.s3)
                self.client.log_batch(run_id, tags={"trainyard.checkpoint.latest": reference["export"] or uri})

            self._once(f"checkpoint {ref.step}", send)


def checkpoint_reference(ref: CheckpointRef, export: ExportTarget | None) -> dict[str, Any]:
    """A committed checkpoint as the run records it (``checkpoints/step-NNNNNNNN.json``): where it is on the claim,
    its exported copy, its commit marker (files, sizes, CRC-32s)."""
    return {
        "step": ref.step,
        "path": str(ref.path),
        "export": f"s3://{export.bucket}/{export.step_prefix(ref.step)}" if export else None,
        "commit": read_commit(ref.path),
    }


def reference_name(step: int) -> str:
    return f"checkpoints/step-{step:08d}.json"


def start_tracker(cfg: Config, is_main: bool) -> Tracker | None:
    """Rank 0's tracker when the pod has a tracking URI; None otherwise (tracking is optional)."""
    target = TrackingTarget.from_env()
    if target is None or not is_main:
        return None
    try:
        return Tracker(target, cfg).start()
    except ValueError as exc:  # a malformed URI: say so, train anyway
        log.warning(kv("tracking_disabled", key=TRACKING_URI_ENV, detail=exc))
        return None

