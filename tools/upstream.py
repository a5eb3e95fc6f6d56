#!/usr/bin/env python3
"""Upstream data the plan and the conformance tests read: CRD schemas, chart default values and whole chart source
trees (what `helm template` renders) at the pinned versions, NVIDIA's MIG table.

`tools/upstream.lock.yaml` lists every file with its source URL and sha256, and every chart tree with the sha256
of its file listing (chart-src/LISTING.md in the mirror), so a tree holds its locked files and nothing else. This
script fills the cache folder
(`.upstream/`, git-ignored) from a local mirror or from the internet, and verifies every checksum either way;
nothing upstream is committed to this repository.

    python tools/upstream.py sync [--from DIR] [--dest DIR]   fill the cache (source: --from, else ../shared/upstream
                                                              when it exists, else the internet), then verify it
    python tools/upstream.py verify [--dest DIR]              verify the cache only
    python tools/upstream.py lock --from DIR                  rebuild the lock from a mirror that has a SOURCES.md

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
import sys
import tarfile
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
LOCK = REPO / "tools" / "upstream.lock.yaml"
CHARTS = REPO / "platform" / "charts.yaml"
DEFAULT_DEST = REPO / ".upstream"
DEFAULT_MIRROR = REPO.parent / "shared" / "upstream"
STAMP = ".verified"
RAW = "https://raw.githubusercontent.com/{repo}/{commit}/{path}"
TIMEOUT_S = 60
CRD_SCHEMA = "crd-schema"


class UpstreamError(Exception):
    """Missing or mismatched upstream data; the message says which files and what to run."""


class DownloadError(UpstreamError):
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


def load_lock(lock: Path = LOCK) -> list[Entry]:
    data = yaml.safe_load(lock.read_text(encoding="utf-8"))
    return [Entry(**item) for item in data["files"]]


def load_trees(lock: Path = LOCK) -> list[Tree]:
    data = yaml.safe_load(lock.read_text(encoding="utf-8"))
    return [Tree(**item) for item in data.get("trees") or ()]


def listing_sha256(root: Path) -> str:
    """The listing hash of chart-src/LISTING.md: every regular file below root, by path in byte order."""
    lines = sorted((p.relative_to(root).as_posix(), sha256(p.read_bytes())) for p in root.rglob("*") if p.is_file())
    return sha256("".join(f"{digest}  {rel}\n" for rel, digest in lines).encode())


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
        path = dest / entry.path
        if not path.is_file():
            found.append(f"{entry.path}: missing")
        elif sha256(path.read_bytes()) != entry.sha256:
            found.append(f"{entry.path}: sha256 differs from the lock")
    return found


def tree_problems(trees: Iterable[Tree], dest: Path) -> list[str]:
    """A tree with a file the lock does not list renders differently: its listing hash tells."""
    return [f"{tree.path}: holds files the lock does not list (its listing sha256 differs)" for tree in trees
            if (dest / tree.path).is_dir() and listing_sha256(dest / tree.path) != tree.listing_sha256]


def verify(dest: Path, lock: Path = LOCK) -> None:
    entries = load_lock(lock)
    found = problems(entries, dest) or tree_problems(load_trees(lock), dest)
    if found:
        raise UpstreamError(_report(f"upstream data in {dest} does not match {lock.name}", found))
    (dest / STAMP).write_text(lock_digest(lock) + "\n", encoding="utf-8")


def sync(dest: Path, mirror: Path | None, lock: Path = LOCK, fetch: Any = download) -> tuple[int, int]:
    """Bring every missing or stale file into `dest`; returns (files copied or downloaded, files already there)."""
    entries = load_lock(lock)
    stale = {line.split(":")[0] for line in problems(entries, dest)}
    fetch = functools.cache(fetch)  # a packaged chart's files are members of one archive: download it once
    failed = []
    for entry in entries:
        if entry.path not in stale:
            continue
        try:
            data = (mirror / entry.path).read_bytes() if mirror is not None else build(entry, fetch)
        except DownloadError:
            raise  # the network is down or the source moved: retrying 170 files would only repeat it
        except (OSError, UpstreamError, tarfile.TarError, yaml.YAMLError) as error:
            failed.append(f"{entry.path}: {error}")
            continue
        if sha256(data) != entry.sha256:
            failed.append(f"{entry.path}: sha256 {sha256(data)[:12]}… from {mirror or entry.url}, lock says "
                          f"{entry.sha256[:12]}…")
            continue
        target = dest / entry.path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    if failed:
        source = f"the mirror {mirror}" if mirror is not None else "the internet"
        raise UpstreamError(_report(f"could not fill {dest} from {source}", failed))
    _prune_trees(entries, load_trees(lock), dest)
    verify(dest, lock)
    return len(stale), len(entries) - len(stale)


def _prune_trees(entries: list[Entry], trees: list[Tree], dest: Path) -> None:
    """Remove files of an older version of a tree from the cache: the lock's files are the whole tree."""
    locked = {entry.path for entry in entries}
    for tree in trees:
        root = dest / tree.path
        for path in sorted(root.rglob("*")) if root.is_dir() else ():
            if (path.is_file() or path.is_symlink()) and path.relative_to(dest).as_posix() not in locked:
                path.unlink()


def is_verified(dest: Path, lock: Path = LOCK) -> bool:
    """Cheap check for test start-up: the cache was verified against this very lock."""
    stamp = dest / STAMP
    return stamp.is_file() and stamp.read_text(encoding="utf-8").strip() == lock_digest(lock)


# --- lock --------------------------------------------------------------------------------------------------------

# SOURCES.md: a table row per file (file | repo | path[!tgz member] | commit | note), the MIG table in prose.
_CELL = r"\s*([^|]+?)\s*\|"
_ROW = re.compile(rf"^\|{_CELL}{_CELL}{_CELL}\s*(?P<commit>[0-9a-f]{{40}})\s*\|\s*([^|]*?)\s*\|$")
_MIG = re.compile(r"`(mig-parted/[^`]+)`: ([\w.-]+/[\w.-]+) `([^`]+)` at commit ([0-9a-f]{40})")
_FIELDS = ("file", "repo", "path", "commit", "note")


def pinned_charts(charts: Path = CHARTS) -> set[tuple[str, str]]:
    releases = yaml.safe_load(charts.read_text(encoding="utf-8"))["releases"]
    return {(pin["chart"], pin["version"]) for pin in releases.values()}


def needed(path: str, pins: set[tuple[str, str]]) -> bool:
    """Charts only at the versions platform/charts.yaml pins; every CRD schema and the MIG table."""
    parts = path.split("/")
    if parts[0] == "charts":
        return (parts[1], parts[2]) in pins
    return parts[0] in ("crds", "mig-parted")


def lock_from_mirror(mirror: Path, pins: set[tuple[str, str]]) -> tuple[list[Entry], list[Tree]]:
    sources = (mirror / "SOURCES.md").read_text(encoding="utf-8")
    rows = [dict(zip(_FIELDS, m.groups(), strict=True)) for m in map(_ROW.match, sources.splitlines()) if m]
    rows += [dict(zip(_FIELDS, (*m.groups(), ""), strict=True)) for m in _MIG.finditer(sources)]
    entries = []
    for row in rows:
        if row["file"] == "file" or not needed(row["file"], pins):
            continue
        archive_path, _, member = row["path"].partition("!")
        entries.append(Entry(
            path=row["file"], url=RAW.format(repo=row["repo"], commit=row["commit"], path=archive_path),
            sha256=sha256((mirror / row["file"]).read_bytes()), member=member or None,
            convert=CRD_SCHEMA if row["note"].startswith("converted from CRD") else None))
    covered = {tuple(e.path.split("/")[1:3]) for e in entries if e.path.startswith("charts/")}
    tree_rows = {row["file"]: row for row in rows if row["file"].startswith(f"{CHART_SRC}/")}
    trees = [tree_of(mirror, tree_rows, chart, version) for chart, version in sorted(pins)
             if f"{CHART_SRC}/{chart}/{version}" in tree_rows]
    for _, files in trees:
        entries += files
    missing = [f"{c} {v}" for c, v in sorted(pins - covered)]
    missing += [f"{c} {v}: no chart source tree ({CHART_SRC}/{c}/{v})" for c, v in sorted(pins)
                if f"{CHART_SRC}/{c}/{v}" not in tree_rows]
    if missing:
        raise UpstreamError(_report(f"{mirror} has no data for these pinned charts", missing))
    return sorted(entries, key=lambda e: e.path), [tree for tree, _ in trees]


# Chart source trees (SOURCES.md, "Chart source trees"): one row per tree and per dependency chart from another
# repository or commit; the note ends in the tree's listing hash.
CHART_SRC = "chart-src"
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
    root = mirror / tree_path
    listing = listing_sha256(root)
    note = _LISTING.search(rows[tree_path]["note"])
    if note is None or note.group(1) != listing:
        raise UpstreamError(f"{root}: its listing sha256 {listing[:12]}… is not the one SOURCES.md records")
    owners = sorted((p for p in rows if p == tree_path or p.startswith(tree_path + "/")), key=len, reverse=True)
    files = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(mirror).as_posix()
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


def write_lock(entries: list[Entry], trees: list[Tree], lock: Path = LOCK) -> None:
    header = ("# Upstream files the plan and the conformance tests read, each with its source and sha256 (of the file\n"
              "# as they read it), and the chart source trees with their listing hash. Written by\n"
              "# `python tools/upstream.py lock --from DIR`; read by `sync` and `verify`.\n")
    items = [{k: v for k, v in asdict(e).items() if v is not None} for e in entries]
    document = {"trees": [asdict(t) for t in trees], "files": items}
    lock.write_text(header + yaml.safe_dump(document, sort_keys=False, width=200), encoding="utf-8")


# --- CLI ---------------------------------------------------------------------------------------------------------

def _report(headline: str, lines: list[str], limit: int = 15) -> str:
    shown = lines[:limit] + ([f"... and {len(lines) - limit} more"] if len(lines) > limit else [])
    return "\n".join([headline + ":", *(f"  - {line}" for line in shown)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools/upstream.py", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("sync", "verify", "lock"):
        command = commands.add_parser(name)
        command.add_argument("--dest", type=Path, default=Path(os.environ.get("TRAINYARD_UPSTREAM") or DEFAULT_DEST))
        if name != "verify":
            command.add_argument("--from", dest="mirror", type=Path, help="local mirror laid out like the cache")
    args = parser.parse_args(argv)
    try:
        if args.command == "verify":
            verify(args.dest)
            print(f"upstream data in {args.dest}: {len(load_lock())} files match {LOCK.name}")
        elif args.command == "lock":
            if args.mirror is None:
                parser.error("lock needs --from DIR (a mirror with SOURCES.md)")
            entries, trees = lock_from_mirror(args.mirror, pinned_charts())
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
        print(f"tools/upstream.py {args.command}: {error}", file=sys.stderr)
        print("Fix: run `python tools/upstream.py sync` with internet access, or `--from DIR` pointing at a mirror "
              "(a checkout's ../shared/upstream).", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
