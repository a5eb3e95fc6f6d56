"""The workflows that hold cloud credentials: pinned actions, no expressions in scripts, least permissions."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
# owner/repo@<40 hex> # vX.Y.Z: a tag can be moved, a commit cannot; the comment says which release it is.
PINNED = re.compile(r"[\w.-]+/[\w.-]+(/[\w./-]+)?@[0-9a-f]{40} # v[0-9]+\.[0-9]+\.[0-9]+", re.ASCII)


def _load(path: Path) -> dict[str, Any]:
    document = yaml.safe_load(path.read_text())
    assert isinstance(document, dict)
    return document


def _steps(document: dict[str, Any]) -> list[dict[str, Any]]:
    return [step for job in document["jobs"].values() for step in job.get("steps", [])]


@pytest.mark.parametrize("path", WORKFLOWS, ids=[p.name for p in WORKFLOWS])
def test_every_action_is_pinned_by_commit_with_its_version(path: Path) -> None:
    lines = [line.split("uses:", 1)[1].strip() for line in path.read_text().splitlines() if "uses:" in line]
    remote = [u for u in lines if not u.startswith("./")]
    assert remote or path.name == "deploy.yml"
    assert [u for u in remote if not PINNED.fullmatch(u)] == []


@pytest.mark.parametrize("path", WORKFLOWS, ids=[p.name for p in WORKFLOWS])
def test_no_expression_is_expanded_inside_a_script(path: Path) -> None:
    assert [s["run"] for s in _steps(_load(path)) if "${{" in s.get("run", "")] == []


@pytest.mark.parametrize("path", WORKFLOWS, ids=[p.name for p in WORKFLOWS])
def test_permissions_are_granted_per_job_and_secrets_passed_by_name(path: Path) -> None:
    document = _load(path)
    assert document["permissions"] == {}, "the workflow grants nothing; each job asks for what it needs"
    for name, job in document["jobs"].items():
        assert "permissions" in job, f"job {name} states its permissions"
        assert job.get("secrets") != "inherit", f"job {name} inherits every secret"
    for step in _steps(document):
        if str(step.get("uses", "")).startswith("actions/checkout@"):
            assert step["with"]["persist-credentials"] is False


def test_the_aws_region_comes_from_the_stack() -> None:
    text = "".join(p.read_text() for p in WORKFLOWS)
    assert "us-east-1" not in text and "vars.AWS_REGION" not in text
    # Both credential steps take the region tools/deploy_settings.py read from the validated stack.
    assert text.count("aws-region: ${{ needs.settings.outputs.region }}") == 1
    assert text.count("aws-region: ${{ fromJSON(needs.settings.outputs.settings)[matrix.stack].region }}") == 1


def test_zizmor_finds_nothing_at_medium_or_above() -> None:
    zizmor = shutil.which("zizmor", path=str(Path(sys.executable).parent)) or shutil.which("zizmor")
    if zizmor is None:
        pytest.skip("zizmor is not installed (requirements-dev.txt pins it; .ci/run runs it)")
    result = subprocess.run([zizmor, "--offline", "--min-severity", "medium", str(ROOT / ".github" / "workflows")],
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
