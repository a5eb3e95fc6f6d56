"""Rules on the pod network: the CNI's operator runs where the first nodes join, and a network policy leaves pods
their EKS Pod Identity credentials."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from trainyard.catalogue.charts import load_catalogue
from trainyard.paths import REPO_ROOT
from trainyard.plan.cluster_model import Taint, admits
from trainyard.plan.cluster_state import cni_charts
from trainyard.plan.pods import lookup, workloads
from trainyard.plan.recording import ResourceRecord
from trainyard.plan.rendering import chart_name
from trainyard.plan.resource_types import CILIUM_POLICY, POD_IDENTITY, RELEASE
from trainyard.plan.rules.base import Moment, of_type, rule
from trainyard.platform.registry import load_registry

POD_IDENTITY_PORT = "80"  # the agent serves credentials on 169.254.170.23:80 (EKS docs, "EKS Pod Identity")


@functools.cache
def cni_operators() -> Mapping[str, str]:
    """CNI chart (by chart name) -> its operator workload (platform/addons.yaml `cniOperator`)."""
    pins = load_catalogue(REPO_ROOT).pins
    return {chart_name(pins[release].chart): addon.cni_operator for addon in load_registry(REPO_ROOT).addons
            if addon.cni_operator for release in addon.charts}


# A node joins Ready only once the CNI runs on it, and with Cilium only once cilium-operator has registered the CRDs
# the agent waits for and, in ENI mode, allocated the node's ENI addresses (docs.cilium.io internals/
# cilium_operator "CRD Registration"): the operator must run (replicas, on the host network, as there is no pod
# network yet), land on the first node groups (NotReady until then) and have its AWS credentials (its Pod
# Identity association) before it starts.
@rule("cni-runs-where-nodes-join", of_type(RELEASE),
      "docs.cilium.io ENI IPAM architecture (operator allocates before a node is Ready)")
def cni_runs_where_nodes_join(record: ResourceRecord, moment: Moment) -> str | None:
    chart = chart_name(str(record.inputs.get("chart", "")))
    if chart not in cni_charts() or chart not in cni_operators():
        return None
    groups = [p for p in moment.after.pools if not p.autoscaled and p.nodes]
    not_ready = Taint("node.kubernetes.io/not-ready", "", "NoSchedule")
    release = moment.release(record)
    name = cni_operators()[chart]
    pod = next((w for w in workloads(release.objects) if w.name == name and not w.daemon and not w.hooks), None)
    if pod is None:
        return f"it renders no {name} (the CNI's operator): no node turns Ready"
    if pod.replicas == 0:
        return f"{pod.label} (the CNI's operator) has no replicas: no node turns Ready"
    if not pod.spec.get("hostNetwork"):
        return (f"{pod.label} (the CNI's operator) is not on the host network: it waits for the pod network it "
                "brings up, so no node turns Ready")
    if groups and not any(admits(pod.needs(), g, (not_ready,)) for g in groups):
        names = ", ".join(g.name for g in groups)
        return f"{pod.label} can run on none of the node groups that join first ({names}): no node turns Ready"
    account = pod.spec.get("serviceAccountName")
    if moment.after.ipam == "eni" and account and not _identity_before(moment, release.namespace, str(account)):
        return (f"{pod.label} runs as {release.namespace}/{account}, which has no Pod Identity association "
                "created before this release: in ENI mode it cannot allocate addresses, so no node turns Ready")
    return None


def _identity_before(moment: Moment, namespace: str, account: str) -> bool:
    return any(r.type == POD_IDENTITY and r.inputs.get("namespace") == namespace and
               r.inputs.get("serviceAccount") == account for r in map(moment.records.get, moment.waited) if r)


def _allows_host(allow: Mapping[str, Any]) -> bool:
    if not {"host", "all"} & set(allow.get("toEntities") or ()):
        return False
    ports = [p for to in allow.get("toPorts") or () for p in to.get("ports") or ()]
    return not ports or any(str(p.get("port")) == POD_IDENTITY_PORT for p in ports)


def _all_pods_allowed_host(namespace: object, moment: Moment) -> bool:
    """Whether a policy that selects every pod of the namespace allows the agent: Cilium adds up the allow rules
    of all policies that select a pod (Policy Language, "Layer 3 Examples": policies are additive), so a narrower
    policy's own egress rules take nothing away from it."""
    return any(r.type == CILIUM_POLICY and lookup(r.inputs, "metadata.namespace") == namespace
               and not lookup(r.inputs, "spec.endpointSelector")
               and any(_allows_host(allow) for allow in lookup(r.inputs, "spec.egress") or ())
               for r in moment.records.values())


# The pod identity agent listens on the node (hostNetwork) at 169.254.170.23, which Cilium classifies as the
# `host` entity, so a toCIDR rule for that address never matches and a default-deny egress policy drops the
# credential fetch; allow it with toEntities: [host].
@rule("pod-identity-reachable", of_type(CILIUM_POLICY), "cilium/cilium issue 34387")
def pod_identity_reachable(record: ResourceRecord, moment: Moment) -> str | None:
    egress = lookup(record.inputs, "spec.egress")
    namespace = lookup(record.inputs, "metadata.namespace")
    if not egress:  # a policy without egress rules leaves egress open
        return None
    users = sorted(str(r.inputs.get("serviceAccount")) for r in moment.records.values()
                   if r.type == POD_IDENTITY and r.inputs.get("namespace") == namespace)
    if not users or any(_allows_host(allow) for allow in egress) or _all_pods_allowed_host(namespace, moment):
        return None
    return (f"pods of {namespace} with EKS Pod Identity ({', '.join(users)}) cannot fetch credentials: egress to "
            f"169.254.170.23:{POD_IDENTITY_PORT} is the Cilium `host` entity and no rule allows toEntities host")
