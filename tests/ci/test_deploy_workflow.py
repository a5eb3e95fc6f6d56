"""The deploy workflows assume the stack's deploy role for long enough (issue 9, items 13 and 14)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from trainyard.plan.duration import longest_create_chain
from trainyard.plan.recording import Recording, ResourceRecord
from trainyard.plan.runtime import read_stack, render, settings_of

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"
AWS_STACKS = ("dev", "staging", "prod")
# AssumeRole's DurationSeconds can reach the role's MaxSessionDuration, at most 12 h (IAM UpdateRole docs).
MAX_SESSION_SECONDS = 12 * 3600


def _credential_steps(workflow: str) -> list[dict[str, Any]]:
    document = yaml.safe_load((WORKFLOWS / workflow).read_text())
    return [step for job in document["jobs"].values() for step in job.get("steps", [])
            if str(step.get("uses", "")).startswith("aws-actions/configure-aws-credentials@")]


@pytest.mark.parametrize("workflow", ["deploy-stack.yml", "preview.yml"])
def test_workflows_assume_the_role_the_stack_names(workflow: str) -> None:
    (step,) = _credential_steps(workflow)
    assert step["with"]["role-to-assume"] == "${{ steps.deploy.outputs.role-arn }}"
    text = (WORKFLOWS / workflow).read_text()
    assert "tools/deploy_settings.py" in text and "vars.AWS_ROLE_ARN" not in text


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_deploy_settings_print_the_stack_role(stack: str) -> None:
    settings = settings_of(read_stack(stack))
    assert settings.deploy is not None
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "deploy_settings.py"), stack], check=True,
                         capture_output=True, text=True).stdout
    assert out.splitlines() == [f"role-arn={settings.deploy.role_arn}"]


def test_deploy_settings_refuse_a_stack_ci_does_not_deploy() -> None:
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "deploy_settings.py"), "local"],
                            capture_output=True, text=True)
    assert result.returncode == 2 and "Traceback" not in result.stderr and "trainyard:deploy" in result.stderr


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_credentials_outlive_the_first_up(stack: str) -> None:
    (step,) = _credential_steps("deploy-stack.yml")
    duration = int(step["with"]["role-duration-seconds"])
    bound = longest_create_chain(render(read_stack(stack))).seconds
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
