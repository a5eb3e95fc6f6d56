"""Physical AWS names and tags: logical names stay stack-neutral, physical names carry the stack.

Several stacks (dev, staging, prod) may share one account and region, so every name AWS sees is prefixed
with `trainyard-<stack>`; the cluster name doubles as Karpenter's discovery tag value.
"""

from __future__ import annotations

from trainyard.config.model import Settings

PREFIX = "trainyard"
DISCOVERY_TAG = "karpenter.sh/discovery"
# The pull-request preview role of a stack: `trainyard-<stack>-preview` (tools/deploy_settings.py prints its ARN).
PREVIEW_ROLE = "preview"


def cluster_name(settings: Settings) -> str:
    return f"{PREFIX}-{settings.stack}"


def physical(settings: Settings, *parts: str) -> str:
    """`trainyard-<stack>-<part>-...`, e.g. the IAM role `trainyard-prod-karpenter-controller`."""
    return "-".join((cluster_name(settings), *parts))


def base_tags(settings: Settings) -> dict[str, str]:
    """Tags every AWS resource carries: the stack's configured tags plus who manages it."""
    configured = settings.aws.tags if settings.aws else {}
    return {**configured, "trainyard.io/stack": settings.stack, "managed-by": "pulumi"}
