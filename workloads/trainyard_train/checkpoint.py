"""Distributed checkpoints with torch.distributed.checkpoint (DCP) and an explicit commit marker.

Layout under ``<run_dir>/checkpoints``::

    step-00000050/  .metadata  __0_0.distcp  __1_0.distcp  COMMIT
    step-00000100/  ...                                        (no COMMIT: torn, ignored)

A checkpoint counts only once ``COMMIT`` exists. Rank 0 writes it, atomically (tmp file + rename),
after DCP's save returned on rank 0: DCP's coordinator gathers every rank's write result before it
writes ``.metadata`` and returns, so that return is the "all ranks finished" barrier. ``COMMIT`` records
every file's size (a truncated file is caught by a stat) and its CRC-32 (flipped bytes are caught before
loading: rank 0 re-reads the files and tells the other ranks). A checkpoint that fails either check, or
whose load still fails, is skipped with one warning line and the next older complete one is used.

CRC-32 (zlib) because it is the fastest checksum in the standard library and releases the GIL on large
buffers; it detects corruption, not tampering (bench/checkpoint.py prints its cost beside BLAKE2b's).
With ``async_save`` rank 0 checksums and commits on a background thread once the write finished, so the
training loop never waits for the re-read.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from .config import ConfigError
from .logs import LOGGER_NAME, kv

COMMIT = "COMMIT"
_CHUNK = 8 << 20  # bytes per read when checksumming
_STEP_DIR = re.compile(r"step-([0-9]{8})")
log = logging.getLogger(LOGGER_NAME)


@dataclass(frozen=True, order=True)
class CheckpointRef:
    step: int
    path: Path


def step_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:08d}"


def list_step_dirs(root: Path) -> list[CheckpointRef]:
    if not root.is_dir():
        return []
    refs = []
    for child in root.iterdir():
        match = _STEP_DIR.fullmatch(child.name)
        if match and child.is_dir():
            refs.append(CheckpointRef(int(match.group(1)), child))
    return sorted(refs)


def read_commit(path: Path) -> dict[str, Any]:
    meta: dict[str, Any] = json.loads((path / COMMIT).read_text())
    return meta


def torn_reason(path: Path) -> str | None:
    """Why a checkpoint directory is not usable, or None when it is complete."""
    try:
        meta = read_commit(path)
    except FileNotFoundError:
        return "commit marker missing"
    except (OSError, ValueError) as exc:
        return f"commit marker unreadable: {exc}"
    for name, size in meta.get("files", {}).items():
        file = path / name
        if not file.is_file():
            return f"{name} missing"
        if file.stat().st_size != size:
            return f"{name} is {file.stat().st_size} bytes, commit recorded {size}"
    return None


def file_crc32(path: Path) -> str:
    crc = 0
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return f"{crc:08x}"


def corrupt_reason(path: Path) -> str | None:
    """Which file no longer matches its recorded checksum, or None. Reads every file: call on one rank."""
    try:
        checksums: dict[str, str] = read_commit(path).get("crc32", {})
    except (OSError, ValueError) as exc:
        return f"commit marker unreadable: {exc}"
    for name, expected in checksums.items():
        try:
            actual = file_crc32(path / name)
        except OSError as exc:
            return f"{name} unreadable: {exc}"
        if actual != expected:
            return f"{name} crc32 {actual}, commit recorded {expected}"
    return None


def complete_checkpoints(root: Path, warn: bool = False) -> list[CheckpointRef]:
    """Complete checkpoints, oldest first."""
    complete = []
    for ref in list_step_dirs(root):
        reason = torn_reason(ref.path)
        if reason is None:
            complete.append(ref)
        elif warn:
            log.warning(kv("checkpoint_ignored", path=ref.path, reason=reason))
    return complete


def plan_retention(
    all_dirs: Sequence[CheckpointRef], complete: Sequence[CheckpointRef], keep_last: int
) -> list[CheckpointRef]:
    """Directories to delete: complete ones beyond the newest ``keep_last``, and torn ones older than
    the newest complete one (a torn one newer than that may still be in flight)."""
    complete_sorted = sorted(complete)
    kept = set(complete_sorted[-keep_last:])
    newest = complete_sorted[-1].step if complete_sorted else -1
    complete_set = set(complete_sorted)
    victims = []
    for ref in all_dirs:
        if ref in kept:
            continue
        if ref in complete_set or ref.step < newest:
            victims.append(ref)
    return sorted(victims)


def write_commit(path: Path, meta: dict[str, Any]) -> None:
    paths = [f for f in sorted(path.rglob("*")) if f.is_file() and f.name != COMMIT and not f.name.endswith(".tmp")]
    files = {str(f.relative_to(path)): f.stat().st_size for f in paths}
    checksums = {str(f.relative_to(path)): file_crc32(f) for f in paths}
    payload = json.dumps({**meta, "files": files, "crc32": checksums, "committed_at": time.time()}, indent=2)
    tmp = path / f"{COMMIT}.tmp"
    with open(tmp, "w") as handle:
        handle.write(payload)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path / COMMIT)
    dir_fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)


class Checkpointer:
    def __init__(
        self, root: Path, *, keep_last: int, async_save: bool, group: dist.ProcessGroup, is_main: bool
    ) -> None:
        self.root = root
        self.keep_last = keep_last
        self.async_save = async_save
        self.group = group
        """A gloo group: DCP's collectives are object collectives on CPU tensors."""
        self.is_main = is_main
        self._pending: Future[None] | None = None
        # Rank 0's commits (checksums + COMMIT + retention) run here when saving asynchronously.
        self._committer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-commit")
        self.last_commit_time = time.time()
        """Read by the metrics thread; written here or on the commit thread (one float, atomic)."""
        self.last_blocking_seconds = 0.0
        """How long the last save() held up the caller (the training loop)."""
        self.last_commit_seconds = 0.0
        """From the start of the last committed save to its commit: what a stop's final checkpoint needs."""

    def save(self, step: int, state: dict[str, Any], meta: dict[str, Any]) -> None:
        """Collective. Sync mode commits before returning; async mode returns after staging to memory."""
        started = time.monotonic()
        self.wait()  # one save in flight at most: its files must not be purged or overwritten
        path = step_dir(self.root, step)
        if self.is_main:
            # A torn directory from an earlier attempt at this step would mix old files into the new save.
            if path.exists():
                shutil.rmtree(path)
            path.mkdir(parents=True)
        dist.barrier(group=self.group)
        if self.async_save:
            written = dcp.async_save(state, checkpoint_id=str(path), process_group=self.group)
            assert isinstance(written, Future)
            self._pending = self._committer.submit(self._commit_after, written, step, path, meta, started)
            self.last_blocking_seconds = time.monotonic() - started
            log.info(kv("checkpoint_staged", step=step, seconds=self.last_blocking_seconds))
        else:
            dcp.save(state, checkpoint_id=str(path), process_group=self.group)
            self._commit(step, path, meta, started)
            self.last_blocking_seconds = time.monotonic() - started

    def _commit_after(self, written: Future[Any], step: int, path: Path, meta: dict[str, Any], started: float) -> None:
        written.result()  # re-raises a failed background write
        self._commit(step, path, meta, started)

    def poll(self) -> None:
        """Surface a finished async save (and its error); cheap and local, so it can run every step."""
        if self._pending is not None and self._pending.done():
            self.wait()

    def wait(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def close(self) -> None:
        self.wait()
        self._committer.shutdown()

    def close_after_error(self) -> None:
        """close() on the way out of an error: the save in flight finishes (or fails) first; its own failure is
        logged, not raised over the error already on its way."""
        try:
            self.close()
        except Exception as exc:  # noqa: BLE001 - the first error is the one to report
            log.warning(kv("checkpoint_save_failed", error=repr(exc)))

    def _commit(self, step: int, path: Path, meta: dict[str, Any], started: float) -> None:
        # Only rank 0 touches COMMIT and retention; see the module docstring for why this is safe.
        if self.is_main:
            write_commit(path, {**meta, "step": step})
            for victim in plan_retention(list_step_dirs(self.root), complete_checkpoints(self.root), self.keep_last):
                shutil.rmtree(victim.path, ignore_errors=True)
            log.info(kv("checkpoint_committed", step=step, path=path, seconds=time.monotonic() - started))
        self.last_commit_seconds = time.monotonic() - started
        self.last_commit_time = time.time()

    def _verified(self, ref: CheckpointRef) -> bool:
        """Collective: rank 0 checks the checksums, every rank gets its verdict."""
        verdict: list[str | None] = [corrupt_reason(ref.path) if self.is_main else None]
        dist.broadcast_object_list(verdict, group=self.group, group_src=0)
        if verdict[0] is not None:
            if self.is_main:
                log.warning(kv("checkpoint_corrupt", path=ref.path, reason=verdict[0], action="falling back"))
            return False
        return True

    def load_latest(
        self,
        make_state: Callable[[CheckpointRef, dict[str, Any]], dict[str, Any]],
        apply: Callable[[dict[str, Any]], None],
    ) -> tuple[CheckpointRef, dict[str, Any]] | None:
        """Collective. Load the newest complete, intact checkpoint, falling back past unusable ones.

        ``make_state(ref, commit_meta)`` builds the destination state dict (it may depend on the saved
        world size); ``apply`` moves the loaded values into the live objects.
        """
        candidates = list(reversed(complete_checkpoints(self.root, warn=self.is_main)))
        for ref in candidates:
            if not self._verified(ref):
                continue
            meta = read_commit(ref.path)
            state = make_state(ref, meta)
            try:
                dcp.load(state, checkpoint_id=str(ref.path), process_group=self.group)
            # DCP turns a failure on any rank into one CheckpointException raised on every rank.
            except (CheckpointException, OSError, RuntimeError, ValueError) as exc:
                log.warning(kv("checkpoint_unloadable", path=ref.path, error=type(exc).__name__, detail=exc))
                continue
            apply(state)
            self.last_commit_time = time.time()
            return ref, meta
        if candidates:
            # Starting from scratch would silently discard a run and let retention delete its history; and no
            # retry reads these files differently, so this is final (the config-error class).
            names = ", ".join(ref.path.name for ref in candidates)
            raise ConfigError(f"run_dir: no checkpoint under {self.root} could be loaded ({names}: see the "
                              "warnings above); refusing to start over: move them away to start a new run")
        return None
