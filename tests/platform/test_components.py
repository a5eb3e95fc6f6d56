"""What the platform layer renders per stack: release sets and the values and objects it computes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from owned_stacks import FLEET, LAPTOP, Stack, every_stack, recording, stack_file, stack_settings, stacks_where
from trainyard.catalogue.charts import load_catalogue
from trainyard.config.instance_types import INSTANCE_TYPES
from trainyard.config.mig import load_mig_catalog
from trainyard.config.model import Settings, TimeSlicing
from trainyard.names import (
    FABRIC_CHECK_NAMESPACE,
    FABRIC_CHECK_QUEUE,
    MLFLOW_DATABASE_NAMESPACE,
    MLFLOW_NAMESPACE,
    TENANT_GRAFANA_NAMESPACE,
)
from trainyard.paths import PLATFORM_DIR
from trainyard.plan.recording import SECRET, Recording, ResourceRecord
from trainyard.plan.runtime import StackFile, render
from trainyard.plan.writers import HELM_RELEASE, is_kubernetes_object, manifest_of, release_of
from trainyard.platform.addon import Addon
from trainyard.platform.gpu_operator import device_plugin_configs
from trainyard.platform.monitoring import retention_size
from trainyard.platform.registry import load_registry
from trainyard.platform.tenants import DEFAULT_DENY_POLICY

REPO_ROOT = Path(__file__).resolve().parents[2]
# Components that are not add-ons of platform/addons.yaml: building blocks the layer itself creates.
NOT_ADDONS = {"trainyard:platform:Tenants", "trainyard:platform:EbsStorageClass"}


def _recording(stack: Stack) -> Recording:
    return recording(stack)


@cache
def _enabled(stack: Stack) -> tuple[Addon, ...]:
    """The add-ons the stack turns on, as the registry reads its switches."""
    return load_registry(REPO_ROOT).enabled(stack_settings(stack))


@cache
def _config(stack: Stack) -> dict[str, Any]:
    name, folder = stack
    return yaml.safe_load((folder / f"Pulumi.{name}.yaml").read_text())["config"]


def _region(settings: Settings) -> str:
    assert settings.aws is not None
    return settings.aws.region


def _cilium_on_aws(settings: Settings) -> bool:
    return settings.is_aws and settings.addons.cilium.enabled


def _ceph_on_aws(settings: Settings) -> bool:
    return settings.is_aws and settings.addons.rook_ceph.enabled


def _releases(stack: Stack) -> dict[str, dict[str, Any]]:
    return {release_of(r)["chart"].rsplit("/", 1)[-1]: release_of(r)
            for r in _recording(stack).resources if r.type == HELM_RELEASE}


def _objects(stack: Stack, kind: str) -> list[dict[str, Any]]:
    return [manifest_of(r) for r in _recording(stack).resources
            if is_kubernetes_object(r) and r.type.rsplit(":", 1)[1] == kind]


def _one(stack: Stack, kind: str, name: str) -> dict[str, Any]:
    (obj,) = [o for o in _objects(stack, kind) if o["metadata"]["name"] == name]
    return obj


def _tenants(stack: Stack) -> list[dict[str, Any]]:
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


@pytest.mark.parametrize("stack", every_stack())
def test_each_stack_installs_the_charts_of_the_addons_it_turns_on(stack: Stack) -> None:
    enabled = _enabled(stack)
    required = {chart for addon in enabled for chart in addon.charts if chart not in addon.optional_charts}
    allowed = {chart for addon in enabled for chart in addon.charts}
    assert required <= set(_releases(stack)) <= allowed


@pytest.mark.parametrize("stack", every_stack())
def test_efa_plugin_only_with_efa_pools(stack: Stack) -> None:
    efa = any(pool.efa for pool in stack_settings(stack).pools("gpu"))
    assert ("aws-efa-k8s-device-plugin" in _releases(stack)) == efa


def test_local_renders_kubernetes_network_policies() -> None:
    assert _objects(LAPTOP, "CiliumNetworkPolicy") == []
    # Registration order is the asyncio scheduler's; compare as sorted lists.
    assert sorted(o["metadata"]["namespace"] for o in _objects(LAPTOP, "NetworkPolicy")
                  if o["metadata"]["name"] == DEFAULT_DENY_POLICY) == ["research"]
    addons = stack_settings(LAPTOP).addons
    # The tracking server, and its CloudNativePG database in a namespace of its own (no RDS without AWS).
    tracking = [MLFLOW_NAMESPACE, MLFLOW_DATABASE_NAMESPACE] if addons.mlflow.enabled else []
    dashboards = [TENANT_GRAFANA_NAMESPACE] if addons.monitoring.enabled and addons.tenant_grafana.enabled else []
    assert sorted(o["metadata"]["name"] for o in _objects(LAPTOP, "Namespace")) == sorted(
        ["monitoring", "research", *tracking, *dashboards])


@pytest.mark.parametrize("stack", every_stack())
def test_releases_use_catalogue_pins(stack: Stack) -> None:
    catalogue = load_catalogue(REPO_ROOT)
    for chart, release in _releases(stack).items():
        pin = catalogue.chart(chart)
        assert (release["version"], release["namespace"]) == (pin.version, pin.namespace)


# --------------------------------------------------------------------------------------------- Cilium


@pytest.mark.parametrize("stack", stacks_where(_cilium_on_aws))
def test_cilium_reaches_the_api_server_of_its_cluster(stack: Stack) -> None:
    values = _releases(stack)["cilium"]["values"]
    ref = values["k8sServiceHostRef"]
    config_map = _one(stack, "ConfigMap", ref["name"])
    host = config_map["data"][ref["key"]]
    assert config_map["metadata"]["namespace"] == "kube-system"
    # The mock EKS endpoint is https://<CLUSTER>.gr7.<region>.eks.amazonaws.com: the host, without scheme.
    assert host.endswith(f".{_region(stack_settings(stack))}.eks.amazonaws.com") and "://" not in host
    assert values["k8sServicePort"] == 443
    assert "k8sServiceHost" not in values
    assert values["ipv4NativeRoutingCIDR"] == stack_settings(stack).network.vpc_cidr
    # No ServiceMonitor CRD exists when Cilium installs: the chart must not ship any.
    assert values["prometheus"]["serviceMonitor"]["enabled"] is False
    assert values["hubble"]["metrics"]["serviceMonitor"]["enabled"] is False


@pytest.mark.parametrize("stack", stacks_where(_cilium_on_aws))
def test_every_tenant_namespace_is_default_deny(stack: Stack) -> None:
    policies = {p["metadata"]["namespace"]: p["spec"] for p in _objects(stack, "CiliumNetworkPolicy")
                if p["metadata"]["name"] == DEFAULT_DENY_POLICY}
    region = _region(stack_settings(stack))
    checks = {FABRIC_CHECK_NAMESPACE} if stack_settings(stack).fabric_checked_pools else set()
    assert set(policies) == {t.get("namespace", t["name"]) for t in _tenants(stack)} | checks
    for namespace, spec in policies.items():
        assert spec["endpointSelector"] == {}
        ingress_from = [rule["fromEndpoints"] for rule in spec["ingress"]]
        assert ingress_from == [[{}], [{"matchLabels": {"k8s:io.kubernetes.pod.namespace": "monitoring"}}]], namespace
        dns = [rule for rule in spec["egress"] if "kube-dns" in json.dumps(rule.get("toEndpoints"))]
        assert len(dns) == 1 and {p["port"] for p in dns[0]["toPorts"][0]["ports"]} == {"53"}
        s3 = [rule for rule in spec["egress"] if "toFQDNs" in rule]
        assert s3 == [{"toFQDNs": [{"matchName": f"s3.{region}.amazonaws.com"},
                                   {"matchPattern": f"*.s3.{region}.amazonaws.com"}],
                       "toPorts": [{"ports": [{"port": "443", "protocol": "TCP"}]}]}]
        # Nothing may reach everything: no world/all entities, no open CIDRs.
        assert "world" not in json.dumps(spec) and "0.0.0.0/0" not in json.dumps(spec)
        # The one entity rule: the node's pod identity agent (Cilium's `host`), on its port only (issue 9 item 8).
        entities = [rule for rule in spec["egress"] if "toEntities" in rule]
        assert entities == [{"toEntities": ["host"],
                             "toPorts": [{"ports": [{"port": "80", "protocol": "TCP"}]}]}], namespace


# ---------------------------------------------------------------------------------------------- Tenants


def _mig_per_gpu(stack: Stack) -> dict[str, int]:
    """MIG profile -> most slices one GPU carries in the stack's MIG pools (from the layouts file)."""
    catalog, slices = load_mig_catalog(), {}
    for pool in stack_settings(stack).pools("gpu"):
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


@pytest.mark.parametrize("stack", every_stack())
def test_queues_carry_weights_and_capability_from_config(stack: Stack) -> None:
    queues = {q["metadata"]["name"]: q["spec"] for q in [*_objects(stack, "Queue"), *_objects(stack, "QueuePatch")]}
    queues.pop(FABRIC_CHECK_QUEUE, None)  # not a tenant's: tests/platform/test_tenancy.py
    mig = _mig_per_gpu(stack)
    expected = {}
    for tenant in _tenants(stack):
        name = "default" if tenant.get("default") else tenant["name"]
        expected[name] = {"weight": tenant.get("weight", 1), "reclaimable": True,
                          "capability": _limits(tenant.get("capability", {}), mig)}
    assert queues == expected


@pytest.mark.parametrize("stack", stacks_where(lambda s: s.default_tenant is not None))
def test_default_tenant_patches_volcanos_default_queue(stack: Stack) -> None:
    (patch,) = _objects(stack, "QueuePatch")
    assert patch["metadata"]["name"] == "default"
    assert patch["metadata"]["annotations"]["pulumi.com/patchForce"] == "true"
    tenants = {t["name"] for t in _tenants(stack) if not t.get("default")}
    checks = {FABRIC_CHECK_QUEUE} if stack_settings(stack).fabric_checked_pools else set()
    assert {q["metadata"]["name"] for q in _objects(stack, "Queue")} == tenants | checks


@pytest.mark.parametrize("stack", every_stack())
def test_quotas_and_trainer_accounts_per_tenant(stack: Stack) -> None:
    quotas = {q["metadata"]["namespace"]: q["spec"]["hard"] for q in _objects(stack, "ResourceQuota")
              if q["metadata"]["name"] == "tenant-quota"}
    mig, rook = _mig_per_gpu(stack), _releases(stack).get("rook-ceph-cluster")
    for tenant in _tenants(stack):
        # A tenant without a quota gets its capability as one (issue 19 finding 12: prod's eval had none).
        limit = tenant.get("quota") or tenant["capability"]
        expected = {f"requests.{k}": v for k, v in _limits(limit, mig).items()}
        expected["pods"] = str(limit.get("pods", 200))
        if rook is not None:  # claims on the checkpoint class only: Fluid's dataset claim is nominally 100Pi
            per_class = f"{rook['values']['cephFileSystems'][0]['storageClass']['name']}.storageclass.storage.k8s.io"
            expected |= {f"{per_class}/requests.storage": limit.get("storage", "10Ti"),
                         f"{per_class}/persistentvolumeclaims": str(limit.get("claims", 20))}
        assert quotas[tenant.get("namespace", tenant["name"])] == expected, tenant["name"]
    accounts = [(a["metadata"]["namespace"], a["metadata"]["name"]) for a in _objects(stack, "ServiceAccount")]
    assert {(t.get("namespace", t["name"]), "trainer") for t in _tenants(stack)} <= set(accounts)
    assert {p["metadata"]["name"] for p in _objects(stack, "PriorityClass")} == {"trainyard-training",
                                                                                 "trainyard-system"}


# ------------------------------------------------------------------------------------------ GPU Operator


@pytest.mark.parametrize("stack", stacks_where(lambda s: s.addons.gpu_operator.enabled
                                               and not s.addons.gpu_operator.time_slicing.enabled))
def test_gpu_operator_config_maps_hold_the_catalogue_files(stack: Stack) -> None:
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
    # Time slicing is off: only the default plugin config, and the chart renders none itself (test_gpu_sharing.py
    # turns it on).
    assert set(plugin["data"]) == {"default"} and "data" not in values["devicePlugin"]["config"]


def test_time_slicing_config_follows_settings() -> None:
    base = load_catalogue(REPO_ROOT).values("gpu-operator")
    assert set(device_plugin_configs(base, TimeSlicing())) == {"default"}
    configs = device_plugin_configs(base, TimeSlicing(enabled=True, replicas=8))
    sliced = yaml.safe_load(configs["time-sliced"])
    assert sliced["sharing"]["timeSlicing"]["resources"] == [{"name": "nvidia.com/gpu", "replicas": 8}]


# --------------------------------------------------------------------------------------------- Rook-Ceph


def _with_system_nodes(stack: Stack, nodes: int, folder: Path) -> Stack:
    """The stack written into `folder` with its system pool at `nodes` nodes."""
    config = _config(stack)
    pools = [dict(p, minSize=nodes, desiredSize=nodes) if p["role"] == "system" else p
             for p in config["trainyard:nodePools"]]
    (folder / f"Pulumi.{stack[0]}.yaml").write_text(yaml.safe_dump({"config": {**config,
                                                                                "trainyard:nodePools": pools}}))
    return stack[0], folder


def _ceph_daemons(stack: Stack) -> tuple[int, int]:
    """Mons need three nodes for a quorum that survives one loss, else one; mgrs run active/standby on two nodes."""
    system = sum(pool.min_size for pool in stack_settings(stack).pools("system"))
    return (3 if system >= 3 else 1), (2 if system >= 2 else 1)


def test_ceph_daemon_counts_follow_the_system_nodes(tmp_path_factory: pytest.TempPathFactory) -> None:
    assert _ceph_daemons(FLEET) == (3, 2)
    two = _with_system_nodes(FLEET, 2, tmp_path_factory.mktemp("system"))
    spec = _releases(two)["rook-ceph-cluster"]["values"]["cephClusterSpec"]
    assert (spec["mon"]["count"], spec["mgr"]["count"]) == (1, 2)


@pytest.mark.parametrize("stack", stacks_where(_ceph_on_aws))
def test_ceph_cluster_values_per_stack(stack: Stack) -> None:
    rook = stack_settings(stack).addons.rook_ceph
    replicas, domain = rook.replicas, rook.failure_domain
    values = _releases(stack)["rook-ceph-cluster"]["values"]
    spec = values["cephClusterSpec"]
    assert (spec["mon"]["count"], spec["mgr"]["count"]) == _ceph_daemons(stack)
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


@pytest.mark.parametrize("stack", stacks_where(lambda s: _ceph_on_aws(s) and s.protect))
def test_ceph_data_is_protected(stack: Stack) -> None:
    protected = {r.name for r in _recording(stack).resources if r.type == HELM_RELEASE and r.protect}
    assert protected == {"rook-ceph-storage-release"}


# ------------------------------------------------------------------------------------------ Fluid/Alluxio


@pytest.mark.parametrize("stack", stacks_where(lambda s: s.is_aws and s.addons.alluxio.enabled))
def test_alluxio_tiers_paths_and_tenant_sharing(stack: Stack) -> None:
    alluxio = stack_settings(stack).addons.alluxio
    (runtime,) = _objects(stack, "AlluxioRuntime")
    levels = runtime["spec"]["tieredstore"]["levels"]
    assert [(lv["mediumtype"], lv["path"], lv["quota"]) for lv in levels] == [
        ("MEM", "/dev/shm", alluxio.memory_cache)]
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
    role = account["metadata"]["annotations"]["eks.amazonaws.com/role-arn"]
    assert role.endswith(f"role/trainyard-{stack[0]}-alluxio")
    assert {runtime["spec"][part]["networkMode"] for part in ("master", "worker", "fuse")} == {"ContainerNetwork"}


# -------------------------------------------------------------------------------------------- Monitoring


@pytest.mark.parametrize("stack", stacks_where(lambda s: s.addons.monitoring.enabled))
def test_prometheus_storage_and_retention(stack: Stack) -> None:
    settings = stack_settings(stack)
    monitoring = settings.addons.monitoring
    spec = _releases(stack)["kube-prometheus-stack"]["values"]["prometheus"]["prometheusSpec"]
    assert spec["retention"] == monitoring.retention
    claim = spec["storageSpec"]["volumeClaimTemplate"]["spec"]
    assert claim["resources"]["requests"]["storage"] == monitoring.storage_size
    # EBS gp3 on AWS (never Ceph: Prometheus must not wait for it or go down with it); the default on local.
    assert claim.get("storageClassName") == ("ebs-gp3" if settings.is_aws else None)


def test_retention_size_leaves_headroom() -> None:
    assert retention_size("500Gi") == "425GB"
    assert retention_size("1Ti") == "870GB"
    with pytest.raises(ValueError):
        retention_size("lots")


def _with_grafana_password(stack: Stack, password: str) -> StackFile:
    base = stack_file(stack)
    key = "trainyard:grafanaAdminPassword"
    return StackFile(stack=base.stack, values={**base.values, key: password}, secret_keys=(*base.secret_keys, key))


@pytest.mark.parametrize("password", [None, "correct-horse-battery-staple"])
def test_grafana_password_never_in_clear(password: str | None) -> None:
    recording = _recording(LAPTOP) if password is None else render(_with_grafana_password(LAPTOP, password))
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


@pytest.mark.parametrize("stack", stacks_where(lambda s: s.addons.monitoring.enabled))
def test_rules_and_dashboards_become_objects(stack: Stack) -> None:
    rules = {r["metadata"]["name"]: r["spec"] for r in _objects(stack, "PrometheusRule")}
    for path in sorted((PLATFORM_DIR / "monitoring" / "rules").glob("*.rules.yaml")):
        name = f"trainyard-{path.name.removesuffix('.rules.yaml')}"
        assert rules[name] == {"groups": yaml.safe_load(path.read_text())["groups"]}
    dashboards = [c for c in _objects(stack, "ConfigMap") if c["metadata"]["labels"].get("grafana_dashboard") == "1"]
    assert len(dashboards) == len(list((PLATFORM_DIR / "monitoring" / "dashboards").glob("*.json")))


@pytest.mark.parametrize("stack", every_stack())
def test_no_component_serves_custom_metrics_nothing_scales_on(stack: Stack) -> None:
    """README, "Autoscaling": no HPA or KEDA object exists, so no custom-metrics adapter is deployed."""
    assert not [r for r in _releases(stack).values() if "adapter" in str(r.get("chart"))]
    scalers = {"HorizontalPodAutoscaler", "ScaledObject", "ScaledJob"}
    assert not [r for r in _recording(stack).resources if r.type.rsplit(":", 1)[-1] in scalers]


@pytest.mark.parametrize("stack", every_stack())
def test_nothing_is_exposed_through_a_load_balancer(stack: Stack) -> None:
    everything = [r.inputs for r in _recording(stack).resources if r.type.startswith("kubernetes:")]
    assert not any(value == "LoadBalancer" for value in _walk(everything))


def _records(stack: Stack, type_prefix: str) -> list[ResourceRecord]:
    return [r for r in _recording(stack).resources if r.type.startswith(type_prefix)]


@pytest.mark.parametrize("stack", every_stack())
def test_every_addon_is_a_typed_component(stack: Stack) -> None:
    """Each add-on the stack turns on is one component, typed after it; every Helm release sits inside one."""
    components = {r.urn: r for r in _records(stack, "trainyard:platform:")}
    top_level = {(r.type, r.name) for r in components.values() if r.parent not in components}
    expected = {(f"trainyard:platform:{a.type_name}", a.resource_name) for a in _enabled(stack)}
    assert {item for item in top_level if item[0] not in NOT_ADDONS} == expected
    by_urn = _recording(stack).by_urn()
    for release in _records(stack, HELM_RELEASE):
        parent = by_urn[release.parent] if release.parent else None
        assert parent is not None and parent.type.startswith("trainyard:platform:"), release.urn
