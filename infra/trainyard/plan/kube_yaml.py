"""YAML as the API server receives it: Helm's client converts a chart's output to JSON (sigs.k8s.io/yaml), where an
unquoted date and YAML 1.1's `=` are plain strings. libyaml parses (PyYAML's C loader)."""

from __future__ import annotations

from typing import Any

import yaml


class _Loader(yaml.CSafeLoader):
    pass


def _string(loader: yaml.CSafeLoader, node: yaml.Node) -> str:
    return str(loader.construct_scalar(node))  # type: ignore[arg-type]


_Loader.add_constructor("tag:yaml.org,2002:value", _string)
_Loader.add_constructor("tag:yaml.org,2002:timestamp", _string)


def load_objects(text: str | bytes) -> list[dict[str, Any]]:
    """Every mapping document of a YAML stream (Helm's empty and comment-only documents drop out)."""
    return [doc for doc in yaml.load_all(text, Loader=_Loader) if isinstance(doc, dict)]
