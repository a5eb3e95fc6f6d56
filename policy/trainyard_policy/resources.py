"""The resource view every rule reads, and helpers to walk Kubernetes objects inside it."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class Resource:
    """What a rule needs to know about one resource, from a plan record or from the policy engine."""

    urn: str
    type: str
    name: str
    inputs: dict[str, Any]
    protect: bool = False
    parent: str | None = None


class _Record(Protocol):
    @property
    def urn(self) -> str: ...
    @property
    def type(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def inputs(self) -> dict[str, Any]: ...
    @property
    def protect(self) -> bool: ...
    @property
    def parent(self) -> str | None: ...


def from_record(record: _Record) -> Resource:
    """A view of a trainyard plan record (trainyard.plan.recording.ResourceRecord)."""
    return Resource(urn=record.urn, type=record.type, name=record.name, inputs=record.inputs,
                    protect=record.protect, parent=record.parent)


@dataclass(frozen=True)
class Violation:
    urn: str
    message: str

    def __str__(self) -> str:
        return f"{self.urn}: {self.message}"


def kind_of(resource: Resource) -> str:
    """The Kubernetes kind of a `kubernetes:group/version:Kind` resource, else ''."""
    if not resource.type.startswith("kubernetes:") or resource.type.startswith("kubernetes:helm.sh"):
        return ""
    return resource.type.rsplit(":", 1)[-1]


def metadata(resource: Resource) -> Mapping[str, Any]:
    meta = resource.inputs.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def pod_specs(value: Any) -> Iterator[Mapping[str, Any]]:
    """Every pod spec (a mapping with a `containers` list) anywhere inside an object: Jobs, Deployments, tasks."""
    if isinstance(value, Mapping):
        if isinstance(value.get("containers"), list):
            yield value
        for child in value.values():
            yield from pod_specs(child)
    elif isinstance(value, list):
        for child in value:
            yield from pod_specs(child)


def containers(pod: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    for key in ("initContainers", "containers"):
        for container in pod.get(key) or []:
            if isinstance(container, Mapping):
                yield container
