"""Checkpoints leave the cluster (issue 19 finding 10): each job exports to its own prefix of the checkpoint
bucket, inside what its namespace's role may write, in the form the trainer reads; and nothing a container caches
lands on the read-only root filesystem (finding 23)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from owned_stacks import Stack, every_stack, recording, stack_settings, stacks_where
from trainyard.plan.recording import Recording
from trainyard.plan.writers import manifest_of
from trainyard_train.export import EXPORT_ENV, ExportTarget

JOB = "kubernetes:batch.volcano.sh/v1alpha1:Job"
NAMESPACE_TAG = "${aws:PrincipalTag/kubernetes-namespace}"


def _recording(stack: Stack) -> Recording:
    return recording(stack)


def _containers(stack: Stack) -> list[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]]:
    """(job, pod spec, container) of every rendered Volcano job."""
    found = []
    for record in _recording(stack).resources:
        if record.type != JOB:
            continue
        job = manifest_of(record)
        for task in job["spec"]["tasks"]:
            pod = task["template"]["spec"]
            found += [(job, pod, container) for container in pod["containers"]]
    return found


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


def _trainer_object_grants(stack: Stack) -> list[str]:
    """Object ARNs the trainer role's policy lets it write (Put) in, namespace variable included."""
    grants = []
    for record in _recording(stack).resources:
        if record.type != "aws:iam/rolePolicy:RolePolicy" or "trainer" not in record.name:
            continue
        for statement in json.loads(record.inputs["policy"])["Statement"]:
            if "s3:PutObject" in statement["Action"]:
                grants += [statement["Resource"]] if isinstance(statement["Resource"], str) else statement["Resource"]
    return grants


@pytest.mark.parametrize("stack", stacks_where(lambda s: s.is_aws))
def test_every_training_job_exports_under_its_own_writable_prefix(stack: Stack) -> None:
    settings = stack_settings(stack)
    grants = _trainer_object_grants(stack)
    assert grants, "the trainer role grants no object writes"
    trainers = [(job, c) for job, _, c in _containers(stack) if c["name"] == "trainer"]
    assert trainers
    for job, container in trainers:
        env = _env(container)
        namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
        target = ExportTarget.from_env(env)  # the trainer's own parser accepts it
        assert target is not None and target.prefix == f"{namespace}/{name}/", name
        assert env["AWS_REGION"] == settings.aws.region if settings.aws else False
        writable = [g.replace(NAMESPACE_TAG, namespace) for g in grants]
        key = f"arn:aws:s3:::{target.bucket}/{target.prefix}checkpoints/step-00000001/COMMIT"
        assert any(g.endswith("/*") and key.startswith(g[:-1]) for g in writable), (name, writable)


@pytest.mark.parametrize("stack", stacks_where(lambda s: not s.is_aws))
def test_nothing_exports_without_a_checkpoint_bucket(stack: Stack) -> None:
    for _, _, container in _containers(stack):
        assert EXPORT_ENV not in _env(container)


@pytest.mark.parametrize("stack", every_stack())
def test_home_is_writable_in_every_container(stack: Stack) -> None:
    for job, pod, container in _containers(stack):
        home = _env(container).get("HOME")
        assert home, job["metadata"]["name"]
        if container["securityContext"].get("readOnlyRootFilesystem"):
            empty_dirs = {v["name"] for v in pod["volumes"] if "emptyDir" in v}
            mounted = [m["mountPath"] for m in container["volumeMounts"] if m["name"] in empty_dirs]
            assert any(home == m or home.startswith(m.rstrip("/") + "/") for m in mounted), job["metadata"]["name"]
