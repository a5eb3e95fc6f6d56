"""The rule on hard network topology: a job that must sit under one HyperNode gets nodes that share one."""

from __future__ import annotations

from trainyard.config.instance_types import INSTANCE_TYPES
from trainyard.names import POOL_LABEL
from trainyard.plan.pods import lookup
from trainyard.plan.recording import ResourceRecord
from trainyard.plan.resource_types import VOLCANO_JOB
from trainyard.plan.rules.base import Moment, of_type, pool_records, rule

CAPACITY_RESERVATION_TYPE = "karpenter.k8s.aws/capacity-reservation-type"


# A hard networkTopology job binds only when one HyperNode of at most its tier holds its whole gang, and a running
# one places new pods only under the HyperNode it holds (volcano pkg/scheduler/actions/allocate, plugins/
# network-topology-aware). Karpenter does not see HyperNodes: it launches nodes for the pending pods wherever the
# NodePool allows; if they share no such HyperNode the pods stay Pending, the empty nodes are consolidated after
# consolidateAfter and Karpenter launches again, a loop that bills GPU hours. Only capacity that is co-located by
# construction breaks it: Capacity Blocks (EC2 UltraClusters) or one instance type in a cluster placement group, on
# types EC2 reports a topology for, with no spot replacements and no growth.
@rule("hard-topology-co-located", of_type(VOLCANO_JOB),
      "volcano v1.15.1 network-topology-aware plugin, allocate getSearchRoot; Karpenter WhenEmpty consolidation")
def hard_topology_co_located(record: ResourceRecord, moment: Moment) -> str | None:
    topology = lookup(record.inputs, "spec.networkTopology") or {}
    if topology.get("mode") != "hard":
        return None
    pool = next((lookup(t, "template.spec.nodeSelector") or {} for t in lookup(record.inputs, "spec.tasks") or ()),
                {}).get(POOL_LABEL)
    node_pool, node_class = pool_records(str(pool), moment)
    if node_pool is None:
        return None  # not Karpenter's: no launch to loop
    requirements = {r.get("key"): list(r.get("values") or ()) for r in
                    lookup(node_pool.inputs, "spec.template.spec.requirements") or ()}
    types = requirements.get("node.kubernetes.io/instance-type", [])
    capacity = requirements.get("karpenter.sh/capacity-type", [])
    class_spec = (node_class.inputs.get("spec") or {}) if node_class else {}
    blocks = (capacity == ["reserved"] and requirements.get(CAPACITY_RESERVATION_TYPE) == ["capacity-block"]
              and bool(class_spec.get("capacityReservationSelectorTerms")))
    placed = bool(class_spec.get("placementGroupSelector")) and len(types) == 1
    tasks = lookup(record.inputs, "spec.tasks") or ()
    replicas = sum(int(t.get("replicas", 1)) for t in tasks)
    loop = f"hard networkTopology on NodePool {pool}: "
    unlabelled = [t for t in types if (offer := INSTANCE_TYPES.get(t)) is None or not offer.network_layers]
    if unlabelled:
        return loop + (f"{', '.join(unlabelled)} report no EC2 network topology, so their nodes are in no "
                       "HyperNode and the job never binds (Karpenter keeps launching and consolidating)")
    if "spot" in capacity:
        return loop + "a reclaimed spot node's replacement may land outside the job's HyperNode and never bind"
    if replicas > int(lookup(record.inputs, "spec.minAvailable") or replicas):
        return loop + (f"the job grows to {replicas} pods, whose nodes Karpenter may launch outside the HyperNode "
                       "the job holds")
    if not (blocks or placed):
        return loop + ("its capacity is not co-located by construction (neither Capacity Blocks only nor one "
                       "instance type in a placement group): Karpenter may launch nodes that share no HyperNode "
                       "of the job's tier, which stay empty, are consolidated and launched again")
    # Co-located capacity shares only the top layer: EC2 promises UltraCluster / placement-group proximity, not one
    # lower network node (tier 1 = one network-node-layer-3 node: Volcano label.go generateHyperNodeInfo @v1.15.1).
    top = min(INSTANCE_TYPES[t].network_layers for t in types) if types else 0
    if (tier := int(topology.get("highestTierAllowed") or top)) < top:
        return loop + (f"highestTierAllowed {tier} needs the nodes under one network node below the top layer, "
                       f"which neither Capacity Blocks nor a placement group promise (only tier {top} is "
                       "co-located): launched nodes may never bind, and are consolidated and launched again")
    return None
