"""MIG layouts: load ``platform/gpu-operator/mig-layouts.yaml`` and check every geometry fits its GPU.

The file is in nvidia-mig-parted's format and goes to the GPU Operator unchanged; this module gives the
stack config the typed view of it: which layouts exist, what each one carves out of a GPU, and the
Kubernetes extended resources those slices appear as under the device plugin's ``mixed`` MIG strategy.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

GPU_MODELS: tuple[str, ...] = ("A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB")

# PCI device IDs in the form NVIDIA's mig-parted tables use for `device-filter`.
GPU_DEVICE_IDS: Mapping[str, str] = MappingProxyType(
    {
        "A100-40GB": "0x20B010DE",  # A100-SXM4-40GB, p4d
        "A100-80GB": "0x20B210DE",  # A100-SXM4-80GB, p4de
        "H100-80GB": "0x233010DE",  # H100-SXM5-80GB, p5
        "H200-141GB": "0x233510DE",  # H200-SXM5-141GB, p5e / p5en
    }
)

WHOLE_GPU_RESOURCE = "nvidia.com/gpu"
DEFAULT_LAYOUTS_PATH = Path(__file__).resolve().parents[3] / "platform" / "gpu-operator" / "mig-layouts.yaml"

COMPUTE_SLICES = 7
MEMORY_SLICES = 8


@dataclass(frozen=True, slots=True)
class SliceShape:
    """How a MIG profile occupies a GPU: compute slices, memory slices, memory slices it may start at."""

    compute: int
    memory: int
    starts: tuple[int, ...]


# Placement rules of A100 and H100/H200 (7 compute, 8 memory slices), per NVIDIA's MIG user guide.
_1G = SliceShape(compute=1, memory=1, starts=(0, 1, 2, 3, 4, 5, 6))
_1G_DOUBLE_MEMORY = SliceShape(compute=1, memory=2, starts=(0, 2, 4, 6))
_2G = SliceShape(compute=2, memory=2, starts=(0, 2, 4))
_3G = SliceShape(compute=3, memory=4, starts=(0, 4))
_4G = SliceShape(compute=4, memory=4, starts=(0,))
_7G = SliceShape(compute=7, memory=8, starts=(0,))


def _profiles(one: str, two: str, four: str, eight: str) -> Mapping[str, SliceShape]:
    """A GPU's profile names; NVIDIA names each by the memory of a 1-, 2-, 4- and 8-memory-slice instance."""
    return MappingProxyType(
        {
            f"1g.{one}": _1G,
            f"1g.{two}": _1G_DOUBLE_MEMORY,
            f"2g.{two}": _2G,
            f"3g.{four}": _3G,
            f"4g.{four}": _4G,
            f"7g.{eight}": _7G,
        }
    )


MIG_PROFILES: Mapping[str, Mapping[str, SliceShape]] = MappingProxyType(
    {
        "A100-40GB": _profiles("5gb", "10gb", "20gb", "40gb"),
        "A100-80GB": _profiles("10gb", "20gb", "40gb", "80gb"),
        "H100-80GB": _profiles("10gb", "20gb", "40gb", "80gb"),
        "H200-141GB": _profiles("18gb", "35gb", "71gb", "141gb"),
    }
)

# Layout names become the value of the node label nvidia.com/mig.config.
_LABEL_VALUE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?")
_ENTRY_KEYS = frozenset({"device-filter", "devices", "mig-enabled", "mig-devices"})


class MigConfigError(ValueError):
    """The MIG layouts file is unreadable or describes something a GPU cannot do."""


def mig_resource_name(profile: str) -> str:
    """Extended resource a MIG profile is advertised as under the device plugin's ``mixed`` strategy."""
    return f"nvidia.com/mig-{profile}"


def fits(gpu_model: str, geometry: Mapping[str, int]) -> bool:
    """Whether ``geometry`` (profile -> instances) can be placed on one GPU of ``gpu_model`` at once."""
    shapes = MIG_PROFILES.get(gpu_model)
    if shapes is None:
        raise ValueError(f"unknown GPU model {gpu_model!r}; known: {', '.join(GPU_MODELS)}")
    unknown = sorted(set(geometry) - set(shapes))
    if unknown:
        raise ValueError(f"{gpu_model} has no MIG profile {', '.join(unknown)}; known: {', '.join(shapes)}")
    instances = [shapes[profile] for profile, count in geometry.items() for _ in range(count)]
    if sum(shape.compute for shape in instances) > COMPUTE_SLICES:
        return False
    # Most constrained first keeps the search tiny (at most 7 instances).
    instances.sort(key=lambda shape: len(shape.starts))
    return _place(instances, frozenset())


def _place(instances: list[SliceShape], used: frozenset[int]) -> bool:
    if not instances:
        return True
    first, rest = instances[0], instances[1:]
    for start in first.starts:
        span = frozenset(range(start, start + first.memory))
        if not span & used and _place(rest, used | span):
            return True
    return False


@dataclass(frozen=True)
class MigLayout:
    """One named layout: per GPU model, MIG profile -> instances per GPU (empty when MIG is disabled)."""

    name: str
    per_gpu: Mapping[str, Mapping[str, int]]


@dataclass(frozen=True)
class MigCatalog:
    """All layouts of one layouts file."""

    source: Path
    layouts: Mapping[str, MigLayout]

    def supports(self, layout: str, gpu_model: str) -> bool:
        entry = self.layouts.get(layout)
        return entry is not None and gpu_model in entry.per_gpu

    def slices(self, layout: str, gpu_model: str) -> Mapping[str, int]:
        """MIG profile -> instances on each GPU; empty for a layout that leaves MIG off."""
        if not self.supports(layout, gpu_model):
            known = ", ".join(
                sorted(name for name, entry in self.layouts.items() if gpu_model in entry.per_gpu)
            )
            raise MigConfigError(
                f"{self.source}: no MIG layout {layout!r} for GPU {gpu_model!r}; "
                f"layouts for it: {known or 'none'}"
            )
        return self.layouts[layout].per_gpu[gpu_model]

    def resource_names(self, layout: str, gpu_model: str) -> Mapping[str, int]:
        """Extended resource -> amount each GPU contributes to its node under the ``mixed`` strategy."""
        geometry = self.slices(layout, gpu_model)
        if not geometry:
            return MappingProxyType({WHOLE_GPU_RESOURCE: 1})
        return MappingProxyType({mig_resource_name(profile): count for profile, count in geometry.items()})


def gpu_sharing(layout: str | None, declared: str | None, gpu_model: str | None, catalog: MigCatalog) -> str | None:
    """How a pool's GPUs serve several pods: `mig` when its layout partitions them, its declared sharing, or None."""
    if layout is not None and gpu_model is not None and catalog.supports(layout, gpu_model) \
            and catalog.slices(layout, gpu_model):
        return "mig"
    return declared


def load_mig_catalog(path: Path = DEFAULT_LAYOUTS_PATH) -> MigCatalog:
    """Read and validate a mig-parted layouts file; raises MigConfigError naming the file and the key."""
    return _load(Path(path).resolve())


@functools.cache
def _load(path: Path) -> MigCatalog:
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise MigConfigError(f"{path}: cannot read MIG layouts: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise MigConfigError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(document, dict) or document.get("version") != "v1":
        raise MigConfigError(f"{path}: version: expected 'v1' (nvidia-mig-parted config format)")
    configs = document.get("mig-configs")
    if not isinstance(configs, dict) or not configs:
        raise MigConfigError(f"{path}: mig-configs: expected a non-empty mapping of layout name to entries")
    layouts = {str(name): _parse_layout(path, str(name), entries) for name, entries in configs.items()}
    return MigCatalog(source=path, layouts=MappingProxyType(layouts))


def _parse_layout(path: Path, name: str, entries: Any) -> MigLayout:
    where = f"mig-configs.{name}"
    if not _LABEL_VALUE.fullmatch(name):
        raise MigConfigError(f"{path}: {where}: layout name must be a valid Kubernetes label value")
    if not isinstance(entries, list) or not entries:
        raise MigConfigError(f"{path}: {where}: expected a non-empty list of entries")
    per_gpu: dict[str, Mapping[str, int]] = {}
    for index, entry in enumerate(entries):
        key = f"{where}[{index}]"
        geometry = _parse_geometry(path, key, entry)
        for gpu in _filtered_gpus(path, key, entry.get("device-filter")):
            if gpu in per_gpu:
                raise MigConfigError(f"{path}: {key}: a second entry for {gpu} ({GPU_DEVICE_IDS[gpu]})")
            _check_fits(path, key, gpu, geometry)
            per_gpu[gpu] = geometry
    return MigLayout(name=name, per_gpu=MappingProxyType(per_gpu))


def _parse_geometry(path: Path, key: str, entry: Any) -> Mapping[str, int]:
    if not isinstance(entry, dict):
        raise MigConfigError(f"{path}: {key}: expected a mapping")
    extra = sorted(set(entry) - _ENTRY_KEYS)
    if extra:
        raise MigConfigError(f"{path}: {key}: unknown keys {', '.join(extra)}")
    if entry.get("devices") != "all":
        # Per-index device lists would make a layout's capacity depend on the GPU count of the node.
        raise MigConfigError(f"{path}: {key}.devices: must be 'all'")
    enabled = entry.get("mig-enabled")
    if not isinstance(enabled, bool):
        raise MigConfigError(f"{path}: {key}.mig-enabled: expected true or false")
    devices = entry.get("mig-devices") or {}
    if not isinstance(devices, dict):
        raise MigConfigError(f"{path}: {key}.mig-devices: expected a mapping of profile to count")
    if enabled and not devices:
        raise MigConfigError(f"{path}: {key}.mig-devices: MIG is enabled but no instances are listed")
    if not enabled and devices:
        raise MigConfigError(f"{path}: {key}.mig-devices: instances listed while mig-enabled is false")
    for profile, count in devices.items():
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise MigConfigError(
                f"{path}: {key}.mig-devices.{profile}: expected a positive count, got {count!r}"
            )
    return MappingProxyType({str(profile): count for profile, count in devices.items()})


def _filtered_gpus(path: Path, key: str, device_filter: Any) -> tuple[str, ...]:
    if device_filter is None:
        return GPU_MODELS
    ids = [device_filter] if isinstance(device_filter, str) else device_filter
    if not isinstance(ids, list) or not ids or not all(isinstance(item, str) for item in ids):
        raise MigConfigError(f"{path}: {key}.device-filter: expected a device ID or a list of them")
    by_id = {device_id.lower(): gpu for gpu, device_id in GPU_DEVICE_IDS.items()}
    unknown = [item for item in ids if item.lower() not in by_id]
    if unknown:
        raise MigConfigError(
            f"{path}: {key}.device-filter: unsupported device {', '.join(unknown)}; "
            f"supported: {', '.join(f'{gpu}={device_id}' for gpu, device_id in GPU_DEVICE_IDS.items())}"
        )
    return tuple(by_id[item.lower()] for item in ids)


def _check_fits(path: Path, key: str, gpu: str, geometry: Mapping[str, int]) -> None:
    unknown = sorted(set(geometry) - set(MIG_PROFILES[gpu]))
    if unknown:
        raise MigConfigError(
            f"{path}: {key}.mig-devices: {gpu} has no MIG profile {', '.join(unknown)}; "
            f"its profiles: {', '.join(MIG_PROFILES[gpu])}"
        )
    if not fits(gpu, geometry):
        layout = ", ".join(f"{count}x{profile}" for profile, count in geometry.items())
        raise MigConfigError(
            f"{path}: {key}.mig-devices: {layout} cannot be placed on one {gpu} "
            f"({COMPUTE_SLICES} compute / {MEMORY_SLICES} memory slices)"
        )
