"""Images the rendered objects would pull, and the ones without a pinned tag.

A chart's source tree is not its published package: publishers stamp versions when they package, so an image that
defaults to `.Chart.AppVersion` renders from the tree with whatever the tree says (the GPU Operator's `main-latest`,
`deployments/gpu-operator/templates/_helpers.tpl` at v26.7.0). The plan states what runs only when every image it
renders carries a digest or a tag that names a release, so it refuses the rest. A reference with both is pulled by
its digest (the tag is then only a label), so where release data records the digest of a tag, the rendered pair
must be that one: Karpenter's tag tree v1.14.1 carries 1.13.0's digest beside a chart-default tag.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from trainyard.config.name_rules import IMAGE_REFERENCE
from trainyard.plan.rendering import RenderedStack

# Tags that move: none at all, `latest`, and branch builds such as `main-latest` or `nightly`.
_MOVING_TAG = re.compile(r"(.*[-_.])?(latest|main|master|nightly|edge)")
_CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")
SPLIT_IMAGE_GROUP = "nvidia.com"  # the GPU Operator's resources: ClusterPolicy, NVIDIADriver


def is_pinned(reference: str) -> bool:
    """`repo:tag` with a release tag, or any `repo@sha256:...`; never what distribution's grammar does not parse
    as one reference (`repo:v1:v1`, or "...:latest\n", which would otherwise read as the tag "latest\n")."""
    if IMAGE_REFERENCE.fullmatch(reference) is None:
        return False
    if "@sha256:" in reference:
        return True
    name = reference.rsplit("/", 1)[-1]
    if ":" not in name:
        return False
    return not _MOVING_TAG.fullmatch(name.rsplit(":", 1)[1])


def images(obj: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """(where in the object, image reference) for every container and every image field of a custom resource.

    An operator's resource names its operands' images two ways. The GPU Operator's (API group nvidia.com) splits
    them into repository, image and version and joins them as `repository/image:version`, or `@version` for a
    sha256 digest (NVIDIA/gpu-operator v26.7.0 api/nvidia/v1/clusterpolicy_types.go imagePath). Everyone else's
    `image` is the whole reference: the Prometheus Operator pulls spec.image as written, its `version` only says
    which configuration to generate (prometheus-operator pkg/operator/image.go BuildImagePath: a set spec.image
    wins).
    """
    split = str(obj.get("apiVersion", "")).partition("/")[0] == SPLIT_IMAGE_GROUP
    yield from _walk(obj, "", split=split)


def _joined(node: Mapping[str, Any]) -> str:
    repository, image, version = node.get("repository"), node["image"], node["version"]
    sep = "@" if version.startswith("sha256:") else ":"
    return f"{repository}/{image}{sep}{version}" if repository else f"{image}{sep}{version}"


def _walk(node: Any, path: str, *, split: bool) -> Iterator[tuple[str, str]]:
    if isinstance(node, list):
        for index, item in enumerate(node):
            yield from _walk(item, f"{path}[{index}]", split=split)
        return
    if not isinstance(node, Mapping):
        return
    for key in _CONTAINER_LISTS:
        for container in node.get(key) or ():
            if isinstance(container, Mapping) and isinstance(container.get("image"), str):
                yield f"{path}.{key}[{container.get('name', '?')}]", container["image"]
    image = node.get("image")
    if isinstance(image, str) and node.get("enabled") is not False and "name" not in node:
        if split and isinstance(node.get("version"), str):
            yield path or ".", _joined(node)
        elif "/" in image or ":" in image:
            yield path or ".", image
    for key, value in node.items():
        if key not in _CONTAINER_LISTS and key != "image":
            yield from _walk(value, f"{path}.{key}", split=split)


def unpinned(rendered: RenderedStack) -> list[str]:
    """One line per image without a pinned tag: release, object, where, reference."""
    found = []
    for release, obj in rendered.objects():
        name = f"{obj.get('kind')}/{(obj.get('metadata') or {}).get('name')}"
        for where, reference in images(obj):
            if not is_pinned(reference):
                found.append(f"release {release.name}: {name} {where.lstrip('.')} runs {reference}")
    return sorted(set(found))


def digest_mismatches(rendered: RenderedStack, digests: Mapping[str, Mapping[str, str]]) -> list[str]:
    """One line per `repository:tag@digest` whose repository has recorded digests (repository -> tag -> digest)
    and whose digest is not the one recorded for its tag."""
    found = []
    for release, obj in rendered.objects():
        name = f"{obj.get('kind')}/{(obj.get('metadata') or {}).get('name')}"
        for where, reference in images(obj):
            named, _, digest = reference.partition("@")
            repository, tag = named.rsplit(":", 1) if ":" in named.rsplit("/", 1)[-1] else (named, "")
            recorded = digests.get(repository)
            if digest and recorded is not None and recorded.get(tag) != digest:
                expected = recorded.get(tag, f"none recorded for tag {tag or '(none)'}")
                found.append(f"release {release.name}: {name} {where.lstrip('.')} runs {reference} "
                             f"(release data: {expected})")
    return sorted(set(found))
