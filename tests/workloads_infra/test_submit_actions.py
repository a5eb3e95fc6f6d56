"""`submit status`, `submit logs` and `submit cancel` (trainyard/job_control.py): the same job file and stack as
`submit`, the member's own kubeconfig, and the requests the Kubernetes Python client really sends, served and
authorized by a local API server stand-in (kube_stand_in.py) that holds the job `submit` applied there."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kube_stand_in import Cluster, collection_path, object_path, serving, write_kubeconfig
from owned_stacks import OWNED_STACKS
from trainyard.__main__ import main as cli
from trainyard.plan.runtime import read_stack
from trainyard.platform.tenant_access import tenant_rules
from trainyard.submit import WORKLOADS_KEY, render_job

TOKEN = "tenant-token"
UID = "0b0e6a55-2f1c-4b4e-9d4a-5a1ce5e0b001"


@pytest.fixture(scope="module")
def job_spec() -> dict[str, Any]:
    spec: dict[str, Any] = {**json.loads(read_stack("fleet", OWNED_STACKS).values[WORKLOADS_KEY])[1],
                            "name": "mine"}  # fleet's finetune-h200: elastic, 1 to 4 nodes
    return spec


@pytest.fixture(scope="module")
def manifests(job_spec: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    job_file = tmp_path_factory.mktemp("job") / "job.yaml"
    job_file.write_text(yaml.safe_dump(job_spec))
    return render_job(read_stack("fleet", OWNED_STACKS), job_spec, job_file)


def args(action: str, job_file: Path, kubeconfig: Path, *more: str) -> list[str]:
    return ["submit", action, "--stack", "fleet", "--stacks-dir", str(OWNED_STACKS), "--job", str(job_file),
            "--kubeconfig", str(kubeconfig), *more]


def _running(job: dict[str, Any]) -> dict[str, Any]:
    """The Job as the API server holds it once Volcano runs it, grown to three pods by the autoscaler (two there so
    far, one restarted once)."""
    (task,) = job["spec"]["tasks"]
    return {**job, "metadata": {**job["metadata"], "uid": UID},
            "spec": {**job["spec"], "tasks": [{**task, "replicas": 3}]},
            "status": {"state": {"phase": "Running"}, "minAvailable": 1, "running": 2, "retryCount": 1}}


def _pod(job: dict[str, Any], index: int, phase: str, node: str | None, restarts: int) -> dict[str, Any]:
    meta = job["metadata"]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{meta['name']}-worker-{index}", "namespace": meta["namespace"],
                         "labels": {"volcano.sh/job-name": meta["name"], "volcano.sh/task-spec": "worker",
                                    "volcano.sh/task-index": str(index)}},
            "spec": {"nodeName": node} if node else {},
            "status": {"phase": phase, "containerStatuses": [{"name": "trainer", "restartCount": restarts}]}}


def _event(namespace: str, kind: str, name: str, type_: str, reason: str, message: str, at: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Event", "type": type_, "reason": reason, "message": message,
            "lastTimestamp": at, "count": 1,
            "metadata": {"name": f"{name}.{reason.lower()}", "namespace": namespace},
            "involvedObject": {"kind": kind, "name": name, "namespace": namespace}}


@pytest.fixture
def cluster(manifests: list[dict[str, Any]], job_spec: dict[str, Any],
            tmp_path: Path) -> Iterator[tuple[Cluster, Path, Path]]:
    """A cluster holding the submitted job, running, and the member's kubeconfig for it."""
    (job,) = [m for m in manifests if m["kind"] == "Job"]
    meta = job["metadata"]
    state = Cluster(tokens={TOKEN: tenant_rules(), "other-tenant": []})
    for manifest in manifests:
        state.add(_running(manifest) if manifest is job else manifest)
    state.add({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
               "metadata": {"name": f"{meta['name']}-{UID}", "namespace": meta["namespace"]},
               "spec": {"minMember": 1}, "status": {"phase": "Running", "conditions": [
                   {"type": "Unschedulable", "status": "True", "reason": "NotEnoughResources",
                    "message": "1/2 tasks in gang unschedulable"}]}})
    worker0 = state.add(_pod(job, 0, "Running", "ip-10-0-1-7", 1))
    state.add(_pod(job, 1, "Pending", None, 0))
    state.add({**_pod(job, 0, "Running", "n", 0), "metadata": {"name": "other-worker-0", "namespace": meta["namespace"],
                                                               "labels": {"volcano.sh/job-name": "other"}}})
    ns = meta["namespace"]
    for event in (_event(ns, "Pod", f"{meta['name']}-worker-1", "Warning", "FailedScheduling",
                         "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.", "2026-12-01T18:02:00Z"),
                  _event(ns, "Pod", f"{meta['name']}-worker-0", "Normal", "Pulled", "image pulled",
                         "2026-12-01T18:01:00Z"),
                  _event(ns, "Job", meta["name"], "Normal", "ExecuteAction", "Start to execute action RestartPod",
                         "2026-12-01T18:03:00Z"),
                  _event(ns, "Pod", "other-worker-0", "Warning", "BackOff", "not this job's", "2026-12-01T18:04:00Z")):
        state.add(event)
    state.logs[worker0] = b"step 10 loss 2.5\nstep 20 loss 2.1\n"
    state.previous_logs[worker0] = b"SIGTERM: checkpoint step-00000010 committed\n"
    job_file, kubeconfig = tmp_path / "job.yaml", tmp_path / "kubeconfig"
    job_file.write_text(yaml.safe_dump(job_spec))
    with serving(state, kubeconfig, TOKEN):
        yield state, job_file, kubeconfig


def test_status_shows_the_job_its_podgroup_its_pods_and_the_events_worth_reading(
        cluster: tuple[Cluster, Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    state, job_file, kubeconfig = cluster
    assert cli(args("status", job_file, kubeconfig)) == 0
    out = capsys.readouterr().out.splitlines()
    job = next(o for o in state.objects.values() if o["kind"] == "Job")
    ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
    assert out[0] == (f"Volcano Job {ns}/{name}: Running (min available {job['spec']['minAvailable']}; pending 0, "
                      f"running 2, succeeded 0, failed 0; retries 1 of {job['spec']['maxRetry']})")
    assert out[1:3] == [f"PodGroup {name}-{UID}: Running (min member 1)",
                        "  Unschedulable: NotEnoughResources 1/2 tasks in gang unschedulable"]
    replicas = job["spec"]["tasks"][0]["replicas"]
    assert out[3:6] == [f"Task worker: 2 of {replicas} pods",
                        f"  {name}-worker-0  Running  restarts 1  node ip-10-0-1-7",
                        f"  {name}-worker-1  Pending  restarts 0  node -"]
    # The scheduler's and Volcano's reasons, oldest first; not the kubelet's routine, not another job's pods.
    assert out[6:] == ["Events (last 2):",
                       f"  2026-12-01T18:02:00Z  Warning  FailedScheduling  pod/{name}-worker-1: 0/3 nodes are "
                       "available: 3 Insufficient nvidia.com/gpu.",
                       f"  2026-12-01T18:03:00Z  Normal  ExecuteAction  job/{name}: Start to execute action RestartPod"]
    sent = [(r.method, r.path, r.query) for r in state.requests]
    assert sent == [
        ("GET", object_path(job), {}),
        ("GET", f"{collection_path('scheduling.volcano.sh/v1beta1', 'podgroups', ns)}/{name}-{UID}", {}),
        ("GET", collection_path("v1", "pods", ns), {"labelSelector": [f"volcano.sh/job-name={name}"]}),
        ("GET", collection_path("v1", "events", ns), {})]
    assert all(r.headers["authorization"] == f"Bearer {TOKEN}" for r in state.requests)


def test_status_before_volcano_made_the_podgroup(cluster: tuple[Cluster, Path, Path],
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    state, job_file, kubeconfig = cluster
    for path in [p for p, o in state.objects.items() if o["kind"] in ("PodGroup", "Pod", "Event")]:
        del state.objects[path]
    assert cli(args("status", job_file, kubeconfig)) == 0
    out = capsys.readouterr().out.splitlines()
    replicas = next(o for o in state.objects.values() if o["kind"] == "Job")["spec"]["tasks"][0]["replicas"]
    assert out[1:] == ["PodGroup: not created yet (Volcano's job controller makes it)",
                       f"Task worker: 0 of {replicas} pods", "Events: none worth showing"]


@pytest.mark.parametrize(("options", "query", "expected"), [
    ((), {"container": ["trainer"]}, b"step 10 loss 2.5\nstep 20 loss 2.1\n"),
    (("--follow",), {"container": ["trainer"], "follow": ["True"]}, b"step 10 loss 2.5\nstep 20 loss 2.1\n"),
    (("--previous", "--index", "0", "--task", "worker"), {"container": ["trainer"], "previous": ["True"]},
     b"SIGTERM: checkpoint step-00000010 committed\n"),
])
def test_logs_read_the_chosen_pods_trainer(cluster: tuple[Cluster, Path, Path],
                                           capfdbinary: pytest.CaptureFixture[bytes], options: tuple[str, ...],
                                           query: dict[str, list[str]], expected: bytes) -> None:
    state, job_file, kubeconfig = cluster
    assert cli(args("logs", job_file, kubeconfig, *options)) == 0
    assert capfdbinary.readouterr().out == expected
    job = next(o for o in state.objects.values() if o["kind"] == "Job")
    ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
    (log,) = [r for r in state.requests if r.path.endswith("/log")]
    assert (log.method, log.path, log.query) == ("GET", f"{collection_path('v1', 'pods', ns)}/{name}-worker-0/log",
                                                 query)


def test_logs_name_what_is_not_there(cluster: tuple[Cluster, Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    state, job_file, kubeconfig = cluster
    job = next(o for o in state.objects.values() if o["kind"] == "Job")
    replicas = job["spec"]["tasks"][0]["replicas"]
    assert cli(args("logs", job_file, kubeconfig, "--task", "master")) == 2
    assert capsys.readouterr().err == f"error: --task 'master': job {job['metadata']['name']} has tasks worker\n"
    assert cli(args("logs", job_file, kubeconfig, "--index", str(replicas))) == 2
    assert capsys.readouterr().err == (f"error: --index {replicas}: task worker has {replicas} pods (indexes 0 to "
                                       f"{replicas - 1})\n")
    assert cli(args("logs", job_file, kubeconfig, "--index", "2")) == 2  # in range, never scheduled
    err = capsys.readouterr().err
    assert err.startswith(f"error: log of pod {job['metadata']['namespace']}/{job['metadata']['name']}-worker-2: "
                          "pod ") and "does not exist now" in err and err.count("\n") == 1
    assert cli(args("logs", job_file, kubeconfig, "--index", "1", "--previous")) == 2
    err = capsys.readouterr().err
    assert "(previous container): the API server refused it (400): previous terminated container" in err


def test_cancel_deletes_the_job_in_the_foreground_and_keeps_the_checkpoints(
        cluster: tuple[Cluster, Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    state, job_file, kubeconfig = cluster
    job = next(o for o in state.objects.values() if o["kind"] == "Job")
    ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
    claim = next(o for o in state.objects.values() if o["kind"] == "PersistentVolumeClaim")["metadata"]["name"]
    assert cli(args("cancel", job_file, kubeconfig)) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"cancelled Volcano Job {ns}/{name}: ")
    assert f"Kept: its checkpoints in claim {claim} (submitting the same job again resumes" in out
    (delete,) = [r for r in state.requests if r.method == "DELETE"]
    assert delete.path == object_path(job)
    assert delete.body == {"propagationPolicy": "Foreground"}  # pods and PodGroup go first (garbage collector)
    assert object_path(job) not in state.objects
    assert {o["kind"] for o in state.objects.values()} >= {"PersistentVolumeClaim", "ConfigMap"}
    assert cli(args("cancel", job_file, kubeconfig)) == 2  # gone now
    assert capsys.readouterr().err == (f"error: Volcano Job {ns}/{name}: no such job (not submitted yet, or "
                                       "cancelled)\n")


@pytest.mark.parametrize("action", ["status", "logs", "cancel"])
def test_a_member_of_another_tenant_is_refused_in_one_line(cluster: tuple[Cluster, Path, Path], action: str,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    state, job_file, kubeconfig = cluster
    write_kubeconfig(kubeconfig, yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"],
                     "other-tenant")
    job = next(o for o in state.objects.values() if o["kind"] == "Job")
    ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
    assert cli(args(action, job_file, kubeconfig)) == 2
    assert capsys.readouterr().err == (
        f'error: Volcano Job {ns}/{name}: the API server refused it (403): jobs.batch.volcano.sh "{name}" is '
        f'forbidden: User "other-tenant" cannot get resource "jobs" in API group "batch.volcano.sh" in the '
        f'namespace "{ns}"\n')
    assert object_path(job) in state.objects


def test_no_kubeconfig_and_no_api_server_are_one_line(job_spec: dict[str, Any], tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(job_spec))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    base = ["submit", "status", "--stack", "fleet", "--stacks-dir", str(OWNED_STACKS), "--job", str(job_file)]
    assert cli(base) == 2
    assert capsys.readouterr().err == (f"error: no kubeconfig: none at {tmp_path}/.kube/config; pass --kubeconfig (on "
                                       "AWS `aws eks update-kubeconfig --name <cluster>` writes one)\n")
    assert cli([*base, "--kubeconfig", str(tmp_path / "nowhere")]) == 2
    assert capsys.readouterr().err == f"error: --kubeconfig {tmp_path / 'nowhere'}: no such file\n"
    with socket.socket() as probe:  # bound, never listening: nothing can listen on its port while it is held
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        write_kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{port}", TOKEN)
        assert cli([*base, "--kubeconfig", str(tmp_path / "kubeconfig")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: Volcano Job ")
    assert f"cannot reach the API server at http://127.0.0.1:{port}: " in err and err.count("\n") == 1
    assert "Traceback" not in err


def test_a_bad_job_file_is_refused_before_any_request(tmp_path: Path, job_spec: dict[str, Any],
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump({**job_spec, "tenant": "nobody"}))
    state = Cluster(tokens={TOKEN: tenant_rules()})
    with serving(state, tmp_path / "kubeconfig", TOKEN):
        assert cli(args("status", job_file, tmp_path / "kubeconfig")) == 2
    assert "job.yaml: tenant: unknown tenant 'nobody'" in capsys.readouterr().err
    assert state.requests == []
