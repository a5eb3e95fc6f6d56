"""Run a stack's rendered Volcano training Job on this machine, as its pods would run it (issue 17 section 3).

What is taken from the render, unchanged: the container's command (the `sh -c` launch line), its args (torchrun's
flags and the trainer's), its env, its volume mounts and the volumes behind them, the trainer config from the job's
ConfigMap, and the job's `policies`. What stands in for the cluster:

- Nodes: one node agent per pod (`VC_TASK_INDEX` = its index, as Volcano's env plugin sets it), all on localhost:
  the rendezvous endpoint (worker-0's svc name) becomes 127.0.0.1 and a free port, the metrics port a free port
  per pod (each pod has its own network namespace in the cluster).
- GPUs: `--nproc-per-node` becomes 1 process per node on multi-node runs, up to 2 on single-node ones (gloo), and
  `--numa-binding` (each rank on its GPU's socket) is left out.
- Volumes, under one directory: the ConfigMap's files, every PersistentVolumeClaim as a directory (shared by all
  pods, as the RWX checkpoint claim is), every emptyDir per pod. Paths in args that start with a mount path are
  moved under that directory; the trainer sees the same layout the pod would.
- The dataset: the job's claim shows the source's S3 prefix at `claim_subpath(...)` (Fluid's mount-path rule, from
  the rendered source and tenant Datasets), and the stack's dataset `<name>` under it, as `aws s3 sync DIR
  s3://<bucket>/datasets/<name>` puts it there; it is written with `prepare` (synthetic, at CPU sizes).
- S3: a job whose env carries the checkpoint export (`TRAINYARD_CHECKPOINT_EXPORT`, AWS stacks) gets an
  S3-compatible server on localhost (moto's server mode) with its bucket, and test credentials.
- Size: CPU_OVERRIDES shrink the model and batch so a step takes milliseconds. Whether the real config is valid
  at every world size of the range is the plan's check (the trainer's own validation); this runner checks that
  the launch line, the mounts, the rendezvous and the exit codes work.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from owned_stacks import planned
from trainer_launch import WORKLOADS, free_port
from trainyard.config.model import Job
from trainyard.plan.recording import Recording, ResourceRecord
from trainyard.plan.runtime import STACKS_DIR
from trainyard.platform.alluxio import claim_subpath
from trainyard_train.config import load_config
from trainyard_train.data import generate_for
from trainyard_train.export import EXPORT_ENV, ExportTarget
from trainyard_train.progress import read_progress

VOLCANO_JOB = "kubernetes:batch.volcano.sh/v1alpha1:Job"
CONFIG_MAP = "kubernetes:core/v1:ConfigMap"
DATASET = "kubernetes:data.fluid.io/v1alpha1:Dataset"
# A model and batch a 2-core machine steps through in milliseconds, at any world size the samples use.
CPU_OVERRIDES = (
    "model.vocab_size=64", "model.seq_len=16", "model.d_model=32", "model.n_layers=1", "model.n_heads=2",
    "model.n_kv_heads=2", "model.ffn_hidden=64",
    "train.global_batch_size=16", "train.micro_batch_size=1", "perf.compile=false", "perf.precision=fp32",
    "data.num_shards=2", "data.records_per_shard=32", "comm.timeout_s=120", "checkpoint.interval_steps=1",
)
S3_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
MAX_SAMPLED_NODES = 2  # node counts run per job: MIN and MAX of the range (the plan checks every size between)


def volcano_action(policies: Sequence[Mapping[str, Any]], exit_code: int) -> str:
    """What Volcano v1.15.1 does when a pod of a `restartPolicy: Never` job exits: `PodFailed` with its container's
    exit code for non-zero (`updatePod`, job_controller_handler.go), then the job's policies in order, each by its
    events, then by its exit code (`applyPolicies`, job_controller_util.go); no match (or a Succeeded pod) syncs."""
    if exit_code == 0:
        return "SyncJob"
    for policy in policies:
        events = [*policy.get("events", []), *([policy["event"]] if "event" in policy else [])]
        if "PodFailed" in events or "*" in events:
            return str(policy["action"])
        if policy.get("exitCode") == exit_code:
            return str(policy["action"])
    return "SyncJob"


@dataclass
class RenderedJob:
    stack: str
    job: Job
    manifest: dict[str, Any]
    config_maps: dict[str, dict[str, str]]
    dataset_subpath: str | None
    """Where the claim shows the source's data (Fluid's rule), or None without a dataset."""

    @property
    def spec(self) -> dict[str, Any]:
        return dict(self.manifest["spec"])

    @property
    def pod(self) -> dict[str, Any]:
        (task,) = self.spec["tasks"]
        return dict(task["template"]["spec"])

    @property
    def container(self) -> dict[str, Any]:
        (container,) = self.pod["containers"]
        return dict(container)

    @property
    def node_counts(self) -> list[int]:
        nnodes = next(a for a in self.container["args"] if a.startswith("--nnodes=")).split("=", 1)[1]
        low, _, high = nnodes.partition(":")
        return sorted({int(low), int(high or low)})[:MAX_SAMPLED_NODES]


def _dataset_subpath(recording: Recording, namespace: str, claim: str) -> str:
    datasets = {(r.inputs["metadata"].get("namespace"), r.inputs["metadata"]["name"]): r
                for r in recording.resources if r.type == DATASET}
    (mount,) = datasets[(namespace, claim)].inputs["spec"]["mounts"]
    reference = mount["mountPoint"]
    source_ns, source_name = reference.removeprefix("dataset://").split("/")[:2]
    (source_mount,) = datasets[(source_ns, source_name)].inputs["spec"]["mounts"]
    return claim_subpath(source_mount, reference)


def rendered_training_jobs(stack: str) -> list[RenderedJob]:
    """The stack's training jobs as its program renders them (the once-per-process plan other test files read)."""
    plan = planned((stack, STACKS_DIR))
    recording = plan.recording
    records: list[ResourceRecord] = recording.resources
    config_maps = {(r.inputs["metadata"].get("namespace"), r.inputs["metadata"]["name"]): r.inputs.get("data", {})
                   for r in records if r.type == CONFIG_MAP}
    jobs = {r.inputs["metadata"]["name"]: r for r in records if r.type == VOLCANO_JOB}
    result = []
    for job in plan.settings.workloads:
        manifest = jobs[job.name].inputs
        namespace = manifest["metadata"]["namespace"]
        (task,) = manifest["spec"]["tasks"]
        volumes = task["template"]["spec"]["volumes"]
        claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in volumes if "persistentVolumeClaim" in v}
        subpath = _dataset_subpath(recording, namespace, claims["dataset"]) if job.dataset else None
        maps = {v["configMap"]["name"]: config_maps[(namespace, v["configMap"]["name"])]
                for v in volumes if "configMap" in v}
        result.append(RenderedJob(stack, job, manifest, maps, subpath))
    return result


def run_key(job: RenderedJob) -> str:
    """What this runner takes from a job (its launch line, env, mounts and volumes, config files, policies, node
    counts, kind and dataset), with the stack's, namespace's and job's names set aside: equal keys, equal runs."""
    pod = job.pod
    seen = {"container": {k: job.container.get(k) for k in ("command", "args", "env", "volumeMounts")},
            "volumes": [{k: v for k, v in volume.items() if k != "emptyDir"} | {"emptyDir": "emptyDir" in volume}
                        for volume in pod["volumes"]],
            "policies": job.spec["policies"], "dataset_subpath": job.dataset_subpath}
    text = json.dumps(seen, sort_keys=True)
    namespace = job.manifest["metadata"]["namespace"]
    for name, placeholder in ((f"trainyard-{job.stack}-", "trainyard-<stack>-"), (job.job.name, "<job>"),
                              (namespace, "<namespace>")):
        text = text.replace(name, placeholder)
    # As they are: what a name may equal by chance (a kind, a dataset), and the files of the job's config maps.
    exact = {"kind": job.job.kind, "dataset": job.job.dataset, "nodes": job.node_counts,
             "files": sorted(json.dumps(files, sort_keys=True) for files in job.config_maps.values())}
    return text + json.dumps(exact, sort_keys=True)


def processes_per_pod(job: RenderedJob, nodes: int) -> int:
    """The rendered --nproc-per-node (the pod's GPUs), capped at 1 on multi-node runs and 2 on single-node ones."""
    rendered = int(next(a for a in job.container["args"] if a.startswith("--nproc-per-node=")).split("=", 1)[1])
    return min(rendered, 1 if nodes > 1 else 2)


@dataclass
class Pod:
    index: int
    proc: subprocess.Popen[str]
    log: Path

    def output(self) -> str:
        return self.log.read_text()

    def workers(self) -> list[int]:
        return [int(p) for p in Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()]


@dataclass
class Cluster:
    """The volumes of one job, laid out under ``root``; claims outlive runs, as PVCs outlive pods."""

    job: RenderedJob
    root: Path
    s3_endpoint: str | None = None
    """An S3-compatible endpoint standing in for S3; required for a job that exports its checkpoints."""
    runs: int = field(default=0)

    def __post_init__(self) -> None:
        if self.export_target is not None:
            assert self.s3_endpoint, f"{self.job.stack}/{self.job.job.name} exports to S3: pass s3_endpoint"
            region = self._env().get("AWS_REGION", "us-east-1")
            location = {} if region == "us-east-1" else {"CreateBucketConfiguration": {"LocationConstraint": region}}
            try:
                self.s3().create_bucket(Bucket=self.export_target.bucket, **location)
            except self.s3().exceptions.BucketAlreadyOwnedByYou:
                pass  # a stack's jobs share its checkpoint bucket, each under its own prefix
        self.bin = self.root / "bin"
        self.bin.mkdir(parents=True, exist_ok=True)
        # The image's `python`: this interpreter (a script, so the venv's site-packages come along).
        (self.bin / "python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
        (self.bin / "python").chmod(0o755)

    def _env(self) -> dict[str, str]:
        """The container's rendered env."""
        return {e["name"]: e["value"] for e in self.job.container.get("env", [])}

    @property
    def export_target(self) -> ExportTarget | None:
        env = self._env()
        return ExportTarget.from_env(env) if EXPORT_ENV in env else None

    def s3(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.s3_endpoint, region_name=self._env().get("AWS_REGION"),
                            **{k.lower(): v for k, v in S3_CREDENTIALS.items()})

    def exported_keys(self) -> list[str]:
        """Every object under the job's export prefix."""
        assert self.export_target is not None
        pages = self.s3().get_paginator("list_objects_v2").paginate(
            Bucket=self.export_target.bucket, Prefix=self.export_target.prefix)
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))

    def claim(self, name: str) -> Path:
        return self.root / "claims" / name

    @property
    def checkpoint_claim(self) -> Path:
        return self.claim(self._claims()["checkpoints"])

    def _claims(self) -> dict[str, str]:
        return {v["name"]: v["persistentVolumeClaim"]["claimName"]
                for v in self.job.pod["volumes"] if "persistentVolumeClaim" in v}

    def _mounts(self, node: int) -> dict[str, Path]:
        """mountPath -> the local directory behind it, for one pod."""
        volumes = {v["name"]: v for v in self.job.pod["volumes"]}
        mounts = {}
        for mount in self.job.container["volumeMounts"]:
            volume = volumes[mount["name"]]
            if "configMap" in volume:
                local = self.root / "configmaps" / volume["configMap"]["name"]
                local.mkdir(parents=True, exist_ok=True)
                for name, text in self.job.config_maps[volume["configMap"]["name"]].items():
                    (local / name).write_text(text)
            elif "persistentVolumeClaim" in volume:
                local = self.claim(volume["persistentVolumeClaim"]["claimName"])
            else:
                local = self.root / f"pod-{node}" / mount["name"]
            local.mkdir(parents=True, exist_ok=True)
            mounts[mount["mountPath"]] = local
        return mounts

    def prepare_dataset(self) -> None:
        """The stack's dataset where the job's claim shows it (see the module docstring)."""
        job = self.job
        if job.job.dataset is None:
            return
        assert job.dataset_subpath is not None
        target = self.claim(self._claims()["dataset"]) / job.dataset_subpath / job.job.dataset
        generate_for(load_config(None, [*CPU_OVERRIDES]), target)

    def _args(self, node: int, nodes: int, port: int, extra: Sequence[str]) -> list[str]:
        mounts = sorted(self._mounts(node).items(), key=lambda kv: -len(kv[0]))

        def localize(arg: str) -> str:
            key, sep, value = arg.rpartition("=") if "=" in arg and not arg.startswith("--") else ("", "", arg)
            for path, local in mounts:
                if value == path or value.startswith(path.rstrip("/") + "/"):
                    return f"{key}{sep}{local}{value[len(path.rstrip('/')):]}"
            return arg

        args = []
        for arg in self.job.container["args"]:
            if arg.startswith("--numa-binding="):
                continue  # binds ranks to their GPU's socket: there are no GPUs here
            if arg.startswith("--rdzv-endpoint="):
                arg = f"--rdzv-endpoint=127.0.0.1:{port}"
            elif arg.startswith("--nproc-per-node="):
                arg = f"--nproc-per-node={processes_per_pod(self.job, nodes)}"
            args.append(localize(arg))
        return [*args, *CPU_OVERRIDES, *extra]

    def start(self, nodes: int, *extra: str) -> list[Pod]:
        """Start ``nodes`` pods of the job, each one node agent with the rendered command line."""
        self.runs += 1
        port = free_port()
        pods = []
        for node in range(nodes):
            env = self._env()
            env |= {"TRAINYARD_METRICS_PORT": str(free_port()), "VC_TASK_INDEX": str(node), "OMP_NUM_THREADS": "1",
                    "PATH": f"{self.bin}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(WORKLOADS),
                    "HOME": str(self.root / f"pod-{node}"), "LOGLEVEL": "INFO"}
            env["TMPDIR"] = str(self._mounts(node).get("/tmp", self.root / f"pod-{node}"))
            if self.export_target is not None:
                env |= {**S3_CREDENTIALS, "AWS_ENDPOINT_URL_S3": str(self.s3_endpoint)}
            log = self.root / f"run-{self.runs}-pod-{node}.log"
            command = [*self.job.container["command"], *self._args(node, nodes, port, extra)]
            with open(log, "w") as handle:
                proc = subprocess.Popen(command, env=env, stdout=handle, stderr=subprocess.STDOUT, text=True,
                                        start_new_session=True)
            pods.append(Pod(node, proc, log))
        return pods

    def events(self) -> list[dict[str, Any]]:
        path = self.checkpoint_claim / "progress.jsonl"
        return read_progress(path) if path.exists() else []

    def wait_for_event(self, pods: list[Pod], predicate: Any, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(predicate(e) for e in self.events()):
                return
            if all(p.proc.poll() is not None for p in pods):
                break
            time.sleep(0.05)
        raise AssertionError("no such event:\n" + "\n".join(p.output()[-3000:] for p in pods))


def wait_all(pods: list[Pod], timeout: float = 600) -> list[int]:
    codes = []
    for pod in pods:
        try:
            codes.append(pod.proc.wait(timeout=timeout))
        except subprocess.TimeoutExpired:
            kill(pods)
            raise AssertionError(f"pod {pod.index} still running after {timeout} s:\n{pod.output()[-3000:]}") from None
    return codes


def kill(pods: list[Pod]) -> None:
    for pod in pods:
        if pod.proc.poll() is None:
            os.killpg(pod.proc.pid, signal.SIGKILL)
            pod.proc.wait()
