"""Write a recording as files reviewers read: resources.json, one manifest per object, one file per release,
and the dependency graph."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import yaml

from trainyard.plan import graph
from trainyard.plan.recording import Recording, ResourceRecord

HELM_RELEASE = "kubernetes:helm.sh/v3:Release"
_NOT_OBJECTS = frozenset({HELM_RELEASE, "pulumi:providers:kubernetes"})


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


def write_plan(recording: Recording, out: Path) -> None:
    """Replace `out` with the plan's files; the same recording always gives the same bytes."""
    if out.exists():
        shutil.rmtree(out)
    (out / "manifests").mkdir(parents=True)
    (out / "helm").mkdir()
    resources = sorted(recording.resources, key=lambda r: r.urn)
    (out / "resources.json").write_text(json.dumps([r.as_json() for r in resources], indent=2, sort_keys=True) + "\n")
    (out / "outputs.json").write_text(json.dumps(recording.outputs, indent=2, sort_keys=True) + "\n")
    dependencies = graph.build(recording)
    (out / "graph.mmd").write_text(graph.to_mermaid(dependencies))
    (out / "graph.dot").write_text(graph.to_dot(dependencies))
    for record in resources:
        if record.type == HELM_RELEASE:
            release = release_of(record)
            _write_yaml(out / "helm" / f"{release['namespace']}.{release['name']}.yaml", release)
        elif is_kubernetes_object(record):
            obj = manifest_of(record)
            path = out / "manifests" / manifest_filename(obj)
            if path.exists():
                raise ValueError(f"two Kubernetes objects would both be written to {path.name}")
            _write_yaml(path, obj)


class _Dumper(yaml.SafeDumper):
    """Block style for multi-line strings, so embedded scripts and dashboards diff line by line."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def _write_yaml(path: Path, data: Any) -> None:
    path.write_text(yaml.dump(data, Dumper=_Dumper, sort_keys=True, default_flow_style=False, width=120,
                              allow_unicode=True))
