"""The platform layer's entry: ClusterContext in, PlatformContext out.

Order (explicit depends_on, no needless chains): Cilium first (`build_cni`, on the control plane, before the
node groups: no node turns Ready without a CNI); then, once the nodes joined, side by side, kube-prometheus-stack,
the EKS add-ons needing pod networking, Karpenter, Volcano, the GPU Operator, Rook and Fluid. Whatever ships
ServiceMonitors/PrometheusRules also waits for kube-prometheus-stack (their CRDs); custom resources wait for the
release owning their CRD. Destroy runs the same graph backwards.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pulumi
import yaml

from trainyard.cloud.addons import EksAddons, after_cni_addons
from trainyard.cloud.context import ClusterContext
from trainyard.config import Secrets, Settings
from trainyard.paths import PLATFORM_DIR, REPO_ROOT
from trainyard.platform.alluxio import Alluxio, AlluxioArgs
from trainyard.platform.catalogue import Catalogue, load_catalogue
from trainyard.platform.cilium import Cilium, CiliumArgs
from trainyard.platform.context import PlatformContext
from trainyard.platform.gpu_operator import GpuOperator, GpuOperatorArgs
from trainyard.platform.karpenter import Karpenter, KarpenterArgs
from trainyard.platform.kube import HelmChart
from trainyard.platform.monitoring import Monitoring, MonitoringArgs
from trainyard.platform.rook_ceph import RookCeph, RookCephArgs, block_storage_class, filesystem_storage_class
from trainyard.platform.tenants import TRAINING_PRIORITY_CLASS, Tenants, TenantsArgs
from trainyard.platform.volcano import Volcano, VolcanoArgs

GPU_OPERATOR_DIR = PLATFORM_DIR / "gpu-operator"
MONITORING_DIR = PLATFORM_DIR / "monitoring"
ADAPTER_RULES = PLATFORM_DIR / "prometheus-adapter" / "rules.yaml"


def build_cni(settings: Settings, cluster: ClusterContext) -> Cilium | None:
    """Cilium on the control plane, before any node exists (the program creates the node groups after it)."""
    if not settings.addons.cilium.enabled:
        return None
    return Cilium("cilium", CiliumArgs(chart=_chart(load_catalogue(REPO_ROOT), "cilium"), cluster=cluster,
                                       native_routing_cidr=settings.network.vpc_cidr,
                                       hubble_ui=settings.addons.cilium.hubble_ui))


def build(settings: Settings, cluster: ClusterContext, secrets: Secrets, cilium: Cilium | None) -> PlatformContext:
    catalogue = load_catalogue(REPO_ROOT)
    addons = settings.addons
    gpu_pools = cluster.pools_with("gpu")
    cni: list[pulumi.Resource] = [cilium.release] if cilium is not None else []

    snapshot_crds: list[pulumi.Resource] = []
    if settings.is_aws:
        # CoreDNS, EBS CSI and the snapshot controller run in pods: they can only turn healthy after the CNI and
        # once nodes exist (`cluster.ready` holds the node groups).
        eks_addons = EksAddons("eks-addons", after_cni_addons(settings, cluster.name),
                               opts=pulumi.ResourceOptions(depends_on=[*cni, *cluster.ready]))
        snapshot_crds = [eks_addons.addons["snapshot-controller"]]

    monitoring = None
    if addons.monitoring.enabled:
        rook_on = addons.rook_ceph.enabled and settings.is_aws
        monitoring = Monitoring("monitoring", MonitoringArgs(
            stack_chart=_chart(catalogue, "kube-prometheus-stack"),
            adapter_chart=_chart(catalogue, "prometheus-adapter"),
            cluster=cluster, settings=addons.monitoring, grafana_admin_password=secrets.grafana_admin_password,
            rules={path.name.removesuffix(".rules.yaml"): _yaml(path)
                   for path in sorted((MONITORING_DIR / "rules").glob("*.rules.yaml"))},
            dashboards={path.stem: path.read_text(encoding="utf-8")
                        for path in sorted((MONITORING_DIR / "dashboards").glob("*.json"))},
            adapter_rules=_yaml(ADAPTER_RULES)["rules"],
            storage_class=block_storage_class(_chart(catalogue, "rook-ceph-cluster")) if rook_on else None,
            scrape_cilium=cilium is not None, depends_on=cni))

    if cluster.karpenter is not None:
        # Its chart ships a ServiceMonitor: after kube-prometheus-stack as well as the CNI.
        Karpenter("karpenter", KarpenterArgs(
            cluster=cluster, chart=_chart(catalogue, "karpenter"),
            after=(*cni, *([monitoring.release] if monitoring else []))))

    volcano = None
    if addons.volcano.enabled:
        volcano = Volcano("volcano", VolcanoArgs(chart=_chart(catalogue, "volcano"), cluster=cluster, depends_on=cni))

    if addons.gpu_operator.enabled and gpu_pools:
        efa = any(pool.efa_interfaces > 0 for pool in gpu_pools)
        GpuOperator("gpu-operator", GpuOperatorArgs(
            chart=_chart(catalogue, "gpu-operator"), cluster=cluster, gpu_pools=gpu_pools,
            mig_layouts=(GPU_OPERATOR_DIR / "mig-layouts.yaml").read_text(encoding="utf-8"),
            dcgm_metrics=(GPU_OPERATOR_DIR / "dcgm-metrics.csv").read_text(encoding="utf-8"),
            time_slicing=addons.gpu_operator.time_slicing,
            efa_chart=_chart(catalogue, "aws-efa-k8s-device-plugin") if efa else None,
            monitoring=monitoring.release if monitoring else None, depends_on=cni))

    checkpoint_class = None
    if addons.rook_ceph.enabled and settings.is_aws:
        cluster_chart = _chart(catalogue, "rook-ceph-cluster")
        RookCeph("rook-ceph", RookCephArgs(
            operator_chart=_chart(catalogue, "rook-ceph"), cluster_chart=cluster_chart, cluster=cluster,
            settings=addons.rook_ceph, system_nodes=sum(pool.min_size for pool in settings.pools("system")),
            csi_drivers_chart=_chart(catalogue, "ceph-csi-drivers") if "ceph-csi-drivers" in catalogue.pins else None,
            monitoring=monitoring.release if monitoring else None, snapshot_crds=snapshot_crds, depends_on=cni,
            protect=settings.protect))
        checkpoint_class = filesystem_storage_class(cluster_chart)

    tenants = Tenants("tenants", TenantsArgs(
        cluster=cluster, tenants=tuple(settings.tenants),
        monitoring_namespace=catalogue.chart("kube-prometheus-stack").namespace,
        network_policy="cilium" if cilium is not None else "kubernetes", region=cluster.region,
        cilium=cilium.release if cilium else None, volcano=volcano.release if volcano else None))

    dataset_claim = None
    if addons.alluxio.enabled and gpu_pools and cluster.dataset_bucket is not None and cluster.region is not None:
        alluxio = Alluxio("alluxio", AlluxioArgs(
            chart=_chart(catalogue, "fluid"), cluster=cluster, settings=addons.alluxio,
            bucket=cluster.dataset_bucket, region=cluster.region, gpu_pools=gpu_pools,
            workers=max(1, sum(pool.desired_size for pool in settings.pools("gpu"))),
            tenant_namespaces={facts.namespace: facts.ready for facts in tenants.facts.values()},
            depends_on=cni))
        dataset_claim = alluxio.claim

    return PlatformContext(
        cluster=cluster, tenants=tenants.facts,
        volcano=volcano.release if volcano else None, monitoring=monitoring.release if monitoring else None,
        checkpoint_storage_class=checkpoint_class, dataset_claim=dataset_claim,
        training_priority_class=TRAINING_PRIORITY_CLASS)


def _chart(catalogue: Catalogue, release: str) -> HelmChart:
    return HelmChart(catalogue.chart(release), catalogue.values(release))


def _yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))
