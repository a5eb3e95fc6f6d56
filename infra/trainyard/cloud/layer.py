"""The cloud layer's entry: Settings in, the control plane out; its node groups join after the CNI."""

from __future__ import annotations

from trainyard.cloud.aws import build_aws
from trainyard.cloud.context import ControlPlane
from trainyard.cloud.local import build_local
from trainyard.config.model import Settings


def build(settings: Settings) -> ControlPlane:
    if settings.target == "local":
        context = build_local(settings)
        return ControlPlane(context, lambda _after: context)
    return build_aws(settings)
