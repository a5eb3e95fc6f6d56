"""Every rendered training pod and fabric check is admitted by the kubelet of every node type its pool launches.

Issue 22: under `topologyManagerPolicy: restricted` the fabric check (16 exclusive CPUs fit one socket, 8 GPUs need
both) fails admission with TopologyAffinityError on an empty node, and a sub-node pod fails whenever its free
GPUs and free cores sit on different sockets. The pool's policy is the GPU NodeConfig's (cloud/userdata.py).
"""

from __future__ import annotations

from typing import Any

import pytest
from jobs_render import rendered, volcano_jobs
from kubelet_model import NumaNode, admits, two_socket
from trainyard.cloud.userdata import GPU_KUBELET
from trainyard.config.instance_types import INSTANCE_TYPES
from trainyard.config.mig import load_mig_catalog, mig_resource_name
from trainyard.names import POOL_LABEL
from trainyard.plan.runtime import available_stacks, read_stack, settings_of
from trainyard.workloads.sizing import EFA_RESOURCE

WHOLE_GPU = "nvidia.com/gpu"
POLICY = GPU_KUBELET.topology_manager_policy or "none"


def _node_devices(pool: Any, instance: str) -> dict[str, int]:
    itype = INSTANCE_TYPES[instance]
    devices = {EFA_RESOURCE: itype.efa_interfaces}
    if pool.mig_layout and itype.gpu is not None:
        for profile, per_gpu in load_mig_catalog().slices(pool.mig_layout, itype.gpu).items():
            devices[mig_resource_name(profile)] = per_gpu * itype.gpu_count
    else:
        devices[WHOLE_GPU] = itype.gpu_count
    return devices


def _topology_requests(pod: dict[str, Any]) -> dict[str, int]:
    """What the CPU and device managers align: integer CPUs of a Guaranteed pod, and every device it asks for."""
    (container,) = pod["spec"]["containers"]
    limits = container["resources"]["limits"]
    requests: dict[str, int] = {k: int(v) for k, v in limits.items() if "/" in k}
    if limits == container["resources"]["requests"] and str(limits["cpu"]).isdigit():
        requests["cpu"] = int(limits["cpu"])
    return requests


def _cross_fragmented(nodes: list[NumaNode], requests: dict[str, int]) -> list[NumaNode]:
    """A node where just enough CPUs are free on the first socket and just enough devices on the last one."""
    if len(nodes) < 2:
        return nodes
    first, last = 0, len(nodes) - 1
    free: list[dict[str, int]] = [dict.fromkeys(n.total, 0) for n in nodes]
    for resource, amount in requests.items():
        socket = first if resource == "cpu" else last
        free[socket][resource] = min(amount, nodes[socket].total.get(resource, 0))
    return [NumaNode(total=n.total, free=f) for n, f in zip(nodes, free, strict=True)]


def _pods_on_pools(stack: str) -> list[tuple[str, str, dict[str, int], list[NumaNode]]]:
    settings = settings_of(read_stack(stack))
    pools = {p.name: p for p in settings.node_pools}
    found = []
    for name, record in volcano_jobs(rendered(stack)).items():
        pod = record.inputs["spec"]["tasks"][0]["template"]
        pool = pools.get((pod["spec"].get("nodeSelector") or {}).get(POOL_LABEL, ""))
        if pool is None or pool.role != "gpu":
            continue
        requests = _topology_requests(pod)
        for instance in pool.instance_types:
            found.append((name, instance, requests, two_socket(INSTANCE_TYPES[instance], _node_devices(pool,
                                                                                                       instance))))
    return found


@pytest.mark.parametrize("stack", available_stacks())
def test_every_gpu_pod_is_admitted_under_the_pool_policy(stack: str) -> None:
    refused = []
    for job, instance, requests, empty in _pods_on_pools(stack):
        for state, nodes in (("an empty node", empty), ("a fragmented node", _cross_fragmented(empty, requests))):
            if not admits(POLICY, nodes, requests):
                refused.append(f"{job} on {instance} ({state}): {requests}")
    assert not refused, f"kubelet topology policy {POLICY!r} rejects (TopologyAffinityError): {refused}"


def test_the_model_rejects_what_restricted_rejects() -> None:
    """The model itself: restricted refuses the fabric check's shape and admits the whole-node trainer's."""
    p5 = INSTANCE_TYPES["p5.48xlarge"]
    empty = two_socket(p5, {WHOLE_GPU: 8, EFA_RESOURCE: 32})
    fabric_check = {"cpu": 16, WHOLE_GPU: 8, EFA_RESOURCE: 32}
    trainer = {"cpu": 172, WHOLE_GPU: 8, EFA_RESOURCE: 32}
    one_gpu = {"cpu": 21, WHOLE_GPU: 1}
    assert not admits("restricted", empty, fabric_check)
    assert admits("restricted", empty, trainer)
    assert admits("restricted", empty, one_gpu)
    assert not admits("restricted", _cross_fragmented(empty, one_gpu), one_gpu)
    assert all(admits("best-effort", nodes, pod) for pod in (fabric_check, trainer, one_gpu)
               for nodes in (empty, _cross_fragmented(empty, pod)))
