"""The dataset path as the cluster would run it: Fluid's controllers and CSI plugin, the three cache tiers, and where
a training pod finds the data (issue 19 findings 1-3, 8, 13, 14b, 14c, 21)."""

from __future__ import annotations

from typing import Any

import pytest
from owned_stacks import Stack, recording, stack_settings, stacks_where
from trainyard.cloud.userdata import CACHE_MOUNT
from trainyard.config.instance_types import INSTANCE_TYPES
from trainyard.config.quantity import quantity_bytes
from trainyard.plan.recording import Recording
from trainyard.plan.writers import HELM_RELEASE, is_kubernetes_object, manifest_of, release_of
from trainyard.platform.alluxio import (
    IMAGE,
    NVME_CACHE_FRACTION,
    claim_subpath,
    reference_mount_point,
    unified_namespace_path,
)
from trainyard.workloads.launch import DATASET_DIR

CACHE_STACKS = stacks_where(lambda s: s.is_aws and s.addons.alluxio.enabled)
JOB = "kubernetes:batch.volcano.sh/v1alpha1:Job"


def _recording(stack: Stack) -> Recording:
    return recording(stack)


def _objects(stack: Stack, kind: str) -> list[dict[str, Any]]:
    return [manifest_of(r) for r in _recording(stack).resources
            if is_kubernetes_object(r) and r.type.rsplit(":", 1)[1] == kind]


def _fluid_values(stack: Stack) -> dict[str, Any]:
    (values,) = [release_of(r)["values"] for r in _recording(stack).resources
                 if r.type == HELM_RELEASE and release_of(r)["chart"] == "fluid"]
    return values


def _source_and_tenants(stack: Stack) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    datasets = _objects(stack, "Dataset")
    (source,) = [d for d in datasets if d["metadata"]["namespace"] == "trainyard-data"]
    return source, [d for d in datasets if d is not source]


def _system_taints(stack: Stack) -> list[dict[str, str]]:
    settings = stack_settings(stack)
    return [{"key": t.key, "effect": t.effect, **({"operator": "Equal", "value": t.value} if t.value else
                                                 {"operator": "Exists"})}
            for pool in settings.pools("system") for t in pool.taints]


# ------------------------------------------------------------------------------------ Fluid's mount-path rule


def test_a_named_mount_sits_under_its_name_unless_its_path_is_absolute() -> None:
    # fluid v1.0.8 pkg/utils/ufs_path_builder.go GenUFSPathInUnifiedNamespace
    assert unified_namespace_path({"name": "s3", "mountPoint": "s3://b/p"}) == "/s3"
    assert unified_namespace_path({"name": "s3", "mountPoint": "s3://b/p", "path": "/"}) == "/"
    assert unified_namespace_path({"name": "s3", "path": "/corpora"}) == "/corpora"
    assert unified_namespace_path({"name": "s3", "path": "relative"}) == "/s3"


def test_the_claim_shows_a_mount_below_the_references_subpath() -> None:
    at_root, named = {"name": "s3", "path": "/"}, {"name": "s3"}
    assert claim_subpath(at_root, reference_mount_point()) == ""
    # The review's finding 3: without `path`, the data shows at <claim>/s3/...
    assert claim_subpath(named, reference_mount_point()) == "s3"
    assert claim_subpath(named, reference_mount_point("s3")) == ""
    with pytest.raises(ValueError, match="does not hold mount"):
        claim_subpath(at_root, reference_mount_point("elsewhere"))
    with pytest.raises(ValueError, match="reference"):
        claim_subpath(at_root, "s3://bucket/prefix")


@pytest.mark.parametrize("stack", CACHE_STACKS)
def test_every_job_reads_its_dataset_where_fluid_mounts_it(stack: Stack) -> None:
    """data.path of each rendered job = the claim's mount + Fluid's subpath + the dataset, computed from the
    rendered Datasets (not from the code that rendered the job)."""
    source, tenants = _source_and_tenants(stack)
    (mount,) = source["spec"]["mounts"]
    shown = {t["metadata"]["namespace"]: claim_subpath(mount, t["spec"]["mounts"][0]["mountPoint"]) for t in tenants}
    jobs = [manifest_of(r) for r in _recording(stack).resources if r.type == JOB]
    checked = 0
    for job in jobs:
        (task,) = job["spec"]["tasks"]
        pod = task["template"]["spec"]
        (container,) = pod["containers"]
        reads = [a.removeprefix("data.path=") for a in container.get("args", []) if a.startswith("data.path=")]
        if not reads:
            continue
        claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"]
                  if "persistentVolumeClaim" in v}
        (mounted,) = [m for m in container["volumeMounts"] if claims.get(m["name"]) == "training-data"]
        namespace = job["metadata"]["namespace"]
        dataset = reads[0].rstrip("/").rsplit("/", 1)[1]
        expected = "/".join(p for p in (mounted["mountPath"].rstrip("/"), shown[namespace], dataset) if p)
        assert reads == [expected], f"{job['metadata']['name']}: reads {reads[0]}, Fluid mounts it at {expected}"
        assert mounted["mountPath"] == DATASET_DIR
        checked += 1
    assert checked == sum(1 for j in jobs if any(a.startswith("data.path=") for t in j["spec"]["tasks"]
                                                 for c in t["template"]["spec"]["containers"] for a in c["args"]))


@pytest.mark.parametrize("stack", CACHE_STACKS)
def test_dataset_mounts_propagate_a_recovered_fuse_mount(stack: Stack) -> None:
    """FuseRecovery remounts into running pods only through HostToContainer propagation (fluid docs
    samples/fuse_recover.md @ v1.0.8); the CSI plugin runs with the gate on."""
    assert "FuseRecovery=true" in _fluid_values(stack)["csi"]["featureGates"].split(",")
    for job in (manifest_of(r) for r in _recording(stack).resources if r.type == JOB):
        for task in job["spec"]["tasks"]:
            pod = task["template"]["spec"]
            claims = {v["name"] for v in pod["volumes"]
                      if v.get("persistentVolumeClaim", {}).get("claimName") == "training-data"}
            for container in pod["containers"]:
                for mount in container["volumeMounts"]:
                    if mount["name"] in claims:
                        assert mount.get("mountPropagation") == "HostToContainer", job["metadata"]["name"]


# ------------------------------------------------------------------------------------ Fluid on the nodes


@pytest.mark.parametrize("stack", CACHE_STACKS)
def test_the_csi_plugin_needs_no_kubelet_kubeconfig(stack: Stack) -> None:
    """useNodeAuthorization mounts /etc/kubernetes/kubelet.conf as a File hostPath (fluid 1.0.8
    templates/csi/daemonset.yaml); AL2023 nodeadm writes none, so the plugin would never start."""
    assert _fluid_values(stack)["csi"]["useNodeAuthorization"] is False


@pytest.mark.parametrize("stack", CACHE_STACKS)
def test_fluid_control_plane_tolerates_only_the_system_pools(stack: Stack) -> None:
    values = _fluid_values(stack)
    expected = _system_taints(stack)
    for key in ("dataset", "fluidapp", "webhook", "crdUpgrade"):
        assert values[key]["tolerations"] == expected, key
    for runtime in ("alluxio", "thin", "jindo", "goosefs", "juicefs", "efc", "vineyard"):
        assert values["runtime"][runtime]["tolerations"] == expected, runtime
    # Only the CSI node plugin goes everywhere (it mounts datasets into pods on GPU nodes).
    assert values["csi"]["tolerations"] == [{"operator": "Exists"}]


@pytest.mark.parametrize("stack", CACHE_STACKS)
def test_reference_datasets_have_their_controller_running(stack: Stack) -> None:
    """A `dataset://` Dataset is served by the ThinRuntime controller, which renders with 0 replicas unless
    runtime.thin.enabled (fluid 1.0.8 templates/controller/thinruntime_controller.yaml)."""
    _, tenants = _source_and_tenants(stack)
    assert tenants and all(t["spec"]["mounts"][0]["mountPoint"].startswith("dataset://") for t in tenants)
    assert _fluid_values(stack)["runtime"]["thin"]["enabled"] is True


@pytest.mark.parametrize("stack", CACHE_STACKS)
def test_no_pod_depends_on_the_serverful_webhook(stack: Stack) -> None:
    """The webhook only mutates labelled pods and fails their creation when it is down (failurePolicy Fail): it
    is off, and no job carries its label."""
    assert _fluid_values(stack)["webhook"]["enabled"] is False
    for job in (manifest_of(r) for r in _recording(stack).resources if r.type == JOB):
        for task in job["spec"]["tasks"]:
            assert "fuse.serverful.fluid.io/inject" not in task["template"]["metadata"].get("labels", {})


@pytest.mark.parametrize("stack", CACHE_STACKS)
def test_master_on_system_nodes_workers_on_storage_nothing_tolerates_gpus(stack: Stack) -> None:
    (runtime,) = _objects(stack, "AlluxioRuntime")
    source, _ = _source_and_tenants(stack)
    spec = runtime["spec"]
    assert spec["master"]["nodeSelector"] == {"trainyard.io/role": "system"}
    assert spec["worker"]["nodeSelector"] == {"trainyard.io/role": "storage"}
    # Master and workers take the Dataset's tolerations (transform_resources.go transformTolerations).
    assert all(t.get("key") not in (None, "nvidia.com/gpu", "trainyard.io/gpu-health")
               for t in source["spec"]["tolerations"])
    for part in ("master", "worker", "fuse"):
        assert spec[part]["resources"]["requests"], part


# Fluid's worker JVM when the runtime sets none (pkg/ddc/alluxio/transform_optimization.go optimizeDefaultForWorker
# @ v1.0.8).
FLUID_WORKER_JVM = ["-Xmx12G", "-XX:+UnlockExperimentalVMOptions", "-XX:MaxDirectMemorySize=32g"]
_JVM_UNITS = {"k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def _jvm_bytes(options: list[str], flag: str) -> int:
    (value,) = [o.removeprefix(flag) for o in options if o.startswith(flag)]
    return int(value[:-1]) * _JVM_UNITS[value[-1].lower()] if value[-1].isalpha() else int(value)


@pytest.mark.parametrize("stack", CACHE_STACKS)
def test_a_worker_requests_its_tier_heap_and_direct_memory(stack: str) -> None:
    """The MEM tier's tmpfs pages are charged to the worker's cgroup next to its JVM: a request of the tier alone
    (the old 64Gi on prod) left the heap and direct buffers unreserved beside the OSDs (review finding 7)."""
    (runtime,) = _objects(stack, "AlluxioRuntime")
    worker = runtime["spec"]["worker"]
    jvm = worker.get("jvmOptions") or FLUID_WORKER_JVM
    tiers = sum(quantity_bytes(level["quota"]) for level in runtime["spec"]["tieredstore"]["levels"]
                if level["mediumtype"] == "MEM")
    holds = tiers + _jvm_bytes(jvm, "-Xmx") + _jvm_bytes(jvm, "-XX:MaxDirectMemorySize=")
    assert quantity_bytes(worker["resources"]["requests"]["memory"]) >= holds


@pytest.mark.parametrize("stack", CACHE_STACKS)
def test_the_root_mount_is_read_only_in_alluxio(stack: str) -> None:
    """A single mount at "/" becomes Alluxio's root UFS, where Fluid 1.0.8 applies no `readOnly` (transform.go sets
    only alluxio.master.mount.table.root.ufs): the runtime says it (review finding 6)."""
    (runtime,) = _objects(stack, "AlluxioRuntime")
    source, _ = _source_and_tenants(stack)
    (mount,) = source["spec"]["mounts"]
    assert unified_namespace_path(mount) == "/" and mount["readOnly"] is True
    assert runtime["spec"]["properties"]["alluxio.master.mount.table.root.readonly"] == "true"


@pytest.mark.parametrize("stack", CACHE_STACKS)
def test_runtime_runs_a_release_image(stack: Stack) -> None:
    (runtime,) = _objects(stack, "AlluxioRuntime")
    spec = runtime["spec"]
    repository, _, tag = IMAGE.rpartition(":")
    assert spec["alluxioVersion"] == {"image": repository, "imageTag": tag}
    assert (spec["fuse"]["image"], spec["fuse"]["imageTag"]) == (repository, tag)
    assert not repository.endswith("-dev")


# ------------------------------------------------------------------------------------ the NVMe warm tier


@pytest.mark.parametrize("stack", CACHE_STACKS)
def test_fuse_caches_on_the_gpu_nodes_nvme(stack: Stack) -> None:
    (runtime,) = _objects(stack, "AlluxioRuntime")
    spec = runtime["spec"]
    fuse = spec["fuse"]
    (volume,) = [v for v in spec["volumes"] if v["name"] == fuse["volumeMounts"][0]["name"]]
    assert volume["hostPath"] == {"path": CACHE_MOUNT, "type": "Directory"}
    assert fuse["volumeMounts"][0]["mountPath"] == CACHE_MOUNT
    assert fuse["nodeSelector"] == {"trainyard.io/role": "gpu"}
    options = dict(o.removeprefix("-D").split("=", 1) for o in fuse["jvmOptions"] if o.startswith("-D"))
    assert options["alluxio.user.client.cache.enabled"] == "true"
    assert options["alluxio.user.client.cache.dirs"].startswith(CACHE_MOUNT + "/")
    # Below every GPU node's instance store (Alluxio's MB is 2^20 bytes).
    size = int(options["alluxio.user.client.cache.size"].removesuffix("MB")) * 2**20
    settings = stack_settings(stack)
    smallest = min(INSTANCE_TYPES[t].nvme_devices * INSTANCE_TYPES[t].nvme_device_gb * 10**9
                   for pool in settings.pools("gpu") for t in pool.instance_types)
    assert 0 < size <= smallest * NVME_CACHE_FRACTION
    # Replacing Fluid's JVM defaults restates the heap.
    assert any(o.startswith("-Xmx") for o in fuse["jvmOptions"])
