"""Where a release's render is found before Helm runs: the local cache of earlier renders (build/render-cache), and
the renders a committed plan records (plans/<stack>/rendered/<release>/render.json), so a clean clone plans every
stack without running Helm.

Both are looked up by the render's key (trainyard.plan.rendering.render_key): a hash of everything that decides
what Helm prints (the binary, the chart tree's content, the values, release name, namespace, Kubernetes version and
the API versions the chart asks about), so a chart, values or flag change is always a miss. A committed entry is
served only while every object file it lists has the bytes it recorded (a hand-edited plan is a miss), and
tests/plan/test_committed_renders.py renders every release of every stack with the real Helm, both caches off, and
proves the committed objects and keys are what Helm produces.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainyard.paths import REPO_ROOT
from trainyard.plan.kube_yaml import load_objects

FORMAT = 2
RECORD = "render.json"  # beside a release's object files in a plan: its key, its renders, its files' digests
SCHEMAS = "crd-schemas.json"  # the CRD schemas the object files keep only digests of, by digest
PLANS_DIR = REPO_ROOT / "plans"
# The local cache keeps the renders used last up to this size (a prod stack's renders take ~15 MB; every edit of a
# values file adds its release's again), and drops the least recently used beyond it.
CACHE_BYTES = 256 * 2**20
_PARTIAL_AGE_S = 3600  # a `.partial` file this old belongs to no render still writing


@dataclass(frozen=True)
class Render:
    """One `helm template` result: its objects, and the API versions its CRDs serve. A committed plan keeps the
    objects of a release's last render only: an earlier one (before other charts' CRDs were known) is known by its
    CRDs alone (objects None)."""

    objects: tuple[dict[str, Any], ...] | None
    crds: tuple[str, ...]


def crd_api_versions(objects: Iterable[Mapping[str, Any]]) -> tuple[str, ...]:
    """`group/version` and `group/version/Kind` of every version the CRDs among `objects` serve."""
    found: set[str] = set()
    for obj in objects:
        if obj.get("kind") != "CustomResourceDefinition":
            continue
        spec = obj.get("spec") or {}
        group, kind = spec.get("group"), (spec.get("names") or {}).get("kind")
        for served in spec.get("versions") or ():
            if served.get("served", True):
                found |= {f"{group}/{served['name']}", f"{group}/{served['name']}/{kind}"}
    return tuple(sorted(found))


# ------------------------------------------------------------------------------------------------ local cache


def default_cache_dir() -> Path:
    """`$TRAINYARD_RENDER_CACHE`, else build/render-cache in the repository (git-ignored)."""
    override = os.environ.get("TRAINYARD_RENDER_CACHE")
    return Path(override) if override else REPO_ROOT / "build" / "render-cache"


def read_local(store: Path, key: str) -> Render | None:
    cached = store / f"{key}.json"
    try:
        entry = json.loads(cached.read_text(encoding="utf-8"))
        os.utime(cached)  # used now: the last the cache drops
        return Render(tuple(entry["objects"]), tuple(entry["crds"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_local(store: Path, key: str, render: Render) -> None:
    try:
        store.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=store, delete=False, suffix=".partial", encoding="utf-8") as tmp:
            tmp.write(json.dumps({"objects": render.objects, "crds": render.crds}))  # one shot: the C encoder
        os.replace(tmp.name, store / f"{key}.json")
    except OSError:
        pass  # a read-only checkout still renders, only without the cache


def prune_cache(store: Path, limit: int = CACHE_BYTES) -> None:
    """Drop the least recently used renders until the cache holds at most `limit` bytes (a hit refreshes an
    entry's mtime), and `.partial` files no render is writing any more. Another plan sharing the cache that
    misses a pruned entry renders it again."""
    try:
        entries = sorted(((e.stat(), e) for e in store.iterdir() if e.is_file()), key=lambda pair: -pair[0].st_mtime)
    except OSError:
        return
    now, kept = time.time(), 0
    for stat, entry in entries:
        stale = entry.suffix == ".partial" and now - stat.st_mtime > _PARTIAL_AGE_S
        if entry.suffix == ".json":
            kept += stat.st_size
        if stale or (entry.suffix == ".json" and kept > limit):
            entry.unlink(missing_ok=True)


# ------------------------------------------------------------------------------------------- committed plans


def crd_summary(crd: Mapping[str, Any]) -> dict[str, Any]:
    """A CRD without its schemas, which are the chart's upstream text: each version's schema by its sha256, so
    a chart bump that changes one still shows in the plan's diff (the schemas themselves go to SCHEMAS)."""
    spec = dict(crd.get("spec") or {})
    versions = []
    for version in spec.get("versions") or ():
        version = dict(version)
        schema = version.pop("schema", None)
        if schema is not None:
            version["schema"] = {"sha256": _schema_digest(schema)}
        versions.append(version)
    spec["versions"] = versions
    return {**crd, "spec": spec}


def record_files(key: str, history: Mapping[str, Sequence[str]], objects: Sequence[Mapping[str, Any]],
                 texts: Sequence[tuple[str, str]]) -> dict[str, str]:
    """RECORD (and SCHEMAS where the release has CRDs) for a release whose object files are `texts` (name, text),
    in the order of `objects`: what lets a later plan serve the render from these files."""
    schemas = {_schema_digest(version["schema"]): version["schema"]
               for crd in objects if crd.get("kind") == "CustomResourceDefinition"
               for version in (crd.get("spec") or {}).get("versions") or () if "schema" in version}
    files = {SCHEMAS: json.dumps(schemas, indent=1, sort_keys=True) + "\n"} if schemas else {}
    record = {"format": FORMAT, "key": key, "renders": {k: list(v) for k, v in history.items()},
              "objects": [[name, _digest(text.encode())] for name, text in (*texts, *files.items())]}
    return {RECORD: json.dumps(record, indent=1, sort_keys=True) + "\n", **files}


class CommittedRenders:
    """The renders the plans under `plans` record, by key (read when looked up; a stack's own or another's)."""

    def __init__(self, plans: Path | None) -> None:
        self._by_key: dict[str, Path] = {}
        for record_path in sorted(plans.glob(f"*/rendered/*/{RECORD}")) if plans is not None else ():
            record = _read_json(record_path)
            if isinstance(record, dict) and record.get("format") == FORMAT:
                for key in record.get("renders") or ():
                    self._by_key.setdefault(str(key), record_path)

    def find(self, key: str) -> Render | None:
        record_path = self._by_key.get(key)
        record = _read_json(record_path) if record_path is not None else None
        if record_path is None or not isinstance(record, dict):
            return None
        try:
            crds = tuple(record["renders"][key])
            if record["key"] != key:
                return Render(None, crds)
            files = dict(_files(record_path.parent, record["objects"]))
            objects = tuple(_restored(files))
        except (OSError, ValueError, KeyError, TypeError):
            return None  # an edited or incomplete plan: Helm renders it
        return Render(objects, crds)


def _files(folder: Path, listed: Iterable[Sequence[str]]) -> Iterator[tuple[str, bytes]]:
    for name, digest in listed:
        data = (folder / name).read_bytes()
        if _digest(data) != digest:
            raise ValueError(f"{folder / name} is not the file the plan recorded")
        yield name, data


def _restored(files: Mapping[str, bytes]) -> Iterator[dict[str, Any]]:
    """The objects of a release's files, as rendered: each CRD with its schemas put back."""
    schemas = json.loads(files[SCHEMAS]) if SCHEMAS in files else {}
    for name, data in files.items():
        if name == SCHEMAS:
            continue
        obj = json.loads(_parsed(_digest(data), data))
        if obj.get("kind") == "CustomResourceDefinition":
            for version in obj["spec"]["versions"]:
                if "schema" in version:
                    version["schema"] = schemas[version["schema"]["sha256"]]
        yield obj


# An object file's parse, as JSON text, by the file's sha256: dev, staging and prod commit many identical files,
# and a fresh json.loads per use gives every release objects of its own.
_PARSED: dict[str, str] = {}


def _parsed(digest: str, data: bytes) -> str:
    if digest not in _PARSED:
        (obj,) = load_objects(data)
        _PARSED[digest] = json.dumps(obj)
    return _PARSED[digest]


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _schema_digest(schema: Any) -> str:
    return _digest(json.dumps(schema, sort_keys=True, separators=(",", ":")).encode())


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
