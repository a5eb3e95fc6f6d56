"""The spot path: an interruption warning reaches the trainer as SIGTERM with time left to commit a checkpoint.

EC2 warns two minutes ahead; Karpenter deletes the NodeClaim and drains the node, evicting every pod without
karpenter.sh/do-not-disrupt (kubernetes-sigs/karpenter v1.14.1 pkg/utils/pod/scheduling.go IsEvictable); the kubelet
sends SIGTERM, torchrun forwards it, the trainer checkpoints within shutdown.grace_period_s. Expectations are read
from each stack's settings and rendered objects.
"""

from __future__ import annotations

from typing import Any

import pytest
from owned_stacks import Stack, recording, stack_settings, stacks_where
from trainyard.config.rules import INTERRUPTION_REACTION_SECONDS, SPOT_NOTICE_SECONDS
from trainyard.names import POOL_LABEL
from trainyard.plan.recording import Recording

JOB = "kubernetes:batch.volcano.sh/v1alpha1:Job"
NODE_POOL = "kubernetes:karpenter.sh/v1:NodePool"
# The tests' fleet (its smoke job runs on a spot pool), then every AWS stack of stacks/.
AWS_STACKS = stacks_where(lambda s: s.is_aws)


def _program(stack: Stack) -> Recording:
    return recording(stack)


def _flag(args: list[str], prefix: str) -> int:
    return int(next(a for a in args if a.startswith(prefix)).split("=", 1)[1])


def _pods(stack: Stack) -> dict[str, dict[str, Any]]:
    return {r.inputs["metadata"]["name"]: r.inputs["spec"]["tasks"][0]["template"]
            for r in _program(stack).resources if r.type == JOB}


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_training_pods_are_evictable_by_the_interruption_drain(stack: Stack) -> None:
    for name, pod in _pods(stack).items():
        assert "karpenter.sh/do-not-disrupt" not in (pod["metadata"].get("annotations") or {}), name


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_gpu_pools_never_disrupt_a_busy_node_voluntarily(stack: Stack) -> None:
    """What the annotation used to promise, held by the NodePools: only empty nodes are consolidated, no budget
    for drift or underutilization, no expiry (Karpenter disruption docs: budgets by reason)."""
    pools = [r.inputs["spec"] for r in _program(stack).resources if r.type == NODE_POOL]
    assert pools
    for spec in pools:
        disruption = spec["disruption"]
        assert disruption["consolidationPolicy"] == "WhenEmpty"
        blocked = {reason for b in disruption["budgets"] if b["nodes"] == "0" for reason in b.get("reasons", [])}
        assert {"Underutilized", "Drifted"} <= blocked
        assert spec["template"]["spec"]["expireAfter"] == "Never"


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_spot_jobs_checkpoint_within_the_notice(stack: Stack) -> None:
    settings = stack_settings(stack)
    spot_pools = {p.name for p in settings.node_pools if "spot" in p.capacity_types}
    checked = 0
    for name, pod in _pods(stack).items():
        if pod["spec"].get("nodeSelector", {}).get(POOL_LABEL) not in spot_pools:
            continue
        (container,) = pod["spec"]["containers"]
        args = container["args"]
        if not any(a.startswith("shutdown.grace_period_s=") for a in args):
            continue  # the fabric check: nothing to save
        trainer = _flag(args, "shutdown.grace_period_s=")
        torchrun = _flag(args, "--shutdown-timeout=")
        assert trainer + INTERRUPTION_REACTION_SECONDS <= SPOT_NOTICE_SECONDS, name
        # torchrun waits for the trainer's checkpoint, the kubelet for torchrun.
        assert trainer < torchrun < pod["spec"]["terminationGracePeriodSeconds"], name
        checked += 1
    assert checked or not spot_pools or not any(j.node_pool in spot_pools for j in settings.workloads)
