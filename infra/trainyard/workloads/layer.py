"""The workload layer's entry: PlatformContext in, training jobs out."""

from __future__ import annotations

from trainyard.config import Settings
from trainyard.platform.context import PlatformContext


def build(settings: Settings, platform: PlatformContext) -> None:
    return None
