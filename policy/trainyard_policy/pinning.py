"""Reproducible installs: Helm charts at exact versions, container images at a tag other than `latest` or a digest."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from trainyard.config.name_rules import image_pin_problem

from trainyard_policy.resources import Resource, Violation, containers, kind_of, pod_specs

HELM_RELEASE = "kubernetes:helm.sh/v3:Release"
_EXACT_VERSION = re.compile(r"v?[0-9]+\.[0-9]+\.[0-9]+(?:[-+][0-9A-Za-z.+-]+)?")


def image_pinned(reference: str) -> bool:
    """`name:tag` with a tag other than latest, or `name@sha256:<digest>`, as the stack config requires."""
    return image_pin_problem(reference) is None


def charts_pinned(resources: Sequence[Resource]) -> list[Violation]:
    found = []
    for r in resources:
        if r.type == HELM_RELEASE:
            version = str(r.inputs.get("version") or "")
            if not _EXACT_VERSION.fullmatch(version):
                found.append(Violation(r.urn, f"chart {r.inputs.get('chart')!r} version {version!r} is not exact"))
    return found


def _value_images(values: Any, path: str = "values") -> Iterator[tuple[str, str]]:
    """(path, problem) for image settings in chart values: `image: repo:tag` strings, and `tag: latest`."""
    if isinstance(values, Mapping):
        for key, value in values.items():
            here = f"{path}.{key}"
            if key == "image" and isinstance(value, str) and value and not image_pinned(value):
                yield here, f"image {value!r} is not pinned"
            elif key == "tag" and value == "latest":
                yield here, "image tag 'latest'"
            else:
                yield from _value_images(value, here)
    elif isinstance(values, list):
        for i, value in enumerate(values):
            yield from _value_images(value, f"{path}[{i}]")


def images_pinned(resources: Sequence[Resource]) -> list[Violation]:
    found = []
    for r in resources:
        if r.type == HELM_RELEASE:
            values = r.inputs.get("values")
            found += [Violation(r.urn, f"{where}: {problem}") for where, problem in _value_images(values)]
        elif kind_of(r):
            for pod in pod_specs(r.inputs):
                for container in containers(pod):
                    image = str(container.get("image") or "")
                    if not image_pinned(image):
                        found.append(Violation(r.urn, f"container {container.get('name')!r} image {image!r} "
                                                      "is not pinned"))
    return found
