"""Node lifecycle rules: whether what Karpenter launches stays bounded, in number and in time.

They have the readiness rules' form (`rules.base.rule`, a pure `(record, moment) -> problem or None`) and run in
the same rehearsal; they differ only in what they protect: not convergence of `pulumi up`, but the bill after it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from trainyard.config.instance_types import INSTANCE_TYPES
from trainyard.config.mig import load_mig_catalog
from trainyard.names import CILIUM_AGENT_NOT_READY_TAINT_KEY, MIG_CONFIG_LABEL
from trainyard.plan.cluster_model import can_launch, can_run_now
from trainyard.plan.pods import lookup, pod_needs
from trainyard.plan.recording import ResourceRecord
from trainyard.plan.resource_types import CLUSTER_ROLE, CLUSTER_ROLE_BINDING, CRON_JOB, NODE_POOL
from trainyard.plan.rules.base import Moment, of_type, ready_pools, rule
from trainyard.plan.rules.gpu import WHOLE_GPU

# Resources every initialized node still reports as it did at launch. `nodes`: Karpenter counts each state node
# as one (kubernetes-sigs/karpenter v1.14.1 pkg/controllers/state/statenode.go Capacity).
STEADY_RESOURCES = frozenset({"nodes", "cpu", "memory", "pods", "ephemeral-storage"})
# Removed by the Cilium operator once the agent runs (operator.removeNodeTaints); a node whose agent never runs
# stays NotReady, which Karpenter's node repair acts on (its Ready policy), so it is no stranding gate here.
CILIUM_STARTUP_TAINT = CILIUM_AGENT_NOT_READY_TAINT_KEY


def _partitioned(record: ResourceRecord) -> bool:
    """Whether the pool's nodes come up with MIG-partitioned GPUs (its mig.config layout enables MIG)."""
    labels = lookup(record.inputs, "spec.template.metadata.labels", {}) or {}
    layout = labels.get(MIG_CONFIG_LABEL)
    if not layout:
        return False
    mig = load_mig_catalog()
    types = next((r.get("values") or () for r in lookup(record.inputs, "spec.template.spec.requirements", ()) or ()
                  if r.get("key") == "node.kubernetes.io/instance-type" and r.get("operator") == "In"), ())
    gpus = {gpu for t in types if t in INSTANCE_TYPES and (gpu := INSTANCE_TYPES[t].gpu) is not None}
    return any(mig.supports(str(layout), gpu) and mig.slices(str(layout), gpu) for gpu in gpus)


# Karpenter launches no node past a NodePool's limits and counts an initialized node at the capacity the node
# reports, not the NodeClaim's (kubernetes-sigs/karpenter v1.14.1 statenode.go Capacity, provisioner.go
# Limits.ExceededBy): a limit bounds only on a resource initialized nodes still report. Under the device plugin's
# mixed MIG strategy a partitioned GPU is advertised as nvidia.com/mig-*, so nvidia.com/gpu stops counting there.
@rule("pool-limits-bound", of_type(NODE_POOL),
      "kubernetes-sigs/karpenter v1.14.1 statenode.go Capacity, NodePool limits; device plugin mixed MIG strategy")
def pool_limits_bound(record: ResourceRecord, moment: Moment) -> str | None:
    limits = lookup(record.inputs, "spec.limits", {}) or {}
    if not limits:  # unbounded by choice: nothing that stops counting
        return None
    partitioned = _partitioned(record)
    if any(r in STEADY_RESOURCES or (r == WHOLE_GPU and not partitioned) for r in limits):
        return None
    why = (f"its nodes come up MIG-partitioned ({MIG_CONFIG_LABEL}) and report nvidia.com/mig-*, not {WHOLE_GPU}"
           if partitioned else "no initialized node reports them")
    return (f"its limits ({', '.join(sorted(limits))}) stop bounding once its nodes initialize: {why}; "
            f"limit `nodes` (or cpu/memory) too")


def _grants_nodeclaim_delete(rule: Mapping[str, Any]) -> bool:
    def has(field: str, value: str) -> bool:
        return bool({value, "*"} & set(rule.get(field) or ()))
    return has("apiGroups", "karpenter.sh") and has("resources", "nodeclaims") and has("verbs", "delete")


def _reapers(moment: Moment) -> Iterator[ResourceRecord]:
    """CronJobs (not suspended) whose service account may delete NodeClaims through a ClusterRoleBinding."""
    records = moment.records.values()
    roles = {str(lookup(r.inputs, "metadata.name")) for r in records if r.type == CLUSTER_ROLE
             and any(_grants_nodeclaim_delete(rule) for rule in r.inputs.get("rules") or ())}
    accounts = {(str(s.get("namespace")), str(s.get("name"))) for r in records if r.type == CLUSTER_ROLE_BINDING
                and lookup(r.inputs, "roleRef.kind") == "ClusterRole" and lookup(r.inputs, "roleRef.name") in roles
                for s in r.inputs.get("subjects") or () if s.get("kind") == "ServiceAccount"}
    for job in (r for r in records if r.type == CRON_JOB and not lookup(r.inputs, "spec.suspend")):
        pod = lookup(job.inputs, "spec.jobTemplate.spec.template.spec", {}) or {}
        account = (str(lookup(job.inputs, "metadata.namespace", "default")), str(pod.get("serviceAccountName",
                                                                                          "default")))
        if account in accounts:
            yield job


def _gates(record: ResourceRecord) -> list[str]:
    taints = lookup(record.inputs, "spec.template.spec.startupTaints", ()) or ()
    return sorted({str(t.get("key")) for t in taints} - {CILIUM_STARTUP_TAINT})


# A node whose startup taint stays (a failed or stuck admission check) is never initialized, and Karpenter
# disrupts no node that is not (kubernetes-sigs/karpenter v1.14.1 statenode.go ValidateNodeDisruptable: "node
# isn't initialized"); liveness has launch and registration timeouts only (nodeclaim/lifecycle/liveness.go) and
# node repair acts on node conditions, not taints (node/health/controller.go). Only expiry (expireAfter) or
# something that deletes the NodeClaim ends such a node's bill.
@rule("stranded-nodes-reclaimed", of_type(NODE_POOL),
      "kubernetes-sigs/karpenter v1.14.1 statenode.go ValidateNodeDisruptable, nodeclaim/lifecycle/liveness.go")
def stranded_nodes_reclaimed(record: ResourceRecord, moment: Moment) -> str | None:
    gates = _gates(record)
    expire = lookup(record.inputs, "spec.template.spec.expireAfter", "720h")
    if not gates or expire != "Never":
        return None
    pools = ready_pools(moment.after)
    for job in _reapers(moment):
        pod = pod_needs(job.name, lookup(job.inputs, "spec.jobTemplate.spec.template.spec", {}) or {})
        if can_run_now(pod, pools) or can_launch(pod, pools):
            return None
    return (f"a node held by its startup taint {', '.join(gates)} is never initialized, so Karpenter never disrupts "
            "it, and with expireAfter Never nothing ends it: no CronJob that may delete karpenter.sh nodeclaims runs "
            "in the cluster (it bills until someone deletes it)")
