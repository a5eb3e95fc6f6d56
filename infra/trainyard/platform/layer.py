"""The platform layer's entry: ClusterContext in, PlatformContext out."""

from __future__ import annotations

from trainyard.cloud.context import ClusterContext
from trainyard.config import Secrets, Settings
from trainyard.platform.context import PlatformContext


def build(settings: Settings, cluster: ClusterContext, secrets: Secrets) -> PlatformContext:
    return PlatformContext(cluster=cluster, tenants={})
