"""The rehearsal's rule on EFA node classes under Cilium's ENI IPAM: which interfaces a node gets, and which of
them Cilium hands to pods."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainyard.config.instance_types import INSTANCE_TYPES
from trainyard.plan.cluster_model import label_mismatch
from trainyard.plan.pods import lookup
from trainyard.plan.recording import ResourceRecord
from trainyard.plan.resource_types import NODE_CLASS, NODE_POOL, VOLCANO_JOB
from trainyard.plan.rules.base import Moment, of_type, rule
from trainyard.plan.volcano_jobs import task_pods

EFA_RESOURCE = "vpc.amazonaws.com/efa"
EFA_ONLY = "efa-only"


def _efa_pools(node_class: str, moment: Moment) -> list[str]:
    """The NodePools of this class that some Volcano job's pods land on asking for EFA devices."""
    pools = {p.name: p for p in moment.after.pools}
    names = sorted(str(lookup(r.inputs, "metadata.name")) for r in moment.records.values() if r.type == NODE_POOL
                   and lookup(r.inputs, "spec.template.spec.nodeClassRef.name") == node_class)
    pods = [pod for job in moment.records.values() if job.type == VOLCANO_JOB for pod, _ in task_pods(job)
            if pod.requests.get(EFA_RESOURCE)]
    return [n for n in names if n in pools and any(label_mismatch(pod, pools[n]) is None for pod in pods)]


def _cards(pools: list[str], moment: Moment) -> int:
    """Network cards every instance type of these pools has (one EFA per card on each EFA type here)."""
    types = {str(v) for r in moment.records.values() if r.type == NODE_POOL
             and lookup(r.inputs, "metadata.name") in pools
             for req in lookup(r.inputs, "spec.template.spec.requirements", ()) or ()
             if req.get("key") == "node.kubernetes.io/instance-type" for v in req.get("values") or ()}
    return min((INSTANCE_TYPES[t].efa_interfaces for t in types if t in INSTANCE_TYPES), default=0)


def _ip_interfaces(interfaces: list[Mapping[str, Any]]) -> list[str]:
    """Interfaces with IPs off card 0's primary: what Cilium would list and give pods."""
    return [f"card {i.get('networkCardIndex')}/device {i.get('deviceIndex')}" for i in interfaces
            if i.get("interfaceType") != EFA_ONLY and (i.get("networkCardIndex"), i.get("deviceIndex")) != (0, 0)]


# Without spec.networkInterfaces Karpenter gives a node launched for EFA pods one `efa` interface with IPs per
# network card (aws/karpenter-provider-aws v1.14.1 launchtemplate.go generateNetworkInterfaces); Cilium's ENI IPAM
# lists every ENI with an IPv4 address (cilium pkg/aws/ec2/ec2.go, filter private-ip-address=*) and hands those IPs
# to pods, and pod-to-pod traffic breaks past two EFA devices (cilium/cilium issue 42600). `efa-only` interfaces
# carry no IP, so Cilium never lists them, and Karpenter counts them as the node's EFA devices (instancetype
# types.go efas).
@rule("efa-interfaces-ip-less", of_type(NODE_CLASS),
      "aws/karpenter-provider-aws v1.14.1 launchtemplate.go; cilium pkg/aws/ec2/ec2.go; cilium/cilium 42600")
def efa_interfaces_ip_less(record: ResourceRecord, moment: Moment) -> str | None:
    name = str(lookup(record.inputs, "metadata.name"))
    pools = _efa_pools(name, moment) if moment.after.ipam == "eni" else []
    if not pools:
        return None
    interfaces = list(lookup(record.inputs, "spec.networkInterfaces", ()) or ())
    cards = _cards(pools, moment)
    where = f"pods of NodePool {', '.join(pools)} request {EFA_RESOURCE} under Cilium's ENI IPAM, "
    if not interfaces:
        return where + (f"and the class lists no networkInterfaces: Karpenter gives each of the {cards} network "
                        "cards an `efa` interface with IPs, which Cilium hands to pods (cilium/cilium 42600: pod "
                        "traffic breaks past two EFA devices); list one efa-only interface per card")
    if with_ips := _ip_interfaces(interfaces):
        return where + (f"and interfaces with IPs sit beside card 0's primary ({', '.join(with_ips)}): Cilium "
                        "lists them and hands their IPs to pods (cilium/cilium 42600); make them efa-only")
    covered = {i.get("networkCardIndex") for i in interfaces if i.get("interfaceType") == EFA_ONLY}
    if missing := sorted(set(range(cards)) - covered):
        return where + (f"and cards {', '.join(map(str, missing))} have no efa-only interface: Karpenter counts "
                        f"only efa-only interfaces as {EFA_RESOURCE}, so the nodes offer fewer EFA devices than "
                        "the instance has cards")
    return None
