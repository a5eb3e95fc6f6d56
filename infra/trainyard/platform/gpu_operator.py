"""NVIDIA GPU Operator (+ the AWS EFA device plugin): advertises GPUs, MIG slices and EFA to the scheduler."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import yaml

from trainyard.cloud.context import ClusterContext, PoolFacts
from trainyard.config.model import GpuOperatorSettings, Settings, TimeSlicing
from trainyard.names import TIME_SLICED_CONFIG
from trainyard.paths import PLATFORM_DIR
from trainyard.platform.addon import AddonCode, AddonContext
from trainyard.platform.kube import HelmChart, helm_release, k8s_options, labels
from trainyard.platform.scheduling import startup_tolerations, tolerations_for

MIG_CONFIG_KEY = "config.yaml"
DCGM_METRICS_KEY = "dcgm-metrics.csv"
DATA_DIR = PLATFORM_DIR / "gpu-operator"


@dataclass(frozen=True)
class GpuOperatorArgs:
    chart: HelmChart
    cluster: ClusterContext
    gpu_pools: tuple[PoolFacts, ...]
    # platform/gpu-operator/mig-layouts.yaml and dcgm-metrics.csv, verbatim.
    mig_layouts: str
    dcgm_metrics: str
    time_slicing: TimeSlicing
    efa_chart: HelmChart | None = None
    depends_on: Sequence[pulumi.Resource] = ()
    # depends_on plus kube-prometheus-stack when monitoring is on: the DCGM exporter ServiceMonitor needs its CRD
    # (the chart's switch for it is set by the add-on framework, platform/addons.yaml serviceMonitors).
    monitored: Sequence[pulumi.Resource] = ()


def device_plugin_configs(base: dict[str, Any], time_slicing: TimeSlicing) -> dict[str, str]:
    """Device plugin configs by name (from the catalogue); the time-sliced one only when the stack enables it,
    with the stack's replica count."""
    configs = dict(base["devicePlugin"]["config"]["data"])
    sliced = yaml.safe_load(configs.pop(TIME_SLICED_CONFIG))
    if time_slicing.enabled:
        for resource in sliced["sharing"]["timeSlicing"]["resources"]:
            resource["replicas"] = time_slicing.replicas
        configs[TIME_SLICED_CONFIG] = yaml.safe_dump(sliced, sort_keys=False)
    return configs


# With time-sliced pools: one exporter series per pod holding a GPU, also when pods share its replicas, so the
# GPUSharedByPods alert can count them; the default attribution keeps one pod per device id (dcgm-exporter
# internal/pkg/transformation/kubernetes.go toDeviceToPod vs toDeviceToSharingPods @4.5.3-4.8.2). The renamed
# resource must be named to be attributed at all (iterateGPUDevices keeps nvidia.com/gpu and MIG only), and host
# PIDs let it split a shared GPU's utilisation and memory per pod (process_metrics.go).
SHARED_GPU_EXPORTER = {"hostPID": True, "env": [
    {"name": "KUBERNETES_VIRTUAL_GPUS", "value": "true"},
    {"name": "NVIDIA_RESOURCE_NAMES", "value": "nvidia.com/gpu.shared"},
]}


def gpu_operator_values(args: GpuOperatorArgs) -> tuple[dict[str, Any], dict[str, Any]]:
    """(base values without the inline device plugin data, computed values)."""
    base = copy.deepcopy(dict(args.chart.base_values))
    # The plugin configs become our own ConfigMap, so the chart must not render its own copy of them.
    del base["devicePlugin"]["config"]["data"]
    computed = {
        # Operands (validator, device plugin, mig-manager, DCGM exporter) run before the node is admitted.
        "daemonsets": {"tolerations": tolerations_for(args.gpu_pools) + startup_tolerations(args.gpu_pools)},
        "devicePlugin": {"config": {"create": False}},
    }
    if any(pool.gpu_sharing == "time-sliced" for pool in args.gpu_pools):
        computed["dcgmExporter"] = copy.deepcopy(SHARED_GPU_EXPORTER)
    return base, computed


class GpuOperator(pulumi.ComponentResource):
    def __init__(self, name: str, args: GpuOperatorArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("trainyard:platform:GpuOperator", name, None, opts)
        cluster, pin = args.cluster, args.chart.pin
        base, computed = gpu_operator_values(args)
        namespace = k8s.core.v1.Namespace(
            f"{name}-namespace",
            # Operands load kernel modules and mount host paths: the namespace must allow privileged pods.
            metadata={"name": pin.namespace, "labels": {**labels("gpu-operator", "gpu"),
                                                        "pod-security.kubernetes.io/enforce": "privileged"}},
            opts=k8s_options(cluster, self, args.depends_on),
        )
        config_maps = [
            self._config_map(f"{name}-mig-layouts", base["migManager"]["config"]["name"],
                             {MIG_CONFIG_KEY: args.mig_layouts}, cluster, namespace),
            self._config_map(f"{name}-dcgm-metrics", base["dcgmExporter"]["config"]["name"],
                             {DCGM_METRICS_KEY: args.dcgm_metrics}, cluster, namespace),
            self._config_map(f"{name}-device-plugin", base["devicePlugin"]["config"]["name"],
                             device_plugin_configs(dict(args.chart.base_values), args.time_slicing), cluster,
                             namespace),
        ]
        self.release = helm_release(
            f"{name}-release", HelmChart(pin, base), cluster, self, values=computed,
            depends_on=[*args.monitored, namespace, *config_maps],
        )
        self.efa: k8s.helm.v3.Release | None = None
        if args.efa_chart is not None:
            self.efa = helm_release(f"{name}-efa", args.efa_chart, cluster, self, depends_on=args.depends_on)
        self.register_outputs({"release": self.release.id})

    def _config_map(self, resource: str, name: str, data: dict[str, str], cluster: ClusterContext,
                    namespace: k8s.core.v1.Namespace) -> k8s.core.v1.ConfigMap:
        return k8s.core.v1.ConfigMap(
            resource,
            metadata={"name": name, "namespace": namespace.metadata.name, "labels": labels(name, "gpu")},
            data=data,
            opts=k8s_options(cluster, self, [namespace]),
        )


def build(ctx: AddonContext) -> GpuOperator:
    gpu_pools = ctx.cluster.pools_with("gpu")
    efa = any(pool.efa_interfaces > 0 for pool in gpu_pools)
    return GpuOperator(ctx.addon.resource_name, GpuOperatorArgs(
        chart=ctx.chart("gpu-operator"), cluster=ctx.cluster, gpu_pools=gpu_pools,
        mig_layouts=(DATA_DIR / "mig-layouts.yaml").read_text(encoding="utf-8"),
        dcgm_metrics=(DATA_DIR / "dcgm-metrics.csv").read_text(encoding="utf-8"),
        time_slicing=ctx.settings(GpuOperatorSettings).time_slicing,
        # Only EFA instances have EFA devices to advertise.
        efa_chart=ctx.chart("aws-efa-k8s-device-plugin") if efa else None,
        depends_on=ctx.after, monitored=ctx.monitored))


def _has_gpu_pools(stack: Settings) -> bool:
    return bool(stack.pools("gpu"))


COMPONENT = AddonCode(build=build, applies=_has_gpu_pools)
