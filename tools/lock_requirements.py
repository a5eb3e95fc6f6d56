#!/usr/bin/env python3
"""Lock each environment's whole dependency closure, every distribution with its sha256.

requirements*.txt name the project's direct pins; pip resolves what they pull in. This writes `<file>.lock` beside
each from pip's installation report (pip.pypa.io/en/stable/reference/installation-report/: every distribution pip
would install into an empty environment, with its archive's sha256), and `make` installs the lock with
`--require-hashes`, then the project's own packages without dependencies. The hashes are those of the files pip
picks on this machine: CPython 3.11 on linux x86_64, as on CI.

    .venv/bin/python tools/lock_requirements.py [requirements.txt ...]   relock those (default: every one in LOCKED)
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LOCKED = ("requirements.txt", "requirements-dev.txt", "requirements-checkov.txt", "requirements-mlflow.txt")
HEADER = ("# The whole closure of {source}, each distribution with its sha256 (pip's installation report for\n"
          "# CPython 3.11 on linux x86_64). Written by `python tools/lock_requirements.py`; `make` installs it with\n"
          "# --require-hashes. Edit {source}, never this file.\n")


def lock_path(requirements: Path) -> Path:
    return requirements.with_suffix(".lock")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()  # PEP 503


def resolve(requirements: Path) -> list[tuple[str, str, str]]:
    """(name, version, sha256) of every distribution pip would install for `requirements`, the project's own
    (local folders, `-e .`) left out."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--dry-run", "--ignore-installed",
                        "--report", str(report), "-r", str(requirements)], check=True, cwd=REPO)
        items = json.loads(report.read_text(encoding="utf-8"))["install"]
    pins = []
    for item in items:
        name, version = canonical(item["metadata"]["name"]), item["metadata"]["version"]
        info = item["download_info"]
        if "dir_info" in info:
            continue
        sha256 = info.get("archive_info", {}).get("hashes", {}).get("sha256")
        if sha256 is None:
            raise SystemExit(f"{requirements.name}: pip reports no sha256 for {name} {version} ({info['url']})")
        pins.append((name, version, sha256))
    return sorted(pins)


def write_lock(requirements: Path, pins: list[tuple[str, str, str]]) -> None:
    lines = [f"{name}=={version} \\\n    --hash=sha256:{sha256}\n" for name, version, sha256 in pins]
    lock_path(requirements).write_text(HEADER.format(source=requirements.name) + "".join(lines), encoding="utf-8")


def main(argv: list[str]) -> int:
    for name in argv or LOCKED:
        requirements = REPO / name
        pins = resolve(requirements)
        write_lock(requirements, pins)
        print(f"{lock_path(requirements).relative_to(REPO)}: {len(pins)} distributions")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
