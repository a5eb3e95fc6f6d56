"""Rook-Ceph on the storage pool's NVMe: RBD block volumes and CephFS (RWX checkpoints).

Checkpoints leave the cluster through the trainer's S3 export (workloads/pod.py), not through CephFS snapshots: a
snap-schedule here could only go through the filesystem's `mirroring` settings, which also enable the mirroring
mgr module and `fs snapshot mirror` with no mirror daemon (rook pkg/operator/ceph/file/controller.go,
reconcileMirroring @ v1.20.6), keep snapshots Kubernetes cannot see or restore, and pin every deleted
checkpoint's capacity on the same disks. A claim can still be snapshotted on demand (the ceph-filesystem
VolumeSnapshotClass).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pulumi

from trainyard.cloud.context import ClusterContext
from trainyard.config.model import RookCephSettings, Settings
from trainyard.platform.addon import AddonCode, AddonContext
from trainyard.platform.kube import HelmChart, helm_release

# Rook's default mon volume size (ceph-cluster-crd.md, "Mon Settings": volumeClaimTemplate).
MON_VOLUME_SIZE = "10Gi"


@dataclass(frozen=True)
class RookCephArgs:
    operator_chart: HelmChart
    cluster_chart: HelmChart
    cluster: ClusterContext
    settings: RookCephSettings
    # Nodes in the system pool (mons and mgrs each need their own node).
    system_nodes: int
    csi_drivers_chart: HelmChart | None = None
    # kube-prometheus-stack when monitoring is on: Rook's ServiceMonitors/PrometheusRules need its CRDs (the charts'
    # switches for them are set by the add-on framework, platform/addons.yaml serviceMonitors).
    monitoring: pulumi.Resource | None = None
    # snapshot.storage.k8s.io CRDs (EKS snapshot-controller add-on) for the VolumeSnapshotClasses.
    snapshot_crds: Sequence[pulumi.Resource] = ()
    # The EBS class the mons keep their stores on, and the resource that makes it.
    mon_storage_class: str | None = None
    mon_storage: Sequence[pulumi.Resource] = ()
    depends_on: Sequence[pulumi.Resource] = ()
    # The Ceph cluster holds checkpoints: protected unless the stack turns protection off to be destroyed.
    protect: bool = True


def cluster_values(args: RookCephArgs) -> dict[str, Any]:
    """Computed rook-ceph-cluster values: daemon counts, mon storage, replication."""
    base, rook = args.cluster_chart.base_values, args.settings
    replicated = {"size": rook.replicas,
                  # Rook refuses size 1 pools unless told that losing the only copy is accepted (dev).
                  "requireSafeReplicaSize": rook.replicas > 1}
    block_pools = copy.deepcopy(base["cephBlockPools"])
    for pool in block_pools:
        pool["spec"].update(failureDomain=rook.failure_domain, replicated=replicated)
    filesystems = copy.deepcopy(base["cephFileSystems"])
    for filesystem in filesystems:
        spec = filesystem["spec"]
        spec["metadataPool"].update(failureDomain=rook.failure_domain, replicated=replicated)
        for data_pool in spec["dataPools"]:
            data_pool.update(failureDomain=rook.failure_domain, replicated=replicated)
    mon: dict[str, Any] = {"count": 3 if args.system_nodes >= 3 else 1}
    if args.mon_storage_class is not None:
        mon["volumeClaimTemplate"] = {"spec": {"storageClassName": args.mon_storage_class,
                                               "resources": {"requests": {"storage": MON_VOLUME_SIZE}}}}
    return {
        "cephClusterSpec": {
            "mon": mon,
            "mgr": {"count": 2 if args.system_nodes >= 2 else 1},
        },
        "cephBlockPools": block_pools,
        "cephFileSystems": filesystems,
    }


def filesystem_storage_class(chart: HelmChart) -> str:
    return str(chart.base_values["cephFileSystems"][0]["storageClass"]["name"])


class CephStorage(pulumi.ComponentResource):
    """The data-holding part (CephCluster, pools, filesystem): protected, so no update or destroy drops it."""

    def __init__(self, name: str, args: RookCephArgs, depends_on: Sequence[pulumi.Resource],
                 opts: pulumi.ResourceOptions) -> None:
        super().__init__("trainyard:platform:CephStorage", name, None,
                         pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(protect=args.protect)))
        # Children inherit protect from this component.
        self.release = helm_release(f"{name}-release", args.cluster_chart, args.cluster, self,
                                    values=cluster_values(args), depends_on=depends_on)
        self.register_outputs({"release": self.release.id})


class RookCeph(pulumi.ComponentResource):
    def __init__(self, name: str, args: RookCephArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("trainyard:platform:RookCeph", name, None, opts)
        cluster = args.cluster
        monitoring = [args.monitoring] if args.monitoring is not None else []
        self.operator = helm_release(f"{name}-operator", args.operator_chart, cluster, self,
                                     depends_on=[*args.depends_on, *monitoring])
        # What an add-on needing Rook waits for: the operator, which owns the ceph.rook.io CRDs.
        self.release = self.operator
        storage_deps: list[pulumi.Resource] = [self.operator, *monitoring, *args.snapshot_crds, *args.mon_storage]
        self.csi_drivers = None
        if args.csi_drivers_chart is not None:
            # Driver CRs need the ceph-csi-operator CRDs that the rook-ceph chart's subchart installs.
            self.csi_drivers = helm_release(f"{name}-csi-drivers", args.csi_drivers_chart, cluster, self,
                                            depends_on=[self.operator])
            storage_deps.append(self.csi_drivers)
        self.storage = CephStorage(f"{name}-storage", args, storage_deps, pulumi.ResourceOptions(parent=self))
        self.checkpoint_storage_class = filesystem_storage_class(args.cluster_chart)
        self.register_outputs({"operator": self.operator.id, "storage": self.storage.release.id})


def build(ctx: AddonContext) -> RookCeph:
    return RookCeph(ctx.addon.resource_name, RookCephArgs(
        operator_chart=ctx.chart("rook-ceph"), cluster_chart=ctx.chart("rook-ceph-cluster"), cluster=ctx.cluster,
        settings=ctx.settings(RookCephSettings), system_nodes=sum(pool.min_size for pool in ctx.stack.pools("system")),
        csi_drivers_chart=ctx.chart("ceph-csi-drivers"), monitoring=ctx.monitoring,
        snapshot_crds=ctx.snapshot_crds, depends_on=ctx.after, protect=ctx.stack.protect,
        mon_storage_class=ctx.block_storage.name if ctx.block_storage is not None else None,
        mon_storage=(ctx.block_storage.storage_class,) if ctx.block_storage is not None else ()))


def _on_aws(stack: Settings) -> bool:
    # OSDs live on the storage pool's instance-store NVMe, which only the AWS target has.
    return stack.is_aws


COMPONENT = AddonCode(build=build, applies=_on_aws)
