"""Checkov's Kubernetes checks over every stack's rendered manifests.

A finding is acceptable only when the object itself says why: the annotation
`checkov.io/skip<N>: CKV_K8S_XX=<reason>` on its metadata. Checkov runs from its own environment (its pins clash
with the program's: it holds protobuf and packaging back), found as $CHECKOV, on PATH, or in ../checkov-venv.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from review_support import REPO_ROOT, STACKS, rendered

from trainyard.plan.writers import write_plan

CHECKOV_VERSION = "3.3.30"


def checkov_binary() -> str | None:
    candidates = [os.environ.get("CHECKOV"), shutil.which("checkov"),
                  str(REPO_ROOT.parent / "checkov-venv" / "bin" / "checkov")]
    return next((c for c in candidates if c and Path(c).is_file()), None)


def run_checkov(binary: str, manifests: Path) -> dict[str, Any]:
    done = subprocess.run([binary, "-d", str(manifests), "--framework", "kubernetes", "-o", "json", "--quiet",
                           "--compact", "--skip-download"], capture_output=True, text=True, check=False, timeout=300)
    # Exit code 1 means "checks failed"; anything else is checkov itself failing.
    assert done.returncode in (0, 1), done.stderr[-3000:]
    report = json.loads(done.stdout)
    reports = report if isinstance(report, list) else [report]
    return next(r for r in reports if r.get("check_type") == "kubernetes")


def describe(check: dict[str, Any]) -> str:
    return f"{check['check_id']} ({check['check_name']}) on {check['resource']} in {Path(check['file_path']).name}"


@pytest.mark.slow
@pytest.mark.parametrize("stack", STACKS)
def test_manifests_pass_checkov_or_say_why_not(stack: str, tmp_path: Path) -> None:
    binary = checkov_binary()
    if binary is None:
        pytest.skip(f"checkov not installed: pip install checkov=={CHECKOV_VERSION} in its own venv, or set CHECKOV")
    write_plan(rendered(stack), tmp_path)
    report = run_checkov(binary, tmp_path / "manifests")
    results = report["results"]
    summary = report["summary"]
    print(f"{stack}: passed={summary['passed']} failed={summary['failed']} skipped={summary['skipped']}")
    assert summary["parsing_errors"] == 0
    unexplained = [describe(c) for c in results.get("skipped_checks", []) if not (c.get("suppress_comment") or "").strip()
                   or c["suppress_comment"].strip() == "No comment provided"]
    assert unexplained == [], "skips need a written reason"
    assert [describe(c) for c in results.get("failed_checks", [])] == []
