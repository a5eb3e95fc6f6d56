"""The platform catalogue: loading, validation, deep merge, and conformance of every base values file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from trainyard.catalogue.charts import CatalogueError, deep_merge, load_catalogue
from trainyard.plan.conformance import check_helm_values
from trainyard.platform.registry import load_registry

ROOT = Path(__file__).resolve().parents[2]


def _write(root: Path, releases: str, values: dict[str, str] | None = None) -> Path:
    (root / "platform").mkdir(parents=True)
    (root / "platform" / "charts.yaml").write_text(releases)
    for release, text in (values or {}).items():
        (root / "platform" / release).mkdir()
        (root / "platform" / release / "values.yaml").write_text(text)
    return root


GOOD = """releases:
  demo:
    chart: demo
    repository: oci://registry.example/charts
    version: v1.2.3
    namespace: demo
    images:
      image.tag: 1.2.3
"""


def test_repository_catalogue_loads() -> None:
    catalogue = load_catalogue(ROOT)
    # Every release belongs to exactly one add-on of platform/addons.yaml (the registry refuses orphans).
    assert sorted(catalogue.releases) == sorted(chart for addon in load_registry(ROOT).addons for chart in addon.charts)
    assert catalogue.chart("karpenter").repository == "oci://public.ecr.aws/karpenter"
    assert catalogue.values("karpenter")["controller"]["image"]["tag"] == "1.14.1"
    assert load_catalogue(ROOT) is catalogue  # cached per process


def test_values_are_fresh_copies(tmp_path: Path) -> None:
    catalogue = load_catalogue(_write(tmp_path, GOOD, {"demo": "image:\n  repository: r\nlist: [1]\n"}))
    first = catalogue.values("demo")
    assert first == {"image": {"repository": "r", "tag": "1.2.3"}, "list": [1]}
    first["image"]["repository"] = "changed"
    first["list"].append(2)
    assert catalogue.values("demo") == {"image": {"repository": "r", "tag": "1.2.3"}, "list": [1]}


@pytest.mark.parametrize(("field", "value", "message"), [
    ("version", "latest", "not an exact version"),
    ("version", "^1.2.0", "not an exact version"),
    ("version", "1.2.x", "not an exact version"),
    ("repository", "http://charts.example", "must start with https:// or oci://"),
])
def test_invalid_pins_are_rejected(tmp_path: Path, field: str, value: str, message: str) -> None:
    text = GOOD.replace(
        {"version": "v1.2.3", "repository": "oci://registry.example/charts"}[field], value)
    with pytest.raises(CatalogueError, match=rf"platform/charts.yaml: releases\.demo\.{field}: .*{message}"):
        load_catalogue(_write(tmp_path, text))


def test_missing_version_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(CatalogueError, match=r"releases\.demo\.version: missing"):
        load_catalogue(_write(tmp_path, GOOD.replace("    version: v1.2.3\n", "")))


def test_unknown_release_is_rejected(tmp_path: Path) -> None:
    catalogue = load_catalogue(_write(tmp_path, GOOD))
    with pytest.raises(CatalogueError, match="unknown release 'nope'"):
        catalogue.chart("nope")
    with pytest.raises(CatalogueError, match=r"platform/typo/values.yaml: no release 'typo'"):
        load_catalogue(_write(tmp_path / "other", GOOD, {"typo": "a: 1\n"}))


def test_floating_image_tag_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(CatalogueError, match=r"releases\.demo\.images\.image\.tag"):
        load_catalogue(_write(tmp_path, GOOD.replace("image.tag: 1.2.3", "image.tag: latest")))


def test_deep_merge_merges_maps_replaces_lists_and_never_mutates() -> None:
    base: dict[str, Any] = {"a": {"b": 1, "c": [1, 2]}, "d": 1}
    overlay: dict[str, Any] = {"a": {"c": [3], "e": {"f": 1}}}
    merged = deep_merge(base, overlay, {"d": 2})
    assert merged == {"a": {"b": 1, "c": [3], "e": {"f": 1}}, "d": 2}
    merged["a"]["e"]["f"] = 9
    assert base == {"a": {"b": 1, "c": [1, 2]}, "d": 1}
    assert overlay == {"a": {"c": [3], "e": {"f": 1}}}


def test_every_base_values_file_conforms_to_upstream() -> None:
    catalogue = load_catalogue(ROOT)
    for release in catalogue.releases:
        pin = catalogue.chart(release)
        rendered = {"name": release, "namespace": pin.namespace, "chart": pin.chart,
                    "repository": pin.repository, "version": pin.version, "values": catalogue.values(release)}
        problems = check_helm_values(rendered)
        assert problems == [], "\n".join(map(str, problems))
