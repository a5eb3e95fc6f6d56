"""Saving and loading checkpoints with torch.distributed.checkpoint (DCP) behind the commit marker (checkpoint.py).

Rank 0 writes ``COMMIT``, atomically (tmp file + rename), after DCP's save returned on rank 0: DCP's coordinator
gathers every rank's write result before it writes ``.metadata`` and returns, so that return is the "all ranks
finished" barrier. Before loading, rank 0 re-reads the files against their recorded CRC-32s and tells the other
ranks. A checkpoint that fails either check, or whose load still fails, is skipped with one warning line and the
next older complete one is used. With ``async_save`` rank 0 checksums and commits on a background thread once the
write finished, so the training loop never waits for the re-read.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from .checkpoint import (
    CheckpointRef,
    complete_checkpoints,
    corrupt_reason,
    list_step_dirs,
    plan_retention,
    read_commit,
    step_dir,
    write_commit,
)
from .config import ConfigError
from .logs import LOGGER_NAME, kv

log = logging.getLogger(LOGGER_NAME)


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
