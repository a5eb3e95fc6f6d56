"""`python -m trainyard submit` (trainyard/submit.py): a tenant's job file rendered by the stack's own code, checked
before anything is written or sent, and applied with server-side apply (against a local stand-in for the API server,
kube_stand_in.py, that records each request and authorizes it with the tenant-user Role)."""

from __future__ import annotations

import copy
import json
import shlex
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kube_stand_in import Cluster, serving
from owned_stacks import OWNED_STACKS, planned
from trainyard import submit
from trainyard.__main__ import main as cli
from trainyard.config.yaml_input import InputError
from trainyard.plan.conformance import check_manifest
from trainyard.plan.runtime import STACKS_DIR, StackFile, available_stacks, read_stack, settings_of
from trainyard.plan.writers import is_kubernetes_object, manifest_of
from trainyard.platform.tenant_access import tenant_rules
from trainyard.platform.tenants import queue_name
from trainyard.submit import FIELD_MANAGER, WORKLOADS_KEY, apply, apply_requests, render_job
from trainyard.workloads.pod import JOB_LABEL

# The sample stacks a user may edit (expectations derive from their data) and the tests' own (fixed expectations).
SAMPLE = [(name, None) for name in available_stacks()]
OWNED = [("fleet", OWNED_STACKS), ("laptop", OWNED_STACKS)]


def stack_of(name: str, where: Path | None) -> StackFile:
    return read_stack(name) if where is None else read_stack(name, where)


def fleet() -> StackFile:
    return read_stack("fleet", OWNED_STACKS)


def cli_args(*args: str) -> list[str]:
    return ["submit", "--stack", "fleet", "--stacks-dir", str(OWNED_STACKS), *args]


def jobs_of(stack: StackFile) -> list[dict[str, Any]]:
    jobs: list[dict[str, Any]] = json.loads(stack.values.get(WORKLOADS_KEY, "[]"))
    return jobs


def without(stack: StackFile, name: str) -> StackFile:
    rest = [j for j in jobs_of(stack) if j["name"] != name]
    return StackFile(stack.stack, {**stack.values, WORKLOADS_KEY: json.dumps(rest)}, stack.secret_keys)


def write_job(tmp_path: Path, spec: dict[str, Any]) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def with_jobs(stacks: list[tuple[str, Path | None]]) -> list[tuple[str, Path | None]]:
    return [(name, where) for name, where in stacks if jobs_of(stack_of(name, where))]


@pytest.mark.parametrize(("stack_name", "where"), with_jobs(SAMPLE) + OWNED)
def test_a_submitted_job_is_exactly_what_the_stack_would_deploy(stack_name: str, where: Path | None,
                                                                 tmp_path: Path) -> None:
    """One source of truth: each job of the stack, taken out of it and submitted by a tenant instead, gives the same
    objects, field for field, as `pulumi up` creates for it in the stack."""
    stack = stack_of(stack_name, where)
    recording = planned((stack_name, where or STACKS_DIR)).recording  # the stack's program, as plan runs it
    for spec in jobs_of(stack):
        _same_as_deployed(stack, recording.resources, spec, tmp_path)


def _same_as_deployed(stack: StackFile, resources: list[Any], spec: dict[str, Any], tmp_path: Path) -> None:
    deployed = sorted((manifest_of(r) for r in resources if is_kubernetes_object(r)
                       and (r.inputs.get("metadata") or {}).get("labels", {}).get(JOB_LABEL) == spec["name"]),
                      key=lambda m: (m["kind"], m["metadata"]["name"]))
    submitted = sorted(render_job(without(stack, spec["name"]), spec, write_job(tmp_path, spec)),
                       key=lambda m: (m["kind"], m["metadata"]["name"]))
    assert [m["kind"] for m in submitted] == [m["kind"] for m in deployed] and "Job" in {m["kind"] for m in submitted}
    assert submitted == deployed


@pytest.mark.parametrize(("stack_name", "where"), with_jobs(SAMPLE) + OWNED)
def test_every_tenant_can_submit_a_job(stack_name: str, where: Path | None, tmp_path: Path) -> None:
    stack = stack_of(stack_name, where)
    settings = settings_of(stack)
    template = jobs_of(stack)[0]
    for tenant in settings.tenants:
        spec = {**template, "name": f"submitted-{tenant.name}"[:52], "tenant": tenant.name}
        manifests = render_job(stack, spec, write_job(tmp_path, spec))
        (job,) = [m for m in manifests if m["kind"] == "Job"]
        assert job["metadata"]["namespace"] == tenant.namespace_name
        assert job["spec"]["queue"] == queue_name(tenant)  # the one queue its namespace may use
        assert {m["metadata"]["namespace"] for m in manifests} == {tenant.namespace_name}  # nothing outside it


JobObjects = Callable[[StackFile, dict[str, Any], Path], list[dict[str, Any]]]


@pytest.fixture
def job_objects(monkeypatch: pytest.MonkeyPatch) -> JobObjects:
    """render_job for the test and for the CLI it runs, one render per stack and job between them: each renders the
    whole program (1-2 CPU-s), and the tests hold what the CLI does with the objects, not two runs of one function."""
    made: dict[str, list[dict[str, Any]]] = {}
    real = submit.render_job

    def shared(stack: StackFile, spec: dict[str, Any], job_file: Path) -> list[dict[str, Any]]:
        key = json.dumps([stack.stack, stack.values, sorted(stack.secret_keys), spec], sort_keys=True)
        if key not in made:
            made[key] = real(stack, spec, job_file)
        return copy.deepcopy(made[key])

    monkeypatch.setattr(submit, "render_job", shared)
    return shared


def bad(tmp_path: Path, capsys: pytest.CaptureFixture[str], spec: Any) -> str:
    path = tmp_path / "job.yaml"
    path.write_text(spec if isinstance(spec, str) else yaml.safe_dump(spec))
    out = tmp_path / "out"
    assert cli(cli_args("--job", str(path), "--out", str(out))) == 2
    assert not out.exists()  # nothing written
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and captured.out == ""
    return captured.err


def test_bad_job_files_are_refused_by_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stack = fleet()
    good = {**jobs_of(stack)[1], "name": "mine"}  # fleet's finetune-h200: elastic, 1 to 4 nodes
    tenants = sorted(t.name for t in settings_of(stack).tenants)

    err = bad(tmp_path, capsys, {**good, "tenant": "nobody"})
    assert f"job.yaml: tenant: unknown tenant 'nobody'; tenants: {', '.join(tenants)}" in err
    err = bad(tmp_path, capsys, {**good, "nodePool": "nowhere"})
    assert "job.yaml: nodePool: unknown pool 'nowhere'" in err
    err = bad(tmp_path, capsys, {**good, "minNodes": 2, "maxNodes": 1, "gpuPerNode": 1})
    assert "job.yaml: minNodes: 2 is greater than maxNodes 1" in err
    assert "job.yaml: gpuPerNode:" in err  # a misspelt key is named, not ignored
    assert err.startswith("error: 2 problems; nothing was written or sent:")
    err = bad(tmp_path, capsys, {**good, "trainerConfig": "../../etc/passwd"})
    assert "job.yaml: trainerConfig: '../../etc/passwd' must be the name of a file in workloads/configs/" in err
    err = bad(tmp_path, capsys, {**good, "name": "pretrain-h100"})
    assert "name: 'pretrain-h100' is a job of stack 'fleet' itself" in err
    err = bad(tmp_path, capsys, "- just\n- a list\n")
    assert "job.yaml: expected a map of job keys" in err
    err = bad(tmp_path, capsys, "name: [unclosed\n")
    assert "job.yaml" in err and err.count("\n") <= 2


def test_a_trainer_config_the_gpus_cannot_hold_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = {**jobs_of(fleet())[0], "name": "too-big", "trainerConfig": "llama-7b.yaml", "minNodes": 1,
            "maxNodes": 1, "gpusPerNode": 1, "autoscaling": {"enabled": False}}  # 7B with AdamW on one 80 GB H100
    err = bad(tmp_path, capsys, good)
    assert "job.yaml: trainerConfig: the trainer refuses its config (/etc/trainyard/llama-7b.yaml" in err
    assert "more than the GPU's" in err and err.count("\n") == 1


def test_a_missing_job_file_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(cli_args("--job", str(tmp_path / "none.yaml"), "--dry-run")) == 2
    assert f"--job {tmp_path / 'none.yaml'}: no such file" in capsys.readouterr().err


def test_dry_run_prints_the_manifests(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                      job_objects: JobObjects) -> None:
    stack = fleet()
    spec = {**jobs_of(stack)[1], "name": "printed"}
    assert cli(cli_args("--job", str(write_job(tmp_path, spec)), "--dry-run")) == 0
    printed = list(yaml.safe_load_all(capsys.readouterr().out))
    assert printed == job_objects(stack, spec, tmp_path / "job.yaml")


@pytest.fixture
def api_server(tmp_path: Path) -> Iterator[tuple[Path, Cluster]]:
    """An API server stand-in where the kubeconfig's token is a tenant member's (the tenant-user Role's rules)."""
    kubeconfig = tmp_path / "kubeconfig"
    with serving(Cluster(tokens={"tenant-token": tenant_rules(), "someone-else": []}), kubeconfig,
                 "tenant-token") as cluster:
        yield kubeconfig, cluster


def test_apply_sends_each_manifest_as_a_server_side_apply(tmp_path: Path, api_server: Any,
                                                         capsys: pytest.CaptureFixture[str],
                                                         job_objects: JobObjects) -> None:
    kubeconfig, cluster = api_server
    stack = fleet()
    spec = {**jobs_of(stack)[1], "name": "applied"}
    manifests = job_objects(stack, spec, write_job(tmp_path, spec))
    assert cli(cli_args("--job", str(tmp_path / "job.yaml"), "--kubeconfig", str(kubeconfig))) == 0
    seen = cluster.requests
    assert [(r.method, r.path, r.body) for r in seen] == [("PATCH", *r) for r in apply_requests(manifests)]
    assert all(r.status == 201 for r in seen)  # each created, as the member's Role allows (create + patch)
    # What the Job mounts goes first: its pods never start on a missing ConfigMap or claim.
    assert [r.body["kind"] for r in seen][:3] == ["ConfigMap", "PersistentVolumeClaim", "Job"]
    for request in seen:
        assert request.headers["content-type"] == "application/apply-patch+yaml"
        assert request.headers["authorization"] == "Bearer tenant-token"
        assert request.query == {"fieldManager": [FIELD_MANAGER], "force": ["true"]}
    namespace = manifests[0]["metadata"]["namespace"]
    assert f"/apis/batch.volcano.sh/v1alpha1/namespaces/{namespace}/jobs/applied" in [r.path for r in seen]
    again = ["--stack", "fleet", "--stacks-dir", str(OWNED_STACKS), "--job", str(tmp_path / "job.yaml"),
             "--kubeconfig", str(kubeconfig)]
    printed = capsys.readouterr().out.splitlines()
    python = shlex.join([str(Path(sys.executable).relative_to(Path.cwd())), "-m", "trainyard", "submit"])
    assert printed == [f"submitted {namespace}/applied ({len(manifests)} objects). Follow it:",
                       f"  {python} status {shlex.join(again)}",
                       f"  {python} logs {shlex.join(again)} --follow",
                       f"  kubectl -n {namespace} get vcjob applied -w",
                       f"Cancel it (the checkpoint claim stays): {python} cancel {shlex.join(again)}"]


def test_a_refused_apply_is_one_line(tmp_path: Path, api_server: Any) -> None:
    kubeconfig, cluster = api_server
    other = yaml.safe_load(kubeconfig.read_text())
    other["users"][0]["user"]["token"] = "someone-else"
    kubeconfig.write_text(yaml.safe_dump(other))
    stack = fleet()
    spec = {**jobs_of(stack)[1], "name": "denied"}
    manifests = render_job(stack, spec, write_job(tmp_path, spec))
    namespace = manifests[0]["metadata"]["namespace"]
    with pytest.raises(InputError) as refused:
        apply(manifests, kubeconfig, None)
    assert str(refused.value) == (
        f'ConfigMap {namespace}/denied-trainer-config: the API server refused it (403): configmaps '
        f'"denied-trainer-config" is forbidden: User "someone-else" cannot patch resource "configmaps" in API group '
        f'"" in the namespace "{namespace}"')
    assert len(cluster.requests) == 1  # nothing sent after the refusal


@pytest.mark.parametrize(("stack_name", "where"), with_jobs(SAMPLE) + OWNED)
def test_the_pipeline_is_a_valid_workflow_template_around_the_same_job(stack_name: str, where: Path | None,
                                                                        tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str],
                                                                        job_objects: JobObjects) -> None:
    stack = stack_of(stack_name, where)
    settings = settings_of(stack)
    spec = {**jobs_of(stack)[0], "name": "piped"}
    job_file = write_job(tmp_path, spec)
    stacks_dir = ["--stacks-dir", str(where)] if where is not None else []
    assert cli(["submit", "--stack", stack_name, *stacks_dir, "--job", str(job_file), "--pipeline", "--dry-run"]) == 0
    printed = list(yaml.safe_load_all(capsys.readouterr().out))
    manifests = job_objects(stack, spec, job_file)
    (template,) = [m for m in printed if m["kind"] == "WorkflowTemplate"]
    # The job's other objects as they are; the Job itself only inside the workflow's train step.
    assert [m for m in printed if m["kind"] != "WorkflowTemplate"] == [m for m in manifests if m["kind"] != "Job"]
    assert check_manifest(template, settings.cluster.kubernetes_version) == []  # Argo v4.0.6's CRD schema
    steps = {t["name"]: t for t in template["spec"]["templates"]}
    (job,) = [m for m in manifests if m["kind"] == "Job"]
    trained = yaml.safe_load(steps["train"]["resource"]["manifest"])
    job_container = job["spec"]["tasks"][0]["template"]["spec"]["containers"][0]
    train_container = trained["spec"]["tasks"][0]["template"]["spec"]["containers"][0]
    assert train_container["args"][:len(job_container["args"])] == job_container["args"]
    assert train_container["args"][len(job_container["args"]):] == [
        "data.path=/checkpoints/data/{{workflow.parameters.data-version}}", "data.generate=false",
        "train.steps={{workflow.parameters.steps}}"]
    train_container["args"] = job_container["args"]  # otherwise the very Job, less the plan's checkov notes
    assert trained == {**job, "metadata": {k: v for k, v in job["metadata"].items() if k != "annotations"}}
    for name in ("prepare", "evaluate", "register"):
        container = steps[name]["container"]
        assert container["image"] == spec["image"]
        assert container["securityContext"] == job_container["securityContext"]
    assert steps["evaluate"]["container"]["resources"] == job_container["resources"]  # measured on the job's GPUs
    assert template["spec"]["serviceAccountName"] == "workflow"
