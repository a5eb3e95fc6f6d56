"""Cilium: the CNI. Installed first, because no pod (CoreDNS, operators, webhooks) schedules without it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi

from trainyard.cloud.context import ClusterContext
from trainyard.platform.kube import HelmChart, helm_release

# Cilium is up before kube-prometheus-stack (which needs a CNI to run), so the chart must not apply
# ServiceMonitors: their CRD does not exist yet. The Monitoring component scrapes Cilium instead.
_NO_SERVICE_MONITORS: dict[str, Any] = {
    "prometheus": {"serviceMonitor": {"enabled": False}},
    "operator": {"prometheus": {"serviceMonitor": {"enabled": False}}},
    "hubble": {"metrics": {"serviceMonitor": {"enabled": False}}},
}


@dataclass(frozen=True)
class CiliumArgs:
    chart: HelmChart
    cluster: ClusterContext
    # Pod IPs are VPC addresses (ENI IPAM): traffic to them is routed natively, never masqueraded.
    native_routing_cidr: str
    hubble_ui: bool = False


def cilium_values(args: CiliumArgs) -> dict[str, Any]:
    """Computed values on top of the catalogue's: API server endpoint, routing CIDR, scrape wiring."""
    values: dict[str, Any] = {
        **_NO_SERVICE_MONITORS,
        "ipv4NativeRoutingCIDR": args.native_routing_cidr,
        # Hubble UI is a ClusterIP service reached with `kubectl port-forward`: never a LoadBalancer.
        "hubble": {**_NO_SERVICE_MONITORS["hubble"], "ui": {"enabled": args.hubble_ui}},
    }
    if args.cluster.api_server_host is not None:
        # Without kube-proxy the agent cannot use the kubernetes Service VIP to find the API server.
        values["k8sServiceHost"] = args.cluster.api_server_host
        values["k8sServicePort"] = args.cluster.api_server_port
    return values


class Cilium(pulumi.ComponentResource):
    def __init__(self, name: str, args: CiliumArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("trainyard:platform:Cilium", name, None, opts)
        self.release = helm_release(f"{name}-release", args.chart, args.cluster, self, values=cilium_values(args))
        self.register_outputs({"release": self.release.id})
