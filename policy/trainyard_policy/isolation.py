"""GPU isolation: different jobs never share a physical GPU unless a pool says so (README, "GPU isolation").

A GPU is shared by time-slicing or MPS replicas (one device, several device ids), by MIG slices, or by a container
that names GPUs in NVIDIA_VISIBLE_DEVICES without being allocated them. Each rule closes one of those paths.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from functools import cache
from typing import Any

import yaml
from trainyard.config.mig import MigCatalog, load_mig_catalog

from trainyard_policy.gpu import GPU_TAINT, MIG_CONFIG_LABEL, Pool, pools
from trainyard_policy.resources import Resource, Violation, containers, kind_of, metadata, pod_specs

SHARING_KEY = "trainyard.io/gpu-sharing"
DEVICE_PLUGIN_CONFIG_LABEL = "nvidia.com/device-plugin.config"
# The device plugin's default config name (platform/gpu-operator/values.yaml devicePlugin.config.default).
UNSHARED_CONFIGS = frozenset({"default"})
# nvidia-container-toolkit's switch (api/config/v1/config.go @v1.20.0): when true, the default, an unprivileged
# container sees every GPU its NVIDIA_VISIBLE_DEVICES names (internal/config/image/cuda_image.go VisibleDevices).
TOOLKIT_ENV_SWITCH = "accept-nvidia-visible-devices-envvar-when-unprivileged=false"
GPU_ENV = "NVIDIA_VISIBLE_DEVICES"
# k8s-device-plugin v0.20.0 api/config/v1: replicas are `sharing.timeSlicing` or `sharing.mps`; an absent
# failRequestsGreaterThanOne means false for time-slicing and true for MPS (config.go).
_SHARING_DEFAULT_FAIL_GT_ONE = {"timeSlicing": False, "mps": True}


@cache
def _catalog() -> MigCatalog:
    return load_mig_catalog()


def _device_plugin_configs(resource: Resource) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(name, config) for each k8s-device-plugin config a ConfigMap carries (`version: v1` documents)."""
    if kind_of(resource) != "ConfigMap":
        return
    for name, text in (resource.inputs.get("data") or {}).items():
        try:
            config = yaml.safe_load(text) if isinstance(text, str) else None
        except yaml.YAMLError:
            continue
        if isinstance(config, Mapping) and config.get("version") == "v1" and "flags" in config:
            yield name, config


def sharing_renamed(resources: Sequence[Resource]) -> list[Violation]:
    """Time-sliced and MPS replicas are advertised under their own name (`<resource>.shared`), never as the
    nvidia.com/gpu training pods request, and a pod may take only one of them."""
    found = []
    for r in resources:
        for name, config in _device_plugin_configs(r):
            for kind, default in _SHARING_DEFAULT_FAIL_GT_ONE.items():
                replicated = (config.get("sharing") or {}).get(kind)
                if not isinstance(replicated, Mapping):
                    continue
                where = f"device plugin config {name!r} sharing.{kind}"
                if replicated.get("renameByDefault") is not True:
                    found.append(Violation(r.urn, f"{where}: renameByDefault is not true, so its replicas are "
                                                  "advertised as nvidia.com/gpu"))
                if replicated.get("failRequestsGreaterThanOne", default) is not True:
                    found.append(Violation(r.urn, f"{where}: failRequestsGreaterThanOne is not true, so one pod "
                                                  "can take several replicas of one GPU"))
    return found


def _shares(pool: Pool) -> bool:
    layout = pool.labels.get(MIG_CONFIG_LABEL)
    partitioned = layout is not None and any(
        t.gpu is not None and _catalog().supports(str(layout), t.gpu) and _catalog().slices(str(layout), t.gpu)
        for t in pool.gpu_types)
    return partitioned or pool.labels.get(DEVICE_PLUGIN_CONFIG_LABEL, "default") not in UNSHARED_CONFIGS


def shared_pools_marked(resources: Sequence[Resource]) -> list[Violation]:
    """A pool whose GPUs serve several pods (a partitioning MIG layout, a sharing device-plugin config) says so
    with the trainyard.io/gpu-sharing label and taint, so only pods that accept sharing land there."""
    found = []
    for pool in pools(resources):
        if pool.gpu_types and _shares(pool):
            if SHARING_KEY not in pool.labels:
                found.append(Violation(pool.resource.urn, f"pool shares its GPUs but has no {SHARING_KEY} label"))
            if SHARING_KEY not in pool.taint_keys:
                found.append(Violation(pool.resource.urn, f"pool shares its GPUs but has no {SHARING_KEY} taint"))
    return found


def _tolerates_sharing(pod: Mapping[str, Any]) -> bool:
    for toleration in pod.get("tolerations") or []:
        key, operator = toleration.get("key") or "", toleration.get("operator", "Equal")
        if key == SHARING_KEY or (operator == "Exists" and key == ""):
            return True
    return False


def _whole_gpus(pod: Mapping[str, Any]) -> int:
    return sum(int((c.get("resources") or {}).get("limits", {}).get(GPU_TAINT, 0) or 0) for c in containers(pod))


def whole_gpus_unshared(resources: Sequence[Resource]) -> list[Violation]:
    """A Volcano Job that takes whole GPUs (nvidia.com/gpu) cannot land on a shared-GPU pool: it does not tolerate
    the sharing taint."""
    found = []
    for r in resources:
        if kind_of(r) != "Job" or not r.type.startswith("kubernetes:batch.volcano.sh/"):
            continue
        for pod in pod_specs(r.inputs.get("spec")):
            if _whole_gpus(pod) and _tolerates_sharing(pod):
                found.append(Violation(r.urn, f"job {metadata(r).get('name', r.name)}: takes whole GPUs and "
                                              f"tolerates {SHARING_KEY}, so it may land on GPUs other pods share"))
    return found


def _privileged(container: Mapping[str, Any]) -> bool:
    context = container.get("securityContext") or {}
    return bool(context.get("privileged")) or "SYS_ADMIN" in ((context.get("capabilities") or {}).get("add") or [])


def _user_data(resource: Resource) -> str | None:
    if kind_of(resource) == "EC2NodeClass":
        value = (resource.inputs.get("spec") or {}).get("userData")
        return value if isinstance(value, str) else None
    return None


def gpu_env_closed(resources: Sequence[Resource]) -> list[Violation]:
    """No unprivileged container names GPUs in NVIDIA_VISIBLE_DEVICES (the NVIDIA runtime would hand them over
    unrequested), and every GPU node class turns that path off in the container toolkit."""
    found = []
    for r in resources:
        for pod in pod_specs(r.inputs):
            for container in containers(pod):
                if _privileged(container):
                    continue
                if any(e.get("name") == GPU_ENV for e in container.get("env") or [] if isinstance(e, Mapping)):
                    found.append(Violation(r.urn, f"container {container.get('name')!r} sets {GPU_ENV} without "
                                                  "privileges: GPUs come from the device plugin only"))
    classes = {metadata(r).get("name"): r for r in resources if kind_of(r) == "EC2NodeClass"}
    for pool in pools(resources):
        if not pool.gpu_types or kind_of(pool.resource) != "NodePool":
            continue
        ref = (((pool.resource.inputs.get("spec") or {}).get("template") or {}).get("spec") or {}).get(
            "nodeClassRef") or {}
        node_class = classes.get(ref.get("name"))
        if node_class is None:
            continue
        data = _user_data(node_class)
        if data is not None and TOOLKIT_ENV_SWITCH not in data:
            found.append(Violation(node_class.urn, f"GPU node class leaves the toolkit's "
                                                   f"{TOOLKIT_ENV_SWITCH.split('=')[0]} on: unprivileged pods can "
                                                   f"select GPUs by {GPU_ENV}"))
    return found
