"""The rehearsal's trainer-config-valid rule: a rendered training job whose trainer config the trainer itself would
refuse at some node count of its range, or that cannot fit its pool's GPUs, is named (issue 19 finding 4)."""

from __future__ import annotations

import copy
import dataclasses
from types import SimpleNamespace

import pytest
from owned_stacks import planned as planned_stack
from trainyard.config.instance_types import INSTANCE_TYPES
from trainyard.plan.cluster_state import cluster_state
from trainyard.plan.recording import ResourceRecord
from trainyard.plan.rules.registry import RULES
from trainyard.plan.runtime import STACKS_DIR, StackPlan, available_stacks
from trainyard.plan.trainer_check import device_memory, trainer_problem
from trainyard_train.planner import gpu_memory_bytes

JOB = "kubernetes:batch.volcano.sh/v1alpha1:Job"


def planned(stack: str) -> StackPlan:
    return planned_stack((stack, STACKS_DIR))


def problems(plan: StackPlan, jobs: list[ResourceRecord] | None = None) -> dict[str, str | None]:
    pools = {pool.name: pool for pool in cluster_state(plan.recording.resources, plan.rendered).pools}
    records = plan.recording.by_urn()
    return {r.name: trainer_problem(r, records, pools)
            for r in (jobs if jobs is not None else plan.recording.resources) if r.type == JOB}


def with_args(record: ResourceRecord, *extra: str, nnodes: str, nproc: int) -> ResourceRecord:
    """A copy of the job with another node range and GPUs per pod, and trainer overrides appended."""
    inputs = copy.deepcopy(record.inputs)
    container = inputs["spec"]["tasks"][0]["template"]["spec"]["containers"][0]
    args = [f"--nnodes={nnodes}" if a.startswith("--nnodes=") else
            f"--nproc-per-node={nproc}" if a.startswith("--nproc-per-node=") else a for a in container["args"]]
    container["args"] = [*args, *extra]
    return dataclasses.replace(record, inputs=inputs)


def gpu_trainer_job() -> tuple[StackPlan, ResourceRecord]:
    """Some stack's rendered trainer job on whole GPUs (whichever comes first: the test pins no stack)."""
    for stack in available_stacks():
        for record in planned(stack).recording.resources:
            pod = record.inputs.get("spec", {}).get("tasks", [{}])[0].get("template", {}).get("spec", {})
            container = (pod.get("containers") or [{}])[0]
            if (record.type == JOB and "trainyard_train" in container.get("args", [])
                    and "nvidia.com/gpu" in container.get("resources", {}).get("limits", {})):
                return planned(stack), record
    raise AssertionError("no stack renders a trainer job on whole GPUs")


def test_the_rule_is_in_the_rehearsal() -> None:
    assert "trainer-config-valid" in {rule.name for rule in RULES}


@pytest.mark.parametrize("stack", available_stacks())
def test_every_rendered_training_job_passes_the_trainers_own_checks(stack: str) -> None:
    found = problems(planned(stack))
    assert {name: p for name, p in found.items() if p is not None} == {}


def test_a_shard_size_that_only_some_node_counts_divide_is_named_with_the_count() -> None:
    plan, job = gpu_trainer_job()
    # Shards of two 8-GPU nodes: a world of 2 or 4 nodes divides, 3 does not.
    bad = with_args(job, "comm.hook=allreduce", "parallel.data_parallel=fsdp", "parallel.dp_shard=16",
                    "parallel.dp_replicate=-1", nnodes="2:4", nproc=8)
    (problem,) = problems(plan, [bad]).values()
    assert problem is not None and "parallel.dp_shard" in problem and "at 3 node(s)" in problem, problem
    good = with_args(job, "comm.hook=allreduce", "parallel.data_parallel=fsdp", "parallel.dp_shard=16",
                     "parallel.dp_replicate=-1", nnodes="2:2", nproc=8)
    assert problems(plan, [good]) == {good.name: None}


def test_a_model_too_large_for_the_pools_gpus_is_named_with_the_estimate() -> None:
    plan, job = gpu_trainer_job()
    bad = with_args(job, "model.d_model=16384", "model.n_heads=128", "model.n_layers=48", nnodes="1:2", nproc=8)
    (problem,) = problems(plan, [bad]).values()
    assert problem is not None and "GiB" in problem and "more than the GPU's" in problem, problem


@pytest.mark.parametrize("instance_type", sorted(n for n, it in INSTANCE_TYPES.items() if it.gpu is not None))
def test_a_pools_gpu_memory_is_what_cuda_reports_not_the_nominal_size(instance_type: str) -> None:
    """The trainer's own check compares with CUDA's total (torch.cuda.mem_get_info), below the nominal size: a plan
    counting the nominal size passed jobs whose every worker then refused to start on the nodes bought for it."""
    it = INSTANCE_TYPES[instance_type]
    assert it.gpu is not None
    pools = {"gpus": SimpleNamespace(offers=[SimpleNamespace(instance_type=instance_type)])}
    pod = {"containers": [{"resources": {"limits": {"nvidia.com/gpu": 1}}}],
           "nodeSelector": {"trainyard.io/pool": "gpus"}}
    assert device_memory(pod, pools) == gpu_memory_bytes(it.gpu.value) < it.gpu_memory_gib * 2**30
