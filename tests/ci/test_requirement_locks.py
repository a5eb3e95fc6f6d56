"""Every environment installs a lock of its whole closure with sha256s (tools/lock_requirements.py), and the lock is
that of the pins the requirements files name today: a pin changed without relocking fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LOCKED = ("requirements.txt", "requirements-dev.txt", "requirements-checkov.txt", "requirements-mlflow.txt")
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;#]+)")
_LOCKED_PIN = re.compile(r"^([a-z0-9-]+)==(\S+) \\\n    --hash=sha256:[0-9a-f]{64}$", re.M)


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()  # PEP 503


def _pins(requirements: Path) -> dict[str, str]:
    """name -> version of every `name==version` the file names, through its `-r` includes."""
    pins: dict[str, str] = {}
    for line in requirements.read_text().splitlines():
        line = line.split(" #")[0].strip()
        if line.startswith("-r "):
            pins |= _pins(requirements.parent / line[3:].strip())
        elif match := _PIN.search(line):
            pins[_normal(match.group(1))] = match.group(2)
    return pins


def _locked(requirements: Path) -> dict[str, str]:
    text = requirements.with_suffix(".lock").read_text()
    entries = [line for line in text.split("\n") if line and not line.startswith(("#", "    "))]
    found = dict(_LOCKED_PIN.findall(text))
    assert len(found) == len(entries), "every lock entry is `name==version` with one sha256 on the next line"
    return found


def _matches(pin: str, locked: str | None) -> bool:
    """PEP 440 `==`: a pin without a local label (2.13.0) takes the locked 2.13.0+cpu."""
    return locked is not None and (locked == pin or ("+" not in pin and locked.partition("+")[0] == pin))


@pytest.mark.parametrize("name", LOCKED)
def test_the_lock_holds_every_pin_at_its_version(name: str) -> None:
    locked = _locked(ROOT / name)
    stale = {dist: (version, locked.get(dist)) for dist, version in _pins(ROOT / name).items()
             if not _matches(version, locked.get(dist))}
    assert not stale, f"{name} and its lock differ (pin, lock): {stale}; run .venv/bin/python " \
                      "tools/lock_requirements.py"


def test_make_installs_the_locks_with_hashes() -> None:
    makefile = (ROOT / "Makefile").read_text()
    for name in LOCKED:
        lock = Path(name).with_suffix(".lock").name
        assert f"--require-hashes -r {lock}" in makefile, f"Makefile does not install {lock} with --require-hashes"
