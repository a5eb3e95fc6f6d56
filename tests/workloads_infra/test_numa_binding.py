"""torchrun --numa-binding: on whole-node pods only, in a form torch 2.13's torchrun parses, with numactl in the image.

torch/numa/binding.py binds local rank i to the CPUs of GPU i's socket inside the pod's cpuset and refuses to start
the worker when that set is empty, or when numactl is missing: a sub-node pod whose cpuset sits on the other socket
(possible under the best-effort topology policy) would never start, so only pods with every GPU and more than half
the node's CPUs bind.
"""

from __future__ import annotations

from typing import Any

import pytest
from jobs_render import REPO_ROOT, fabric_checks, rendered, training_jobs
from owned_stacks import FLEET, Stack, fleet_and_samples_where, stack_settings
from torch.distributed.run import get_args_parser
from trainyard.config.instance_types import INSTANCE_TYPES


def _torchrun_args(record: Any) -> list[str]:
    (container,) = record.inputs["spec"]["tasks"][0]["template"]["spec"]["containers"]
    args = list(container["args"])
    return args[:args.index("-m")] + ["train.py"]  # torchrun's own flags, then a stand-in entry point


def _takes_whole_nodes(record: Any, instance_types: list[str]) -> bool:
    (container,) = record.inputs["spec"]["tasks"][0]["template"]["spec"]["containers"]
    limits = container["resources"]["limits"]
    gpus, cpus = int(limits.get("nvidia.com/gpu", 0)), int(str(limits["cpu"]).removesuffix("m") or 0)
    millicpu = cpus if str(limits["cpu"]).endswith("m") else cpus * 1000
    types = [INSTANCE_TYPES[t] for t in instance_types]
    return all(t.gpu_count > 1 and gpus == t.gpu_count and 2 * millicpu > t.vcpu * 1000 for t in types)


@pytest.mark.parametrize("stack", fleet_and_samples_where(lambda s: True))
def test_whole_node_pods_bind_ranks_to_their_gpus_socket(stack: Stack) -> None:
    settings = stack_settings(stack)
    pools = {p.name: p for p in settings.node_pools}
    for job in settings.workloads:
        record = training_jobs(rendered(*stack))[job.name]
        parsed = get_args_parser().parse_args(_torchrun_args(record))
        pool = pools.get(job.node_pool or "")
        whole = pool is not None and _takes_whole_nodes(record, pool.instance_types)
        assert parsed.numa_binding == ("socket" if whole else None), job.name
    for name, record in fabric_checks(rendered(*stack)).items():
        # 16 CPUs for 8 GPUs: its cpuset may sit on one socket.
        assert get_args_parser().parse_args(_torchrun_args(record)).numa_binding is None, name


def test_the_fleets_whole_node_jobs_bind() -> None:
    """The tests' fleet has whole-node jobs (8 GPUs of a p5.48xlarge), so the binding is exercised whatever
    stacks/ holds."""
    bound = [j for j in training_jobs(rendered(*FLEET)).values() if "--numa-binding=socket" in _torchrun_args(j)]
    assert bound, "no whole-node job of the fleet binds: the binding is never exercised"


def test_the_image_installs_numactl() -> None:
    dockerfile = (REPO_ROOT / "workloads" / "Dockerfile").read_text()
    install = next(line for line in dockerfile.splitlines() if "apt-get install" in line)
    assert "numactl" in install.split()
