"""The workload layer's rendered objects (platform double, see jobs_render): one job of each kind in the stacks the
tests own (fixed expectations), and every job of every stack in stacks/ (expectations that hold for any job)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from jobs_render import (
    CEPHFS_CLASS,
    DATASET_CLAIM,
    PRIORITY_CLASS,
    REPO_ROOT,
    rendered,
    volcano_jobs,
    volcano_schema_errors,
)
from trainyard.config.instance_types import INSTANCE_TYPES
from trainyard.plan.recording import Recording, ResourceRecord
from trainyard.plan.runtime import available_stacks
from trainyard.workloads.launch import (
    CONFIG_ERROR_EXIT_CODE,
    RDZV_LAST_CALL_TIMEOUT,
    RDZV_PORT,
    SINGLE_NODE_WRAPPER,
    STORE_LOST_EXIT_CODE,
    TRAINER_ELASTIC_WRAPPER,
)

GIB = 1024**3


def _job(recording: Recording, name: str) -> ResourceRecord:
    return volcano_jobs(recording)[name]


def _pod(record: ResourceRecord) -> dict[str, Any]:
    tasks = record.inputs["spec"]["tasks"]
    assert len(tasks) == 1 and tasks[0]["name"] == "worker"
    return dict(tasks[0]["template"])


def _container(record: ResourceRecord) -> dict[str, Any]:
    (container,) = _pod(record)["spec"]["containers"]
    return dict(container)


def _env(record: ResourceRecord) -> dict[str, str]:
    return {e["name"]: e["value"] for e in _container(record).get("env", [])}


def _of_type(recording: Recording, type_: str) -> list[ResourceRecord]:
    return [r for r in recording.resources if r.type == type_]


def _urn_of(recording: Recording, type_: str, name: str) -> str:
    return next(r.urn for r in recording.resources if r.type == type_ and r.name == name)


def _mebibytes(quantity: str) -> int:
    assert quantity.endswith("Mi"), quantity
    return int(quantity[:-2])


# --- fleet: the elastic pretraining job on the H100 EFA pool --------------------------------------------------

def test_elastic_gang_queue_priority_and_retries(fleet: Recording) -> None:
    spec = _job(fleet, "pretrain-h100").inputs["spec"]
    assert spec["schedulerName"] == "volcano"
    assert spec["queue"] == "foundation"
    assert spec["priorityClassName"] == PRIORITY_CLASS
    assert _pod(_job(fleet, "pretrain-h100"))["spec"]["priorityClassName"] == PRIORITY_CLASS
    assert spec["minAvailable"] == 2  # minNodes: the gang
    assert spec["tasks"][0]["replicas"] == 8  # maxNodes: autoscaling on, grows into free capacity
    assert spec["maxRetry"] >= 10
    assert set(spec["plugins"]) == {"svc", "env"}
    assert "--disable-network-policy=true" in spec["plugins"]["svc"]


def test_elastic_without_autoscaling_keeps_its_minimum_size(fleet: Recording) -> None:
    spec = _job(fleet, "finetune-h200").inputs["spec"]
    assert spec["minAvailable"] == 1 and spec["tasks"][0]["replicas"] == 1
    assert "--nnodes=1:4" in _container(_job(fleet, "finetune-h200"))["args"]


def test_elastic_restart_policies_restart_only_the_lost_pod(fleet: Recording) -> None:
    spec = _job(fleet, "pretrain-h100").inputs["spec"]
    # In order: the config-error exit code ends the job before the PodFailed policy could restart it; any other
    # failed pod (an evicted one turns Failed first) is recreated alone, never the whole gang.
    # The rendezvous store's loss (worker-0 gone) fails every other pod with one code: one RestartJob, not a
    # RestartPod (and a retry) per survivor.
    assert spec["policies"] == [
        {"exitCode": CONFIG_ERROR_EXIT_CODE, "action": "TerminateJob"},
        {"exitCode": STORE_LOST_EXIT_CODE, "action": "RestartJob"},
        {"event": "PodFailed", "action": "RestartPod"},
    ]
    # Never: a non-zero exit fails the pod, the only time Volcano reads its exit code (no in-place restart).
    assert _pod(_job(fleet, "pretrain-h100"))["spec"]["restartPolicy"] == "Never"
    assert spec["minSuccess"] == spec["minAvailable"]


@pytest.mark.parametrize("job", ["pretrain-h100", "eval-mig", "smoke"])
def test_launch_line_exits_with_the_final_code_on_a_config_error_before_torchrun(
    fleet: Recording, tmp_path: Path, job: str
) -> None:
    """Run the rendered command itself: the config it names is not here, so the node agent must fail it with
    one line and the config-error code before any rendezvous (none could start here: the endpoint does not
    resolve, and the agent would say so instead)."""
    container = _container(_job(fleet, job))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # A script, not a symlink: the venv's interpreter finds its site-packages (torch) through its own path.
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    (bin_dir / "python").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "VC_TASK_INDEX": "0",
           "PYTHONPATH": str(REPO_ROOT / "workloads")}
    done = subprocess.run([*container["command"], *container["args"]], env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == CONFIG_ERROR_EXIT_CODE, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"trainyard_train: config error: --config: cannot read /etc/trainyard/{_config_name(container)}: "
        "No such file or directory"
    ]


def _config_name(container: dict[str, Any]) -> str:
    args = container["args"]
    return str(args[args.index("--config") + 1]).rsplit("/", 1)[1]


def test_torchrun_elastic_command_has_explicit_rendezvous(fleet: Recording) -> None:
    container = _container(_job(fleet, "pretrain-h100"))
    assert container["command"] == ["sh", "-c", TRAINER_ELASTIC_WRAPPER, "torchrun"]
    # The wrapper only adds is_host for worker 0 and execs the trainer's node agent with the container args.
    script = shlex.split(container["command"][2].split("exec ", 1)[1])
    assert script[:3] == ["python", "-m", "trainyard_train.agent"] and script[-1] == "$@"
    # Once MIN nodes joined, wait seconds (not c10d's default 30) for more before starting.
    assert f"last_call_timeout={RDZV_LAST_CALL_TIMEOUT}" in script[3] and RDZV_LAST_CALL_TIMEOUT <= 10
    args = container["args"]
    assert "--nnodes=2:8" in args
    assert "--nproc-per-node=8" in args
    assert "--rdzv-backend=c10d" in args
    assert f"--rdzv-endpoint=pretrain-h100-worker-0.pretrain-h100.foundation.svc:{RDZV_PORT}" in args
    assert "--rdzv-id=foundation-pretrain-h100" in args
    assert any(a.startswith("--max-restarts=") and int(a.split("=")[1]) > 0 for a in args)
    module = args[args.index("-m"):]
    assert module[:4] == ["-m", "trainyard_train", "--config", "/etc/trainyard/gpt-small.yaml"]
    assert "run_dir=/checkpoints" in module


def test_gpu_and_efa_resources_are_requested_and_limited(fleet: Recording) -> None:
    resources = _container(_job(fleet, "pretrain-h100"))["resources"]
    assert resources["requests"] == resources["limits"]  # Guaranteed QoS
    assert resources["limits"]["nvidia.com/gpu"] == "8"
    assert resources["limits"]["vpc.amazonaws.com/efa"] == "32"  # p5.48xlarge's EFA interfaces
    p5 = INSTANCE_TYPES["p5.48xlarge"]
    cpu = int(resources["limits"]["cpu"])
    memory = _mebibytes(resources["limits"]["memory"]) * 2**20
    # All 8 GPUs: nearly the whole node, minus headroom for the kubelet and DaemonSets.
    assert 0.8 * p5.vcpu <= cpu < p5.vcpu
    assert 0.8 * p5.memory_gib * GIB <= memory < p5.memory_gib * GIB


def test_efa_env_only_on_efa_pools(fleet: Recording) -> None:
    efa_env = _env(_job(fleet, "pretrain-h100"))
    assert efa_env["FI_PROVIDER"] == "efa"
    # NCCL must use the EFA plugin or fail, never fall back to TCP sockets unnoticed.
    assert efa_env["NCCL_NET"] == "Libfabric"
    for name in ("eval-mig", "smoke"):
        env = _env(_job(fleet, name))
        assert not {k for k in env if k.startswith(("FI_", "NCCL_"))}, name
        assert "vpc.amazonaws.com/efa" not in _container(_job(fleet, name))["resources"]["limits"]


def test_gpu_toleration_and_pool_selector(fleet: Recording) -> None:
    spec = _pod(_job(fleet, "pretrain-h100"))["spec"]
    assert spec["nodeSelector"] == {"trainyard.io/pool": "h100"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]


def test_pods_of_a_multi_node_job_share_a_zone(fleet: Recording) -> None:
    (term,) = _pod(_job(fleet, "pretrain-h100"))["spec"]["affinity"]["podAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "topology.kubernetes.io/zone"
    assert term["labelSelector"]["matchLabels"] == {"trainyard.io/job": "pretrain-h100"}
    assert _pod(_job(fleet, "pretrain-h100"))["metadata"]["labels"]["trainyard.io/job"] == "pretrain-h100"
    assert "affinity" not in _pod(_job(fleet, "eval-mig"))["spec"]


def test_checkpoint_claim_is_rwx_cephfs_and_protected(fleet: Recording) -> None:
    claim = next(r for r in _of_type(fleet, "kubernetes:core/v1:PersistentVolumeClaim")
                 if r.inputs["metadata"]["name"] == "pretrain-h100-checkpoints")
    assert claim.inputs["spec"]["accessModes"] == ["ReadWriteMany"]
    assert claim.inputs["spec"]["storageClassName"] == CEPHFS_CLASS
    assert claim.inputs["spec"]["resources"]["requests"]["storage"] == "2Ti"
    assert claim.protect and claim.retain_on_delete
    assert claim.urn in _job(fleet, "pretrain-h100").depends_on


def test_volumes_checkpoints_dataset_read_only_and_shm(fleet: Recording) -> None:
    pod = _pod(_job(fleet, "pretrain-h100"))["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m for m in _container(_job(fleet, "pretrain-h100"))["volumeMounts"]}
    assert volumes["checkpoints"]["persistentVolumeClaim"]["claimName"] == "pretrain-h100-checkpoints"
    assert mounts["checkpoints"]["mountPath"] == "/checkpoints" and not mounts["checkpoints"].get("readOnly")
    assert volumes["dataset"]["persistentVolumeClaim"] == {"claimName": DATASET_CLAIM, "readOnly": True}
    assert mounts["dataset"] == {"name": "dataset", "mountPath": "/data", "readOnly": True,
                                 "mountPropagation": "HostToContainer"}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "64Gi"}
    assert mounts["dshm"]["mountPath"] == "/dev/shm"
    assert volumes["trainer-config"]["configMap"]["name"] == "pretrain-h100-trainer-config"
    assert mounts["trainer-config"]["mountPath"] == "/etc/trainyard"


def test_trainer_config_map_carries_the_config_file(fleet: Recording) -> None:
    config_map = next(r for r in _of_type(fleet, "kubernetes:core/v1:ConfigMap")
                      if r.inputs["metadata"]["name"] == "pretrain-h100-trainer-config")
    text = (REPO_ROOT / "workloads" / "configs" / "gpt-small.yaml").read_text(encoding="utf-8")
    assert config_map.inputs["data"] == {"gpt-small.yaml": text}
    assert config_map.inputs["metadata"]["namespace"] == "foundation"


def test_grace_periods_are_ordered(fleet: Recording) -> None:
    for name in ("pretrain-h100", "eval-mig", "smoke"):
        pod = _pod(_job(fleet, name))
        trainer_grace = int(next(a for a in _container(_job(fleet, name))["args"]
                                 if a.startswith("shutdown.grace_period_s=")).split("=")[1])
        torchrun_grace = int(next(a for a in _container(_job(fleet, name))["args"]
                                  if a.startswith("--shutdown-timeout=")).split("=")[1])
        assert trainer_grace == 100  # checkpointGraceSeconds default
        # trainer checkpoints < torchrun waits for it < kubelet's SIGKILL
        assert trainer_grace < torchrun_grace < pod["spec"]["terminationGracePeriodSeconds"]
        # Karpenter's interruption drain skips do-not-disrupt pods: the trainer would get no SIGTERM.
        assert "karpenter.sh/do-not-disrupt" not in pod["metadata"].get("annotations", {})
        assert pod["spec"]["serviceAccountName"] == "trainer"


def test_shm_fits_in_the_memory_limit(fleet: Recording) -> None:
    for name, shm_gib in (("pretrain-h100", 64), ("eval-mig", 4)):
        memory = _mebibytes(_container(_job(fleet, name))["resources"]["limits"]["memory"])
        assert memory * 2**20 > shm_gib * GIB


def test_pod_monitor_scrapes_metrics_port_after_monitoring(fleet: Recording) -> None:
    monitor = next(r for r in _of_type(fleet, "kubernetes:monitoring.coreos.com/v1:PodMonitor")
                   if r.inputs["metadata"]["name"] == "pretrain-h100-trainer")
    assert monitor.inputs["spec"]["selector"]["matchLabels"] == {"trainyard.io/job": "pretrain-h100"}
    assert monitor.inputs["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    assert _urn_of(fleet, "trainyard:test:Monitoring", "monitoring") in monitor.depends_on
    ports = {p["name"]: p["containerPort"] for p in _container(_job(fleet, "pretrain-h100"))["ports"]}
    assert ports["metrics"] == 9108 and _env(_job(fleet, "pretrain-h100"))["TRAINYARD_METRICS_PORT"] == "9108"


def test_jobs_wait_for_tenant_and_volcano(fleet: Recording) -> None:
    volcano = _urn_of(fleet, "trainyard:test:Volcano", "volcano")
    for name, tenant in (("pretrain-h100", "foundation"), ("eval-mig", "eval"), ("smoke", "research")):
        depends_on = _job(fleet, name).depends_on
        assert volcano in depends_on
        assert _urn_of(fleet, "trainyard:test:TenantReady", tenant) in depends_on


def test_components_parent_their_resources(fleet: Recording) -> None:
    kinds = {"pretrain-h100": "ElasticTrainingJob", "eval-mig": "MigTrainingJob", "smoke": "SmokeTrainingJob"}
    for name, kind in kinds.items():
        parent = _urn_of(fleet, f"trainyard:workloads:{kind}", name)
        assert _job(fleet, name).parent == parent
        owned = {r.type for r in fleet.resources if r.parent == parent}
        assert {"kubernetes:core/v1:ConfigMap", "kubernetes:core/v1:PersistentVolumeClaim",
                "kubernetes:batch.volcano.sh/v1alpha1:Job", "kubernetes:monitoring.coreos.com/v1:PodMonitor"} <= owned


# --- fleet: MIG and smoke jobs ------------------------------------------------------------------------------

def test_mig_job_requests_one_slice_on_the_mig_pool(fleet: Recording) -> None:
    record = _job(fleet, "eval-mig")
    resources = _container(record)["resources"]
    assert resources["limits"]["nvidia.com/mig-2g.20gb"] == "1"
    assert resources["requests"] == resources["limits"]
    assert "nvidia.com/gpu" not in resources["limits"]
    spec = record.inputs["spec"]
    assert spec["minAvailable"] == 1 and spec["tasks"][0]["replicas"] == 1 and spec["queue"] == "eval"
    pod = _pod(record)["spec"]
    assert pod["nodeSelector"] == {"trainyard.io/pool": "h100-mig"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    args = _container(record)["args"]
    assert args[:3] == ["--standalone", "--nnodes=1", "--nproc-per-node=1"]
    # A slice's share of a p5 node: 8 GPUs x the layout's slices per GPU share the node's CPU and memory.
    assert int(resources["limits"]["cpu"]) < INSTANCE_TYPES["p5.48xlarge"].vcpu // 8


def test_smoke_job_is_a_short_single_node_run_that_fails_visibly(fleet: Recording) -> None:
    record = _job(fleet, "smoke")
    container = _container(record)
    assert container["command"] == ["sh", "-c", SINGLE_NODE_WRAPPER, "torchrun"]
    assert container["args"][:4] == ["--standalone", "--nnodes=1", "--nproc-per-node=1", "--max-restarts=0"]
    assert any(a.startswith("train.steps=") for a in container["args"])
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    spec = record.inputs["spec"]
    assert spec["maxRetry"] == 0
    assert spec["policies"] == [{"event": "PodFailed", "action": "TerminateJob"}]
    assert _pod(record)["spec"]["restartPolicy"] == "Never"


# --- laptop: CPU only --------------------------------------------------------------------------------------

def test_local_smoke_job_is_cpu_only(laptop: Recording) -> None:
    record = _job(laptop, "smoke")
    pod = _pod(record)["spec"]
    container = _container(record)
    assert set(container["resources"]["limits"]) == {"cpu", "memory"}
    assert "tolerations" not in pod and "nodeSelector" not in pod and "affinity" not in pod
    assert not {k for k in _env(record) if k.startswith(("FI_", "NCCL_"))}
    assert "dataset" not in {v["name"] for v in pod["volumes"]}  # Alluxio is off locally
    claim = next(r for r in _of_type(laptop, "kubernetes:core/v1:PersistentVolumeClaim"))
    assert claim.inputs["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert "storageClassName" not in claim.inputs["spec"]  # the cluster's default class
    assert claim.protect


# --- every rendered Job against Volcano's CRD schema ----------------------------------------------------

@pytest.mark.parametrize("stack", available_stacks())
def test_every_job_validates_against_the_volcano_crd(stack: str) -> None:
    jobs = volcano_jobs(rendered(stack))
    assert jobs, f"stack {stack} renders no Volcano Job"
    for name, record in jobs.items():
        errors = volcano_schema_errors(record)
        assert not errors, f"{stack}/{name}: " + "; ".join(errors[:5])


# Pod Security Standards: what "restricted" demands of a pod (tenant namespaces enforce "baseline", a subset).
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}


@pytest.mark.parametrize("stack", available_stacks())
def test_training_pods_meet_pod_security_restricted(stack: str) -> None:
    for name, record in volcano_jobs(rendered(stack)).items():
        spec = _pod(record)["spec"]
        pod_security = spec["securityContext"]
        assert pod_security["runAsNonRoot"] and pod_security["seccompProfile"]["type"] == "RuntimeDefault", name
        assert not any(spec.get(k) for k in ("hostNetwork", "hostPID", "hostIPC")), name
        assert all(set(v) - {"name"} <= RESTRICTED_VOLUMES for v in spec["volumes"]), name
        for container in spec["containers"]:
            security = container["securityContext"]
            assert security["allowPrivilegeEscalation"] is False and not security.get("privileged"), name
            assert security["capabilities"] == {"drop": ["ALL"]}, name
