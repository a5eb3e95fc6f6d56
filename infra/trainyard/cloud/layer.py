"""The cloud layer's entry: Settings in, ClusterContext out."""

from __future__ import annotations

from trainyard.cloud.aws import build_aws
from trainyard.cloud.context import ClusterContext
from trainyard.cloud.local import build_local
from trainyard.config.model import Settings


def build(settings: Settings) -> ClusterContext:
    return build_local(settings) if settings.target == "local" else build_aws(settings)
