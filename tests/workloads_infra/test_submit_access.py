"""The tenant-user Role (platform/tenant_access.py) against what `submit` does with a member's own credentials: every
object it applies, with and without --pipeline, and every next step it prints (its own `status`, `logs` and
`cancel`, run for real against the API server stand-in that authorizes each request with the Role; kubectl's and
argo's lines by what they call) is allowed, and the Role grants nothing that none of them needs."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from kube_stand_in import Cluster, object_path, serving
from owned_stacks import OWNED_STACKS
from trainyard.__main__ import main as cli
from trainyard.plan.runtime import read_stack
from trainyard.platform.tenant_access import tenant_rules
from trainyard.submit import WORKLOADS_KEY

Needs = dict[tuple[str, str], set[str]]
READ = {"get", "list", "watch"}
TOKEN = "member"
# Beyond the apply itself (patch, and create for an object not there yet: what the stand-in authorizes): reading it
# back, and deleting what one submitted (a claim counts against the namespace's quota).
APPLIED = {*READ, "delete"}
# What kubectl's and argo's lines `submit` prints ask of the API server: kubectl, and argo's CLI, which without an
# Argo server runs the Argo API in process on the member's kubeconfig, caching the namespace's templates and
# Workflows (pkg/apiclient/argo-kube-client.go @ v4.0.10), creating the Workflow and following its pods.
COMMANDS: list[tuple[str, Needs]] = [
    (r"kubectl -n \S+ get vcjob \S+ -w", {("batch.volcano.sh", "jobs"): READ}),
    (r"argo submit -n \S+ --from workflowtemplate/\S+( -p \S+)* --watch",
     {("argoproj.io", "workflowtemplates"): READ, ("argoproj.io", "workflows"): {"create", *READ},
      ("", "pods"): READ}),
]
# The rest of a pipeline's life and of a job's (argo-workflows v4.0.10; README "Tenant access"): `argo stop` and
# `terminate` patch a Workflow (workflow/util/util.go patchShutdownStrategy), `argo suspend` and `resume` update it
# (util.go SuspendWorkflow, ResumeWorkflow: wfIf.Update), `argo retry` deletes the failed steps' pods and updates it
# (server/workflow/workflow_server.go RetryWorkflow, with the caller's own clients), `argo delete` removes it; the
# PodGroup and the events of both read with kubectl describe.
LIFECYCLE: Needs = {("argoproj.io", "workflows"): {"patch", "update", "delete"}, ("", "pods"): {"delete"},
                    ("scheduling.volcano.sh", "podgroups"): READ, ("", "events"): READ,
                    ("events.k8s.io", "events"): READ}
# Signing in to MLflow's UI: the namespace's user and password (README step 6, `kubectl get secret mlflow-client`);
# the rule names that one Secret (test_tenant_access.py).
SIGN_IN: Needs = {("", "secrets"): {"get"}}


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


def _worker_pod(cluster: Cluster) -> None:
    """The submitted job's first pod, as Volcano creates it (its log is what `submit logs` reads)."""
    job = next(o for o in cluster.objects.values() if o["kind"] == "Job")
    meta = job["metadata"]
    pod = cluster.add({"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": f"{meta['name']}-worker-0", "namespace": meta["namespace"],
        "labels": {"volcano.sh/job-name": meta["name"], "volcano.sh/task-spec": "worker",
                   "volcano.sh/task-index": "0"}}, "status": {"phase": "Running"}})
    cluster.logs[pod] = b"step 1\n"


def _needs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[Needs, Cluster]:
    """What submitting a job of the tests' fleet stack, plain and as a pipeline, and following each printed next
    step asks of the Role (the same kinds in every tenant's namespace: test_submit.py
    test_every_tenant_can_submit_a_job)."""
    stack = read_stack("fleet", OWNED_STACKS)
    template = yaml.safe_load(stack.values[WORKLOADS_KEY])[0]
    job_file, kubeconfig = tmp_path / "job.yaml", tmp_path / "kubeconfig"
    job_file.write_text(yaml.safe_dump({**template, "name": "submitted"}))
    needs: Needs = {}
    cluster = Cluster(tokens={TOKEN: tenant_rules()})
    with serving(cluster, kubeconfig, TOKEN):
        for pipeline in ([], ["--pipeline"]):
            assert cli(["submit", "--stack", "fleet", "--stacks-dir", str(OWNED_STACKS), "--job", str(job_file),
                        "--kubeconfig", str(kubeconfig), *pipeline]) == 0
            applied = [r.body for r in cluster.requests if r.method == "PATCH"]
            for manifest in applied:
                group, plural = manifest["apiVersion"].rpartition("/")[0], object_path(manifest).split("/")[-2]
                _add(needs, {(group, plural): APPLIED})
            if not pipeline:
                _worker_pod(cluster)
            for line in capsys.readouterr().out.splitlines()[1:]:
                command = line.split(": ", 1)[1] if line.startswith("Cancel it") else line.strip()
                if " -m trainyard submit " in command:
                    assert cli(shlex.split(command)[3:]) == 0, command  # `<python> -m trainyard submit ...`
                    capsys.readouterr()
                else:
                    _add(needs, _command_needs(command))
    for attributes in (a for r in cluster.requests for a in r.authorized):
        _add(needs, {(attributes.group, attributes.resource): {attributes.verb}})
    return needs, cluster


def test_the_role_allows_what_submit_does_and_nothing_more(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    needs, cluster = _needs(tmp_path, capsys)
    refused = [(r.method, r.path, r.status) for r in cluster.requests if r.status in (401, 403)]
    assert not refused, f"the Role refuses what submit and its printed steps do: {refused}"
    sent = {(r.method, r.attributes.resource) for r in cluster.requests}
    assert {("GET", "pods/log"), ("DELETE", "jobs"), ("GET", "podgroups"), ("GET", "events")} <= sent
    _add(needs, LIFECYCLE)
    _add(needs, SIGN_IN)
    granted = _granted()
    missing = {k: sorted(v - granted.get(k, set())) for k, v in needs.items() if v - granted.get(k, set())}
    assert not missing, f"the Role lacks {missing}"
    extra = {k: sorted(v - needs.get(k, set())) for k, v in granted.items() if v - needs.get(k, set())}
    assert not extra, f"the Role grants more than submit, its printed steps and a pipeline's life need: {extra}"


def test_the_stand_in_refuses_what_the_role_does_not_grant(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above can fail: without `delete` on Volcano Jobs, the printed `submit cancel` is refused."""
    rules: list[dict[str, Any]] = [
        {**r, "verbs": [v for v in r["verbs"] if v != "delete"]} if r["resources"] == ["jobs"] else r
        for r in tenant_rules()]
    monkeypatch.setattr(sys.modules[__name__], "tenant_rules", lambda: rules)
    with pytest.raises(AssertionError, match=r" submit cancel "):
        _needs(tmp_path, capsys)
    assert "cannot delete resource \"jobs\"" in capsys.readouterr().err
