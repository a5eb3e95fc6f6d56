"""The cloud layer's entry: Settings in, ClusterContext out."""

from __future__ import annotations

from trainyard.cloud.context import ClusterContext
from trainyard.cloud.local import build_local
from trainyard.config.model import Settings


def build(settings: Settings) -> ClusterContext:
    if settings.target == "local":
        return build_local(settings)
    from trainyard.cloud.aws import build_aws

    return build_aws(settings)
