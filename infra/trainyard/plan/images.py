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

# Tags that move: none at all, `latest`, and branch or channel builds such as `main-latest`, `nightly`, `devel`.
_MOVING_TAG = re.compile(r"(.*[-_.])?(latest|main|master|nightly|edge|dev|devel|develop|stable|canary|snapshot)")
_CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")
SPLIT_IMAGE_GROUP = "nvidia.com"  # the GPU Operator's resources: ClusterPolicy, NVIDIADriver
# Ceph CSI's operator runs its driver pods with the images of the ConfigMap an OperatorConfig's or Driver's
# `imageSet` names, one image per key (ceph/ceph-csi-operator api/v1 driver_types.go DriverSpec.ImageSet).
IMAGE_SET_GROUP = "csi.ceph.io"


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
            if isinstance(container, Mapping):
                yield from _env_images(container, f"{path}.{key}[{container.get('name', '?')}]")
    image = node.get("image")
    if isinstance(image, str) and node.get("enabled") is not False and "name" not in node:
        if split and isinstance(node.get("version"), str):
            yield path or ".", _joined(node)
        elif "/" in image or ":" in image:
            yield path or ".", image
    for key, value in node.items():
        if key not in _CONTAINER_LISTS and key != "image":
            yield from _walk(value, f"{path}.{key}", split=split)


def _env_images(container: Mapping[str, Any], path: str) -> Iterator[tuple[str, str]]:
    """Images a controller is told to run by environment: Fluid's runtime controllers take their runtimes'
    default images from `*_IMAGE_ENV` variables (fluid v1.0.8 pkg/common/alluxio.go AlluxioRuntimeImageEnv)."""
    for variable in container.get("env") or ():
        name, value = str(variable.get("name", "")), variable.get("value")
        if "IMAGE" in name and isinstance(value, str) and ("/" in value or ":" in value):
            yield f"{path}.env[{name}]", value


def _image_sets(rendered: RenderedStack) -> set[tuple[str, str]]:
    """(namespace, name) of every ConfigMap a rendered Ceph CSI resource names as its imageSet."""
    found = set()
    for release, obj in rendered.objects():
        if str(obj.get("apiVersion", "")).partition("/")[0] == IMAGE_SET_GROUP:
            namespace = str((obj.get("metadata") or {}).get("namespace") or release.namespace)
            found |= {(namespace, name) for name in _set_names(obj.get("spec"))}
    return found


def _set_names(node: Any) -> Iterator[str]:
    if isinstance(node, list):
        for item in node:
            yield from _set_names(item)
    elif isinstance(node, Mapping):
        for key, value in node.items():
            if key == "imageSet" and isinstance(value, Mapping) and value.get("name"):
                yield str(value["name"])
            else:
                yield from _set_names(value)


def references(rendered: RenderedStack) -> Iterator[tuple[str, str, str, str]]:
    """(release, object, where, image reference) of every image the rendered objects make a node pull."""
    sets = _image_sets(rendered)
    for release, obj in rendered.objects():
        metadata = obj.get("metadata") or {}
        name = f"{obj.get('kind')}/{metadata.get('name')}"
        for where, reference in images(obj):
            yield release.name, name, where, reference
        if obj.get("kind") == "ConfigMap" and \
                (str(metadata.get("namespace") or release.namespace), str(metadata.get("name"))) in sets:
            for key, reference in sorted((obj.get("data") or {}).items()):
                yield release.name, name, f".data.{key}", str(reference)


def unpinned(rendered: RenderedStack) -> list[str]:
    """One line per image without a pinned tag: release, object, where, reference."""
    return sorted({f"release {release}: {name} {where.lstrip('.')} runs {reference}"
                   for release, name, where, reference in references(rendered) if not is_pinned(reference)})


def digest_mismatches(rendered: RenderedStack, digests: Mapping[str, Mapping[str, str]]) -> list[str]:
    """One line per `repository:tag@digest` whose repository has recorded digests (repository -> tag -> digest)
    and whose digest is not the one recorded for its tag."""
    found = []
    for release, name, where, reference in references(rendered):
        named, _, digest = reference.partition("@")
        repository, tag = named.rsplit(":", 1) if ":" in named.rsplit("/", 1)[-1] else (named, "")
        recorded = digests.get(repository)
        if digest and recorded is not None and recorded.get(tag) != digest:
            expected = recorded.get(tag, f"none recorded for tag {tag or '(none)'}")
            found.append(f"release {release}: {name} {where.lstrip('.')} runs {reference} (release data: {expected})")
    return sorted(set(found))
