"""The deploy workflows run on the stack's runner, as the stack's deploy or read-only preview role, for long enough
(issue 9, items 13 and 14; issue 18, items 2 and 4)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from owned_stacks import FLEET, LAPTOP, OWNED_STACKS, Stack, recording, stack_settings, stacks_where
from trainyard.plan.duration import longest_create_chain
from trainyard.plan.recording import Recording, ResourceRecord
from trainyard.plan.runtime import STACKS_DIR, available_stacks, read_stack, settings_of

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"
# The tests' fleet, then every AWS stack of stacks/.
AWS = stacks_where(lambda s: s.is_aws)
# AssumeRole's DurationSeconds can reach the role's MaxSessionDuration, at most 12 h (IAM UpdateRole docs).
MAX_SESSION_SECONDS = 12 * 3600


def _credential_steps(workflow: str) -> list[dict[str, Any]]:
    document = yaml.safe_load((WORKFLOWS / workflow).read_text())
    return [step for job in document["jobs"].values() for step in job.get("steps", [])
            if str(step.get("uses", "")).startswith("aws-actions/configure-aws-credentials@")]


def _job(workflow: str, name: str) -> dict[str, Any]:
    job: dict[str, Any] = yaml.safe_load((WORKFLOWS / workflow).read_text())["jobs"][name]
    return job


def _deploy_settings(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "tools" / "deploy_settings.py"), *args], capture_output=True,
                          text=True, timeout=120, check=False)


def _outputs(result: subprocess.CompletedProcess[str]) -> dict[str, str]:
    assert result.returncode == 0, result.stderr
    return dict(line.split("=", 1) for line in result.stdout.splitlines())


def test_the_deploy_runs_on_the_stacks_runner_with_the_stacks_role() -> None:
    # The runner is a setting of the stack (GitHub's standard ubuntu-* runners have no fixed egress address, so
    # they cannot reach an endpoint limited to the deploy runners' ranges); the role is the one the program admits.
    up = _job("deploy-stack.yml", "up")
    assert up["needs"] == "settings" and up["runs-on"] == "${{ fromJSON(needs.settings.outputs.runner) }}"
    (step,) = [s for s in up["steps"] if str(s.get("uses", "")).startswith("aws-actions/configure-aws-credentials@")]
    assert step["with"]["role-to-assume"] == "${{ needs.settings.outputs.role-arn }}"
    assert step["with"]["aws-region"] == "${{ needs.settings.outputs.region }}"
    settings = _job("deploy-stack.yml", "settings")
    assert settings["outputs"] == {key: f"${{{{ steps.deploy.outputs.{key} }}}}" for key in ("region", "role-arn",
                                                                                         "runner")}
    assert settings["permissions"] == {"contents": "read"}, "the settings job holds no credential"
    assert any(s.get("run") == '.venv/bin/python tools/deploy_settings.py "$STACK" >> "$GITHUB_OUTPUT"'
               for s in settings["steps"])
    text = (WORKFLOWS / "deploy-stack.yml").read_text()
    assert "vars.AWS_ROLE_ARN" not in text


def test_previews_run_on_the_preview_runner_with_the_preview_role_never_the_deploy_role() -> None:
    preview = _job("preview.yml", "preview")
    where = "fromJSON(needs.settings.outputs.settings)[matrix.stack]"
    assert preview["runs-on"] == f"${{{{ {where}.runner }}}}"
    (step,) = [s for s in preview["steps"]
               if str(s.get("uses", "")).startswith("aws-actions/configure-aws-credentials@")]
    assert step["with"]["role-to-assume"] == f"${{{{ {where}.role-arn }}}}"
    # No environment: the job's OIDC subject stays repo:<owner>/<name>:pull_request, which only the preview role
    # trusts (the deploy role's trust names its environment).
    assert "environment" not in preview
    settings = _job("preview.yml", "settings")
    # No stack named: every AWS stack stacks/ holds is previewed, whichever a user keeps.
    assert any(s.get("run") == '.venv/bin/python tools/deploy_settings.py --previews >> "$GITHUB_OUTPUT"'
               for s in settings["steps"])


@pytest.mark.parametrize("stack", AWS)
def test_deploy_settings_print_the_stacks_region_role_and_runner(stack: Stack) -> None:
    settings = stack_settings(stack)
    assert settings.deploy is not None and settings.aws is not None
    runner = settings.deploy.runner
    expected = {"group": runner.group, "labels": runner.labels} if runner.group else runner.labels
    assert _outputs(_deploy_settings("--stacks-dir", str(stack[1]), stack[0])) == {
        "region": settings.aws.region, "role-arn": settings.deploy.role_arn,
        "runner": json.dumps(expected, separators=(",", ":"))}


@pytest.mark.parametrize("stacks_dir", [OWNED_STACKS, STACKS_DIR], ids=["owned", "stacks"])
def test_preview_settings_name_the_preview_role_of_each_previewed_stack(stacks_dir: Path) -> None:
    outputs = _outputs(_deploy_settings("--stacks-dir", str(stacks_dir), "--previews"))
    previewed = json.loads(outputs["settings"])
    assert json.loads(outputs["stacks"]) == list(previewed)
    aws = [s for s in available_stacks(stacks_dir) if settings_of(read_stack(s, stacks_dir)).is_aws]
    assert set(previewed) <= set(aws)
    if stacks_dir == OWNED_STACKS:
        assert FLEET[0] in previewed and LAPTOP[0] not in previewed
    for stack in aws:
        settings = settings_of(read_stack(stack, stacks_dir))
        assert settings.deploy is not None
        preview = settings.deploy.preview
        if preview is None:
            assert stack not in previewed
            continue
        account = settings.deploy.role_arn.split(":")[4]
        assert previewed[stack]["role-arn"] == f"arn:aws:iam::{account}:role/trainyard-{stack}-preview"
        assert previewed[stack]["role-arn"] != settings.deploy.role_arn
        assert previewed[stack]["runner"] == (preview.runner or settings.deploy.runner).labels


def test_a_stack_whose_runner_cannot_reach_its_endpoint_is_refused_before_any_credential(tmp_path: Path) -> None:
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    document = yaml.safe_load((OWNED_STACKS / "Pulumi.fleet.yaml").read_text())
    document["config"]["trainyard:deploy"]["runner"] = {"labels": ["ubuntu-24.04"]}
    (stacks / "Pulumi.fleet.yaml").write_text(yaml.safe_dump(document))
    for args in (("fleet",), ("--previews", "fleet"), ("--previews",)):
        result = _deploy_settings("--stacks-dir", str(stacks), *args)
        assert result.returncode == 2 and result.stdout == "" and "Traceback" not in result.stderr
        assert "trainyard:deploy.runner" in result.stderr and "no fixed egress address" in result.stderr


def test_deploy_settings_refuse_a_stack_ci_does_not_deploy() -> None:
    result = _deploy_settings("--stacks-dir", str(OWNED_STACKS), LAPTOP[0])
    assert result.returncode == 2 and "Traceback" not in result.stderr and "trainyard:deploy" in result.stderr


@pytest.mark.parametrize("stack", AWS)
def test_credentials_outlive_the_first_up(stack: Stack) -> None:
    (step,) = _credential_steps("deploy-stack.yml")
    duration = int(step["with"]["role-duration-seconds"])
    bound = longest_create_chain(recording(stack)).seconds
    assert bound > 3600, "the first up is longer than the 1 h default; the bound must show it"
    assert bound <= duration <= MAX_SESSION_SECONDS, (stack, bound, duration)


def _record(type_: str, name: str, custom: bool = True, parent: str | None = None, provider: str | None = None,
            deps: tuple[str, ...] = ()) -> ResourceRecord:
    return ResourceRecord(urn=f"urn:pulumi:ci::trainyard::{type_}::{name}", type=type_, name=name, custom=custom,
                          parent=parent, provider=provider, depends_on=deps, protect=False, retain_on_delete=False,
                          deleted_with=None, inputs={})


def test_the_bound_follows_what_the_engine_waits_on() -> None:
    """A dependency on a component waits for its children, and a resource waits for its provider's inputs."""
    component = _record("trainyard:cloud:EksCluster", "eks", custom=False)
    cluster = _record("aws:eks/cluster:Cluster", "eks-cluster", parent=component.urn)
    provider = _record("pulumi:providers:kubernetes", "k8s", deps=(cluster.urn,))
    group = _record("aws:eks/nodeGroup:NodeGroup", "group", deps=(component.urn,))
    namespace = _record("kubernetes:core/v1:Namespace", "ns", provider=provider.urn)
    bound = longest_create_chain(Recording(resources=[group, namespace, provider, cluster, component]))
    assert bound.path == (component.urn, cluster.urn, group.urn)
    assert bound.seconds == 30 * 60 + 60 * 60
    alone = longest_create_chain(Recording(resources=[namespace, provider, cluster, component]))
    assert alone.path == (component.urn, cluster.urn, provider.urn, namespace.urn)
    assert alone.seconds == 30 * 60 + 60  # configuring the provider calls no cloud API
