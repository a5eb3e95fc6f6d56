"""tools/upstream.py: the lock covers what the tests read, and sync/verify refuse anything that does not match it."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import tarfile
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from trainyard.plan.conformance import upstream_dir

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tool(upstream_tool: ModuleType) -> ModuleType:
    return upstream_tool


CRD = """\
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
spec:
  group: example.com
  names: {kind: Widget}
  versions:
  - name: v1
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              size: {format: int-or-string}
              free: {type: object, x-kubernetes-preserve-unknown-fields: true, properties: {a: {type: string}}}
              parts: {type: array, items: {type: object, properties: {name: {type: string}}}}
"""


def _entry(path: str, data: bytes, **extra: str) -> dict[str, str]:
    return {"path": path, "url": f"https://example.invalid/{path}", "sha256": hashlib.sha256(data).hexdigest(),
            **extra}


def _write_lock(tmp: Path, entries: list[dict[str, str]]) -> Path:
    lock = tmp / "upstream.lock.yaml"
    lock.write_text(yaml.safe_dump({"files": entries}))
    return lock


def test_crd_conversion_closes_nested_objects_only(tool: ModuleType) -> None:
    schema = json.loads(tool.crd_json_schema(CRD.encode(), "example.com", "widget", "v1"))
    spec = schema["properties"]["spec"]
    assert "additionalProperties" not in schema  # the root stays open: apiVersion/kind/metadata come from k8s
    assert spec["additionalProperties"] is False
    assert spec["properties"]["parts"]["items"]["additionalProperties"] is False
    assert "additionalProperties" not in spec["properties"]["free"]  # preserve-unknown-fields stays open
    assert spec["properties"]["size"] == {"oneOf": [{"type": "string"}, {"type": "integer"}]}
    with pytest.raises(tool.UpstreamError, match="no CRD example.com/widget version v2"):
        tool.crd_json_schema(CRD.encode(), "example.com", "widget", "v2")


def test_sync_builds_from_sources_and_verifies(tool: ModuleType, tmp_path: Path) -> None:
    chart_values = b"replicas: 1\n"
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w:gz") as tar:
        info = tarfile.TarInfo("demo/values.yaml")
        info.size = len(chart_values)
        tar.addfile(info, io.BytesIO(chart_values))
    schema = tool.crd_json_schema(CRD.encode(), "example.com", "widget", "v1")
    lock = _write_lock(tmp_path, [
        _entry("charts/demo/1.0.0/values.yaml", chart_values, member="demo/values.yaml"),
        _entry("crds/example.com/widget_v1.json", schema, convert="crd-schema"),
    ])
    sources = {"charts/demo/1.0.0/values.yaml": archive.getvalue(), "crds/example.com/widget_v1.json": CRD.encode()}
    fetched: list[str] = []

    def fetch(url: str) -> bytes:
        fetched.append(url)
        return sources[url.removeprefix("https://example.invalid/")]

    dest = tmp_path / "cache"
    assert tool.sync(dest, None, lock, fetch) == (2, 0)
    assert (dest / "charts/demo/1.0.0/values.yaml").read_bytes() == chart_values
    assert tool.is_verified(dest, lock)
    assert tool.sync(dest, None, lock, fetch) == (0, 2)  # nothing downloaded twice
    assert len(fetched) == 2


def test_sync_refuses_a_mirror_file_that_differs_from_the_lock(tool: ModuleType, tmp_path: Path) -> None:
    mirror = tmp_path / "mirror"
    (mirror / "crds/g").mkdir(parents=True)
    (mirror / "crds/g/a_v1.json").write_text("{}\n")
    (mirror / "crds/g/b_v1.json").write_text('{"tampered": true}\n')
    lock = _write_lock(tmp_path, [_entry("crds/g/a_v1.json", b"{}\n"), _entry("crds/g/b_v1.json", b"{}\n")])
    with pytest.raises(tool.UpstreamError) as raised:
        tool.sync(tmp_path / "cache", mirror, lock)
    assert "crds/g/b_v1.json: sha256" in str(raised.value)
    assert "a_v1.json" not in str(raised.value)
    assert not tool.is_verified(tmp_path / "cache", lock)


def test_verify_catches_an_edited_cache_file(tool: ModuleType, tmp_path: Path) -> None:
    lock = _write_lock(tmp_path, [_entry("mig-parted/config.yaml", b"a: 1\n")])
    (tmp_path / "cache/mig-parted").mkdir(parents=True)
    (tmp_path / "cache/mig-parted/config.yaml").write_text("a: 1\n")
    tool.verify(tmp_path / "cache", lock)
    (tmp_path / "cache/mig-parted/config.yaml").write_text("a: 2\n")
    with pytest.raises(tool.UpstreamError, match="mig-parted/config.yaml: sha256 differs"):
        tool.verify(tmp_path / "cache", lock)


def test_no_mirror_and_no_network_ends_in_one_message(tool: ModuleType, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    def offline(url: str) -> bytes:
        raise tool.DownloadError(f"cannot download {url}: Name or service not known")

    monkeypatch.setattr(tool, "download", offline)
    monkeypatch.setattr(tool, "DEFAULT_MIRROR", tmp_path / "no-shared")
    assert tool.main(["sync", "--dest", str(tmp_path / "cache")]) == 2
    err = capsys.readouterr().err
    assert "cannot download https://" in err and "python tools/upstream.py sync" in err
    assert "Traceback" not in err


def test_lock_is_built_from_a_mirror_and_its_sources(tool: ModuleType, tmp_path: Path) -> None:
    commit = "0" * 40
    files = {"charts/demo/1.0.0/values.yaml": "a: 1\n", "charts/demo/0.9.0/values.yaml": "a: 0\n",
             "charts/demo/1.0.0/Chart.yaml": "name: demo\n", "crds/example.com/widget_v1.json": "{}\n",
             "mig-parted/config-default.yaml": "version: v1\n"}
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    (tmp_path / "SOURCES.md").write_text("\n".join([
        "| file | repo | path | commit | note |", "|---|---|---|---|---|",
        f"| charts/demo/1.0.0/values.yaml | o/demo | demo-1.0.0.tgz!demo/values.yaml | {commit} | packaged |",
        f"| charts/demo/1.0.0/Chart.yaml | o/demo | chart/Chart.yaml | {commit} | ref v1.0.0 |",
        f"| charts/demo/0.9.0/values.yaml | o/demo | chart/values.yaml | {commit} | ref v0.9.0 |",
        f"| crds/example.com/widget_v1.json | o/demo | crds/widgets.yaml | {commit} | converted from CRD x |",
        "## mig-parted",
        f"- `mig-parted/config-default.yaml`: NVIDIA/mig-parted `deploy/config.yaml` at commit {commit}.",
    ]))
    entries = {e.path: e for e in tool.lock_from_mirror(tmp_path, {("demo", "1.0.0")})}
    assert sorted(entries) == ["charts/demo/1.0.0/Chart.yaml", "charts/demo/1.0.0/values.yaml",
                               "crds/example.com/widget_v1.json", "mig-parted/config-default.yaml"]
    values = entries["charts/demo/1.0.0/values.yaml"]
    assert (values.url, values.member) == (f"https://raw.githubusercontent.com/o/demo/{commit}/demo-1.0.0.tgz",
                                           "demo/values.yaml")
    assert values.sha256 == hashlib.sha256(b"a: 1\n").hexdigest()
    assert entries["crds/example.com/widget_v1.json"].convert == "crd-schema"
    assert entries["mig-parted/config-default.yaml"].url.endswith(f"NVIDIA/mig-parted/{commit}/deploy/config.yaml")
    with pytest.raises(tool.UpstreamError, match="no data for these pinned charts"):
        tool.lock_from_mirror(tmp_path, {("demo", "1.0.0"), ("other", "2.0.0")})


def test_lock_covers_every_pinned_chart_and_every_custom_resource_the_plans_render(tool: ModuleType) -> None:
    locked = {entry.path for entry in tool.load_lock()}
    for chart, version in sorted(tool.pinned_charts()):
        assert f"charts/{chart}/{version}/values.yaml" in locked, f"{chart} {version}: add it to the lock"
    rendered = set()
    for manifest in (REPO / "plans").glob("*/manifests/*.yaml"):
        obj = yaml.safe_load(manifest.read_text())
        group, _, version = obj["apiVersion"].rpartition("/")
        if "." in group and not group.endswith(".k8s.io"):
            rendered.add(f"crds/{group}/{obj['kind'].lower()}_{version}.json")
    assert rendered, "plans/ rendered no custom resources"
    assert sorted(rendered - locked) == []


def test_the_cache_the_suite_reads_matches_the_lock(tool: ModuleType, tmp_path: Path) -> None:
    cache = upstream_dir(REPO)
    assert tool.problems(tool.load_lock(), cache) == []
    copy = tmp_path / "copy"
    shutil.copytree(cache, copy)
    tool.verify(copy)
    assert tool.is_verified(copy)
