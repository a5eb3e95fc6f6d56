"""Custom resources from plain manifests: the platform builds CR bodies as data, tests check them as data."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pulumi
import pulumi_kubernetes as k8s


def custom_resource(name: str, manifest: Mapping[str, Any],
                    opts: pulumi.ResourceOptions) -> k8s.apiextensions.CustomResource:
    """Create `manifest` ({apiVersion, kind, metadata, spec}) as a CustomResource with a fixed object name."""
    return k8s.apiextensions.CustomResource(
        name,
        api_version=manifest["apiVersion"],
        kind=manifest["kind"],
        metadata=manifest["metadata"],
        spec=manifest["spec"],
        opts=opts,
    )
