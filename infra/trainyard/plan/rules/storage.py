"""Rules on storage: a claim binds only once its StorageClass's backend can provision, and Ceph serves storage only
with mons and OSD hosts."""

from __future__ import annotations

from trainyard.plan.cluster_state import ClusterState, ceph_cluster_problem
from trainyard.plan.pods import OPERATED_KINDS, lookup
from trainyard.plan.recording import ResourceRecord
from trainyard.plan.rendering import chart_name
from trainyard.plan.resource_types import PVC, RELEASE
from trainyard.plan.rules.base import Moment, of_type, rule


def _class_problem(name: str | None, state: ClusterState) -> str | None:
    if name is None:
        return "it names no StorageClass and the cluster has no default class"
    storage_class = state.storage_classes.get(name)
    if storage_class is None:
        return f"StorageClass {name} does not exist yet"
    return storage_class.problem


# Volumes of pods a release's operator creates (a Prometheus or Alertmanager resource's spec.storage
# volumeClaimTemplate, which prometheus-operator makes its StatefulSet's claim) stay Pending until their
# StorageClass's backend can provision (kubernetes.io/docs/concepts/storage/dynamic-provisioning); a monitoring
# volume on a backend installed later waits for it.
@rule("release-volumes-bind", of_type(RELEASE),
      "Kubernetes dynamic provisioning: a claim waits for its class's provisioner")
def release_volumes_bind(record: ResourceRecord, moment: Moment) -> str | None:
    for obj in moment.release(record).objects:
        group = str(obj.get("apiVersion", "")).rpartition("/")[0]
        claim = lookup(obj, "spec.storage.volumeClaimTemplate")
        if obj.get("kind") not in OPERATED_KINDS.get(group, frozenset()) or claim is None:
            continue
        name = lookup(claim, "spec.storageClassName") or moment.before.default_class
        if problem := _class_problem(name, moment.before):
            return (f"{obj['kind']}'s volume (StorageClass {name}) stays Pending when this release installs: "
                    f"{problem}")
    return None


# Rook's storage selection decides which nodes get OSDs: useAllNodes, or a nodes: list (useAllNodes false with
# no list selects none), filtered by the OSD placement; mons need `mon.count` distinct nodes unless
# allowMultiplePerNode. Rook keeps reconciling, so the nodes at the end of the run count.
@rule("ceph-has-osds", of_type(RELEASE), "Rook ceph-cluster-crd doc: storage selection, mon count")
def ceph_has_osds(record: ResourceRecord, moment: Moment) -> str | None:
    if chart_name(str(record.inputs.get("chart", ""))) != "rook-ceph-cluster" or moment.after.ceph is None:
        return None
    if problem := ceph_cluster_problem(moment.after.ceph):
        return f"the CephCluster never serves storage: {problem}"
    return None


# pulumi-kubernetes waits for a PersistentVolumeClaim to be Bound unless the pulumi.com/skipAwait annotation is
# set or its class binds WaitForFirstConsumer (pulumi-kubernetes await logic). Binding needs the class's backend
# to provision: Ceph needs the Rook operator, a CephCluster, mons and OSD hosts, and a pool size no larger than
# the OSD hosts with failureDomain host.
@rule("claim-binds", of_type(PVC),
      "pulumi-kubernetes PVC await (Bound; issue 895); Rook ceph-cluster-crd / ceph-pool-crd")
def claim_binds(record: ResourceRecord, moment: Moment) -> str | None:
    annotations = lookup(record.inputs, "metadata.annotations", {}) or {}
    name = lookup(record.inputs, "spec.storageClassName")
    awaited_class = moment.before.storage_classes.get(str(name or moment.before.default_class))
    awaited = annotations.get("pulumi.com/skipAwait") != "true" and (awaited_class is None or
                                                                       awaited_class.immediate)
    state = moment.before if awaited else moment.after
    problem = _class_problem(str(name) if name else state.default_class, state)
    if problem is None:
        return None
    if awaited:
        return f"pulumi up waits for the claim to bind, and nothing it waits on can serve it: {problem}"
    return f"the claim never binds: {problem}"
