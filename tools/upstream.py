#!/usr/bin/env python3
"""Upstream data the plan and the conformance tests read: CRD schemas, chart default values and whole chart source
trees (what `helm template` renders) at the pinned versions, NVIDIA's MIG table, and files of registry packages
(`packages/<registry>/<package>/<version>/`: the RDS CA certificates the program's release data holds).

`tools/upstream.lock.yaml` lists every file with its source URL and sha256, and every chart tree with the sha256
of its file listing (chart-src/LISTING.md in the mirror), so a tree holds its locked files and nothing else. This
script fills the cache folder
(`.upstream/`, git-ignored) from a local mirror or from the internet, and verifies every checksum either way;
nothing upstream is committed to this repository.

    python tools/upstream.py sync [--from DIR] [--dest DIR]   fill the cache (source: --from, else ../shared/upstream
                                                              when it exists, else the internet), then verify it
    python tools/upstream.py verify [--dest DIR]              verify the cache only
    python tools/upstream.py lock --from DIR                  rebuild the lock from a mirror that has a SOURCES.md
                                                              (a pinned chart it lacks keeps what `add` locked)
    python tools/upstream.py add CHART VERSION --source URL [--package FILE]
                                                              lock a chart no mirror holds from its package: URL's
                                                              bytes, or FILE as `helm pull` leaves it

Exit status: 0 when the cache matches the lock, 2 with one message naming each missing or mismatched file.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import io
import json
import os
import re
import shutil
import sys
import tarfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml
from trainyard.escape import escaped
from trainyard.safe_paths import UnsafePathError, check_root, inside, relative_parts, write_file

REPO = Path(__file__).resolve().parents[1]
LOCK = REPO / "tools" / "upstream.lock.yaml"
CHARTS = REPO / "platform" / "charts.yaml"
DEFAULT_DEST = REPO / ".upstream"
DEFAULT_MIRROR = REPO.parent / "shared" / "upstream"
STAMP = ".verified"
RAW = "https://raw.githubusercontent.com/{repo}/{commit}/{path}"
TIMEOUT_S = 60
CRD_SCHEMA = "crd-schema"
# Files of packages on a public registry (npm), which no mirror's SOURCES.md lists: `lock` keeps them as locked.
PACKAGES = "packages"
_SHA256 = re.compile(r"[0-9a-f]{64}")
# build() reads the group, kind and version of a converted CRD from its path.
_CRD_PATH = re.compile(r"crds/[^/]+/[^/]+_[^/_]+\.json")
_Loader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class UpstreamError(Exception):
    """Missing or mismatched upstream data; the message says which files and what to run."""


class DataError(UpstreamError):
    """The cache lacks files or holds files that differ from the lock: fetching them again is the fix."""


class DownloadError(DataError):
    """A source URL could not be read."""


@dataclass(frozen=True, slots=True)
class Entry:
    path: str  # relative to the cache folder
    url: str  # raw file, or a .tgz holding it as `member`
    sha256: str  # of the file as the tests read it (after `member` extraction and `convert`)
    member: str | None = None
    convert: str | None = None  # "crd-schema": CRD openAPIV3Schema -> kubeconform-style JSON schema


@dataclass(frozen=True, slots=True)
class Tree:
    """A chart source tree `chart-src/<chart>/<version>`: its files are entries of their own."""

    path: str
    listing_sha256: str  # chart-src/LISTING.md: sha256 over "<sha256>  <relative path>\n", sorted by path


def _lock_document(lock: Path) -> dict[str, Any]:
    """The lock as plain data, or UpstreamError: it arrives in pull requests, so it may use no YAML alias (a "billion
    laughs" lock would exhaust memory; write_lock never writes one)."""
    try:
        text = lock.read_text(encoding="utf-8")
        if any(isinstance(event, yaml.AliasEvent) for event in yaml.parse(text, Loader=_Loader)):
            raise UpstreamError(f"{lock}: uses a YAML alias; the lock is plain data (rewrite it with `lock`)")
        data = yaml.load(text, Loader=_Loader)  # noqa: S506 (a safe loader: yaml.CSafeLoader or yaml.SafeLoader)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise UpstreamError(f"{lock}: cannot be read as YAML ({error})") from None
    if not isinstance(data, dict) or not isinstance(data.get("files"), list) \
            or not isinstance(data.get("trees") or [], list):
        raise UpstreamError(f"{lock}: expected a map with a 'files:' list (and optionally a 'trees:' list)")
    return data


def load_lock(lock: Path = LOCK) -> list[Entry]:
    """The lock's file entries, or UpstreamError listing every entry sync would refuse to act on: each path stays
    inside the cache (trainyard.safe_paths) and each source is an https URL."""
    entries: list[Entry] = []
    found: list[str] = []
    for i, item in enumerate(_lock_document(lock)["files"]):
        try:
            entries.append(_lock_entry(item))
        except (UpstreamError, UnsafePathError) as error:
            found.append(f"files[{i}]: {error}")
    seen: set[str] = set()
    for entry in entries:
        if entry.path in seen:
            found.append(f"{entry.path}: listed twice")
        seen.add(entry.path)
    if found:
        raise UpstreamError(_report(f"{lock} has entries sync refuses", found))
    return entries


def _lock_entry(item: object) -> Entry:
    fields = ("path", "url", "sha256")
    if not isinstance(item, dict) or not set(fields) <= item.keys() <= {*fields, "member", "convert"}:
        raise UpstreamError("expected path, url, sha256 and optionally member and convert")
    if not all(isinstance(v, str) for v in item.values()):
        raise UpstreamError("every field is a string")
    entry = Entry(**item)
    relative_parts(entry.path)
    if entry.path == STAMP:
        raise UpstreamError(f"{entry.path!r} is the name of sync's own stamp file")
    url = urllib.parse.urlsplit(entry.url)
    if url.scheme != "https" or not url.hostname:
        raise UpstreamError(f"{entry.path}: url {entry.url!r} is not an https URL")
    if not _SHA256.fullmatch(entry.sha256):
        raise UpstreamError(f"{entry.path}: sha256 {entry.sha256!r} is not 64 lowercase hex digits")
    if entry.convert not in (None, CRD_SCHEMA):
        raise UpstreamError(f"{entry.path}: convert {entry.convert!r}; the only conversion is {CRD_SCHEMA!r}")
    if entry.convert == CRD_SCHEMA and not _CRD_PATH.fullmatch(entry.path):
        raise UpstreamError(f"{entry.path}: a converted CRD is named crds/<group>/<kind>_<version>.json")
    return entry


def load_trees(lock: Path = LOCK) -> list[Tree]:
    """The lock's chart trees, each `chart-src/<chart>/<version>` (sync deletes unlisted files below one)."""
    trees: list[Tree] = []
    found: list[str] = []
    for i, item in enumerate(_lock_document(lock).get("trees") or ()):
        if not (isinstance(item, dict) and set(item) == {"path", "listing_sha256"}
                and all(isinstance(v, str) for v in item.values())):
            found.append(f"trees[{i}]: expected path and listing_sha256")
            continue
        tree = Tree(**item)
        try:
            relative_parts(tree.path)
        except UnsafePathError as error:
            found.append(f"trees[{i}]: {error}")
            continue
        if not _TREE_PATH.fullmatch(tree.path):
            found.append(f"trees[{i}]: {tree.path!a} is not {CHART_SRC}/<chart>/<version>")
        elif not _SHA256.fullmatch(tree.listing_sha256):
            found.append(f"trees[{i}]: listing_sha256 is not 64 lowercase hex digits")
        else:
            trees.append(tree)
    if found:
        raise UpstreamError(_report(f"{lock} has trees sync refuses", found))
    return trees


def tree_files(root: Path) -> list[tuple[str, Path]]:
    """(path relative to root, path) of every file and link below root; links are listed, never followed."""
    found = []
    for folder, dirs, files in os.walk(root, followlinks=False):
        base = Path(folder)
        for name in [*files, *(d for d in dirs if (base / d).is_symlink())]:
            found.append(((base / name).relative_to(root).as_posix(), base / name))
    return sorted(found)


def listing_sha256(root: Path) -> str:
    """The listing hash of chart-src/LISTING.md: every regular file below root, by path in byte order (a link counts
    as a file no listing holds, so a tree with one never matches)."""
    lines = [f"{sha256(p.read_bytes()) if not p.is_symlink() else 'link'}  {rel}\n" for rel, p in tree_files(root)]
    return sha256("".join(lines).encode())


def lock_digest(lock: Path = LOCK) -> str:
    return hashlib.sha256(lock.read_bytes()).hexdigest()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --- CRD -> JSON schema ---------------------------------------------------------------------------------------

def crd_json_schema(crd_yaml: bytes, group: str, kind: str, version: str) -> bytes:
    """The `openAPIV3Schema` of one served version as a strict JSON schema (kubeconform's openapi2jsonschema rules).

    Every non-root object that lists `properties` gets `additionalProperties: false` unless it preserves unknown
    fields, so a misspelt key fails validation; `format: int-or-string` becomes a string/integer `oneOf`.
    """
    for doc in yaml.safe_load_all(crd_yaml):
        spec = (doc or {}).get("spec", {})
        if spec.get("group") != group or spec.get("names", {}).get("kind", "").lower() != kind:
            continue
        for served in spec.get("versions", []):
            if served.get("name") == version:
                schema = _strict(served["schema"]["openAPIV3Schema"], root=True)
                return (json.dumps(schema, indent=2) + "\n").encode()
    raise UpstreamError(f"no CRD {group}/{kind} version {version} in the downloaded file")


def _strict(node: Mapping[str, Any], *, root: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "properties" and isinstance(value, dict):
            out[key] = {name: _strict(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties", "not") and isinstance(value, dict):
            out[key] = _strict(value)
        elif key in ("anyOf", "allOf", "oneOf") and isinstance(value, list):
            out[key] = [_strict(sub) for sub in value]
        else:
            out[key] = value
    if out.get("format") == "int-or-string":
        del out["format"]
        out["oneOf"] = [{"type": "string"}, {"type": "integer"}]
    closed = "properties" in out and not out.get("x-kubernetes-preserve-unknown-fields")
    if not root and closed and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


# --- obtaining one file -----------------------------------------------------------------------------------------

def download(url: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:  # noqa: S310 (https URLs from the lock)
            return bytes(response.read())
    except (urllib.error.URLError, TimeoutError, OSError) as error:
        raise DownloadError(f"cannot download {url}: {getattr(error, 'reason', error)}") from None


def build(entry: Entry, fetch: Any = download) -> bytes:
    """The file's bytes from its source: download, extract the chart member, convert a CRD."""
    data = fetch(entry.url)
    if entry.member is not None:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
            member = archive.extractfile(entry.member)
            if member is None:
                raise UpstreamError(f"{entry.url} has no file {entry.member}")
            data = member.read()
    if entry.convert == CRD_SCHEMA:
        group, name = entry.path.split("/")[-2:]
        kind, _, version = name.removesuffix(".json").rpartition("_")
        data = crd_json_schema(data, group, kind, version)
    return data


# --- sync / verify ----------------------------------------------------------------------------------------------

def problems(entries: Iterable[Entry], dest: Path) -> list[str]:
    found = []
    for entry in entries:
        try:
            path = inside(dest, entry.path)
        except UnsafePathError as error:
            found.append(f"{entry.path}: {error}")
            continue
        if not path.is_file():
            found.append(f"{entry.path}: missing")
        elif sha256(path.read_bytes()) != entry.sha256:
            found.append(f"{entry.path}: sha256 differs from the lock")
    return found


def tree_problems(trees: Iterable[Tree], dest: Path) -> list[str]:
    """A tree with a file the lock does not list renders differently: its listing hash tells."""
    found = []
    for tree in trees:
        try:
            root = inside(dest, tree.path, folder=True)
        except UnsafePathError as error:
            found.append(f"{tree.path}: {error}")
            continue
        if root.is_dir() and listing_sha256(root) != tree.listing_sha256:
            found.append(f"{tree.path}: holds files the lock does not list (its listing sha256 differs)")
    return found


def verify(dest: Path, lock: Path = LOCK) -> None:
    entries = load_lock(lock)
    trees = load_trees(lock)
    _check_dest(dest)
    found = problems(entries, dest) or tree_problems(trees, dest)
    if found:
        raise DataError(_report(f"upstream data in {dest} does not match {lock.name}", found))
    try:
        write_file(dest, STAMP, (lock_digest(lock) + "\n").encode())
    except (OSError, UnsafePathError) as error:
        raise UpstreamError(f"{dest}/{STAMP}: cannot be written ({_reason(error)})") from None


def _check_dest(dest: Path) -> None:
    """The cache folder: a folder or a path where one can be made, never a link (a committed `.upstream` link would
    send every file elsewhere)."""
    try:
        check_root(dest, "--dest")
    except UnsafePathError as error:
        raise UpstreamError(str(error)) from None


def _reason(error: Exception) -> str:
    return (error.strerror if isinstance(error, OSError) else None) or str(error)


def sync(dest: Path, mirror: Path | None, lock: Path = LOCK, fetch: Any = download) -> tuple[int, int]:
    """Bring every missing or stale file into `dest`; returns (files copied or downloaded, files already there)."""
    entries = load_lock(lock)
    trees = load_trees(lock)
    _check_dest(dest)
    stale = {line.split(":")[0] for line in problems(entries, dest)}
    fetch = functools.cache(fetch)  # a packaged chart's files are members of one archive: download it once
    failed = []
    for entry in entries:
        if entry.path not in stale:
            continue
        try:
            # A chart no mirror holds (locked with `add`) comes from its own source.
            local = inside(mirror, entry.path) if mirror is not None else None
            data = local.read_bytes() if local is not None and local.is_file() else build(entry, fetch)
        except DownloadError:
            raise  # the network is down or the source moved: retrying 170 files would only repeat it
        except (OSError, UpstreamError, UnsafePathError, tarfile.TarError, yaml.YAMLError) as error:
            failed.append(f"{entry.path}: {_reason(error)}")
            continue
        if sha256(data) != entry.sha256:
            failed.append(f"{entry.path}: sha256 {sha256(data)[:12]}… from {mirror or entry.url}, lock says "
                          f"{entry.sha256[:12]}…")
            continue
        try:
            write_file(dest, entry.path, data)
        except (OSError, UnsafePathError) as error:
            failed.append(f"{entry.path}: cannot be written ({_reason(error)})")
    if failed:
        source = f"the mirror {mirror}" if mirror is not None else "the internet"
        raise DataError(_report(f"could not fill {dest} from {source}", failed))
    _prune_trees(entries, trees, dest)
    verify(dest, lock)
    return len(stale), len(entries) - len(stale)


def _prune_trees(entries: list[Entry], trees: list[Tree], dest: Path) -> None:
    """Remove files of an older version of a tree from the cache: the lock's files are the whole tree. Only below
    the tree itself (checked by trainyard.safe_paths.inside): a link is removed, never followed."""
    locked = {entry.path for entry in entries}
    for tree in trees:
        try:
            root = inside(dest, tree.path, folder=True)
            for rel, path in tree_files(root) if root.is_dir() else ():
                if f"{tree.path}/{rel}" not in locked:
                    path.unlink()
        except (OSError, UnsafePathError) as error:
            raise UpstreamError(f"{dest}/{tree.path}: cannot be pruned ({_reason(error)})") from None


def is_verified(dest: Path, lock: Path = LOCK) -> bool:
    """Cheap check for test start-up: the cache was verified against this very lock."""
    stamp = dest / STAMP
    return stamp.is_file() and stamp.read_text(encoding="utf-8").strip() == lock_digest(lock)


# --- lock --------------------------------------------------------------------------------------------------------

# SOURCES.md: a table row per file (file | repo | path[!tgz member] | commit | note), the MIG table in prose.
_CELL = r"\s*([^|]+?)\s*\|"
_ROW = re.compile(rf"\|{_CELL}{_CELL}{_CELL}\s*(?P<commit>[0-9a-f]{{40}})\s*\|\s*([^|]*?)\s*\|")
_MIG = re.compile(r"`(mig-parted/[^`]+)`: ([\w.-]+/[\w.-]+) `([^`]+)` at commit ([0-9a-f]{40})")
_FIELDS = ("file", "repo", "path", "commit", "note")


def pinned_charts(charts: Path = CHARTS) -> set[tuple[str, str]]:
    try:
        releases = yaml.safe_load(charts.read_text(encoding="utf-8"))["releases"]
        return {(str(pin["chart"]), str(pin["version"])) for pin in releases.values()}
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError) as error:
        raise UpstreamError(f"{charts}: no releases map of chart and version ({_reason(error)})") from None


def needed(path: str, pins: set[tuple[str, str]]) -> bool:
    """Charts only at the versions platform/charts.yaml pins; every CRD schema and the MIG table."""
    parts = path.split("/")
    if parts[0] == "charts":
        return len(parts) > 3 and (parts[1], parts[2]) in pins
    return parts[0] in ("crds", "mig-parted")


def chart_of(path: str) -> tuple[str, str] | None:
    """The (chart, version) of a path at or below `charts/<c>/<v>` (its defaults) or `chart-src/<c>/<v>` (its tree)."""
    parts = path.split("/")
    return (parts[1], parts[2]) if parts[0] in ("charts", CHART_SRC) and len(parts) >= 3 else None


def lock_from_mirror(mirror: Path, pins: set[tuple[str, str]], locked: Sequence[Entry] = (),
                     locked_trees: Sequence[Tree] = ()) -> tuple[list[Entry], list[Tree]]:
    """The lock the mirror's SOURCES.md gives for `pins`. A pinned chart whose tree the mirror lacks keeps its
    entries and tree from `locked`/`locked_trees` (the lock as it is: what `add` wrote) when they hold its tree."""
    try:
        sources = inside(mirror, "SOURCES.md").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError, UnsafePathError) as error:
        raise UpstreamError(f"{mirror}/SOURCES.md: cannot be read ({_reason(error)}); `lock --from` needs a mirror "
                            "whose SOURCES.md lists each file's repo, path and commit") from None
    rows = [dict(zip(_FIELDS, m.groups(), strict=True)) for m in map(_ROW.fullmatch, sources.splitlines()) if m]
    rows += [dict(zip(_FIELDS, (*m.groups(), ""), strict=True)) for m in _MIG.finditer(sources)]
    entries = []
    found = []
    for row in rows:
        if row["file"] == "file":
            continue
        try:
            relative_parts(row["file"])
        except UnsafePathError as error:
            found.append(str(error))
            continue
        if not needed(row["file"], pins):
            continue
        archive_path, _, member = row["path"].partition("!")
        try:
            data = inside(mirror, row["file"]).read_bytes()
        except (OSError, UnsafePathError) as error:
            found.append(f"{row['file']}: {_reason(error)}")
            continue
        entries.append(Entry(
            path=row["file"], url=RAW.format(repo=row["repo"], commit=row["commit"], path=archive_path),
            sha256=sha256(data), member=member or None,
            convert=CRD_SCHEMA if row["note"].startswith("converted from CRD") else None))
    if found:
        raise UpstreamError(_report(f"{mirror}/SOURCES.md lists files the mirror cannot give", found))
    tree_rows = {row["file"]: row for row in rows if row["file"].startswith(f"{CHART_SRC}/")}
    in_mirror = {(c, v) for c, v in pins if f"{CHART_SRC}/{c}/{v}" in tree_rows}
    kept_trees = [t for t in locked_trees if chart_of(t.path) in pins - in_mirror]
    carried = {chart_of(t.path) for t in kept_trees}
    entries = [e for e in entries if chart_of(e.path) not in carried]
    entries += [e for e in locked if chart_of(e.path) in carried]
    entries += [e for e in locked if e.path.startswith(f"{PACKAGES}/")]
    trees = [tree_of(mirror, tree_rows, chart, version) for chart, version in sorted(in_mirror)]
    for _, files in trees:
        entries += files
    covered = {chart_of(e.path) for e in entries if e.path.startswith("charts/")}
    missing = [f"{c} {v}" for c, v in sorted(pins - covered)]
    missing += [f"{c} {v}: no chart source tree ({CHART_SRC}/{c}/{v})" for c, v in sorted(pins - in_mirror - carried)]
    if missing:
        raise UpstreamError(_report(f"{mirror} has no data for these pinned charts", missing))
    return sorted(entries, key=lambda e: e.path), sorted([tree for tree, _ in trees] + kept_trees,
                                                         key=lambda t: chart_of(t.path) or ())


# Chart source trees (SOURCES.md, "Chart source trees"): one row per tree and per dependency chart from another
# repository or commit; the note ends in the tree's listing hash.
CHART_SRC = "chart-src"
_TREE_PATH = re.compile(rf"{CHART_SRC}/[^/\s]+/[^/\s]+")
_LISTING = re.compile(r"sha256 of the sorted file listing: ([0-9a-f]{64})")
# Symbolic links in the charts' git trees, which `helm package` and the mirror's trees replace by their targets
# (chart-src/LISTING.md, "How the trees were made"): a raw URL of the link would serve the link's text, so a file
# below one is fetched from the target. repo -> {link directory in the repo: target directory}.
_LINKED_DIRS: Mapping[str, Mapping[str, str]] = {
    # charts/karpenter/crds/<file> -> ../../../pkg/apis/crds/<file> (aws/karpenter-provider-aws at v1.14.1)
    "aws/karpenter-provider-aws": {"charts/karpenter/crds": "pkg/apis/crds"},
    # charts/library -> deploy/charts/library (rook/rook at v1.20.6)
    "rook/rook": {"deploy/charts/rook-ceph/charts/library": "deploy/charts/library",
                  "deploy/charts/rook-ceph-cluster/charts/library": "deploy/charts/library"},
    # crd/v1 -> bases (volcano-sh/volcano at v1.15.1)
    "volcano-sh/volcano": {
        "installer/helm/chart/volcano/crd/v1": "installer/helm/chart/volcano/crd/bases",
        "installer/helm/chart/volcano/charts/jobflow/crd/v1": "installer/helm/chart/volcano/charts/jobflow/crd/bases"},
}


def source_of(repo: str, path: str) -> str:
    """The path in `repo` whose bytes a chart file has, following the linked directories above."""
    for link, target in _LINKED_DIRS.get(repo, {}).items():
        if path.startswith(link + "/"):
            return target + path[len(link):]
    return path


def tree_of(mirror: Path, rows: Mapping[str, Mapping[str, str]], chart: str, version: str) -> tuple[Tree, list[Entry]]:
    """The lock entries of one tree: each file from the most specific row (the tree's, or a dependency's)."""
    tree_path = f"{CHART_SRC}/{chart}/{version}"
    try:
        root = inside(mirror, tree_path, folder=True)
        links = [rel for rel, path in tree_files(root) if path.is_symlink()]
    except UnsafePathError as error:
        raise UpstreamError(f"{mirror}: {error}") from None
    if links:
        raise UpstreamError(f"{root}: holds symbolic links ({', '.join(links[:3])}); a mirror tree holds the files")
    listing = listing_sha256(root)
    note = _LISTING.search(rows[tree_path]["note"])
    if note is None or note.group(1) != listing:
        raise UpstreamError(f"{root}: its listing sha256 {listing[:12]}… is not the one SOURCES.md records")
    owners = sorted((p for p in rows if p == tree_path or p.startswith(tree_path + "/")), key=len, reverse=True)
    files = []
    for inner_rel, path in tree_files(root):
        rel = f"{tree_path}/{inner_rel}"
        owner = next(o for o in owners if rel.startswith(o + "/"))
        row, inner = rows[owner], rel[len(owner) + 1:]
        if row["path"].endswith(".tgz"):  # a packaged chart: its files are members under the chart's name
            name = chart if owner == tree_path else owner.rsplit("/", 1)[1]
            url, member = RAW.format(repo=row["repo"], commit=row["commit"], path=row["path"]), f"{name}/{inner}"
        else:
            source = source_of(row["repo"], f"{row['path']}/{inner}")
            url, member = RAW.format(repo=row["repo"], commit=row["commit"], path=source), None
        files.append(Entry(path=rel, url=url, sha256=sha256(path.read_bytes()), member=member))
    return Tree(path=tree_path, listing_sha256=listing), files


# --- add: a chart no mirror holds ---------------------------------------------------------------------------------

_CHART_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_CHART_VERSION = re.compile(r"v?\d+\.\d+\.\d+(?:[-+][0-9A-Za-z.-]+)?")
# What conformance reads besides the tree (charts/<chart>/<version>/): the chart's own metadata and defaults.
_DEFAULTS = ("Chart.yaml", "values.yaml", "values.schema.json")


def package_files(chart: str, package: bytes, url: str) -> dict[str, bytes]:
    """The files of a chart package by their path in the chart: `helm package` puts every file under `<chart>/`."""
    files = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(package), mode="r:gz") as archive:
            for member in archive.getmembers():
                if member.isdir():
                    continue
                top, _, rel = member.name.partition("/")
                if not member.isfile() or top != chart or not rel:
                    raise UpstreamError(f"{url}: {member.name} is not a file under {chart}/, as `helm package` "
                                        "writes them")
                relative_parts(rel)
                data = archive.extractfile(member)
                assert data is not None  # a regular file's member
                files[rel] = data.read()
    except (tarfile.TarError, OSError, EOFError) as error:
        raise UpstreamError(f"{url}: not a chart package (a gzipped tar: {_reason(error)})") from None
    except UnsafePathError as error:
        raise UpstreamError(f"{url}: {error}") from None
    return files


def add_chart(chart: str, version: str, package: bytes, url: str, dest: Path, lock: Path = LOCK) -> int:
    """Lock the chart package `package`, the bytes `url` serves, as `chart-src/<chart>/<version>` and its defaults as
    `charts/<chart>/<version>`: each file with `url`, its member in the package and its sha256; then put them in the
    cache `dest`. Replaces what the lock held for that chart and version. Returns the files locked."""
    if not _CHART_NAME.fullmatch(chart) or not _CHART_VERSION.fullmatch(version):
        raise UpstreamError(f"{chart} {version}: a chart name is a DNS label and a version is SemVer (such as 1.2.3)")
    if not (url.startswith("https://") and url.endswith(".tgz")):
        raise UpstreamError(f"--source {url}: the https:// URL of the chart's package (.tgz), as `helm pull` reads it")
    files = package_files(chart, package, url)
    try:
        declared = yaml.safe_load(files.get("Chart.yaml", b"")) or {}
    except yaml.YAMLError as error:
        raise UpstreamError(f"{url}: {chart}/Chart.yaml is not YAML ({error})") from None
    if not isinstance(declared, dict) or (str(declared.get("name")), str(declared.get("version"))) != (chart, version):
        shown = f"{declared.get('name')} {declared.get('version')}" if isinstance(declared, dict) else "no chart"
        raise UpstreamError(f"{url}: {chart}/Chart.yaml declares {shown}, not {chart} {version}")
    tree, defaults = f"{CHART_SRC}/{chart}/{version}", f"charts/{chart}/{version}"
    added = {f"{tree}/{rel}": (rel, data) for rel, data in files.items()}
    added |= {f"{defaults}/{name}": (name, files[name]) for name in _DEFAULTS if name in files}
    kept = [e for e in load_lock(lock) if not e.path.startswith((f"{tree}/", f"{defaults}/"))]
    entries = kept + [Entry(path=path, url=url, sha256=sha256(data), member=f"{chart}/{rel}")
                      for path, (rel, data) in added.items()]
    _check_dest(dest)
    try:
        for folder in (inside(dest, tree, folder=True), inside(dest, defaults, folder=True)):
            if folder.is_dir():
                shutil.rmtree(folder)
        for path, (_, data) in added.items():
            write_file(dest, path, data)
    except (OSError, UnsafePathError) as error:
        raise UpstreamError(f"{dest}: cannot hold {chart} {version} ({_reason(error)})") from None
    trees = [t for t in load_trees(lock) if t.path != tree]
    trees.append(Tree(path=tree, listing_sha256=listing_sha256(dest / tree)))
    write_lock(sorted(entries, key=lambda e: e.path), sorted(trees, key=lambda t: t.path), lock)
    verify(dest, lock)
    return len(added)


def write_lock(entries: list[Entry], trees: list[Tree], lock: Path = LOCK) -> None:
    header = ("# Upstream files the plan and the conformance tests read, each with its source and sha256 (of the file\n"
              "# as they read it), and the chart source trees with their listing hash. Written by\n"
              "# `python tools/upstream.py lock --from DIR`; read by `sync` and `verify`.\n")
    items = [{k: v for k, v in asdict(e).items() if v is not None} for e in entries]
    document = {"trees": [asdict(t) for t in trees], "files": items}
    text = header + yaml.safe_dump(document, sort_keys=False, width=200)
    try:
        write_file(lock.parent, lock.name, text.encode())
    except (OSError, UnsafePathError) as error:
        raise UpstreamError(f"{lock}: cannot be written ({_reason(error)})") from None


# --- CLI ---------------------------------------------------------------------------------------------------------

def _report(headline: str, lines: list[str], limit: int = 15) -> str:
    shown = lines[:limit] + ([f"... and {len(lines) - limit} more"] if len(lines) > limit else [])
    return "\n".join([headline + ":", *(f"  - {line}" for line in shown)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools/upstream.py", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("sync", "verify", "lock", "add"):
        command = commands.add_parser(name)
        command.add_argument("--dest", type=_folder, default=Path(os.environ.get("TRAINYARD_UPSTREAM") or DEFAULT_DEST))
        if name == "add":
            command.add_argument("chart")
            command.add_argument("version")
            command.add_argument("--source", required=True, help="the https:// URL of the chart's package (.tgz)")
            command.add_argument("--package", type=Path, help="that package, as `helm pull` leaves it (else the "
                                                              "package is downloaded from --source)")
        elif name != "verify":
            command.add_argument("--from", dest="mirror", type=_folder, help="local mirror laid out like the cache")
    args = parser.parse_args(argv)
    try:
        if args.command == "add":
            count = add_chart(args.chart, args.version, _package(args.package, args.source), args.source,
                              args.dest)
            print(f"{LOCK.relative_to(REPO)}: {args.chart} {args.version} locked ({count} files from {args.source}); "
                  f"{args.dest} holds them")
        elif args.command == "verify":
            verify(args.dest)
            print(f"upstream data in {args.dest}: {len(load_lock())} files match {LOCK.name}")
        elif args.command == "lock":
            if args.mirror is None:
                parser.error("lock needs --from DIR (a mirror with SOURCES.md)")
            try:
                locked, locked_trees = load_lock(), load_trees()
            except UpstreamError:  # a lock sync refuses keeps nothing: the mirror alone rewrites it
                locked, locked_trees = [], []
            entries, trees = lock_from_mirror(args.mirror, pinned_charts(), locked, locked_trees)
            write_lock(entries, trees)
            print(f"{LOCK.relative_to(REPO)}: {len(entries)} files, {len(trees)} chart source trees")
        else:
            mirror = args.mirror if args.mirror is not None else (DEFAULT_MIRROR if DEFAULT_MIRROR.is_dir() else None)
            if mirror is not None and not mirror.is_dir():
                raise UpstreamError(f"--from {mirror}: no such folder")
            fetched, kept = sync(args.dest, mirror)
            print(f"upstream data in {args.dest}: {fetched} files from {mirror or 'the internet'}, {kept} already "
                  f"there; all {fetched + kept} match {LOCK.name}")
    except UpstreamError as error:
        print(escaped(f"tools/upstream.py {args.command}: {error}"), file=sys.stderr)
        if isinstance(error, DataError):
            print("Fix: run `python tools/upstream.py sync` with internet access, or `--from DIR` pointing at a "
                  "mirror (a checkout's ../shared/upstream); a chart no mirror holds: `python tools/upstream.py add "
                  "CHART VERSION --source URL`.", file=sys.stderr)
        return 2
    return 0


def _package(path: Path | None, url: str) -> bytes:
    if path is None:
        return download(url)
    try:
        return path.read_bytes()
    except OSError as error:
        raise UpstreamError(f"--package {path}: cannot be read ({_reason(error)})") from None


def _folder(text: str) -> Path:
    """A folder option: an empty one would silently mean the current folder."""
    if not text.strip() or "\x00" in text:
        raise argparse.ArgumentTypeError(f"{text!r} is not a folder name")
    return Path(text)


if __name__ == "__main__":
    sys.exit(main())
