"""The fabric check: one Volcano gang of two whole nodes per EFA pool, whose command line the check itself accepts."""

from __future__ import annotations

from typing import Any

import pytest
from jobs_render import fabric_checks, rendered, volcano_schema_errors
from owned_stacks import Stack, every_stack, stack_settings, stacks_where
from torch.distributed.run import get_args_parser
from trainyard.config.instance_types import INSTANCE_TYPES, fabric_threshold
from trainyard.plan.recording import Recording
from trainyard_train.commcheck import parse_args

MODULE = "trainyard_train.commcheck"


def _checks(recording: Recording) -> dict[str, dict[str, Any]]:
    return {name: r.inputs for name, r in fabric_checks(recording).items()}


def _container(job: dict[str, Any]) -> dict[str, Any]:
    return job["spec"]["tasks"][0]["template"]["spec"]["containers"][0]


def test_the_fleet_checks_its_efa_pools(fleet: Recording) -> None:
    assert set(_checks(fleet)) == {"fabric-check-h100", "fabric-check-h100-spot", "fabric-check-h200"}


@pytest.mark.parametrize("stack", every_stack())
def test_one_check_per_efa_pool_and_none_elsewhere(stack: Stack) -> None:
    settings = stack_settings(stack)
    efa_pools = [p.name for p in settings.node_pools if p.efa] if settings.fabric_check.enabled else []
    assert set(_checks(rendered(*stack))) == {f"fabric-check-{name}" for name in efa_pools}


def test_check_is_a_gang_of_two_that_runs_once(fleet: Recording) -> None:
    for name, job in _checks(fleet).items():
        spec = job["spec"]
        assert spec["minAvailable"] == spec["minSuccess"] == spec["tasks"][0]["replicas"] == 2, name
        assert spec["maxRetry"] == 0 and spec["policies"] == [{"event": "PodFailed", "action": "TerminateJob"}]
        assert spec["tasks"][0]["template"]["spec"]["restartPolicy"] == "Never"
        # A hung check fails instead of holding two GPU nodes.
        assert 0 < spec["tasks"][0]["template"]["spec"]["activeDeadlineSeconds"] <= 3600
        assert spec["queue"] and spec["schedulerName"] == "volcano"


def test_check_takes_every_gpu_and_efa_device_of_a_node(fleet: Recording) -> None:
    for pool, types in {"h100": ["p5.48xlarge"], "h200": ["p5e.48xlarge", "p5en.48xlarge"]}.items():
        job = _checks(fleet)[f"fabric-check-{pool}"]
        template = job["spec"]["tasks"][0]["template"]["spec"]
        limits = _container(job)["resources"]["limits"]
        assert template["nodeSelector"] == {"trainyard.io/pool": pool}
        assert limits["nvidia.com/gpu"] == "8"
        # A pair of cores and 4 GiB per rank plus /dev/shm, not the node: the gang must fit a training queue.
        assert (limits["cpu"], limits["memory"]) == ("16", f"{(8 * 4 + 8) * 1024}Mi")
        assert limits["vpc.amazonaws.com/efa"] == str(min(INSTANCE_TYPES[t].efa_interfaces for t in types))
        env = {e["name"]: e.get("value") for e in _container(job)["env"]}
        assert env["NCCL_NET"] == "Libfabric" and env["FI_PROVIDER"] == "efa"


@pytest.mark.parametrize("stack", stacks_where(lambda s: bool(s.fabric_checked_pools)))
def test_command_line_parses_with_torchrun_and_the_checks_own_parser(stack: Stack) -> None:
    pools = {p.name: p for p in stack_settings(stack).node_pools}
    checks = _checks(rendered(*stack))
    assert checks
    for name, job in checks.items():
        container = _container(job)
        torchrun_args = container["args"]
        assert container["command"][-1] == "torchrun"
        torchrun = get_args_parser().parse_args(torchrun_args)
        assert (torchrun.nnodes, torchrun.max_restarts, torchrun.module) == ("2", 0, True)
        assert torchrun.nproc_per_node == "8" and torchrun.training_script == MODULE
        check = parse_args(torchrun.training_script_args)
        pool = pools[name.removeprefix("fabric-check-")]
        efa = int(container["resources"]["limits"]["vpc.amazonaws.com/efa"])
        assert check.min_busbw_gbps == fabric_threshold(pool.instance_types, efa) > 0


def test_check_conforms_to_the_volcano_job_schema(fleet: Recording) -> None:
    for record in fabric_checks(fleet).values():
        assert volcano_schema_errors(record) == []
