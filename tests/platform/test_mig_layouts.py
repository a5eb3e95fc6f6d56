"""MIG layouts: the catalogue loads, covers every GPU, and agrees with NVIDIA's own mig-parted table."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from trainyard.config.mig import (
    COMPUTE_SLICES,
    GPU_DEVICE_IDS,
    GPU_MODELS,
    MEMORY_SLICES,
    MIG_PROFILES,
    MigConfigError,
    fits,
    load_mig_catalog,
)
from trainyard.plan.conformance import upstream_dir

REPO = Path(__file__).resolve().parents[2]
NVIDIA_TABLE = upstream_dir(REPO) / "mig-parted" / "config-default.yaml"
LAYOUTS = ("all-disabled", "all-1g", "all-2g", "all-3g", "all-7g", "balanced", "training-mixed")
SINGLE_PROFILE_LAYOUTS = ("all-1g", "all-2g", "all-3g", "all-7g")
GPU_MEMORY_GB = {"A100-40GB": 40, "A100-80GB": 80, "H100-80GB": 80, "H200-141GB": 141}


@pytest.fixture(scope="module")
def nvidia_table() -> dict[str, Any]:
    table: dict[str, Any] = yaml.safe_load(NVIDIA_TABLE.read_text())["mig-configs"]
    return table


def _ids(entry: Mapping[str, Any]) -> list[str] | None:
    device_filter = entry.get("device-filter")
    if device_filter is None:
        return None
    return [device_filter] if isinstance(device_filter, str) else list(device_filter)


def nvidia_geometries(table: Mapping[str, Any], gpu: str) -> Iterator[tuple[str, dict[str, int]]]:
    """NVIDIA's MIG geometries for one GPU: entries filtered to its device ID, plus unfiltered entries made
    only of that GPU's profiles (NVIDIA groups those by comment, which a parser cannot read)."""
    device_id = GPU_DEVICE_IDS[gpu]
    for name, entries in table.items():
        for entry in entries:
            devices = dict(entry.get("mig-devices") or {})
            if not entry.get("mig-enabled") or not devices:
                continue
            ids = _ids(entry)
            if (ids is not None and device_id in ids) or (
                ids is None and set(devices) <= set(MIG_PROFILES[gpu])
            ):
                yield name, devices


def nvidia_profiles_for_device(table: Mapping[str, Any], device_id: str) -> tuple[set[str], set[str]]:
    """Profiles NVIDIA lists in entries filtered to this device, and profiles in unfiltered entries."""
    filtered: set[str] = set()
    unfiltered: set[str] = set()
    for entries in table.values():
        for entry in entries:
            ids = _ids(entry)
            profiles = set(entry.get("mig-devices") or {})
            if ids is None:
                unfiltered |= profiles
            elif device_id in ids:
                filtered |= profiles
    return filtered, unfiltered


def test_catalog_has_every_layout_for_every_gpu() -> None:
    catalog = load_mig_catalog()
    assert tuple(catalog.layouts) == LAYOUTS
    for layout in LAYOUTS:
        for gpu in GPU_MODELS:
            assert catalog.supports(layout, gpu), (layout, gpu)
    assert not catalog.supports("balanced", "L4-24GB")
    assert not catalog.supports("no-such-layout", "H100-80GB")


def test_device_ids_select_the_gpus_nvidia_lists_under_them(nvidia_table: dict[str, Any]) -> None:
    # NVIDIA's all-balanced entries are per device ID and name each GPU's memory size, so matching them
    # proves our device-filter IDs point at the GPUs we think they do.
    catalog = load_mig_catalog()
    for gpu in GPU_MODELS:
        nvidia_balanced = [
            dict(entry["mig-devices"])
            for entry in nvidia_table["all-balanced"]
            if GPU_DEVICE_IDS[gpu] in (_ids(entry) or [])
        ]
        assert nvidia_balanced == [dict(catalog.slices("balanced", gpu))], gpu


def test_every_profile_exists_in_nvidia_table_for_its_gpu(nvidia_table: dict[str, Any]) -> None:
    catalog = load_mig_catalog()
    for gpu in GPU_MODELS:
        filtered, unfiltered = nvidia_profiles_for_device(nvidia_table, GPU_DEVICE_IDS[gpu])
        for layout in LAYOUTS:
            for profile in catalog.slices(layout, gpu):
                assert profile in filtered | unfiltered, (layout, gpu, profile)
                assert profile in MIG_PROFILES[gpu], (layout, gpu, profile)


def test_profile_table_covers_nvidia_device_entries(nvidia_table: dict[str, Any]) -> None:
    for gpu in GPU_MODELS:
        filtered, _ = nvidia_profiles_for_device(nvidia_table, GPU_DEVICE_IDS[gpu])
        assert filtered, gpu
        assert filtered <= set(MIG_PROFILES[gpu]), (gpu, filtered - set(MIG_PROFILES[gpu]))


@pytest.mark.parametrize("gpu", GPU_MODELS)
def test_profile_names_match_gpu_memory_and_slices(gpu: str) -> None:
    per_memory_slice = GPU_MEMORY_GB[gpu] / MEMORY_SLICES
    for profile, shape in MIG_PROFILES[gpu].items():
        match = re.fullmatch(r"(\d)g\.(\d+)gb", profile)
        assert match, profile
        assert int(match.group(1)) == shape.compute, profile
        # NVIDIA rounds the memory in the name (3g.71gb is 4 x 17.6 GB on H200).
        assert abs(int(match.group(2)) - shape.memory * per_memory_slice) <= 1, profile


@pytest.mark.parametrize("gpu", GPU_MODELS)
def test_placement_rule_accepts_every_nvidia_geometry(nvidia_table: dict[str, Any], gpu: str) -> None:
    geometries = list(nvidia_geometries(nvidia_table, gpu))
    # Five single-profile layouts at least, the double-memory 1g layout and all-balanced.
    assert len(geometries) >= 7, geometries
    for name, geometry in geometries:
        assert fits(gpu, geometry), (name, geometry)


@pytest.mark.parametrize("gpu", GPU_MODELS)
def test_placement_rule_rejects_one_more_than_nvidia_maximum(nvidia_table: dict[str, Any], gpu: str) -> None:
    singles = [
        (name, geometry) for name, geometry in nvidia_geometries(nvidia_table, gpu) if len(geometry) == 1
    ]
    assert {profile for _, geometry in singles for profile in geometry} == set(MIG_PROFILES[gpu])
    for name, geometry in singles:
        ((profile, count),) = geometry.items()
        assert not fits(gpu, {profile: count + 1}), name


@pytest.mark.parametrize(
    ("geometry", "valid"),
    [
        ({"3g.20gb": 2, "1g.5gb": 1}, False),  # 7 compute slices, but the two 3g take all 8 memory slices
        ({"4g.20gb": 1, "3g.20gb": 1}, True),
        ({"2g.10gb": 2, "3g.20gb": 1}, True),  # the 3g must sit at slice 4 for this to fit
        ({"2g.10gb": 3, "1g.10gb": 1}, True),
        ({"4g.20gb": 1, "2g.10gb": 2}, False),  # 8 compute slices
        ({"1g.10gb": 4, "1g.5gb": 1}, False),
        ({"7g.40gb": 1, "1g.5gb": 1}, False),
    ],
)
def test_placement_rule_on_known_a100_combinations(geometry: dict[str, int], valid: bool) -> None:
    assert fits("A100-40GB", geometry) is valid


def test_fits_rejects_profiles_of_another_gpu() -> None:
    with pytest.raises(ValueError, match="A100-40GB has no MIG profile 3g.40gb"):
        fits("A100-40GB", {"3g.40gb": 1})
    with pytest.raises(ValueError, match="unknown GPU model"):
        fits("B200-180GB", {"1g.23gb": 1})


def test_single_profile_layouts_are_nvidia_geometries(nvidia_table: dict[str, Any]) -> None:
    catalog = load_mig_catalog()
    for gpu in GPU_MODELS:
        nvidia = [geometry for _, geometry in nvidia_geometries(nvidia_table, gpu)]
        for layout in SINGLE_PROFILE_LAYOUTS:
            assert dict(catalog.slices(layout, gpu)) in nvidia, (layout, gpu)


def test_slices_numbers() -> None:
    catalog = load_mig_catalog()
    assert catalog.slices("all-1g", "A100-40GB") == {"1g.5gb": 7}
    assert catalog.slices("all-1g", "H200-141GB") == {"1g.18gb": 7}
    assert catalog.slices("all-2g", "A100-80GB") == {"2g.20gb": 3}
    assert catalog.slices("all-3g", "H200-141GB") == {"3g.71gb": 2}
    assert catalog.slices("all-7g", "H100-80GB") == {"7g.80gb": 1}
    assert catalog.slices("training-mixed", "H100-80GB") == {"4g.40gb": 1, "2g.20gb": 1, "1g.20gb": 1}
    assert catalog.slices("training-mixed", "A100-40GB") == {"4g.20gb": 1, "2g.10gb": 1, "1g.10gb": 1}
    assert catalog.slices("all-disabled", "H200-141GB") == {}


def test_training_mixed_uses_the_whole_gpu() -> None:
    catalog = load_mig_catalog()
    for gpu in GPU_MODELS:
        shapes = [
            MIG_PROFILES[gpu][profile]
            for profile, count in catalog.slices("training-mixed", gpu).items()
            for _ in range(count)
        ]
        assert sum(shape.compute for shape in shapes) == COMPUTE_SLICES, gpu
        assert sum(shape.memory for shape in shapes) == MEMORY_SLICES, gpu


def test_resource_names_under_mixed_strategy() -> None:
    catalog = load_mig_catalog()
    assert catalog.resource_names("balanced", "A100-80GB") == {
        "nvidia.com/mig-1g.10gb": 2,
        "nvidia.com/mig-2g.20gb": 1,
        "nvidia.com/mig-3g.40gb": 1,
    }
    assert catalog.resource_names("all-7g", "H200-141GB") == {"nvidia.com/mig-7g.141gb": 1}
    assert catalog.resource_names("all-disabled", "A100-40GB") == {"nvidia.com/gpu": 1}


def test_unknown_layout_error_names_file_and_choices() -> None:
    catalog = load_mig_catalog()
    with pytest.raises(MigConfigError, match=r"mig-layouts\.yaml: no MIG layout 'half' for GPU 'H100-80GB'"):
        catalog.slices("half", "H100-80GB")


def test_loader_is_cached() -> None:
    assert load_mig_catalog() is load_mig_catalog()


_ENTRY = (
    "    - device-filter: {id}\n      devices: all\n      mig-enabled: true\n      mig-devices: {devices}\n"
)


def _layout(devices: str, device_id: str = '"0x233010DE"') -> str:
    return "version: v1\nmig-configs:\n  bad:\n" + _ENTRY.format(id=device_id, devices=devices)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("version: v2\nmig-configs: {}\n", "version: expected 'v1'"),
        ("version: v1\nmig-configs: [\n", "not valid YAML"),
        ("version: v1\nmig-configs: {}\n", "mig-configs: expected a non-empty mapping"),
        (_layout('{"1g.5gb": 7}'), "mig-configs.bad[0].mig-devices: H100-80GB has no MIG profile 1g.5gb"),
        (
            _layout('{"3g.40gb": 3}'),
            "mig-configs.bad[0].mig-devices: 3x3g.40gb cannot be placed on one H100-80GB",
        ),
        (_layout('{"1g.10gb": 0}'), "mig-configs.bad[0].mig-devices.1g.10gb: expected a positive count"),
        (_layout("{}"), "mig-configs.bad[0].mig-devices: MIG is enabled but no instances"),
        (
            _layout('{"1g.6gb": 4}', '"0x20B710DE"'),
            "mig-configs.bad[0].device-filter: unsupported device 0x20B710DE",
        ),
        (
            _layout('{"7g.80gb": 1}', '["0x233010DE", "0x233010DE"]'),
            "mig-configs.bad[0]: a second entry for H100-80GB",
        ),
        (
            _layout('{"7g.80gb": 1}').replace("devices: all", "devices: [0, 1]"),
            "mig-configs.bad[0].devices: must be",
        ),
        (
            _layout('{"7g.80gb": 1}').replace("mig-enabled: true", "mig-enabled: yes please"),
            "mig-configs.bad[0].mig-enabled: expected true or false",
        ),
        (
            _layout('{"7g.80gb": 1}').replace("  bad:", "  Bad Name:"),
            "mig-configs.Bad Name: layout name must be",
        ),
    ],
)
def test_loader_errors_name_file_and_key(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "layouts.yaml"
    path.write_text(text)
    with pytest.raises(MigConfigError) as error:
        load_mig_catalog(path)
    message = str(error.value)
    assert message.startswith(f"{path.resolve()}: "), message
    assert expected in message, message


def test_missing_file_error_names_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(MigConfigError, match=re.escape(f"{missing}: cannot read MIG layouts")):
        load_mig_catalog(missing)
