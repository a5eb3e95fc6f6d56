"""The checkpoint directory's layout and commit marker: what counts as a complete, intact checkpoint.

Layout under ``<run_dir>/checkpoints``::

    step-00000050/  .metadata  __0_0.distcp  __1_0.distcp  COMMIT
    step-00000100/  ...                                        (no COMMIT: torn, ignored)

A checkpoint counts only once ``COMMIT`` exists (checkpointer.py writes it after DCP's save). ``COMMIT`` records
every file's size (a truncated file is caught by a stat) and its CRC-32 (flipped bytes are caught before loading).
No torch here: the node agent's preflight reads the markers before torch is imported.

CRC-32 (zlib) because it is the fastest checksum in the standard library and releases the GIL on large
buffers; it detects corruption, not tampering (bench/checkpoint.py prints its cost beside BLAKE2b's).
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
