"""What the platform layer renders per stack: release sets and the values and objects it computes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from trainyard.catalogue.charts import load_catalogue
from trainyard.config.instance_types import INSTANCE_TYPES
from trainyard.config.mig import load_mig_catalog
from trainyard.config.model import TimeSlicing
from trainyard.names import FABRIC_CHECK_NAMESPACE, FABRIC_CHECK_QUEUE
from trainyard.paths import PLATFORM_DIR
from trainyard.plan.recording import SECRET, Recording, ResourceRecord
from trainyard.plan.runtime import StackFile, available_stacks, read_stack, render, settings_of
from trainyard.plan.writers import HELM_RELEASE, is_kubernetes_object, manifest_of, release_of
from trainyard.platform.addon import Addon
from trainyard.platform.gpu_operator import device_plugin_configs
from trainyard.platform.monitoring import retention_size
from trainyard.platform.registry import load_registry
from trainyard.platform.tenants import DEFAULT_DENY_POLICY

REPO_ROOT = Path(__file__).resolve().parents[2]
STACKS = available_stacks()
# Components that are not add-ons of platform/addons.yaml: building blocks the layer itself creates.
NOT_ADDONS = {"trainyard:platform:Tenants", "trainyard:platform:EbsStorageClass"}


@cache
def _recording(stack: str) -> Recording:
    return render(read_stack(stack))


@cache
def _enabled(stack: str) -> tuple[Addon, ...]:
    """The add-ons the stack turns on, as the registry reads its switches."""
    return load_registry(REPO_ROOT).enabled(settings_of(read_stack(stack)))


@cache
def _config(stack: str) -> dict[str, Any]:
    return yaml.safe_load((REPO_ROOT / "stacks" / f"Pulumi.{stack}.yaml").read_text())["config"]


def _releases(stack: str) -> dict[str, dict[str, Any]]:
    return {release_of(r)["chart"].rsplit("/", 1)[-1]: release_of(r)
            for r in _recording(stack).resources if r.type == HELM_RELEASE}


def _objects(stack: str, kind: str) -> list[dict[str, Any]]:
    return [manifest_of(r) for r in _recording(stack).resources
            if is_kubernetes_object(r) and r.type.rsplit(":", 1)[1] == kind]


def _one(stack: str, kind: str, name: str) -> dict[str, Any]:
    (obj,) = [o for o in _objects(stack, kind) if o["metadata"]["name"] == name]
    return obj


def _tenants(stack: str) -> list[dict[str, Any]]:
    return list(_config(stack)["trainyard:tenants"])


def _walk(value: Any) -> Iterator[Any]:
    yield value
    if isinstance(value, dict):
        for item in value.values():
            yield from _walk(item)
    elif isinstance(value, list):
        for item in value:
            yield from _walk(item)


# ------------------------------------------------------------------------------------------ release sets


@pytest.mark.parametrize("stack", STACKS)
def test_each_stack_installs_the_charts_of_the_addons_it_turns_on(stack: str) -> None:
    enabled = _enabled(stack)
    required = {chart for addon in enabled for chart in addon.charts if chart not in addon.optional_charts}
    allowed = {chart for addon in enabled for chart in addon.charts}
    assert required <= set(_releases(stack)) <= allowed


@pytest.mark.parametrize("stack", STACKS)
def test_efa_plugin_only_with_efa_pools(stack: str) -> None:
    efa = any(pool.efa for pool in settings_of(read_stack(stack)).pools("gpu"))
    assert ("aws-efa-k8s-device-plugin" in _releases(stack)) == efa


def test_local_renders_kubernetes_network_policies() -> None:
    assert _objects("local", "CiliumNetworkPolicy") == []
    # Registration order is the asyncio scheduler's; compare as sorted lists.
    assert sorted(o["metadata"]["namespace"] for o in _objects("local", "NetworkPolicy")
                  if o["metadata"]["name"] == DEFAULT_DENY_POLICY) == ["research"]
    tracking = ["mlflow"] if settings_of(read_stack("local")).addons.mlflow.enabled else []
    assert sorted(o["metadata"]["name"] for o in _objects("local", "Namespace")) == sorted(
        ["monitoring", "research", *tracking])


def test_releases_use_catalogue_pins() -> None:
    catalogue = load_catalogue(REPO_ROOT)
    for chart, release in _releases("prod").items():
        pin = catalogue.chart(chart)
        assert (release["version"], release["namespace"]) == (pin.version, pin.namespace)


# --------------------------------------------------------------------------------------------- Cilium


@pytest.mark.parametrize("stack", ["prod", "staging", "dev"])
def test_cilium_reaches_the_api_server_of_its_cluster(stack: str) -> None:
    values = _releases(stack)["cilium"]["values"]
    ref = values["k8sServiceHostRef"]
    config_map = _one(stack, "ConfigMap", ref["name"])
    host = config_map["data"][ref["key"]]
    assert config_map["metadata"]["namespace"] == "kube-system"
    # The mock EKS endpoint is https://<CLUSTER>.gr7.<region>.eks.amazonaws.com: the host, without scheme.
    assert host.endswith(".us-west-2.eks.amazonaws.com") and "://" not in host
    assert values["k8sServicePort"] == 443
    assert "k8sServiceHost" not in values
    assert values["ipv4NativeRoutingCIDR"] == _config(stack)["trainyard:network"]["vpcCidr"]
    # No ServiceMonitor CRD exists when Cilium installs: the chart must not ship any.
    assert values["prometheus"]["serviceMonitor"]["enabled"] is False
    assert values["hubble"]["metrics"]["serviceMonitor"]["enabled"] is False


@pytest.mark.parametrize("stack", ["prod", "staging"])
def test_every_tenant_namespace_is_default_deny(stack: str) -> None:
    policies = {p["metadata"]["namespace"]: p["spec"] for p in _objects(stack, "CiliumNetworkPolicy")
                if p["metadata"]["name"] == DEFAULT_DENY_POLICY}
    checks = {FABRIC_CHECK_NAMESPACE} if settings_of(read_stack(stack)).fabric_checked_pools else set()
    assert set(policies) == {t.get("namespace", t["name"]) for t in _tenants(stack)} | checks
    for namespace, spec in policies.items():
        assert spec["endpointSelector"] == {}
        ingress_from = [rule["fromEndpoints"] for rule in spec["ingress"]]
        assert ingress_from == [[{}], [{"matchLabels": {"k8s:io.kubernetes.pod.namespace": "monitoring"}}]], namespace
        dns = [rule for rule in spec["egress"] if "kube-dns" in json.dumps(rule.get("toEndpoints"))]
        assert len(dns) == 1 and {p["port"] for p in dns[0]["toPorts"][0]["ports"]} == {"53"}
        s3 = [rule for rule in spec["egress"] if "toFQDNs" in rule]
        assert s3 == [{"toFQDNs": [{"matchName": "s3.us-west-2.amazonaws.com"},
                                   {"matchPattern": "*.s3.us-west-2.amazonaws.com"}],
                       "toPorts": [{"ports": [{"port": "443", "protocol": "TCP"}]}]}]
        # Nothing may reach everything: no world/all entities, no open CIDRs.
        assert "world" not in json.dumps(spec) and "0.0.0.0/0" not in json.dumps(spec)
        # The one entity rule: the node's pod identity agent (Cilium's `host`), on its port only (issue 9 item 8).
        entities = [rule for rule in spec["egress"] if "toEntities" in rule]
        assert entities == [{"toEntities": ["host"],
                             "toPorts": [{"ports": [{"port": "80", "protocol": "TCP"}]}]}], namespace


# ---------------------------------------------------------------------------------------------- Tenants


def _mig_per_gpu(stack: str) -> dict[str, int]:
    """MIG profile -> most slices one GPU carries in the stack's MIG pools (from the layouts file)."""
    catalog, slices = load_mig_catalog(), {}
    for pool in settings_of(read_stack(stack)).pools("gpu"):
        if pool.mig_layout:
            gpu = INSTANCE_TYPES[pool.instance_types[0]].gpu
            assert gpu is not None
            for profile, count in catalog.slices(pool.mig_layout, gpu).items():
                slices[profile] = max(slices.get(profile, 0), count)
    return slices


def _limits(resources: dict[str, Any], mig: dict[str, int]) -> dict[str, str]:
    gpu = resources.get("gpu", 0)
    wanted = {"cpu": resources.get("cpu"), "memory": resources.get("memory"),
              "nvidia.com/gpu": str(gpu) if gpu else None,
              **{f"nvidia.com/mig-{profile}": str(gpu * n) for profile, n in mig.items() if gpu}}
    return {k: str(v) for k, v in wanted.items() if v}


@pytest.mark.parametrize("stack", ["prod", "staging", "dev", "local"])
def test_queues_carry_weights_and_capability_from_config(stack: str) -> None:
    queues = {q["metadata"]["name"]: q["spec"] for q in [*_objects(stack, "Queue"), *_objects(stack, "QueuePatch")]}
    queues.pop(FABRIC_CHECK_QUEUE, None)  # not a tenant's: tests/platform/test_tenancy.py
    mig = _mig_per_gpu(stack)
    expected = {}
    for tenant in _tenants(stack):
        name = "default" if tenant.get("default") else tenant["name"]
        expected[name] = {"weight": tenant.get("weight", 1), "reclaimable": True,
                          "capability": _limits(tenant.get("capability", {}), mig)}
    assert queues == expected


def test_default_tenant_patches_volcanos_default_queue() -> None:
    (patch,) = _objects("prod", "QueuePatch")
    assert patch["metadata"]["name"] == "default"
    assert patch["metadata"]["annotations"]["pulumi.com/patchForce"] == "true"
    tenants = {t["name"] for t in _tenants("prod") if not t.get("default")}
    assert {q["metadata"]["name"] for q in _objects("prod", "Queue")} == tenants | {FABRIC_CHECK_QUEUE}


@pytest.mark.parametrize("stack", ["prod", "staging"])
def test_quotas_and_trainer_accounts_per_tenant(stack: str) -> None:
    quotas = {q["metadata"]["namespace"]: q["spec"]["hard"] for q in _objects(stack, "ResourceQuota")}
    mig = _mig_per_gpu(stack)
    for tenant in _tenants(stack):
        # A tenant without a quota gets its capability as one (issue 19 finding 12: prod's eval had none).
        limit = tenant.get("quota") or tenant["capability"]
        expected = {f"requests.{k}": v for k, v in _limits(limit, mig).items()}
        expected["pods"] = str(limit.get("pods", 200))
        assert quotas[tenant.get("namespace", tenant["name"])] == expected, tenant["name"]
    accounts = [(a["metadata"]["namespace"], a["metadata"]["name"]) for a in _objects(stack, "ServiceAccount")]
    assert {(t.get("namespace", t["name"]), "trainer") for t in _tenants(stack)} <= set(accounts)
    assert {p["metadata"]["name"] for p in _objects(stack, "PriorityClass")} == {"trainyard-training",
                                                                                 "trainyard-system"}


# ------------------------------------------------------------------------------------------ GPU Operator


@pytest.mark.parametrize("stack", ["prod", "staging"])
def test_gpu_operator_config_maps_hold_the_catalogue_files(stack: str) -> None:
    values = _releases(stack)["gpu-operator"]["values"]
    mig = _one(stack, "ConfigMap", values["migManager"]["config"]["name"])
    assert mig["data"] == {"config.yaml": (PLATFORM_DIR / "gpu-operator" / "mig-layouts.yaml").read_text()}
    dcgm = _one(stack, "ConfigMap", values["dcgmExporter"]["config"]["name"])
    assert dcgm["data"] == {"dcgm-metrics.csv": (PLATFORM_DIR / "gpu-operator" / "dcgm-metrics.csv").read_text()}
    assert values["migManager"]["config"]["create"] is False and values["mig"]["strategy"] == "mixed"
    assert values["driver"]["enabled"] is False and values["toolkit"]["enabled"] is False
    assert values["dcgmExporter"]["serviceMonitor"]["enabled"] is True
    gpu_taint = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    assert gpu_taint in values["daemonsets"]["tolerations"]
    plugin = _one(stack, "ConfigMap", values["devicePlugin"]["config"]["name"])
    # Time slicing is off in every stack: only the default plugin config, and the chart renders none itself.
    assert set(plugin["data"]) == {"default"} and "data" not in values["devicePlugin"]["config"]


def test_time_slicing_config_follows_settings() -> None:
    base = load_catalogue(REPO_ROOT).values("gpu-operator")
    assert set(device_plugin_configs(base, TimeSlicing())) == {"default"}
    configs = device_plugin_configs(base, TimeSlicing(enabled=True, replicas=8))
    sliced = yaml.safe_load(configs["time-sliced"])
    assert sliced["sharing"]["timeSlicing"]["resources"] == [{"name": "nvidia.com/gpu", "replicas": 8}]


# --------------------------------------------------------------------------------------------- Rook-Ceph


@pytest.mark.parametrize(("stack", "mons", "mgrs"), [("prod", 3, 2), ("staging", 3, 2), ("dev", 1, 2)])
def test_ceph_cluster_values_per_stack(stack: str, mons: int, mgrs: int) -> None:
    rook = settings_of(read_stack(stack)).addons.rook_ceph
    replicas, domain = rook.replicas, rook.failure_domain
    values = _releases(stack)["rook-ceph-cluster"]["values"]
    spec = values["cephClusterSpec"]
    assert (spec["mon"]["count"], spec["mgr"]["count"]) == (mons, mgrs)
    assert spec["cleanupPolicy"]["confirmation"] == ""
    placement = spec["placement"]
    role = {daemon: placement[daemon]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] for daemon in ("mon", "mgr", "osd")}
    assert role == {"mon": ["system"], "mgr": ["system"], "osd": ["storage"]}
    assert spec["storage"]["useAllDevices"] is False and spec["storage"]["devicePathFilter"]
    (pool,) = values["cephBlockPools"]
    assert pool["spec"]["failureDomain"] == domain and pool["spec"]["replicated"]["size"] == replicas
    assert pool["spec"]["replicated"]["requireSafeReplicaSize"] is (replicas > 1)
    (filesystem,) = values["cephFileSystems"]
    fs = filesystem["spec"]
    assert {p["replicated"]["size"] for p in [fs["metadataPool"], *fs["dataPools"]]} == {replicas}
    assert "mirroring" not in fs
    assert values["monitoring"]["enabled"] is True


def test_ceph_data_is_protected() -> None:
    protected = {r.name for r in _recording("prod").resources if r.type == HELM_RELEASE and r.protect}
    assert protected == {"rook-ceph-storage-release"}


# ------------------------------------------------------------------------------------------ Fluid/Alluxio


@pytest.mark.parametrize("stack", ["prod", "staging", "dev"])
def test_alluxio_tiers_paths_and_tenant_sharing(stack: str) -> None:
    alluxio = _config(stack)["trainyard:addons"]["alluxio"]
    (runtime,) = _objects(stack, "AlluxioRuntime")
    levels = runtime["spec"]["tieredstore"]["levels"]
    assert [(lv["mediumtype"], lv["path"], lv["quota"]) for lv in levels] == [
        ("MEM", "/dev/shm", alluxio["memoryCache"])]
    # On the storage pool, never on GPU nodes (issue 9 item 9).
    assert runtime["spec"]["worker"]["nodeSelector"] == {"trainyard.io/role": "storage"}
    datasets = {d["metadata"]["namespace"]: d["spec"] for d in _objects(stack, "Dataset")}
    source = datasets.pop("trainyard-data")
    (mount,) = source["mounts"]
    assert mount["mountPoint"].startswith("s3://") and mount["mountPoint"].endswith("/datasets")
    assert mount["readOnly"] is True and not any(k.endswith(("accessKeyId", "secretKey")) for k in mount["options"])
    # Master and workers get these: never the GPU taint (issue 19 finding 8).
    assert all(t["key"] != "nvidia.com/gpu" for t in source["tolerations"])
    assert set(datasets) == {t.get("namespace", t["name"]) for t in _tenants(stack)}
    for spec in datasets.values():
        assert spec["mounts"] == [{"mountPoint": "dataset://trainyard-data/training-data", "readOnly": True}]
        assert spec["accessModes"] == ["ReadOnlyMany"]
    # The runtime's pods run as the dataset namespace's default account: the one annotated with the IRSA role.
    (account,) = [a for a in _objects(stack, "ServiceAccountPatch") if a["metadata"]["namespace"] == "trainyard-data"]
    assert account["metadata"]["name"] == "default"
    assert account["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].endswith(f"role/trainyard-{stack}-alluxio")
    assert {runtime["spec"][part]["networkMode"] for part in ("master", "worker", "fuse")} == {"ContainerNetwork"}


# -------------------------------------------------------------------------------------------- Monitoring


@pytest.mark.parametrize("stack", ["prod", "local"])
def test_prometheus_storage_and_retention(stack: str) -> None:
    monitoring = _config(stack)["trainyard:addons"]["monitoring"]
    spec = _releases(stack)["kube-prometheus-stack"]["values"]["prometheus"]["prometheusSpec"]
    assert spec["retention"] == monitoring["retention"]
    claim = spec["storageSpec"]["volumeClaimTemplate"]["spec"]
    assert claim["resources"]["requests"]["storage"] == monitoring["storageSize"]
    # EBS gp3 on AWS (never Ceph: Prometheus must not wait for it or go down with it); the default on local.
    assert claim.get("storageClassName") == ("ebs-gp3" if stack == "prod" else None)


def test_retention_size_leaves_headroom() -> None:
    assert retention_size("500Gi") == "425GB"
    assert retention_size("1Ti") == "870GB"
    with pytest.raises(ValueError):
        retention_size("lots")


def _with_grafana_password(stack: str, password: str) -> StackFile:
    base = read_stack(stack)
    key = "trainyard:grafanaAdminPassword"
    return StackFile(stack=stack, values={**base.values, key: password}, secret_keys=(*base.secret_keys, key))


@pytest.mark.parametrize("password", [None, "correct-horse-battery-staple"])
def test_grafana_password_never_in_clear(password: str | None) -> None:
    recording = _recording("local") if password is None else render(_with_grafana_password("local", password))
    values = {release_of(r)["chart"]: release_of(r)["values"] for r in recording.resources if r.type == HELM_RELEASE}
    admin = values["kube-prometheus-stack"]["grafana"]["admin"]
    (grafana_namespace,) = [release_of(r)["namespace"] for r in recording.resources if r.type == HELM_RELEASE
                            and release_of(r)["chart"] == "kube-prometheus-stack"]
    (record,) = [r for r in recording.resources if r.type == "kubernetes:core/v1:Secret"
                 and manifest_of(r)["metadata"]["namespace"] == grafana_namespace]
    secret = manifest_of(record)
    assert admin == {"existingSecret": secret["metadata"]["name"], "userKey": "admin-user",
                     "passwordKey": "admin-password"}
    assert secret["stringData"] == {"admin-user": SECRET, "admin-password": SECRET}
    assert "adminPassword" not in json.dumps(values)
    if password is not None:
        assert password not in json.dumps([r.as_json() for r in recording.resources])
    else:
        generated = [r.type for r in recording.resources if r.type.startswith("random:") and r.urn in record.depends_on]
        assert generated == ["random:index/randomPassword:RandomPassword"]


def test_rules_and_dashboards_become_objects() -> None:
    rules = {r["metadata"]["name"]: r["spec"] for r in _objects("prod", "PrometheusRule")}
    for path in sorted((PLATFORM_DIR / "monitoring" / "rules").glob("*.rules.yaml")):
        name = f"trainyard-{path.name.removesuffix('.rules.yaml')}"
        assert rules[name] == {"groups": yaml.safe_load(path.read_text())["groups"]}
    dashboards = [c for c in _objects("prod", "ConfigMap") if c["metadata"]["labels"].get("grafana_dashboard") == "1"]
    assert len(dashboards) == len(list((PLATFORM_DIR / "monitoring" / "dashboards").glob("*.json")))


def test_no_component_serves_custom_metrics_nothing_scales_on() -> None:
    """README, "Autoscaling": no HPA or KEDA object exists, so no custom-metrics adapter is deployed."""
    for stack in available_stacks():
        assert not [r for r in _releases(stack).values() if "adapter" in str(r.get("chart"))], stack
        scalers = {"HorizontalPodAutoscaler", "ScaledObject", "ScaledJob"}
        assert not [r for r in render(read_stack(stack)).resources if r.type.rsplit(":", 1)[-1] in scalers]


@pytest.mark.parametrize("stack", ["prod", "local"])
def test_nothing_is_exposed_through_a_load_balancer(stack: str) -> None:
    everything = [r.inputs for r in _recording(stack).resources if r.type.startswith("kubernetes:")]
    assert not any(value == "LoadBalancer" for value in _walk(everything))


def _records(stack: str, type_prefix: str) -> list[ResourceRecord]:
    return [r for r in _recording(stack).resources if r.type.startswith(type_prefix)]


@pytest.mark.parametrize("stack", STACKS)
def test_every_addon_is_a_typed_component(stack: str) -> None:
    """Each add-on the stack turns on is one component, typed after it; every Helm release sits inside one."""
    components = {r.urn: r for r in _records(stack, "trainyard:platform:")}
    top_level = {(r.type, r.name) for r in components.values() if r.parent not in components}
    expected = {(f"trainyard:platform:{a.type_name}", a.resource_name) for a in _enabled(stack)}
    assert {item for item in top_level if item[0] not in NOT_ADDONS} == expected
    by_urn = _recording(stack).by_urn()
    for release in _records(stack, HELM_RELEASE):
        parent = by_urn[release.parent] if release.parent else None
        assert parent is not None and parent.type.startswith("trainyard:platform:"), release.urn
