"""Committed checkpoints copied out of the cluster, and a run restored from that copy when its claim is empty.

The job sets ``TRAINYARD_CHECKPOINT_EXPORT=s3://<checkpointBucket>/<namespace>/<job>/`` (infra/trainyard/workloads/
pod.py); credentials come from the default AWS chain (EKS Pod Identity in the cluster). Under that prefix the
layout mirrors run_dir: ``checkpoints/step-00000500/{.metadata, __0_0.distcp, ..., COMMIT}``.

- Upload. On global rank 0 a thread watches run_dir's checkpoints and uploads each newly committed step: every
  file, then ``COMMIT`` last. A copy is committed exactly when its ``COMMIT`` object exists and every file it lists
  is there with the recorded size, the same rule as on the claim (checkpoint.torn_reason); an upload cut short
  (a killed pod, a network failure) leaves no ``COMMIT`` or a short file, and is never taken for a checkpoint.
  The newest ``checkpoint.keep_last`` committed copies are kept; older ones lose their ``COMMIT`` first, so a
  half-deleted step is never committed either. Uploads run beside training, never in the step.
- Restore. When run_dir holds no complete checkpoint (a new claim, a lost Ceph), rank 0 downloads the newest
  committed copy before the trainer looks (files first, ``COMMIT`` last), and the run resumes from it; the CRC-32s
  in ``COMMIT`` are checked on load as for any checkpoint.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .checkpoint import COMMIT, CheckpointRef, complete_checkpoints, list_step_dirs, step_dir
from .config import ConfigError
from .logs import LOGGER_NAME, kv

EXPORT_ENV = "TRAINYARD_CHECKPOINT_EXPORT"
_URI = re.compile(r"s3://([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])/((?:[^/]+/)*)")
_STEP_KEY = re.compile(r"step-(\d{8})")
POLL_SECONDS = 2.0
log = logging.getLogger(LOGGER_NAME)


@dataclass(frozen=True)
class ExportTarget:
    bucket: str
    prefix: str
    """Ends in '/' (or is empty: the bucket's root)."""

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> ExportTarget | None:
        raw = (os.environ if env is None else env).get(EXPORT_ENV)
        if not raw:
            return None
        match = _URI.fullmatch(raw if raw.endswith("/") else raw + "/")
        if match is None:
            raise ConfigError(f"{EXPORT_ENV}: expected s3://<bucket>/<prefix>/, got {raw!r}")
        return cls(bucket=match.group(1), prefix=match.group(2))

    def step_prefix(self, step: int) -> str:
        return f"{self.prefix}checkpoints/step-{step:08d}/"


def _client() -> Any:
    import boto3  # only runs that export pay for the import

    return boto3.client("s3")  # region, endpoint (AWS_ENDPOINT_URL_S3) and credentials from the default chain


class CheckpointExport:
    def __init__(self, target: ExportTarget, keep_last: int, client: Any | None = None) -> None:
        self.target = target
        self.keep_last = keep_last
        self.s3 = client if client is not None else _client()

    # -- what is in the bucket ------------------------------------------------------------------------------

    def _objects(self) -> dict[str, int]:
        sizes: dict[str, int] = {}
        pages = self.s3.get_paginator("list_objects_v2").paginate(
            Bucket=self.target.bucket, Prefix=f"{self.target.prefix}checkpoints/")
        for page in pages:
            for obj in page.get("Contents", []):
                sizes[obj["Key"]] = int(obj["Size"])
        return sizes

    def committed_steps(self) -> list[int]:
        """Steps whose copy is complete, oldest first."""
        objects = self._objects()
        steps = set()
        for key in objects:
            rest = key[len(self.target.prefix) + len("checkpoints/"):]
            match = _STEP_KEY.fullmatch(rest.split("/", 1)[0])
            if match and rest.endswith(f"/{COMMIT}"):
                steps.add(int(match.group(1)))
        return sorted(s for s in steps if self._torn_reason(s, objects) is None)

    def _torn_reason(self, step: int, objects: dict[str, int]) -> str | None:
        prefix = self.target.step_prefix(step)
        try:
            body = self.s3.get_object(Bucket=self.target.bucket, Key=prefix + COMMIT)["Body"].read()
            files: dict[str, int] = json.loads(body)["files"]
        except (ValueError, KeyError, TypeError) as exc:
            return f"commit marker unreadable: {exc}"
        for name, size in files.items():
            if objects.get(prefix + name) != size:
                return f"{name} is {objects.get(prefix + name)} bytes in the bucket, commit recorded {size}"
        return None

    # -- upload -----------------------------------------------------------------------------------------------

    def upload(self, ref: CheckpointRef) -> None:
        prefix = self.target.step_prefix(ref.step)
        files = sorted(p for p in ref.path.rglob("*") if p.is_file() and p.name != COMMIT)
        for path in files:
            self.s3.upload_file(str(path), self.target.bucket, prefix + str(path.relative_to(ref.path)))
        self.s3.upload_file(str(ref.path / COMMIT), self.target.bucket, prefix + COMMIT)
        log.info(kv("checkpoint_exported", step=ref.step, bucket=self.target.bucket, prefix=prefix))
        self._retain()

    def _retain(self) -> None:
        steps = self.committed_steps()
        objects = self._objects()
        for step in steps[: -self.keep_last]:
            prefix = self.target.step_prefix(step)
            self.s3.delete_object(Bucket=self.target.bucket, Key=prefix + COMMIT)  # uncommitted from here on
            for key in sorted(k for k in objects if k.startswith(prefix) and not k.endswith(COMMIT)):
                self.s3.delete_object(Bucket=self.target.bucket, Key=key)

    # -- restore ----------------------------------------------------------------------------------------------

    def restore_if_empty(self, root: Path) -> CheckpointRef | None:
        """Download the newest committed copy when ``root`` has no complete checkpoint; returns what it wrote."""
        if complete_checkpoints(root):
            return None
        steps = self.committed_steps()
        if not steps:
            return None
        step = steps[-1]
        prefix = self.target.step_prefix(step)
        path = step_dir(root, step)
        path.mkdir(parents=True, exist_ok=True)
        keys = sorted(k for k in self._objects() if k.startswith(prefix))
        for key in [k for k in keys if not k.endswith(f"/{COMMIT}")] + [prefix + COMMIT]:
            target = path / key[len(prefix):]
            target.parent.mkdir(parents=True, exist_ok=True)
            self.s3.download_file(self.target.bucket, key, str(target))
        log.warning(kv("checkpoint_restored_from_export", step=step, bucket=self.target.bucket, prefix=prefix))
        return CheckpointRef(step, path)


class ExportWatcher:
    """Rank 0's thread: uploads every step committed under ``root``, in order, until closed."""

    def __init__(self, export: CheckpointExport, root: Path, poll_s: float = POLL_SECONDS,
                 on_error: Callable[[BaseException], None] | None = None) -> None:
        self.export = export
        self.root = root
        self.poll_s = poll_s
        self.on_error = on_error
        self._done: set[int] = set(export.committed_steps())
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ckpt-export", daemon=True)

    def start(self) -> ExportWatcher:
        self._thread.start()
        return self

    def _pass(self) -> None:
        existing = {ref.step for ref in list_step_dirs(self.root)}
        for ref in complete_checkpoints(self.root):
            if ref.step not in self._done and ref.step in existing:
                self.export.upload(ref)
                self._done.add(ref.step)

    def _run(self) -> None:
        while True:
            stopping = self._stop.wait(self.poll_s)
            try:
                self._pass()
            except Exception as exc:  # noqa: BLE001 - the copy is a second one: training goes on, we say so
                log.error(kv("checkpoint_export_failed", error=type(exc).__name__, detail=exc))
                if self.on_error is not None:
                    self.on_error(exc)
            if stopping:
                return

    def close(self, timeout_s: float) -> bool:
        """One last pass for what was committed since, then stop; False if it did not finish in time."""
        self._stop.set()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.error(kv("checkpoint_export_unfinished", seconds=timeout_s))
            return False
        return True
