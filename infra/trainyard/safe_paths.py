"""Files a tool writes or deletes stay inside the folder they belong to.

Relative paths often come from files someone else can edit: a lock entry, a plan's marker, a mirror's SOURCES.md,
a pull request. Each is refused unless it names a plain place inside its root: no absolute path, no `..`, and no
symbolic link on the way or at the end (git stores links, so a committed folder can hold one pointing anywhere).
Every writer calls `inside` (or `write_file` / `remove_file`, which call it) for every path below its root.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path, PurePosixPath


class UnsafePathError(ValueError):
    """A path that would leave its root or pass through a link; the message names the path and why."""


def relative_parts(rel: str) -> tuple[str, ...]:
    """The parts of `rel`, a plain relative POSIX path, or UnsafePathError saying what is wrong with it."""
    if not rel:
        raise UnsafePathError("an empty path")
    if bad := next((c for c in rel if ord(c) < 0x20 or c in "\x7f\\"), None):
        raise UnsafePathError(f"{rel!a} holds the character {bad!a}; only plain relative paths are allowed")
    path = PurePosixPath(rel)
    if path.is_absolute():
        raise UnsafePathError(f"{rel!a} is an absolute path; only paths inside the folder are allowed")
    parts = rel.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise UnsafePathError(f"{rel!a} has an empty, '.' or '..' part; only plain relative paths are allowed")
    return tuple(parts)


def inside(root: Path, rel: str, *, folder: bool = False) -> Path:
    """`root / rel`, after checking that it stays in `root`: `rel` is plain (see `relative_parts`), no existing
    part of it is a symbolic link, every existing part but the last is a folder, and the last, if it exists, is a
    regular file (a folder with `folder`). The root itself is the caller's to check (`check_root`)."""
    parts = relative_parts(rel)
    current = root
    for depth, part in enumerate(parts, start=1):
        current = current / part
        try:
            mode = os.lstat(current).st_mode
        except FileNotFoundError:
            break  # nothing below a missing folder exists either
        shown = "/".join(parts[:depth])
        if stat.S_ISLNK(mode):
            raise UnsafePathError(f"{shown} is a symbolic link; links are never followed: remove it")
        if depth < len(parts) and not stat.S_ISDIR(mode):
            raise UnsafePathError(f"{shown} is a file where {rel} needs a folder")
        if depth == len(parts) and folder and not stat.S_ISDIR(mode):
            raise UnsafePathError(f"{shown} is a file where a folder belongs")
        if depth == len(parts) and not folder and not stat.S_ISREG(mode):
            raise UnsafePathError(f"{shown} is a folder or special file, not a regular file")
    return root.joinpath(*parts)


def write_file(root: Path, rel: str, data: bytes) -> Path:
    """Write `data` to `root / rel` (checked by `inside`), creating its folders; never through a link."""
    target = inside(root, rel)
    target.parent.mkdir(parents=True, exist_ok=True)
    # O_NOFOLLOW: a link put in place after the check is refused by the kernel, not followed.
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    return target


def remove_file(root: Path, rel: str) -> None:
    """Delete `root / rel` (checked by `inside`) if it exists."""
    inside(root, rel).unlink(missing_ok=True)


def check_root(root: Path, what: str) -> None:
    """UnsafePathError unless `root` is a folder or absent (then created by the writer), and not a link."""
    if root.is_symlink():
        raise UnsafePathError(f"{what} {root} is a symbolic link; name the folder itself")
    if os.path.lexists(root) and not root.is_dir():
        raise UnsafePathError(f"{what} {root} exists and is not a folder")
    blocker = next((p for p in root.parents if os.path.lexists(p) and not p.is_dir()), None)
    if blocker is not None:
        raise UnsafePathError(f"{what} {root}: {blocker} is a file, not a folder")
