"""Cilium: the CNI. Installed first, before the node groups: no node turns Ready without it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from trainyard.cloud.context import ClusterContext
from trainyard.cloud.iam import cluster_owned_tag
from trainyard.cloud.naming import cluster_name
from trainyard.config.model import CiliumSettings
from trainyard.platform.addon import AddonCode, AddonContext
from trainyard.platform.kube import HelmChart, helm_release, k8s_options, labels

# The API server host is only known once the cluster exists (an Output), so it reaches the agent through a
# ConfigMap the chart references (k8sServiceHostRef) rather than through Helm values.
API_SERVER_CONFIG_MAP = "cilium-api-server"
API_SERVER_HOST_KEY = "host"


@dataclass(frozen=True)
class CiliumArgs:
    chart: HelmChart
    cluster: ClusterContext
    # Pod IPs are VPC addresses (ENI IPAM): traffic to them is routed natively, never masqueraded.
    native_routing_cidr: str
    hubble_ui: bool = False
    # Tags of the ENIs the operator creates: the cluster-owned tag its IAM is scoped by (cloud/iam.py).
    eni_tags: Mapping[str, str] = field(default_factory=dict)


def cilium_values(args: CiliumArgs) -> dict[str, Any]:
    """Computed values on top of the catalogue's: API server endpoint and routing CIDR."""
    values: dict[str, Any] = {
        "ipv4NativeRoutingCIDR": args.native_routing_cidr,
        # Hubble UI is a ClusterIP service reached with `kubectl port-forward`: never a LoadBalancer.
        "hubble": {"ui": {"enabled": args.hubble_ui}},
    }
    if args.eni_tags:
        # Set on CreateNetworkInterface (chart 1.20.0 values.yaml eni.eniTags -> the operator's TagSpecifications).
        values["eni"] = {"eniTags": dict(args.eni_tags)}
    if args.cluster.api_server_host is not None:
        # Without kube-proxy the agent cannot use the kubernetes Service VIP to find the API server.
        values["k8sServiceHostRef"] = {"name": API_SERVER_CONFIG_MAP, "key": API_SERVER_HOST_KEY}
        values["k8sServicePort"] = args.cluster.api_server_port
    return values


class Cilium(pulumi.ComponentResource):
    def __init__(self, name: str, args: CiliumArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("trainyard:platform:Cilium", name, None, opts)
        cluster = args.cluster
        endpoint: list[pulumi.Resource] = []
        if cluster.api_server_host is not None:
            endpoint.append(k8s.core.v1.ConfigMap(
                f"{name}-api-server",
                metadata={"name": API_SERVER_CONFIG_MAP, "namespace": args.chart.pin.namespace,
                          "labels": labels("cilium", "network")},
                data={API_SERVER_HOST_KEY: cluster.api_server_host},
                opts=k8s_options(cluster, self)))
        # Installed before any node exists, so its pods cannot be Ready yet: create, do not wait.
        self.release = helm_release(f"{name}-release", args.chart, cluster, self, values=cilium_values(args),
                                    depends_on=endpoint, wait=False)
        self.register_outputs({"release": self.release.id})


def build(ctx: AddonContext) -> Cilium:
    return Cilium(ctx.addon.resource_name, CiliumArgs(
        chart=ctx.chart("cilium"), cluster=ctx.cluster, native_routing_cidr=ctx.stack.network.vpc_cidr,
        hubble_ui=ctx.settings(CiliumSettings).hubble_ui,
        eni_tags=dict([cluster_owned_tag(cluster_name(ctx.stack))]) if ctx.stack.is_aws else {}))


COMPONENT = AddonCode(build=build)
