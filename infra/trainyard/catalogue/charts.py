"""The chart catalogue: chart pins from `platform/charts.yaml` and base Helm values per release.

`platform/` is data only; this module is the one place that reads the pins and values, validates them and hands
out copies, so no caller can mutate the shared base values and no version string lives anywhere else.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

CHARTS_FILE = Path("platform") / "charts.yaml"
VALUES_FILE = "values.yaml"

_REQUIRED = ("chart", "repository", "version", "namespace")
_ALLOWED = frozenset((*_REQUIRED, "images", "appVersion"))
# Exact SemVer with an optional leading "v" (Rook and the GPU Operator tag their charts that way).
_EXACT_VERSION = re.compile(r"v?[0-9]+\.[0-9]+\.[0-9]+(?:-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?")
_REPOSITORY_SCHEMES = ("https://", "oci://")
_FLOATING_TAGS = frozenset(("latest", "main", "master", "stable", "edge"))


class CatalogueError(ValueError):
    """The catalogue data is invalid; the message names the file and the key."""


@dataclass(frozen=True, slots=True)
class ChartPin:
    release: str
    chart: str
    repository: str
    version: str
    namespace: str
    # Values path (dotted) -> image tag we pin over the chart default; applied by Catalogue.values().
    images: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    # The appVersion the publisher stamps into Chart.yaml when it packages this version, where the chart's source
    # tree says another version (trainyard.plan.rendering stamps the tree as `helm package` does).
    app_version: str | None = None


@dataclass(frozen=True, slots=True)
class Catalogue:
    root: Path
    pins: Mapping[str, ChartPin]
    base_values: Mapping[str, Mapping[str, Any]]

    @property
    def releases(self) -> tuple[str, ...]:
        return tuple(self.pins)

    def chart(self, release: str) -> ChartPin:
        try:
            return self.pins[release]
        except KeyError:
            raise CatalogueError(
                f"{CHARTS_FILE}: unknown release {release!r} (known: {', '.join(sorted(self.pins))})"
            ) from None

    def values(self, release: str) -> dict[str, Any]:
        """Base values with the image pins applied; a fresh deep copy on every call."""
        pin = self.chart(release)
        image_overlay: dict[str, Any] = {}
        for dotted, tag in pin.images.items():
            node = image_overlay
            *parents, leaf = dotted.split(".")
            for key in parents:
                node = node.setdefault(key, {})
            node[leaf] = tag
        return deep_merge(self.base_values.get(release, {}), image_overlay)


def deep_merge(base: Mapping[str, Any], *overlays: Mapping[str, Any]) -> dict[str, Any]:
    """Merge maps recursively, later overlays winning; lists and scalars are replaced whole, as Helm does.

    Inputs are never mutated and the result shares no dict or list with them; other objects (such as Pulumi
    Outputs, which cannot be deep-copied) are passed through as they are.
    """
    result: dict[str, Any] = {key: _copy(value) for key, value in base.items()}
    for overlay in overlays:
        for key, value in overlay.items():
            current = result.get(key)
            if isinstance(current, dict) and isinstance(value, Mapping):
                result[key] = deep_merge(current, value)
            else:
                result[key] = _copy(value)
    return result


def _copy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key: _copy(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_copy(item) for item in value]
    return value


def load_catalogue(root: Path) -> Catalogue:
    """Load and validate `<root>/platform`; cached per process (the data does not change while we run)."""
    return _load(root.resolve())


@cache
def _load(root: Path) -> Catalogue:
    charts_path = root / CHARTS_FILE
    document = _read_yaml(charts_path, root)
    where = charts_path.relative_to(root)
    if not isinstance(document, dict) or not isinstance(document.get("releases"), dict):
        raise CatalogueError(f"{where}: expected a top-level 'releases:' map")
    pins = {name: _parse_pin(where, name, entry) for name, entry in document["releases"].items()}

    base_values: dict[str, Mapping[str, Any]] = {}
    for values_path in sorted((root / "platform").glob(f"*/{VALUES_FILE}")):
        release = values_path.parent.name
        rel = values_path.relative_to(root)
        if release not in pins:
            raise CatalogueError(f"{rel}: no release {release!r} in {where} for these values")
        values = _read_yaml(values_path, root)
        if values is None:
            values = {}
        if not isinstance(values, dict):
            raise CatalogueError(f"{rel}: expected a map of Helm values, got {type(values).__name__}")
        base_values[release] = values
    return Catalogue(root=root, pins=MappingProxyType(pins), base_values=MappingProxyType(base_values))


def _read_yaml(path: Path, root: Path) -> Any:
    try:
        with path.open(encoding="utf-8") as handle:
            return yaml.safe_load(handle)
    except FileNotFoundError:
        raise CatalogueError(f"{path.relative_to(root)}: file not found") from None
    except yaml.YAMLError as err:
        raise CatalogueError(f"{path.relative_to(root)}: not valid YAML: {err}") from None


def _parse_pin(where: Path, release: str, entry: object) -> ChartPin:
    prefix = f"{where}: releases.{release}"
    if not isinstance(entry, dict):
        raise CatalogueError(f"{prefix}: expected a map with keys {', '.join(_REQUIRED)}")
    unknown = sorted(set(entry) - _ALLOWED)
    if unknown:
        raise CatalogueError(f"{prefix}: unknown key(s) {', '.join(unknown)}")
    for key in _REQUIRED:
        value = entry.get(key)
        if not isinstance(value, str) or not value.strip():
            raise CatalogueError(f"{prefix}.{key}: missing or not a non-empty string")
    version = entry["version"]
    if not _EXACT_VERSION.fullmatch(version):
        raise CatalogueError(
            f"{prefix}.version: {version!r} is not an exact version (no 'latest', ranges or wildcards)"
        )
    repository = entry["repository"]
    if not repository.startswith(_REPOSITORY_SCHEMES):
        raise CatalogueError(f"{prefix}.repository: {repository!r} must start with https:// or oci://")
    images = entry.get("images") or {}
    if not isinstance(images, dict):
        raise CatalogueError(f"{prefix}.images: expected a map of values path -> image tag")
    for path, tag in images.items():
        if not isinstance(tag, str) or not tag or tag in _FLOATING_TAGS:
            raise CatalogueError(f"{prefix}.images.{path}: {tag!r} is not a pinned image tag")
    app_version = entry.get("appVersion")
    if app_version is not None and (not isinstance(app_version, str) or not _EXACT_VERSION.fullmatch(app_version)):
        raise CatalogueError(f"{prefix}.appVersion: {app_version!r} is not an exact version (as the release has it)")
    return ChartPin(
        release=release,
        chart=entry["chart"],
        repository=repository,
        version=version,
        namespace=entry["namespace"],
        images=MappingProxyType(dict(images)),
        app_version=app_version,
    )
