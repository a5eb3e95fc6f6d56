"""The platform layer's entry: ClusterContext in, PlatformContext out.

The add-ons a stack turns on come from the registry (platform/addons.yaml), built in dependency order: the CNI
first (`build_cni`, on the control plane, before the node groups: no node turns Ready without a CNI); then, once
the nodes joined, the EKS add-ons needing pod networking; then every other add-on after what it needs, and after
kube-prometheus-stack when it ships ServiceMonitors. The tenants come next (their queues and network policies
need Volcano's and Cilium's CRDs), then the add-ons that put objects into tenant namespaces. Destroy runs the
same graph backwards.
"""

from __future__ import annotations

from collections.abc import Mapping

import pulumi

from trainyard.catalogue.addons import MONITORING
from trainyard.catalogue.charts import load_catalogue
from trainyard.cloud.addons import EksAddons, after_cni_addons
from trainyard.cloud.context import ClusterContext
from trainyard.config import Secrets, Settings
from trainyard.paths import REPO_ROOT
from trainyard.platform.addon import Addon, AddonContext, Installed
from trainyard.platform.alluxio import Alluxio
from trainyard.platform.context import PlatformContext, TenantFacts
from trainyard.platform.ebs import EbsStorageClass, EbsStorageClassArgs
from trainyard.platform.mlflow import Mlflow
from trainyard.platform.registry import load_registry
from trainyard.platform.rook_ceph import RookCeph
from trainyard.platform.tenants import (
    TRAINING_PRIORITY_CLASS,
    Tenants,
    TenantsArgs,
    fabric_check_tenant,
    mig_slices_per_gpu,
)

CNI = "cilium"
VOLCANO = "volcano"


def build_cni(settings: Settings, cluster: ClusterContext, secrets: Secrets) -> Installed | None:
    """The CNI add-on on the control plane, before any node exists (the program creates the node groups after it)."""
    enabled = load_registry(REPO_ROOT).enabled(settings)
    cni = next((a for a in enabled if a.cni), None)
    if cni is None:
        return None
    return cni.code.build(AddonContext(addon=cni, stack=settings, cluster=cluster, secrets=secrets,
                                       catalogue=load_catalogue(REPO_ROOT), after=(), monitoring=None,
                                       enabled=enabled))


def build(settings: Settings, cluster: ClusterContext, secrets: Secrets, cni: Installed | None) -> PlatformContext:
    catalogue = load_catalogue(REPO_ROOT)
    enabled = load_registry(REPO_ROOT).enabled(settings)
    installed: dict[str, Installed] = {}
    cni_releases: list[pulumi.Resource] = []
    if cni is not None:
        installed.update({a.name: cni for a in enabled if a.cni})
        cni_releases.append(cni.release)
    snapshot_crds: tuple[pulumi.Resource, ...] = ()
    ebs = None
    if settings.is_aws:
        # CoreDNS, EBS CSI and the snapshot controller run in pods: they can only turn healthy after the CNI and
        # once nodes exist (`cluster.ready` holds the node groups).
        eks_addons = EksAddons("eks-addons", after_cni_addons(settings, cluster.name),
                               opts=pulumi.ResourceOptions(providers=[p for p in (cluster.aws_provider,) if p],
                                                           depends_on=[*cni_releases, *cluster.ready]))
        snapshot_crds = (eks_addons.addons["snapshot-controller"],)
        ebs = EbsStorageClass("ebs-gp3", EbsStorageClassArgs(
            cluster=cluster, depends_on=[eks_addons.addons["aws-ebs-csi-driver"]]))

    def install(addon: Addon, tenants: Mapping[str, TenantFacts]) -> None:
        monitoring = installed.get(MONITORING)
        installed[addon.name] = addon.code.build(AddonContext(
            addon=addon, stack=settings, cluster=cluster, secrets=secrets, catalogue=catalogue,
            after=(*cni_releases, *(installed[need].release for need in addon.needs if need in installed)),
            monitoring=monitoring.release if monitoring is not None else None,
            enabled=enabled, snapshot_crds=snapshot_crds, block_storage=ebs,
            tenants=tenants))

    for addon in (a for a in enabled if not a.cni and not a.after_tenants):
        install(addon, {})

    cilium, volcano, rook = installed.get(CNI), installed.get(VOLCANO), installed.get("rookCeph")
    checkpoint_class = rook.checkpoint_storage_class if isinstance(rook, RookCeph) else None
    checked = {pool.name for pool in settings.fabric_checked_pools}
    tenants = Tenants("tenants", TenantsArgs(
        cluster=cluster, tenants=tuple(settings.tenants),
        monitoring_namespace=catalogue.chart("kube-prometheus-stack").namespace,
        network_policy="cilium" if cilium is not None else "kubernetes", region=cluster.region,
        cilium=cilium.release if cilium else None, volcano=volcano.release if volcano else None,
        fabric_checks=fabric_check_tenant([p for p in cluster.pools if p.name in checked]),
        mig_slices=mig_slices_per_gpu(cluster.pools), claim_storage_class=checkpoint_class))
    for addon in (a for a in enabled if a.after_tenants):
        install(addon, tenants.facts)

    monitoring, alluxio = installed.get(MONITORING), installed.get("alluxio")
    tracking, workflows = installed.get("mlflow"), installed.get("argoWorkflows")
    return PlatformContext(
        cluster=cluster, tenants=tenants.facts, fabric_checks=tenants.fabric_checks,
        volcano=volcano.release if volcano else None, monitoring=monitoring.release if monitoring else None,
        checkpoint_storage_class=checkpoint_class,
        checkpoint_storage=(rook.storage.release,) if isinstance(rook, RookCeph) else (),
        dataset_claim=alluxio.claim if isinstance(alluxio, Alluxio) else None,
        dataset_subpath=alluxio.claim_subpath if isinstance(alluxio, Alluxio) else "",
        training_priority_class=TRAINING_PRIORITY_CLASS,
        tracking_uri=tracking.tracking_uri if isinstance(tracking, Mlflow) else None,
        workflows=workflows.release if workflows is not None else None)
