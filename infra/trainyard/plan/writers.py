"""Write a recording as files reviewers read: resources.json, one manifest per object, one file per release,
the objects each release renders (rendered/<release>/), and the dependency graph."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from trainyard.config.yaml_input import InputError
from trainyard.paths import REPO_ROOT
from trainyard.plan import graph
from trainyard.plan.recording import Recording, ResourceRecord
from trainyard.plan.render_cache import crd_summary, record_files
from trainyard.plan.rendering import RenderedRelease, RenderedStack
from trainyard.safe_paths import UnsafePathError, check_root, inside, relative_parts, remove_file, write_file

HELM_RELEASE = "kubernetes:helm.sh/v3:Release"
_NOT_OBJECTS = frozenset({HELM_RELEASE, "pulumi:providers:kubernetes"})
# Lists the files a plan wrote, so the next plan replaces those and nothing else.
MARKER = ".trainyard-plan"
# A plan lists a few thousand files; a marker far larger than that was not written by one.
MAX_MARKER_BYTES = 4 * 1024 * 1024


def is_kubernetes_object(record: ResourceRecord) -> bool:
    return record.type.startswith("kubernetes:") and record.type not in _NOT_OBJECTS


def manifest_of(record: ResourceRecord) -> dict[str, Any]:
    """The object as the provider sends it to the API server (the SDK already sets apiVersion and kind)."""
    return {k: v for k, v in record.inputs.items() if not k.startswith("__")}


def release_of(record: ResourceRecord) -> dict[str, Any]:
    inputs = record.inputs
    chart = str(inputs.get("chart", ""))
    repository = (inputs.get("repositoryOpts") or {}).get("repo")
    if repository is None and chart.startswith("oci://"):
        repository, chart = chart.rsplit("/", 1)
    return {
        "name": inputs.get("name", record.name),
        "namespace": inputs.get("namespace"),
        "chart": chart,
        "repository": repository,
        "version": inputs.get("version"),
        "values": inputs.get("values", {}),
    }


def manifest_filename(obj: dict[str, Any]) -> str:
    metadata = obj.get("metadata") or {}
    namespace = metadata.get("namespace") or "_cluster"
    return f"{namespace}.{str(obj.get('kind', 'Unknown')).lower()}.{metadata.get('name', 'unnamed')}.yaml"


def object_identity(obj: dict[str, Any]) -> tuple[str, str, str, str]:
    """(API group, kind, namespace, name): what the API server keys an object by, whatever its version."""
    metadata = obj.get("metadata") or {}
    group = str(obj.get("apiVersion", "")).rpartition("/")[0]
    return group, str(obj.get("kind", "")), str(metadata.get("namespace") or ""), str(metadata.get("name", ""))


def check_unique_objects(recording: Recording) -> None:
    """InputError when two resources would create (or patch) one Kubernetes object: `pulumi up` would fail on
    the second ("already exists") or the two would overwrite each other, so the stack cannot be deployed."""
    owners: dict[tuple[str, str, str, str], ResourceRecord] = {}
    for record in sorted(recording.resources, key=lambda r: r.urn):
        if not is_kubernetes_object(record):
            continue
        identity = object_identity(manifest_of(record))
        if (first := owners.setdefault(identity, record)) is not record:
            _, kind, namespace, name = identity
            where = f" in namespace {namespace}" if namespace else ""
            raise InputError(f"the stack creates the {kind} {name!r}{where} twice ({first.name} and {record.name}): "
                             "a tenant, pool or job name takes a name the platform already uses; rename it")


def plan_files(recording: Recording, rendered: RenderedStack | None = None) -> dict[str, str]:
    """Relative path -> text of every file a plan writes; the same recording always gives the same bytes."""
    check_unique_objects(recording)
    resources = sorted(recording.resources, key=lambda r: r.urn)
    dependencies = graph.build(recording)
    files = {
        "resources.json": json.dumps([r.as_json() for r in resources], indent=2, sort_keys=True) + "\n",
        "outputs.json": json.dumps(recording.outputs, indent=2, sort_keys=True) + "\n",
        "graph.mmd": graph.to_mermaid(dependencies),
        "graph.dot": graph.to_dot(dependencies),
    }
    for record in resources:
        if record.type == HELM_RELEASE:
            release = release_of(record)
            files[f"helm/{release['namespace']}.{release['name']}.yaml"] = _yaml(release)
        elif is_kubernetes_object(record):
            obj = manifest_of(record)
            path = f"manifests/{manifest_filename(obj)}"
            if path in files:  # distinct objects whose names differ only in API group or case
                raise InputError(f"two Kubernetes objects would both be written to {path}")
            files[path] = _yaml(obj)
    for rendered_release in (rendered.releases.values() if rendered is not None else ()):
        files.update(rendered_files(rendered_release))
    return files


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def rendered_files(release: RenderedRelease) -> dict[str, str]:
    """`rendered/<release>/<kind>.<name>.yaml` per object (`<kind>.<namespace>.<name>` where names repeat; a CRD
    with its schemas' digests only), and the release's render record (trainyard.plan.render_cache)."""
    folder = f"rendered/{_UNSAFE.sub('_', release.name)}/"

    def name(obj: Mapping[str, Any], with_namespace: bool) -> str:
        metadata = obj.get("metadata") or {}
        parts = [str(obj.get("kind", "Unknown")).lower(), *([str(metadata.get("namespace") or "_release")]
                                                           if with_namespace else []), str(metadata.get("name"))]
        return ".".join(_UNSAFE.sub("_", p) for p in parts) + ".yaml"

    short = [name(obj, False) for obj in release.objects]
    texts: dict[str, str] = {}
    for obj, path in zip(release.objects, short, strict=True):
        if short.count(path) > 1:
            path = name(obj, True)
        if path in texts:
            raise InputError(f"release {release.name}: two rendered objects would both be written to {folder}{path}")
        texts[path] = _yaml(crd_summary(obj) if obj.get("kind") == "CustomResourceDefinition" else obj)
    record = record_files(release.key, release.history, release.objects, list(texts.items()))
    return {folder + path: text for path, text in (texts | record).items()}


def write_plan(recording: Recording, out: Path, rendered: RenderedStack | None = None) -> None:
    """Write the plan into `out`: a new or empty folder, or one an earlier plan wrote (it has MARKER).

    Only the files the earlier plan listed in MARKER are replaced or removed; anything else in the folder is
    left alone, and a plan file that would overwrite it is refused (InputError) before anything is written.
    Every path written or removed stays inside `out` and passes through no link (trainyard.safe_paths): plans/
    is committed and git stores links, so an earlier plan's `manifests/` may be one.
    """
    files = plan_files(recording, rendered)
    previous = _previous_plan(out)
    try:
        for rel in sorted(files.keys() | previous):
            inside(out, rel)
        for folder in _FOLDERS:
            inside(out, folder, folder=True)
    except UnsafePathError as exc:
        raise InputError(f"--out {out}: {exc}; nothing was written") from None
    clashes = sorted(rel for rel in files if rel not in previous and os.path.lexists(out / rel))
    if clashes:
        raise InputError(f"--out {out}: {clashes[0]} exists and was not written by an earlier plan; "
                         "nothing was written (move it, or choose a new folder)")
    try:
        for rel in sorted(previous - files.keys()):
            remove_file(out, rel)
            emptied = (out / rel).parent
            if emptied.parent == out / "rendered" and emptied.is_dir() and not any(emptied.iterdir()):
                emptied.rmdir()  # a release the stack no longer has
        for folder in _FOLDERS:
            inside(out, folder, folder=True).mkdir(parents=True, exist_ok=True)
        for rel, text in files.items():
            write_file(out, rel, text.encode())
        write_file(out, MARKER, (_MARKER_HEADER + "".join(f"{rel}\n" for rel in sorted(files))).encode())
    except UnsafePathError as exc:  # a link made while the plan was being written
        raise InputError(f"--out {out}: {exc}") from None
    except OSError as exc:
        raise InputError(f"--out {out}: cannot write the plan there ({exc.strerror or exc})") from None


# Folders every plan has, even when it renders no object or release into them.
_FOLDERS = ("manifests", "helm")


def check_out(out: Path) -> None:
    """InputError unless a plan may be written into `out` (checked again, with the files, by write_plan)."""
    _previous_plan(out)
    parent = next((p for p in (out, *out.parents) if p.exists()), Path("."))
    if not os.access(parent, os.W_OK):
        raise InputError(f"--out {out}: {parent} is not writable")


def _check_root(out: Path) -> None:
    """`out` is a folder or absent, never a link; inside the repository, no folder on the way to it is a link
    either (a committed `plans` link would send `make plans` elsewhere)."""
    try:
        check_root(out, "--out")
        absolute = Path(os.path.abspath(out))
        if absolute != REPO_ROOT and absolute.is_relative_to(REPO_ROOT):
            inside(REPO_ROOT, absolute.relative_to(REPO_ROOT).as_posix(), folder=True)
    except UnsafePathError as exc:
        raise InputError(f"--out {out}: {exc}; nothing was written") from None


def _previous_plan(out: Path) -> set[str]:
    """The files an earlier plan wrote into `out` (empty for a new or empty folder); InputError for anything else."""
    _check_root(out)
    if not os.path.lexists(out):
        return set()
    marker = out / MARKER
    if not marker.is_file() or marker.is_symlink():
        legacy = _unmarked_plan(out)
        if legacy is not None:
            return legacy
        if any(out.iterdir()):
            raise InputError(f"--out {out}: a folder with files not written by `trainyard plan` (no {MARKER}); "
                             "nothing was written: choose a new or empty folder")
        return set()
    return _marker_files(out, marker)


def _marker_files(out: Path, marker: Path) -> set[str]:
    """The paths MARKER lists; InputError naming the line when one is not a plain path inside `out` (an edited
    marker never makes the plan delete or write elsewhere)."""
    if marker.stat().st_size > MAX_MARKER_BYTES:
        raise InputError(f"--out {out}: {MARKER} holds more than {MAX_MARKER_BYTES} bytes, far more than a plan "
                         "lists; nothing was written: delete the folder or choose a new one")
    listed = set()
    text = marker.read_text(encoding="utf-8", errors="replace")
    for number, line in enumerate(text.split("\n"), start=1):
        if not line or line.startswith("#"):
            continue
        try:
            relative_parts(line)
        except UnsafePathError as exc:
            raise InputError(f"--out {out}: {MARKER} line {number}: {exc}; nothing was written: delete that line "
                             "(a plan lists only its own files)") from None
        listed.add(line)
    return listed


_TOP_LEVEL_FILES = frozenset({"resources.json", "outputs.json", "graph.mmd", "graph.dot"})


def _unmarked_plan(out: Path) -> set[str] | None:
    """A plan written before MARKER existed: its files, when the folder holds plan files and nothing else."""
    files: set[str] = set()
    for path in out.rglob("*"):
        rel = path.relative_to(out)
        if path.is_symlink():
            return None
        if path.is_dir():
            if str(rel) not in ("manifests", "helm"):
                return None
        elif str(rel) in _TOP_LEVEL_FILES or (len(rel.parts) == 2 and rel.parts[0] in ("manifests", "helm")
                                               and rel.suffix == ".yaml"):
            files.add(rel.as_posix())
        else:
            return None
    return files if "resources.json" in files else None


_MARKER_HEADER = ("# Written by `python -m trainyard plan --out`: the files below are the plan's own and are\n"
                  "# replaced by the next plan into this folder. Any other file here is left alone.\n")


class _Dumper(yaml.SafeDumper):
    """Block style for multi-line strings, so embedded scripts and dashboards diff line by line."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def _yaml(data: Any) -> str:
    return yaml.dump(data, Dumper=_Dumper, sort_keys=True, default_flow_style=False, width=120, allow_unicode=True)
