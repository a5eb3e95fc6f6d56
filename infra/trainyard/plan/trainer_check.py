"""Whether a rendered training job's trainer can start at every world size its elastic range allows, and fit its GPUs.

The check is the trainer's own (workloads/trainyard_train: `validate.check_node_range`, `planner.check_fits`; pure
Python, no torch), run on what the job really passes it: the trainer config from the job's ConfigMap and the
overrides in the container's args, `--nnodes=MIN:MAX` and `--nproc-per-node` from the same line, and the device
memory of the smallest GPU (as CUDA reports it, `planner.gpu_memory_bytes`; or MIG slice) the job's pods can be
given. Memory is checked at MIN nodes, where each
rank holds the most (data-parallel sharding divides by the world).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from trainyard_train.config import ConfigError, parse_config
from trainyard_train.planner import check_fits, gpu_memory_bytes
from trainyard_train.safe_yaml import InvalidYamlError, load
from trainyard_train.validate import check_node_range

from trainyard.config.instance_types import INSTANCE_TYPES
from trainyard.plan.recording import ResourceRecord

CONFIG_MAP = "kubernetes:core/v1:ConfigMap"
TRAINER_MODULE = "trainyard_train"
# NVIDIA names a MIG profile by its compute slices and its memory: <n>g.<m>gb (NVIDIA MIG user guide, "Supported
# MIG Profiles").
_MIG_MEMORY = re.compile(r"nvidia\.com/mig-\d+g\.(\d+)gb")


def _flag(args: list[str], name: str) -> str | None:
    return next((a.split("=", 1)[1] for a in args if a.startswith(f"{name}=")), None)


def _config_text(record: ResourceRecord, pod: Mapping[str, Any], path: str,
                 records: Mapping[str, ResourceRecord]) -> str | None:
    """The file `path` as the pod mounts it from a ConfigMap (the trainer config the job ships)."""
    (container,) = pod["containers"]
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    namespace = record.inputs.get("metadata", {}).get("namespace")
    for mount in container.get("volumeMounts", []):
        prefix = mount["mountPath"].rstrip("/") + "/"
        volume = volumes.get(mount["name"], {})
        if path.startswith(prefix) and "configMap" in volume:
            name = volume["configMap"]["name"]
            for other in records.values():
                meta = other.inputs.get("metadata", {})
                if other.type == CONFIG_MAP and meta.get("name") == name and meta.get("namespace") == namespace:
                    data: Mapping[str, str] = other.inputs.get("data", {})
                    return data.get(path[len(prefix):])
    return None


def device_memory(pod: Mapping[str, Any], pools: Mapping[str, Any]) -> int | None:
    """Bytes of the smallest device a pod of this job can get, or None for a CPU pod."""
    (container,) = pod["containers"]
    limits = container.get("resources", {}).get("limits", {})
    for resource in limits:
        if match := _MIG_MEMORY.fullmatch(resource):
            return int(match.group(1)) * 10**9
    if "nvidia.com/gpu" not in limits:
        return None
    pool = pools.get(pod.get("nodeSelector", {}).get("trainyard.io/pool"))
    # What CUDA reports, below the nominal size: the total the trainer's own memory check compares with.
    types = [INSTANCE_TYPES[o.instance_type] for o in getattr(pool, "offers", ()) if o.instance_type in INSTANCE_TYPES]
    sizes = [gpu_memory_bytes(it.gpu.value) for it in types if it.gpu is not None]
    return min(sizes) if sizes else None


def trainer_problem(record: ResourceRecord, records: Mapping[str, ResourceRecord],
                    pools: Mapping[str, Any]) -> str | None:
    tasks = record.inputs.get("spec", {}).get("tasks", [])
    if len(tasks) != 1:
        return None
    pod = tasks[0]["template"]["spec"]
    (container,) = pod["containers"]
    args = list(container.get("args", []))
    if ["-m", TRAINER_MODULE] not in [args[i:i + 2] for i in range(len(args) - 1)]:
        return None  # not the trainer (the fabric check runs its own module)
    trainer = args[args.index(TRAINER_MODULE) + 1:]
    if trainer[:1] != ["--config"] or len(trainer) < 2:
        return "the trainer is started without --config"
    text = _config_text(record, pod, trainer[1], records)
    if text is None:
        return f"--config {trainer[1]} is not a file of a ConfigMap the pod mounts"
    nnodes = _flag(args, "--nnodes") or "1"
    low, _, high = nnodes.partition(":")
    nproc = int(_flag(args, "--nproc-per-node") or "1")
    try:
        cfg = parse_config(load(text) or {}, trainer[2:])
        check_node_range(cfg, nproc_per_node=nproc, min_nodes=int(low), max_nodes=int(high or low))
        memory = device_memory(pod, pools)
        if memory is not None:
            check_fits(cfg, world_size=int(low) * nproc, local_world_size=nproc, device_memory_bytes=memory)
    except (ConfigError, InvalidYamlError) as exc:
        return f"the trainer refuses its config ({trainer[1]} with the job's overrides, --nnodes={nnodes}, " \
               f"--nproc-per-node={nproc}): {exc}"
    return None
