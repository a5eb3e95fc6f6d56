"""The kubelet's topology-manager admission (issue 22): the model, the rule on synthetic pools, and every stack.

Under `topologyManagerPolicy: restricted` the fabric check (16 exclusive CPUs fit one socket, 8 GPUs need both)
fails admission with TopologyAffinityError on an empty node, and a sub-node pod fails whenever its free GPUs and
free cores sit on different sockets; the whole-node trainer is admitted.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import pytest
from owned_stacks import recording as stack_recording
from rehearsal_records import (
    GPU_TAINT,
    cilium,
    cluster,
    job,
    karpenter_pool,
    node_group,
    rec,
    recording,
    rehearsed,
    release,
)
from trainyard.cloud.userdata import GPU_KUBELET, KubeletSettings, NodeRole, render_user_data
from trainyard.plan.cluster_model import InstanceOffer
from trainyard.plan.recording import Recording, ResourceRecord
from trainyard.plan.resource_types import NODE_CLASS
from trainyard.plan.rules.kubelet_admission import (
    KubeletTopology,
    admitted,
    aligned_requests,
    cross_fragmented,
    numa_nodes,
    user_data_kubelet,
)
from trainyard.plan.runtime import STACKS_DIR, available_stacks, read_stack, settings_of

RULE = "kubelet-admits-pod"
GPU, EFA = "nvidia.com/gpu", "vpc.amazonaws.com/efa"
P5 = InstanceOffer("p5.48xlarge", {"cpu": 192.0, GPU: 8.0, EFA: 32.0, "memory": 2048 * 2.0**30})
RESTRICTED = KubeletSettings(cpu_manager_policy="static", topology_manager_policy="restricted",
                             topology_manager_scope="pod")


def test_the_model_rejects_what_restricted_rejects() -> None:
    empty = numa_nodes(P5)
    fabric_check = {"cpu": 16, GPU: 8, EFA: 32}
    trainer = {"cpu": 172, GPU: 8, EFA: 32}
    one_gpu = {"cpu": 21, GPU: 1}
    assert len(empty) == 2 and empty[0].total == {"cpu": 96, GPU: 4, EFA: 16}
    assert not admitted("restricted", empty, fabric_check)
    assert admitted("restricted", empty, trainer)
    assert admitted("restricted", empty, one_gpu)
    fragmented = cross_fragmented(empty, one_gpu)
    assert fragmented is not None and not admitted("restricted", fragmented, one_gpu)
    assert cross_fragmented(empty, trainer) is None  # 172 CPUs never sit on one socket
    assert not admitted("single-numa-node", empty, trainer)
    assert all(admitted(policy, nodes, pod) for policy in ("best-effort", "none")
               for pod in (fabric_check, trainer, one_gpu) for nodes in (empty, cross_fragmented(empty, pod)) if nodes)


def _container(cpu: str, memory: str = "64Gi", devices: dict[str, str] | None = None) -> dict[str, Any]:
    limits = {"cpu": cpu, "memory": memory, **(devices or {})}
    return {"name": "c", "resources": {"limits": limits, "requests": dict(limits)}}


def test_only_a_guaranteed_pods_integer_cpus_are_aligned_and_scope_decides_the_unit() -> None:
    static_pod = KubeletTopology("static", "restricted", "pod")
    two = {"containers": [_container("16", devices={GPU: "8"}), _container("2")]}
    assert aligned_requests(two, static_pod) == [{"cpu": 18, GPU: 8}]
    assert aligned_requests(two, KubeletTopology("static", "restricted", "container")) == [{"cpu": 16, GPU: 8},
                                                                                           {"cpu": 2}]
    assert aligned_requests(two, KubeletTopology("none", "restricted", "pod")) == [{GPU: 8}]
    fractional = {"containers": [_container("15900m", devices={GPU: "8"})]}
    assert aligned_requests(fractional, static_pod) == [{GPU: 8}]
    burstable = {"containers": [{"name": "c", "resources": {"requests": {"cpu": "16"},
                                                            "limits": {"cpu": "16", GPU: "8"}}}]}
    assert aligned_requests(burstable, static_pod) == [{GPU: 8}]
    # An init container larger than the app containers sets the pod's request.
    with_init = {"initContainers": [_container("32")], "containers": [_container("16")]}
    assert aligned_requests(with_init, static_pod) == [{"cpu": 32}]


def test_the_node_class_user_data_is_read_as_nodeadm_reads_it() -> None:
    assert KubeletTopology.of(user_data_kubelet(render_user_data(NodeRole.GPU, RESTRICTED))) == \
        KubeletTopology("static", "restricted", "pod")
    assert KubeletTopology.of(user_data_kubelet(render_user_data(NodeRole.GPU))) == KubeletTopology(
        str(GPU_KUBELET.cpu_manager_policy), str(GPU_KUBELET.topology_manager_policy),
        str(GPU_KUBELET.topology_manager_scope))
    plain = "apiVersion: node.eks.aws/v1alpha1\nkind: NodeConfig\nspec:\n  kubelet:\n    config:\n" \
            "      topologyManagerPolicy: single-numa-node\n"
    assert KubeletTopology.of(user_data_kubelet(plain)).topology_manager_policy == "single-numa-node"
    assert KubeletTopology.of(user_data_kubelet(None)) == KubeletTopology()


def _cluster_with(kubelet: KubeletSettings, pod_cpu: str) -> list[ResourceRecord]:
    eks = cluster()
    cni = cilium(eks)
    system = node_group("system", eks, cni)
    karpenter = release("karpenter", "karpenter", {"nodeSelector": {"trainyard.io/role": "system"},
                                                    "settings": {"clusterName": "test"}}, system)
    node_class, pool = karpenter_pool("h100", "p5.48xlarge", karpenter, taints=[GPU_TAINT])
    node_class = rec(NODE_CLASS, node_class.name, {**node_class.inputs, "spec": {
        "userData": render_user_data(NodeRole.GPU, kubelet)}}, (karpenter,))
    container = _container(pod_cpu, "512Gi", {GPU: "8", EFA: "32"})
    spec = {"nodeSelector": {"trainyard.io/pool": "h100"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [container]}
    return [eks, cni, system, karpenter, node_class, pool, job("check", spec, pool, replicas=2)]


@pytest.mark.parametrize(("kubelet", "cpu", "refused"), [
    (RESTRICTED, "16", True),  # the fabric check's shape under restricted
    (RESTRICTED, "172", False),  # the whole-node trainer
    (RESTRICTED, "15900m", False),  # no exclusive CPUs, no CPU hint
    (GPU_KUBELET, "16", False),  # the pools' policy
])
def test_the_rule_refuses_a_pod_the_pools_kubelet_rejects(kubelet: KubeletSettings, cpu: str, refused: bool) -> None:
    found = [f for f in rehearsed(recording(*_cluster_with(kubelet, cpu))).findings if f.rule == RULE]
    if refused:
        assert len(found) == 1 and "TopologyAffinityError" in found[0].problem, found
        assert "p5.48xlarge in pool h100" in found[0].problem and "restricted" in found[0].problem
    else:
        assert found == []


def _restricted_gpu_classes(stack: Recording) -> Recording:
    """The stack with every node class that runs a topology manager switched to restricted (on a copy)."""
    resources, changed = [], 0
    for record in stack.resources:
        data = (record.inputs.get("spec") or {}).get("userData") if record.type == NODE_CLASS else None
        if isinstance(data, str) and "topologyManagerPolicy: best-effort" in data:
            changed += 1
            inputs = copy.deepcopy(record.inputs)
            inputs["spec"]["userData"] = data.replace("topologyManagerPolicy: best-effort",
                                                      "topologyManagerPolicy: restricted")
            record = replace(record, inputs=inputs)
        resources.append(record)
    return Recording(resources=resources) if changed else stack


@pytest.mark.parametrize("stack", available_stacks())
def test_every_job_of_every_stack_is_admitted_and_restricted_would_refuse_the_fabric_check(stack: str) -> None:
    recording_ = stack_recording((stack, STACKS_DIR))
    assert not [f for f in rehearsed(recording_).findings if f.rule == RULE]
    checks = [r for r in recording_.resources if r.type.endswith("batch.volcano.sh/v1alpha1:Job")
              and (r.inputs.get("metadata") or {}).get("labels", {}).get("trainyard.io/check") == "fabric"]
    restricted = _restricted_gpu_classes(recording_)
    refused = {f.name for f in rehearsed(restricted).findings if f.rule == RULE}
    # Not vacuous: every pool the stack checks the fabric of has its check here.
    assert len(checks) == len(settings_of(read_stack(stack)).fabric_checked_pools)
    assert {c.name for c in checks} <= refused
