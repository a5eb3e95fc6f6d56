"""What the offline plan records: every resource registration with the options the engine would see."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from google.protobuf import json_format, struct_pb2
from pulumi.runtime import mocks, rpc

SECRET = "[secret]"
UNKNOWN = "[unknown]"


@dataclass(frozen=True)
class ResourceRecord:
    urn: str
    type: str
    name: str
    custom: bool
    parent: str | None
    provider: str | None
    depends_on: tuple[str, ...]
    protect: bool
    retain_on_delete: bool
    deleted_with: str | None
    inputs: dict[str, Any]
    replace_on_changes: tuple[str, ...] = ()
    delete_before_replace: bool = False
    # customTimeouts the program set (create/update/delete, Go durations); empty: the provider's defaults.
    custom_timeouts: dict[str, str] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {
            "urn": self.urn,
            "type": self.type,
            "name": self.name,
            "parent": self.parent,
            "provider": self.provider,
            "depends_on": list(self.depends_on),
            "protect": self.protect,
            "retain_on_delete": self.retain_on_delete,
            "deleted_with": self.deleted_with,
            "replace_on_changes": list(self.replace_on_changes),
            "delete_before_replace": self.delete_before_replace,
            "custom_timeouts": self.custom_timeouts,
            "inputs": self.inputs,
        }


@dataclass
class Recording:
    resources: list[ResourceRecord] = field(default_factory=list)
    outputs: dict[str, Any] = field(default_factory=dict)

    def by_urn(self) -> dict[str, ResourceRecord]:
        return {r.urn: r for r in self.resources}


class RecordingMonitor(mocks.MockMonitor):
    """The mock monitor, plus a record of each request's options (Mocks.new_resource never sees them)."""

    def __init__(self, mock: mocks.Mocks, recording: Recording | None = None) -> None:
        super().__init__(mock)
        self.recording = recording if recording is not None else Recording()

    def make_urn(self, parent: str, type_: str, name: str) -> str:
        # The engine leaves the root stack out of its children's type chain; the base mock does not.
        if parent.split("::")[-2:-1] and parent.split("::")[-2].endswith("pulumi:pulumi:Stack"):
            parent = ""
        return str(super().make_urn(parent, type_, name))

    def RegisterResource(self, request: Any) -> Any:  # noqa: N802 - gRPC method name
        response = super().RegisterResource(request)  # type: ignore[no-untyped-call]  # pulumi's mock is untyped
        if request.type != "pulumi:pulumi:Stack":
            self.recording.resources.append(ResourceRecord(
                urn=response.urn,
                type=request.type,
                name=request.name,
                custom=bool(request.custom),
                parent=request.parent or None,
                # Provider references are "URN::ID"; the URN is what identifies the provider.
                provider=request.provider.rsplit("::", 1)[0] if request.provider else None,
                depends_on=tuple(sorted(set(request.dependencies))),
                protect=bool(request.protect),
                retain_on_delete=bool(request.retainOnDelete),
                deleted_with=request.deletedWith or None,
                inputs=plain(request.object),
                replace_on_changes=tuple(request.replaceOnChanges),
                delete_before_replace=bool(request.deleteBeforeReplace),
                custom_timeouts={k: v for k in ("create", "update", "delete")
                                 if (v := str(getattr(request.customTimeouts, k)))},
            ))
        return response


def plain(struct: struct_pb2.Struct) -> dict[str, Any]:
    """A registration's properties as JSON-ready values, with every secret leaf masked."""
    value = _plain(json_format.MessageToDict(struct))
    assert isinstance(value, dict)
    return value


def _masked(value: Any) -> Any:
    """A secret with its shape kept and every leaf masked: a Secret's `stringData` stays a map of strings, so
    the object still passes its schema (the SDK wraps the whole map as one secret)."""
    if isinstance(value, dict):
        return {k: _masked(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_masked(v) for v in value]
    return SECRET


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        sig = value.get(rpc._special_sig_key)
        if sig == rpc._special_secret_sig:
            return _masked(_plain(value.get("value")))
        if sig == rpc._special_resource_sig:
            return value.get("urn")
        if sig == rpc._special_output_value_sig:
            if value.get("secret"):
                return _masked(_plain(value["value"])) if "value" in value else SECRET
            return _plain(value["value"]) if "value" in value else UNKNOWN
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if value == rpc.UNKNOWN:
        return UNKNOWN
    # Struct numbers are doubles; whole numbers were ints in the program.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value
