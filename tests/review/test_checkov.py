"""Checkov's Kubernetes checks over every stack's rendered manifests.

A finding is acceptable only when the object itself says why: the annotation
`checkov.io/skip<N>: CKV_K8S_XX=<reason>` on its metadata. Checkov runs from its own environment (its pins clash
with the program's: it holds protobuf and packaging back), found as $CHECKOV (set by `make test`) or on PATH.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from review_support import STACKS, rendered
from trainyard.plan.writers import write_plan

CHECKOV_VERSION = "3.3.30"

pytestmark = pytest.mark.checkov


def checkov_binary() -> str | None:
    candidates = [os.environ.get("CHECKOV"), shutil.which("checkov")]
    return next((c for c in candidates if c and Path(c).is_file()), None)


def run_checkov(binary: str, manifests: Path) -> dict[str, Any]:
    done = subprocess.run([binary, "-d", str(manifests), "--framework", "kubernetes", "-o", "json", "--compact",
                           "--skip-download"], capture_output=True, text=True, check=False, timeout=300)
    # Exit code 1 means "checks failed"; anything else is checkov itself failing.
    assert done.returncode in (0, 1), done.stderr[-3000:]
    report = json.loads(done.stdout)
    reports = report if isinstance(report, list) else [report]
    return next(r for r in reports if r.get("check_type") == "kubernetes")


def skip_reason(check: dict[str, Any]) -> str:
    """The reason written in the skip annotation (checkov fills in a placeholder when there is none)."""
    reason = str((check.get("check_result") or {}).get("suppress_comment") or "").strip()
    return "" if reason == "No comment provided" else reason


def describe(check: dict[str, Any]) -> str:
    return f"{check['check_id']} ({check['check_name']}) on {check['resource']} in {Path(check['file_path']).name}"


@pytest.mark.parametrize("stack", STACKS)
def test_manifests_pass_checkov_or_say_why_not(stack: str, tmp_path: Path) -> None:
    binary = checkov_binary()
    if binary is None:
        message = f"checkov not installed: `make test` installs checkov=={CHECKOV_VERSION} in .venv-checkov"
        pytest.fail(message)
    write_plan(rendered(stack), tmp_path)
    report = run_checkov(binary, tmp_path / "manifests")
    results = report["results"]
    summary = report["summary"]
    print(f"{stack}: passed={summary['passed']} failed={summary['failed']} skipped={summary['skipped']}")
    assert summary["parsing_errors"] == 0
    unexplained = [describe(c) for c in results.get("skipped_checks", []) if not skip_reason(c)]
    assert unexplained == [], "skips need a written reason"
    assert [describe(c) for c in results.get("failed_checks", [])] == []
