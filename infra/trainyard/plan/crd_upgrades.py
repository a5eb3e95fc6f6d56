"""CRDs `pulumi up` does not apply: those in a chart's crds/ directories, which Helm installs on a release's first
install only.

helm/helm v3.19.0 pkg/action/install.go installs `crds/` before the templates (installCRDs) unless SkipCRDs;
pkg/action/upgrade.go renders without them (renderResources(..., includeCrds false)) and has no CRD step; and
pulumi-kubernetes upgrades an existing Release with action.NewUpgrade (provider/pkg/provider/helm_release.go
helmUpdate). So a chart bump that changes or adds such a CRD shows in plans/<stack>/rendered while the cluster keeps
the old one (or none): `trainyard diff` names each, with the chart file to apply. CRDs a chart renders from its
templates (argo-workflows with crds.full false, rook-ceph, volcano) are upgraded like any object.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from trainyard.plan.kube_yaml import load_objects

CRD_FILES = "customresourcedefinition.*.yaml"  # how writers.rendered_files names a release's CRDs


@dataclass(frozen=True, slots=True)
class CrdNotApplied:
    release: str
    name: str  # the CRD's metadata.name
    change: str  # "changed" or "added"
    source: Path  # the chart file that holds it
    hooks: tuple[str, ...] = ()  # the release's pre-upgrade hook Jobs (a chart may apply its CRDs from one)

    def __str__(self) -> str:
        hooks = f" (unless its pre-upgrade hook {', '.join(self.hooks)} applies it)" if self.hooks else ""
        return (f"{self.release}: CRD {self.name} {self.change}, which Helm's upgrade does not apply{hooks}: "
                f"kubectl apply --server-side -f {self.source}")


def _in_crds_dir(parts: tuple[str, ...]) -> bool:
    """Whether a path inside a chart tree lies under the crds/ of the chart or of a subchart (charts/<name>/..., and
    a subchart may itself be named crds: kube-prometheus-stack's charts/crds/crds/)."""
    return any(part == "crds" and i % 2 == 0 and all(parts[j] == "charts" for j in range(0, i, 2))
               for i, part in enumerate(parts[:-1]))


def install_only_crds(tree: Path) -> dict[str, Path]:
    """CRD name -> the file holding it, for every CRD in a crds/ directory of the chart tree or its subcharts."""
    found: dict[str, Path] = {}
    for path in sorted(tree.rglob("*")):
        if path.suffix in (".yaml", ".yml", ".json") and path.is_file() and _in_crds_dir(path.relative_to(tree).parts):
            for obj in load_objects(path.read_bytes()):
                if obj.get("kind") == "CustomResourceDefinition":
                    found.setdefault(str((obj.get("metadata") or {}).get("name")), path)
    return found


def _pre_upgrade_hooks(folder: Path) -> tuple[str, ...]:
    hooks = []
    for path in sorted(folder.glob("job.*.yaml")):
        for obj in load_objects(path.read_bytes()):
            annotations = (obj.get("metadata") or {}).get("annotations") or {}
            if "pre-upgrade" in str(annotations.get("helm.sh/hook", "")).split(","):
                hooks.append(f"Job/{(obj.get('metadata') or {}).get('name')}")
    return tuple(hooks)


def not_applied(base: Path, head: Path, trees: Mapping[str, Path]) -> list[CrdNotApplied]:
    """The install-only CRDs that the plan folder `head` (<plan>/rendered/<release>/) changes or adds against the
    plan folder `base`, for releases the base already installs (a release's first install applies them).
    `trees`: release folder name -> its chart tree at head."""
    found = []
    for release, tree in sorted(trees.items()):
        before, after = base / "rendered" / release, head / "rendered" / release
        if not before.is_dir():
            continue
        sources = install_only_crds(tree)
        for path in sorted(after.glob(CRD_FILES)):
            (crd,) = load_objects(path.read_bytes())
            name = str((crd.get("metadata") or {}).get("name"))
            old = before / path.name
            change = "added" if not old.is_file() else "changed" if old.read_bytes() != path.read_bytes() else ""
            if name in sources and change:
                found.append(CrdNotApplied(release, name, change, sources[name], _pre_upgrade_hooks(after)))
    return found
