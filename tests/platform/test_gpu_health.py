"""GPU node admission and repair as the plans render them: the startup taint, the check DaemonSet and its RBAC,
the operands that must run before admission, the node monitoring agent and Karpenter's node repair."""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from owned_stacks import OWNED_STACKS, recording
from trainyard import names
from trainyard.cloud.context import PoolFacts
from trainyard.config import Settings
from trainyard.config.instance_types import INSTANCE_TYPES, GpuModel
from trainyard.config.mig import load_mig_catalog
from trainyard.plan.recording import Recording
from trainyard.plan.runtime import STACKS_DIR, StackFile, available_stacks, read_stack, render, settings_of
from trainyard.plan.writers import HELM_RELEASE, is_kubernetes_object, manifest_of, release_of
from trainyard.platform.gpu_health import DCGM_IMAGE, KUBECTL_IMAGE, expectations

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "platform" / "gpu-health" / "gpu-health-check.sh"
ADDON = "aws:eks/addon:Addon"


def _admits(settings: Settings) -> bool:
    return settings.is_aws and settings.addons.gpu_health.enabled and bool(settings.pools("gpu"))


# A stack is (name, folder): the tests' own fleet stack, whose pools the fixed expectations name, or a sample stack.
Stack = tuple[str, Path]
FLEET: Stack = ("fleet", OWNED_STACKS)
# The fleet and every sample stack that admits GPU nodes: the checks that hold for any such stack run on each.
ADMITTING = [pytest.param(stack, id=stack[0]) for stack in [
    FLEET, *((name, STACKS_DIR) for name in available_stacks() if _admits(settings_of(read_stack(name))))]]


def _with_addons(stack: Stack, **gpu_health: Any) -> StackFile:
    base = read_stack(*stack)
    addons = json.loads(base.values.get("trainyard:addons", "{}"))
    addons["gpuHealth"] = {**addons.get("gpuHealth", {}), **gpu_health}
    return StackFile(stack=base.stack, values={**base.values, "trainyard:addons": json.dumps(addons)},
                     secret_keys=base.secret_keys)


@cache
def _recording(stack: Stack, enabled: bool = True, repair: bool = True) -> Recording:
    if enabled and repair:
        return recording(stack)
    return render(_with_addons(stack, enabled=enabled, repair=repair))


def _objects(recording: Recording, kind: str) -> dict[str, dict[str, Any]]:
    return {manifest_of(r)["metadata"]["name"]: manifest_of(r) for r in recording.resources
            if is_kubernetes_object(r) and r.type.rsplit(":", 1)[1] == kind}


def _node_pools(recording: Recording) -> dict[str, dict[str, Any]]:
    return {r.inputs["metadata"]["name"]: r.inputs for r in recording.resources
            if r.type == "kubernetes:karpenter.sh/v1:NodePool"}


def _release(recording: Recording, chart: str) -> dict[str, Any]:
    (release,) = [release_of(r) for r in recording.resources
                  if r.type == HELM_RELEASE and release_of(r)["chart"].endswith(chart)]
    return release


def _daemonset(recording: Recording) -> dict[str, Any]:
    return _objects(recording, "DaemonSet")["gpu-health-check"]


@pytest.mark.parametrize("stack", ADMITTING)
def test_every_gpu_node_pool_starts_tainted_until_the_check_passes(stack: Stack) -> None:
    pools = _node_pools(_recording(stack))
    assert pools
    for name, pool in pools.items():
        startup = pool["spec"]["template"]["spec"]["startupTaints"]
        assert {"key": "trainyard.io/gpu-health", "value": "pending", "effect": "NoSchedule"} in startup, name


@pytest.mark.parametrize("stack", ADMITTING)
def test_the_check_runs_on_gpu_nodes_not_yet_admitted_and_tolerates_their_taints(stack: Stack) -> None:
    spec = _daemonset(_recording(stack))["spec"]["template"]["spec"]
    (term,) = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert {"key": "trainyard.io/role", "operator": "In", "values": ["gpu"]} in term["matchExpressions"]
    assert {"key": "trainyard.io/gpu-health", "operator": "NotIn", "values": ["passed"]} in term["matchExpressions"]
    tolerated = {(t["key"], t.get("effect")) for t in spec["tolerations"]}
    assert {("nvidia.com/gpu", "NoSchedule"), ("trainyard.io/gpu-health", "NoSchedule"),
            ("trainyard.io/gpu-health-failed", "NoSchedule")} <= tolerated
    # Cilium's startup taint is not tolerated: the check needs the pod network to reach the API server.
    assert "node.cilium.io/agent-not-ready" not in {key for key, _ in tolerated}
    steps = [c["command"][-1] for c in spec["initContainers"]] + [spec["containers"][0]["command"][-1]]
    assert steps == ["wait", "probe", "bash /opt/gpu-health/gpu-health-check.sh admit && exec sleep infinity"]
    images = [c["image"] for c in (*spec["initContainers"], *spec["containers"])]
    assert images == [KUBECTL_IMAGE, DCGM_IMAGE, KUBECTL_IMAGE]


@pytest.mark.parametrize("stack", ADMITTING)
def test_the_stack_sets_the_diagnostic_level_and_thresholds(stack: Stack) -> None:
    settings = settings_of(read_stack(*stack)).addons.gpu_health
    spec = _daemonset(_recording(stack))["spec"]["template"]["spec"]
    for container in (*spec["initContainers"], *spec["containers"]):
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["DIAG_LEVEL"] == str(settings.diag_level)
        assert env["MIN_MEMORY_PERCENT"] == str(settings.min_memory_percent)
        assert env["WAIT_SECONDS"] == str(settings.wait_minutes * 60)
    if stack == FLEET:  # the level it sets, the defaults it leaves
        assert (settings.diag_level, settings.min_memory_percent, settings.wait_minutes) == (2, 90, 30)


def test_only_the_probe_is_privileged() -> None:
    spec = _daemonset(_recording(FLEET))["spec"]["template"]["spec"]
    by_name = {c["name"]: c for c in (*spec["initContainers"], *spec["containers"])}
    assert by_name["probe"]["securityContext"] == {"privileged": True}
    for name in ("wait", "admit"):
        context = by_name[name]["securityContext"]
        assert context["runAsNonRoot"] and not context["allowPrivilegeEscalation"]
        assert context["capabilities"] == {"drop": ["ALL"]} and context["readOnlyRootFilesystem"]


def test_rbac_is_least_privilege() -> None:
    recording = _recording(FLEET)
    roles = _objects(recording, "ClusterRole")
    assert roles["gpu-health-check"]["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]},
        {"apiGroups": ["karpenter.sh"], "resources": ["nodeclaims"], "verbs": ["list"]}]
    # Only the reaper may delete NodeClaims (and so terminate instances).
    assert roles["gpu-health-reaper"]["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "patch"]},
        {"apiGroups": ["karpenter.sh"], "resources": ["nodeclaims"], "verbs": ["list", "delete"]}]
    bindings = _objects(recording, "ClusterRoleBinding")
    for name in ("gpu-health-check", "gpu-health-reaper"):
        assert bindings[name]["roleRef"]["name"] == name
        assert bindings[name]["subjects"] == [{"kind": "ServiceAccount", "name": name, "namespace": "gpu-health"}]
    role = _objects(recording, "Role")["gpu-health-check"]
    assert role["metadata"]["namespace"] == "gpu-health"
    assert role["rules"] == [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]


@pytest.mark.parametrize("stack", ADMITTING)
def test_the_reaper_bounds_failed_and_stuck_nodes_as_the_stack_says(stack: Stack) -> None:
    settings = settings_of(read_stack(*stack)).addons.gpu_health
    cron = _objects(_recording(stack), "CronJob")["gpu-health-reaper"]
    assert cron["metadata"]["namespace"] == "gpu-health" and cron["spec"]["concurrencyPolicy"] == "Forbid"
    pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "gpu-health-reaper"
    assert pod["nodeSelector"] == {"trainyard.io/role": "system"}
    (container,) = pod["containers"]
    assert container["command"] == ["bash", "/opt/gpu-health/gpu-health-check.sh", "reap"]
    assert container["image"] == KUBECTL_IMAGE
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["STUCK_SECONDS"] == str(settings.stuck_minutes * 60)
    assert env["FAILED_HOLD_SECONDS"] == str(settings.failed_hold_hours * 3600)
    assert env["MAX_FAILED_PER_POOL"] == str(settings.max_failed_nodes_per_pool)


def test_the_reaper_follows_its_settings() -> None:
    recording = render(_with_addons(FLEET, stuckMinutes=90, failedHoldHours=0, maxFailedNodesPerPool=0))
    (container,) = _objects(recording, "CronJob")["gpu-health-reaper"]["spec"]["jobTemplate"]["spec"]["template"][
        "spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert (env["STUCK_SECONDS"], env["FAILED_HOLD_SECONDS"], env["MAX_FAILED_PER_POOL"]) == ("5400", "0", "0")


@pytest.mark.parametrize("stack", ADMITTING)
def test_failed_nodes_of_reserved_only_pools_are_not_held(stack: Stack) -> None:
    """Their held node would keep a reserved instance and the pool's node limit (review-topology-bringup 2)."""
    (container,) = _objects(_recording(stack), "CronJob")["gpu-health-reaper"]["spec"]["jobTemplate"]["spec"][
        "template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    reserved = sorted(p.name for p in settings_of(read_stack(*stack)).pools("gpu")
                      if list(p.capacity_types) == ["reserved"])
    assert env["UNHELD_POOLS"].split() == reserved


def test_the_script_and_the_expectations_ship_verbatim() -> None:
    data = _objects(_recording(FLEET), "ConfigMap")["gpu-health-check"]["data"]
    assert data["gpu-health-check.sh"] == SCRIPT.read_text()
    rows = {tuple(line.split()[:2]): line.split()[2:] for line in data["expected.tsv"].splitlines()
            if not line.startswith("#")}
    # EFA: 32 EFA devices; the fleet runs the dataset cache, whose FUSE pods need the NVMe cache mount.
    assert rows[("h100", "p5.48xlarge")] == ["8", "81920", "32", "-", "-", "dcgm-diag", "/mnt/trainyard-cache"]
    assert rows[("h200", "p5en.48xlarge")] == ["8", "144384", "16", "-", "-", "dcgm-diag", "/mnt/trainyard-cache"]
    assert rows[("h100-mig", "p5.48xlarge")][3] != "-"  # MIG pool: the layout must be applied


def test_expectations_need_efa_only_on_efa_pools() -> None:
    pool = PoolFacts(name="p", role="gpu", node_labels={}, taints=(), zones=("a",), efa_interfaces=0,
                     gpu=GpuModel.A100_40GB, instance_types=("p4d.24xlarge",), mig_layout="balanced")
    assert expectations([pool]).splitlines()[1] == \
        "p p4d.24xlarge 8 40960 0 balanced 1g.5gb=16,2g.10gb=8,3g.20gb=8 dcgm-health -"


@pytest.mark.parametrize("stack", ADMITTING)
def test_mig_partitioned_pools_are_admitted_without_the_diagnostic(stack: Stack) -> None:
    # dcgmi diag refuses MIG-partitioned GPUs (NVIDIA/DCGM v4.6.0 nvvs/src/Gpu.cpp IsMigModeDiagCompatible,
    # NvidiaValidationSuite.cpp BuildCommonGpusList): a pool whose layout partitions its GPUs must be checked by
    # DCGM health and its MIG devices, or none of its nodes is ever admitted.
    settings = settings_of(read_stack(*stack))
    mig = load_mig_catalog()
    data = _objects(_recording(stack), "ConfigMap")["gpu-health-check"]["data"]
    rows = {tuple(line.split()[:2]): line.split()[2:] for line in data["expected.tsv"].splitlines()
            if not line.startswith("#")}
    for pool in settings.pools("gpu"):
        for itype in pool.instance_types:
            gpu = INSTANCE_TYPES[itype]
            slices = mig.slices(pool.mig_layout, gpu.gpu) if pool.mig_layout and gpu.gpu else {}
            *_, devices, check, _cache = rows[(pool.name, itype)]
            assert check == ("dcgm-health" if slices else "dcgm-diag"), (pool.name, itype)
            wanted = {p: n * gpu.gpu_count for p, n in slices.items()}
            assert devices == (",".join(f"{p}={n}" for p, n in sorted(wanted.items())) or "-"), (pool.name, itype)


@pytest.mark.parametrize("stack", ADMITTING)
def test_nodes_are_admitted_only_with_the_nvme_cache_the_dataset_cache_mounts(stack: Stack) -> None:
    """A node whose instance store prepare-node.sh refused has no cache mount; the dataset cache's FUSE pod mounts
    it as a hostPath of type Directory and would never start there, holding the training pod in ContainerCreating
    (review-incluster finding 2). So admission requires the mount on every type with instance store."""
    recording = _recording(stack)
    runtimes = [manifest_of(r) for r in recording.resources if r.type.endswith(":AlluxioRuntime")]
    fuse_paths = {v["hostPath"]["path"] for r in runtimes for v in r["spec"].get("volumes", ())
                  if v.get("hostPath", {}).get("type") == "Directory"}
    data = _objects(recording, "ConfigMap")["gpu-health-check"]["data"]
    rows = {tuple(line.split()[:2]): line.split()[-1] for line in data["expected.tsv"].splitlines()
            if not line.startswith("#")}
    for pool in settings_of(read_stack(*stack)).pools("gpu"):
        for itype in pool.instance_types:
            (path,) = fuse_paths if fuse_paths and INSTANCE_TYPES[itype].nvme_devices else ("-",)
            assert rows[(pool.name, itype)] == path, (pool.name, itype)
    # The probe sees the host's mounts under the cache's parent (HOST_ROOT + parent), submounts included.
    spec = _daemonset(recording)["spec"]["template"]["spec"]
    (probe,) = [c for c in spec["initContainers"] if c["name"] == "probe"]
    host_root = {e["name"]: e.get("value") for e in probe["env"]}["HOST_ROOT"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    for path in fuse_paths:
        assert any(path.startswith(volumes[m["name"]].get("hostPath", {}).get("path", "//") + "/")
                   and m["mountPath"] == host_root + volumes[m["name"]]["hostPath"]["path"]
                   for m in probe["volumeMounts"]), probe["volumeMounts"]


def test_the_script_uses_the_keys_the_component_and_karpenter_use() -> None:
    text = SCRIPT.read_text()
    assert f"STARTUP_TAINT={names.GPU_HEALTH_TAINT_KEY}\n" in text
    assert f"FAILED_TAINT={names.GPU_HEALTH_FAILED_TAINT_KEY}\n" in text
    assert f"RESULT_LABEL={names.GPU_HEALTH_LABEL}\n" in text


@pytest.mark.parametrize("stack", ADMITTING)
def test_operands_needed_before_admission_tolerate_the_startup_taint(stack: Stack) -> None:
    values = _release(_recording(stack), "gpu-operator")["values"]
    startup = {"key": "trainyard.io/gpu-health", "operator": "Exists", "effect": "NoSchedule"}
    assert startup in values["daemonsets"]["tolerations"]
    nfd = values["node-feature-discovery"]["worker"]["tolerations"]
    assert any(t.get("key") == "trainyard.io/gpu-health" for t in nfd)


@pytest.mark.parametrize("stack", ADMITTING)
def test_repair_is_the_monitoring_agent_plus_karpenter_node_repair(stack: Stack) -> None:
    recording = _recording(stack)
    addons = {r.inputs["addonName"]: r.inputs for r in recording.resources if r.type == ADDON}
    agent = addons["eks-node-monitoring-agent"]
    assert re.fullmatch(r"v\d+\.\d+\.\d+-eksbuild\.\d+", agent["addonVersion"])
    assert json.loads(agent["configurationValues"]) == {"dcgmAgent": {"tolerations": [{"operator": "Exists"}]}}
    assert _release(recording, "karpenter")["values"]["settings"]["featureGates"]["nodeRepair"] is True


def test_repair_off_drops_the_agent_and_the_feature_gate() -> None:
    recording = _recording(FLEET, repair=False)
    assert "eks-node-monitoring-agent" not in {r.inputs["addonName"] for r in recording.resources if r.type == ADDON}
    assert _release(recording, "karpenter")["values"]["settings"]["featureGates"]["nodeRepair"] is False
    assert "gpu-health-check" in _objects(recording, "DaemonSet")


def test_admission_off_leaves_no_taint_and_no_check() -> None:
    recording = _recording(FLEET, enabled=False)
    assert "gpu-health-check" not in _objects(recording, "DaemonSet")
    assert "gpu-health-reaper" not in _objects(recording, "CronJob")
    for pool in _node_pools(recording).values():
        keys = {t["key"] for t in pool["spec"]["template"]["spec"]["startupTaints"]}
        assert keys == {"node.cilium.io/agent-not-ready"}
    values = _release(recording, "gpu-operator")["values"]
    assert all(t["key"] != "trainyard.io/gpu-health" for t in values["daemonsets"]["tolerations"])


def test_local_has_neither() -> None:
    recording = _recording(("laptop", OWNED_STACKS))
    assert "gpu-health-check" not in _objects(recording, "DaemonSet")
    assert not [r for r in recording.resources if r.type == ADDON]
