"""The tenant-user Role (platform/tenant_access.py) against what `submit` does with a member's own credentials: every
object it applies, with and without --pipeline, and every command it prints for watching, reading logs and
cancelling is allowed, and the Role grants nothing that none of them needs."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from owned_stacks import OWNED_STACKS
from trainyard import submit
from trainyard.plan.runtime import read_stack
from trainyard.platform.tenant_access import tenant_rules

Needs = dict[tuple[str, str], set[str]]
READ = {"get", "list", "watch"}
# Server-side apply: patch, and create for an object not there yet (Kubernetes docs, "Server-Side Apply":
# permissions); reading it back; deleting what one submitted (a claim counts against the namespace's quota).
APPLIED = {"create", "patch", *READ, "delete"}
# What each next step `submit` prints asks of the API server: kubectl, and argo's CLI, which without an Argo server
# runs the Argo API in process on the member's kubeconfig, caching the namespace's templates and Workflows
# (pkg/apiclient/argo-kube-client.go @ v4.0.10), creating the Workflow and following its pods.
COMMANDS: list[tuple[str, Needs]] = [
    (r"kubectl -n \S+ get vcjob \S+ -w", {("batch.volcano.sh", "jobs"): READ}),
    (r"kubectl -n \S+ logs -f -l \S+ --max-log-requests \d+", {("", "pods"): READ, ("", "pods/log"): {"get"}}),
    (r"Cancel it \(.*\): kubectl -n \S+ delete vcjob \S+", {("batch.volcano.sh", "jobs"): {"delete"}}),
    (r"argo submit -n \S+ --from workflowtemplate/\S+( -p \S+)* --watch",
     {("argoproj.io", "workflowtemplates"): READ, ("argoproj.io", "workflows"): {"create", *READ},
      ("", "pods"): READ}),
]
# The rest of a job's status and of a pipeline's life: the PodGroup Volcano makes for the job and the events of both
# (kubectl describe); `argo stop`/`terminate` patch a Workflow (workflow/util/util.go patchShutdownStrategy @
# v4.0.10) and `argo delete` removes it.
STATUS: Needs = {("scheduling.volcano.sh", "podgroups"): READ, ("", "events"): READ, ("events.k8s.io", "events"): READ,
                 ("argoproj.io", "workflows"): {"patch", "delete"}}


def _add(into: Needs, more: Needs) -> None:
    for key, verbs in more.items():
        into.setdefault(key, set()).update(verbs)


def _granted() -> Needs:
    granted: Needs = {}
    for rule in tenant_rules():
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                _add(granted, {(group, resource): set(rule["verbs"])})
    return granted


def _command_needs(line: str) -> Needs:
    matched = [needs for pattern, needs in COMMANDS if re.fullmatch(pattern, line)]
    assert matched, f"submit prints {line!r}: say what it needs of the Role in COMMANDS"
    return matched[0]


def _needs(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Needs:
    """What submitting a job of the tests' fleet stack, plain and as a pipeline, asks of the Role (the same kinds in
    every tenant's namespace: test_submit.py test_every_tenant_can_submit_a_job)."""
    stack = read_stack("fleet", OWNED_STACKS)
    applied: list[dict[str, Any]] = []
    monkeypatch.setattr(submit, "apply", lambda manifests, kubeconfig, context: applied.extend(manifests))
    template = json.loads(stack.values[submit.WORKLOADS_KEY])[0]
    needs: Needs = {}
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump({**template, "name": "submitted"}))
    for pipeline in (False, True):
        assert submit.main(stack, job_file, dry_run=False, out=None, kubeconfig=None, context=None,
                           pipeline=pipeline) == 0
        for line in capsys.readouterr().out.splitlines():
            if line.startswith("  ") or "kubectl" in line or "argo " in line:
                _add(needs, _command_needs(line.strip()))
    kinds = {(m["apiVersion"], m["kind"]) for m in applied}
    assert ("argoproj.io/v1alpha1", "WorkflowTemplate") in kinds and ("batch.volcano.sh/v1alpha1", "Job") in kinds
    for api_version, kind in kinds:
        group = api_version.rpartition("/")[0]
        _add(needs, {(group, submit.COLLECTIONS[(api_version, kind)].rsplit("/", 1)[1]): APPLIED})
    return needs


def test_the_role_allows_what_submit_does_and_nothing_more(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    needs = _needs(tmp_path, capsys, monkeypatch)
    _add(needs, STATUS)
    granted = _granted()
    missing = {k: sorted(v - granted.get(k, set())) for k, v in needs.items() if v - granted.get(k, set())}
    assert not missing, f"the Role lacks {missing}"
    extra = {k: sorted(v - needs.get(k, set())) for k, v in granted.items() if v - needs.get(k, set())}
    assert not extra, f"the Role grants more than submit, status, logs and cancel need: {extra}"
