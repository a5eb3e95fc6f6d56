"""Shared by the cloud tests: each stack rendered once per session under the mock runtime.

The entry point runs the real cloud layer and the Karpenter component the way the platform layer calls it,
so the Karpenter custom resources are checked before (and independently of) the platform layer's wiring.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

from trainyard.catalogue.charts import load_catalogue
from trainyard.cloud import layer as cloud
from trainyard.config import load_settings
from trainyard.paths import REPO_ROOT
from trainyard.plan.recording import Recording, ResourceRecord
from trainyard.plan.runtime import STACKS_DIR, available_stacks, read_stack, render, settings_of
from trainyard.platform.karpenter import Karpenter, KarpenterArgs
from trainyard.platform.kube import HelmChart

# Every stack in stacks/ that targets AWS (users add and edit their own).
AWS_STACKS = tuple(s for s in available_stacks() if settings_of(read_stack(s)).is_aws)


def cloud_and_karpenter() -> None:
    settings, _ = load_settings()
    cluster = cloud.build(settings).join_nodes(())
    if settings.is_aws:
        catalogue = load_catalogue(REPO_ROOT)
        chart = HelmChart(catalogue.chart("karpenter"), catalogue.values("karpenter"))
        Karpenter("karpenter", KarpenterArgs(cluster=cluster, chart=chart,
                                             node_repair=settings.addons.gpu_health.repair))


@cache
def plan(stack: str, stacks_dir: Path = STACKS_DIR) -> Recording:
    """The stack's cloud layer and Karpenter: a stack of stacks/ by name, or of another folder (tests/fixtures)."""
    return render(read_stack(stack, stacks_dir), cloud_and_karpenter)


def of_type(rec: Recording, type_: str) -> list[ResourceRecord]:
    return [r for r in rec.resources if r.type == type_]


def one(rec: Recording, type_: str, name: str | None = None) -> ResourceRecord:
    found = [r for r in of_type(rec, type_) if name is None or r.name == name]
    assert len(found) == 1, f"expected one {type_} {name or ''}, found {[r.name for r in found]}"
    return found[0]


def by_urn(rec: Recording, urn: str) -> ResourceRecord:
    return rec.by_urn()[urn]


def policy_documents(rec: Recording) -> Iterator[tuple[ResourceRecord, dict[str, Any]]]:
    """Every IAM-style policy document in the plan: role trust and inline policies, bucket and queue policies."""
    keys = ("policy", "assumeRolePolicy")
    for r in rec.resources:
        for key in keys:
            text = r.inputs.get(key)
            if isinstance(text, str) and text.lstrip().startswith("{"):
                yield r, json.loads(text)
