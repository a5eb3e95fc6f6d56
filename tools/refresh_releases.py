"""Refresh the release data the pins are checked against (infra/trainyard/config/release_data/*.yaml).

Each file holds facts read from one kind of upstream source: the URL, the day it was read, and the versions it
listed. `tests/config/test_release_pins.py` checks every pin in the repository against them. With internet:

    python tools/refresh_releases.py eks-ami        # awslabs/amazon-eks-ami CHANGELOG.md
    python tools/refresh_releases.py eks-addons     # aws eks describe-addon-versions (AWS credentials)
    python tools/refresh_releases.py charts         # each chart repository's index.yaml (OCI: registry tags)

A parser per source is a pure function of the fetched text, so it is tested offline on fixtures
(tests/config/fixtures/releases/). Review the diff before committing: a pin may only move to a listed version.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from trainyard.config.releases import ADDON_FIELDS

ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = ROOT / "infra" / "trainyard" / "config" / "release_data"
EKS_AMI_CHANGELOG = "https://raw.githubusercontent.com/awslabs/amazon-eks-ami/main/CHANGELOG.md"
KEEP_RELEASES = 12

_AMI_RELEASE = re.compile(r"^# AMI Release v(\d{8})\s*$", re.M)
_K8S_BLOCK = re.compile(r"<summary><b>Kubernetes (\d+\.\d+)</b></summary>(.*?)</details>", re.S)
_RELEASE_VERSION = re.compile(r"<td[^>]*>(\d+\.\d+\.\d+-\d{8})</td>")
_SEMVER = re.compile(r"v?([0-9]+)\.([0-9]+)\.([0-9]+)(?:[-+].*)?")
# A release, not a pre-release (`1.20.0-rc.1`, `1.21.0-pre.0`): pins never take pre-releases.
_RELEASE = re.compile(r"v?[0-9]+\.[0-9]+\.[0-9]+")


def parse_eks_ami_changelog(text: str, minors: Iterable[str]) -> dict[str, list[str]]:
    """AL2023 node group release versions (`1.34.9-20260714`) per Kubernetes minor, newest release first."""
    wanted = set(minors)
    found: dict[str, list[str]] = {m: [] for m in sorted(wanted)}
    starts = [(m.start(), m.group(1)) for m in _AMI_RELEASE.finditer(text)]
    for (start, date), (end, _) in zip(starts, [*starts[1:], (len(text), "")], strict=True):
        for block in _K8S_BLOCK.finditer(text, start, end):
            minor, body = block.group(1), block.group(2)
            if minor not in wanted or f"al2023-x86_64-standard-{minor}-v{date}" not in body:
                continue
            version = _RELEASE_VERSION.search(body)
            if version and version.group(1).endswith(f"-{date}"):
                found[minor].append(version.group(1))
    return {m: v[:KEEP_RELEASES] for m, v in found.items()}


def parse_addon_versions(describe_output: str, kubernetes_version: str) -> dict[str, list[str]]:
    """`aws eks describe-addon-versions --kubernetes-version X` → versions compatible with X, per add-on."""
    addons = json.loads(describe_output)["addons"]
    result: dict[str, list[str]] = {}
    for addon in addons:
        versions = [v["addonVersion"] for v in addon["addonVersions"]
                    if any(c.get("clusterVersion") == kubernetes_version for c in v.get("compatibilities", []))]
        result[addon["addonName"]] = sorted(set(versions), key=_version_key, reverse=True)
    return result


def parse_helm_index(index_text: str, chart: str) -> list[str]:
    """A Helm repository's index.yaml → the chart's published releases, newest first."""
    entries = (yaml.safe_load(index_text) or {}).get("entries", {}).get(chart, [])
    versions = {str(e["version"]) for e in entries}
    return sorted((v for v in versions if _RELEASE.fullmatch(v)), key=_version_key, reverse=True)


def parse_registry_tags(tags_json: str) -> list[str]:
    """An OCI distribution `/v2/<name>/tags/list` answer → its release tags, newest first."""
    tags = json.loads(tags_json).get("tags") or []
    return sorted((t for t in tags if _RELEASE.fullmatch(t)), key=_version_key, reverse=True)


def _version_key(version: str) -> tuple[int, ...]:
    match = _SEMVER.fullmatch(version)
    base = tuple(int(p) for p in match.groups()) if match else (0, 0, 0)
    build = re.search(r"eksbuild\.([0-9]+)", version)
    return (*base, int(build.group(1)) if build else 0)


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=60) as response:  # noqa: S310 - fixed https URLs of public sources
        return str(response.read().decode())


def _write(name: str, document: Mapping[str, Any]) -> Path:
    path = DATA_DIR / f"{name}.yaml"
    header = "# Facts only, read from `source` on `retrieved`; written by tools/refresh_releases.py.\n"
    path.write_text(header + yaml.safe_dump(dict(document), sort_keys=False, width=120))
    return path


def _today() -> str:
    return datetime.datetime.now(datetime.UTC).date().isoformat()


def refresh_eks_ami(minors: list[str]) -> Path:
    releases = parse_eks_ami_changelog(_get(EKS_AMI_CHANGELOG), minors)
    return _write("eks-ami", {"source": EKS_AMI_CHANGELOG, "retrieved": _today(), "releases": releases})


def refresh_eks_addons(minors: list[str], addons: list[str]) -> Path:
    per_version: dict[str, dict[str, list[str]]] = {}
    for minor in minors:
        out = subprocess.run(["aws", "eks", "describe-addon-versions", "--kubernetes-version", minor,
                              "--output", "json"], check=True, capture_output=True, text=True).stdout
        parsed = parse_addon_versions(out, minor)
        per_version[minor] = {a: parsed.get(a, [])[:KEEP_RELEASES] for a in addons}
    return _write("eks-addons", {"source": "aws eks describe-addon-versions --kubernetes-version <minor>",
                                 "retrieved": _today(), "versions": per_version})


def refresh_charts() -> Path:
    current = yaml.safe_load((DATA_DIR / "charts.yaml").read_text())
    for name, chart in current["charts"].items():
        repository = chart["repository"]
        if repository.startswith("oci://"):
            registry, _, repo = repository.removeprefix("oci://").partition("/")
            versions = parse_registry_tags(_get(f"https://{registry}/v2/{repo}/{name}/tags/list"))
        else:
            versions = parse_helm_index(_get(f"{repository.rstrip('/')}/index.yaml"), name)
        chart.update(source=repository, retrieved=_today(), versions=versions[:KEEP_RELEASES])
    return _write("charts", current)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("eks-ami", "eks-addons", "charts"))
    args = parser.parse_args(argv)
    minors = list(yaml.safe_load((DATA_DIR / "eks-ami.yaml").read_text())["releases"])
    if args.what == "eks-ami":
        path = refresh_eks_ami(minors)
    elif args.what == "eks-addons":
        path = refresh_eks_addons(minors, list(ADDON_FIELDS))
    else:
        path = refresh_charts()
    print(f"wrote {path.relative_to(ROOT)}: review the diff, then move pins only to listed versions")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
