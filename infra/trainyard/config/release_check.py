"""Every pinned version in the repository, checked against the release data in `release_data/`.

A pin is confirmed when the dated release data (read from its upstream source, see each file's `source`) lists
it, or else must be listed in `release_data/unverified.yaml` with the reason it could not be confirmed. Pins are
named `<kind>/<where>=<version>`, e.g. `eks-ami/1.34=1.34.9-20260714` or `chart/cilium=1.20.0`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from trainyard.config.releases import ADDON_FIELDS, KUBERNETES_RELEASES, KubernetesRelease

DATA_DIR = Path(__file__).resolve().parent / "release_data"
_FROM = re.compile(r"^FROM\s+(?:--platform=\S+\s+)?(\S+)", re.M)
# Karpenter's AMI alias is `<family>@<version>`, the version `latest` or `v<date>` of an EKS AMI release
# (karpenter.sh/docs/tasks/managing-amis: `alias: al2023@v20240807` pins one release).
_ALIAS = re.compile(r"al2023@v([0-9]{8})")
_DIGEST = "sha256:"


@dataclass(frozen=True, slots=True)
class Pin:
    name: str  # `<kind>/<where>=<version>`
    source: str  # the file that sets it
    confirmed: bool


def _load(name: str, data_dir: Path) -> Any:
    return yaml.safe_load((data_dir / name).read_text())


def unverified(data_dir: Path = DATA_DIR) -> dict[str, str]:
    """Pins accepted without confirmation, with the reason each could not be confirmed."""
    return {str(e["pin"]): str(e["reason"]) for e in _load("unverified.yaml", data_dir) or []}


def release_problems(release: KubernetesRelease) -> list[str]:
    """A release entry whose parts disagree: the AMI date, the node group release and the Karpenter alias."""
    problems = []
    date = release.node_group_release.rpartition("-")[2]
    if not release.node_group_release.startswith(f"{release.version}."):
        problems.append(f"{release.version}: node group release {release.node_group_release} is of another minor")
    if release.ami_release != date:
        problems.append(f"{release.version}: ami_release {release.ami_release} differs from the node group "
                        f"release's date {date}")
    match = _ALIAS.fullmatch(release.karpenter_ami_alias)
    if not match or match.group(1) != date:
        problems.append(f"{release.version}: Karpenter alias {release.karpenter_ami_alias} is not al2023@v{date}")
    return problems


def kubernetes_pins(releases: Mapping[str, KubernetesRelease], data_dir: Path = DATA_DIR) -> Iterator[Pin]:
    amis = _load("eks-ami.yaml", data_dir)["releases"]
    addons = _load("eks-addons.yaml", data_dir)["versions"]
    where = "infra/trainyard/config/releases.py"
    for minor, release in releases.items():
        yield Pin(f"eks-ami/{minor}={release.node_group_release}", where,
                  release.node_group_release in (amis.get(minor) or []))
        for addon, field in ADDON_FIELDS.items():
            version = str(getattr(release, field))
            known = (addons.get(minor) or {}).get(addon) or []
            yield Pin(f"eks-addon/{minor}/{addon}={version}", where, version in known)


def chart_pins(repo_root: Path, data_dir: Path = DATA_DIR) -> Iterator[Pin]:
    charts = _load("charts.yaml", data_dir)["charts"]
    images = _load("images.yaml", data_dir)
    catalogue = yaml.safe_load((repo_root / "platform" / "charts.yaml").read_text())["releases"]
    for entry in catalogue.values():
        chart = str(entry["chart"])
        known = charts.get(chart) or {}
        confirmed = str(entry["version"]) in map(str, known.get("versions", [])) \
            and known.get("repository") == entry["repository"]
        yield Pin(f"chart/{chart}={entry['version']}", "platform/charts.yaml", confirmed)
        pinned = {images["chart_image_values"].get(chart, {}).get(path, f"<{chart} {path}>"): str(value)
                  for path, value in (entry.get("images") or {}).items() if not str(value).startswith(_DIGEST)}
        for path, value in (entry.get("images") or {}).items():
            repository = images["chart_image_values"].get(chart, {}).get(path, f"<{chart} {path}>")
            if str(value).startswith(_DIGEST):
                yield _digest_pin(repository, pinned.get(repository), str(value), "platform/charts.yaml", images)
            else:
                yield _image_pin(f"{repository}:{value}", "platform/charts.yaml", images)


def _image_pin(reference: str, source: str, images: Mapping[str, Any]) -> Pin:
    repository, _, tag = reference.rpartition(":")
    known = (images["images"].get(repository) or {}).get("versions", [])
    return Pin(f"image/{reference}", source, tag in map(str, known))


def _digest_pin(repository: str, tag: str | None, digest: str, source: str, images: Mapping[str, Any]) -> Pin:
    """A digest is confirmed only as the one release data records for the tag pinned beside it."""
    digests = (images["images"].get(repository) or {}).get("digests") or {}
    return Pin(f"image/{repository}:{tag}@{digest}", source, tag is not None and digests.get(tag) == digest)


def recorded_digests(data_dir: Path = DATA_DIR) -> dict[str, dict[str, str]]:
    """repository -> tag -> the digest release data records for that tag (only repositories with recorded digests)."""
    images = _load("images.yaml", data_dir)["images"]
    return {repository: {str(tag): str(digest) for tag, digest in entry["digests"].items()}
            for repository, entry in images.items() if (entry or {}).get("digests")}


def image_pins(repo_root: Path, data_dir: Path = DATA_DIR) -> Iterator[Pin]:
    """Base images of every Dockerfile, images of chart-less add-ons and the stacks' job images; the project's own
    images are not upstream."""
    images = _load("images.yaml", data_dir)
    project = tuple(f"{name}:" for name in images.get("project_images") or ())
    found: list[tuple[str, str]] = []
    for dockerfile in sorted(repo_root.glob("workloads/**/Dockerfile")):
        found += [(ref, str(dockerfile.relative_to(repo_root))) for ref in _FROM.findall(dockerfile.read_text())]
    # Images of add-ons without a chart (platform/<add-on>/images.yaml: name -> reference).
    for listing in sorted((repo_root / "platform").glob("*/images.yaml")):
        found += [(str(ref), str(listing.relative_to(repo_root)))
                  for ref in (yaml.safe_load(listing.read_text()) or {}).values()]
    for stack in sorted((repo_root / "stacks").glob("Pulumi.*.yaml")):
        jobs = ((yaml.safe_load(stack.read_text()) or {}).get("config") or {}).get("trainyard:workloads") or []
        found += [(str(job["image"]), str(stack.relative_to(repo_root))) for job in jobs if "image" in job]
    for reference, source in found:
        if not reference.startswith(project):
            yield _image_pin(reference, source, images)


def all_pins(repo_root: Path, data_dir: Path = DATA_DIR) -> list[Pin]:
    return [*kubernetes_pins(KUBERNETES_RELEASES, data_dir), *chart_pins(repo_root, data_dir),
            *image_pins(repo_root, data_dir)]
