"""Where the upstream data is, and which of kubernetes-validate's schema sets stands for a cluster's version.

`tools/upstream.py sync` fills `upstream_dir()` (`.upstream/`, or `$TRAINYARD_UPSTREAM`) from the sources and
checksums in `tools/upstream.lock.yaml`; rendering reads the chart trees there, conformance the CRD schemas.
"""

from __future__ import annotations

import os
from pathlib import Path

from kubernetes_validate.utils import all_versions
from packaging.version import Version


def repo_root() -> Path:
    """The repository this module lives in (infra/trainyard/plan/upstream.py -> repo root)."""
    return Path(__file__).resolve().parents[3]


def upstream_dir(root: Path | None = None) -> Path:
    """Where `tools/upstream.py sync` puts the upstream data: `$TRAINYARD_UPSTREAM`, else `<repo>/.upstream`."""
    override = os.environ.get("TRAINYARD_UPSTREAM")
    return Path(override) if override else (root or repo_root()) / ".upstream"


def kubernetes_schema_version(cluster_version: str) -> str:
    """Newest Kubernetes schema set shipped by kubernetes-validate that is not newer than the cluster."""
    wanted = Version(cluster_version.removeprefix("v"))
    wanted_minor = (wanted.major, wanted.minor)
    shipped = sorted({Version(v) for v in all_versions()})
    usable = [v for v in shipped if (v.major, v.minor) <= wanted_minor]
    if not usable:
        raise ValueError(f"kubernetes-validate ships no schemas at or below Kubernetes {cluster_version}")
    return str(usable[-1])
