"""The local target: no AWS at all; everything goes into an existing kubeconfig context (e.g. a kind cluster)."""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as k8s

from trainyard.cloud.context import ClusterContext
from trainyard.config.model import Settings


class LocalCluster(pulumi.ComponentResource):
    """Hands over a provider for the current kubeconfig's context; creates nothing else."""

    def __init__(self, name: str, context: str, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("trainyard:cloud:LocalCluster", name, None, opts)
        self.provider = k8s.Provider(f"{name}-k8s", context=context, opts=pulumi.ResourceOptions(parent=self))
        self.register_outputs({})


def build_local(settings: Settings) -> ClusterContext:
    assert settings.local is not None
    local = LocalCluster("local", settings.local.kubeconfig_context)
    return ClusterContext(
        name=settings.local.kubeconfig_context,
        provider=local.provider,
        cluster=None,
        api_server_host=None,
        api_server_port=6443,
        pools=(),
    )
