"""GPU sharing is explicit: MIG and time-sliced pools are labelled and tainted, replicas never look like whole GPUs.

Renders the tests' fleet stack with one pool turned time-sliced (pools are found by what they are, not by name) and
checks what reaches Karpenter, the device plugin and dcgm-exporter.
"""

from __future__ import annotations

import copy
import json
from functools import cache
from typing import Any

import pytest
import yaml
from owned_stacks import FLEET, Stack, planned, stack_file, stack_settings, stacks_where
from trainyard.catalogue.charts import load_catalogue
from trainyard.config import ConfigError
from trainyard.config.load import decode_value, parse_settings
from trainyard.config.model import TimeSlicing
from trainyard.paths import REPO_ROOT
from trainyard.plan.recording import Recording
from trainyard.plan.runtime import PROJECT, StackFile, render
from trainyard.platform.gpu_operator import SHARED_GPU_EXPORTER, device_plugin_configs

SHARING = "trainyard.io/gpu-sharing"
NODE_POOL = "kubernetes:karpenter.sh/v1:NodePool"
OVERLAY = "kubernetes:karpenter.sh/v1alpha1:NodeOverlay"
RELEASE = "kubernetes:helm.sh/v3:Release"


def _raw() -> dict[str, Any]:
    return {k.split(":", 1)[1]: decode_value(v) for k, v in stack_file(FLEET).values.items()}


def _sliced_fleet() -> tuple[dict[str, Any], str]:
    """The fleet with its first whole-GPU, non-EFA-job pool time-sliced (jobs on it moved off) and time slicing on."""
    raw = _raw()
    used = {w.get("nodePool") for w in raw["workloads"] if w["kind"] != "mig"}
    pool = next(p for p in raw["nodePools"] if p["role"] == "gpu" and not p.get("migLayout")
                and not p.get("capacityReservations") and p["name"] in used)
    pool["gpuSharing"] = "time-sliced"
    raw["workloads"] = [w for w in raw["workloads"] if w.get("nodePool") != pool["name"]]
    raw.setdefault("addons", {}).setdefault("gpuOperator", {})["timeSlicing"] = {"enabled": True, "replicas": 4}
    return raw, pool["name"]


def _render(raw: dict[str, Any]) -> Recording:
    base = stack_file(FLEET)
    values = {**base.values, **{f"{PROJECT}:{k}": v if isinstance(v, str) else json.dumps(v) for k, v in raw.items()}}
    return render(StackFile(stack=base.stack, values=values, secret_keys=base.secret_keys))


def _recording(stack: Stack = FLEET) -> Recording:
    return planned(stack).recording


@cache
def _sliced() -> tuple[Recording, str]:
    raw, name = _sliced_fleet()
    return _render(raw), name


def _node_pools(recording: Recording) -> dict[str, dict[str, Any]]:
    return {r.inputs["metadata"]["name"]: r.inputs["spec"] for r in recording.resources if r.type == NODE_POOL}


@pytest.mark.parametrize("stack", stacks_where(lambda s: s.is_aws and bool(s.pools("gpu"))))
def test_mig_pools_are_marked_shared_and_whole_gpu_pools_are_not(stack: Stack) -> None:
    settings = stack_settings(stack)
    recording = _recording(stack)
    for name, spec in _node_pools(recording).items():
        template = spec["template"]
        taints = {t["key"]: t["value"] for t in template["spec"]["taints"]}
        mig = settings.pool(name).mig_layout is not None
        assert template["metadata"]["labels"].get(SHARING) == ("mig" if mig else None), name
        assert taints.get(SHARING) == ("mig" if mig else None), name


def test_a_time_sliced_pool_is_marked_selects_the_config_and_offers_shared_replicas() -> None:
    recording, name = _sliced()
    template = _node_pools(recording)[name]["template"]
    assert template["metadata"]["labels"][SHARING] == "time-sliced"
    assert template["metadata"]["labels"]["nvidia.com/device-plugin.config"] == "time-sliced"
    assert {"key": SHARING, "value": "time-sliced", "effect": "NoSchedule"} in template["spec"]["taints"]
    # Karpenter learns the replicas from a NodeOverlay (it knows only physical GPUs per instance type).
    overlays = [r.inputs["spec"] for r in recording.resources if r.type == OVERLAY
                and name in r.inputs["spec"]["requirements"][0]["values"]]
    assert overlays and all(o["capacity"] == {"nvidia.com/gpu.shared": "32"} for o in overlays)  # 8 GPUs x 4
    operator = next(r.inputs for r in recording.resources if r.type == RELEASE and r.inputs["chart"] == "gpu-operator")
    exporter = operator["values"]["dcgmExporter"]
    assert {k: exporter[k] for k in SHARED_GPU_EXPORTER} == SHARED_GPU_EXPORTER
    # Without time-sliced pools the exporter keeps its defaults.
    plain = next(r.inputs for r in _recording().resources
                 if r.type == RELEASE and r.inputs["chart"] == "gpu-operator")
    assert "env" not in plain["values"]["dcgmExporter"]


def test_time_sliced_replicas_are_renamed_one_per_pod() -> None:
    base = load_catalogue(REPO_ROOT).values("gpu-operator")
    sliced = yaml.safe_load(device_plugin_configs(base, TimeSlicing(enabled=True, replicas=4))["time-sliced"])
    sharing = sliced["sharing"]["timeSlicing"]
    assert sharing["renameByDefault"] is True and sharing["failRequestsGreaterThanOne"] is True


@pytest.mark.parametrize(("case", "path", "fragment"), [
    ("no-config", "gpuSharing", "timeSlicing.enabled"),
    ("unused-config", "addons.gpuOperator.timeSlicing.enabled", "no pool"),
    ("whole-gpu-job", "nodePool", "time-slices its GPUs"),
    ("mig-and-sliced", "gpuSharing", "not both"),
])
def test_sharing_config_problems(case: str, path: str, fragment: str) -> None:
    raw, name = _sliced_fleet()
    index = next(i for i, p in enumerate(raw["nodePools"]) if p["name"] == name)
    if case == "no-config":
        raw["addons"]["gpuOperator"]["timeSlicing"]["enabled"] = False
    if case == "unused-config":
        del raw["nodePools"][index]["gpuSharing"]
    if case == "whole-gpu-job":
        job = copy.deepcopy(next(w for w in _raw()["workloads"] if w["kind"] == "smoke"))
        job["nodePool"] = name
        raw["workloads"].append(job)
        index = len(raw["workloads"]) - 1
    if case == "mig-and-sliced":
        raw["nodePools"][index]["migLayout"] = "all-1g"
    with pytest.raises(ConfigError) as caught:
        parse_settings(PROJECT, "fleet", raw)
    where = {"whole-gpu-job": f"workloads[{index}]", "unused-config": ""}.get(case, f"nodePools[{index}]")
    key = f"{where}.{path}" if where else path
    messages = {p.path: p.message for p in caught.value.problems}
    assert fragment in messages.get(key, ""), messages
