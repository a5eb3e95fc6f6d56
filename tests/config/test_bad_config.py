"""Bad stack config is refused before anything is created, with every problem named by its key path."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from owned_stacks import OWNED_STACKS
from trainyard.config import ConfigError
from trainyard.config.load import decode_value, parse_settings
from trainyard.plan.recording import Recording
from trainyard.plan.runtime import PROJECT, STACKS_DIR, StackFile, available_stacks, read_stack, render

Raw = dict[str, Any]


def _raw(stack: str, stacks_dir: Path = STACKS_DIR) -> Raw:
    values = read_stack(stack, stacks_dir).values
    return {k.split(":", 1)[1]: decode_value(v) for k, v in values.items()}


@pytest.fixture(scope="module")
def fleet() -> Raw:
    """The tests' own prod-environment stack (tests/fixtures/stacks/Pulumi.fleet.yaml): the cases name its keys by
    index, so they are about this file, never about a sample stack."""
    return _raw("fleet", OWNED_STACKS)


def _pool(raw: Raw, name: str) -> dict[str, Any]:
    return next(p for p in raw["nodePools"] if p["name"] == name)


def _set(path: str, value: Any) -> Callable[[Raw], None]:
    """A mutation that sets `a.b[1].c` to value."""
    def apply(raw: Raw) -> None:
        node: Any = raw
        parts = path.replace("[", ".").replace("]", "").split(".")
        for part in parts[:-1]:
            node = node[int(part)] if part.isdigit() else node.setdefault(part, {})
        last = parts[-1]
        if last.isdigit():
            node[int(last)] = value
        else:
            node[last] = value
    return apply


def _delete(path: str) -> Callable[[Raw], None]:
    def apply(raw: Raw) -> None:
        node: Any = raw
        parts = path.split(".")
        for part in parts[:-1]:
            node = node[part]
        del node[parts[-1]]
    return apply


# (id, mutation of the fleet stack, key path that must be named, a fragment of the message)
CASES: list[tuple[str, Callable[[Raw], None], str, str]] = [
    ("typo-top-level", _set("nodePool", []), "trainyard:nodePool", "unknown key"),
    ("typo-pool-key", _set("nodePools[0].minsize", 1), "trainyard:nodePools[0].minsize", "allowed here"),
    ("typo-addon", _set("addons.cillium", {}), "trainyard:addons.cillium", "unknown key"),
    ("min-above-desired", _set("nodePools[1].minSize", 5), "trainyard:nodePools[1].minSize", "greater than"),
    ("desired-above-max", _set("nodePools[0].desiredSize", 9), "trainyard:nodePools[0].desiredSize", "maxSize"),
    ("bad-vpc-cidr", _set("network.vpcCidr", "10.30.0.0/33"), "trainyard:network.vpcCidr", "CIDR"),
    ("host-bits-cidr", _set("network.vpcCidr", "10.30.1.0/16"), "trainyard:network.vpcCidr", "host bits"),
    ("vpc-too-small", _set("network.vpcCidr", "10.30.0.0/24"), "trainyard:network.vpcCidr", "/16 and /20"),
    ("service-overlaps-vpc", _set("network.serviceCidr", "10.30.128.0/20"), "trainyard:network.serviceCidr",
     "overlaps"),
    ("open-api-in-prod", _set("network.publicAccessCidrs", ["0.0.0.0/0"]), "trainyard:network.publicAccessCidrs[0]",
     "0.0.0.0/0"),
    ("unknown-instance", _set("nodePools[2].instanceTypes", ["p9.48xlarge"]),
     "trainyard:nodePools[2].instanceTypes[0]", "allowed"),
    ("bad-capacity", _set("nodePools[2].capacityTypes", ["preemptible"]), "trainyard:nodePools[2].capacityTypes[0]",
     "spot"),
    ("bad-role", _set("nodePools[0].role", "controller"), "trainyard:nodePools[0].role", "system"),
    ("pool-name-not-dns", _set("nodePools[2].name", "H100_Pool"), "trainyard:nodePools[2].name", "DNS-1123"),
    ("duplicate-pool", lambda r: r["nodePools"].append(copy.deepcopy(r["nodePools"][2])), "trainyard:nodePools",
     "more than once"),
    ("mig-on-non-mig-gpu", lambda r: r["nodePools"].append({"name": "l4", "role": "gpu", "instanceTypes":
     ["g6.xlarge"], "maxSize": 1, "migLayout": "all-1g"}), "trainyard:nodePools[6].migLayout", "do not support MIG"),
    ("unknown-mig-layout", _set("nodePools[5].migLayout", "all-9g"), "trainyard:nodePools[5].migLayout",
     "unknown MIG layout"),
    ("mig-on-system", _set("nodePools[0].migLayout", "all-1g"), "trainyard:nodePools[0].migLayout", "only 'gpu'"),
    ("efa-without-efa", lambda r: r["nodePools"].append({"name": "l4", "role": "gpu", "instanceTypes":
     ["g6.xlarge"], "maxSize": 1, "efa": True}), "trainyard:nodePools[6].efa", "no EFA interface"),
    ("gpu-min-not-zero", _set("nodePools[2].minSize", 1), "trainyard:nodePools[2].minSize", "scale from zero"),
    ("gpu-type-in-system", _set("nodePools[0].instanceTypes", ["p5.48xlarge"]), "trainyard:nodePools[0].instanceTypes",
     "may not use GPU"),
    ("cpu-type-in-gpu-pool", _set("nodePools[2].instanceTypes", ["m7i.xlarge"]),
     "trainyard:nodePools[2].instanceTypes", "only list GPU"),
    ("storage-without-nvme", _set("nodePools[1].instanceTypes", ["m7i.4xlarge"]),
     "trainyard:nodePools[1].instanceTypes", "NVMe"),
    ("mixed-gpu-models", _set("nodePools[4].instanceTypes", ["p5.48xlarge", "p5e.48xlarge"]),
     "trainyard:nodePools[4].instanceTypes", "same GPU model"),
    ("placement-two-zones", _set("nodePools[2].zones", ["us-west-2a", "us-west-2b"]),
     "trainyard:nodePools[2].placementGroup", "one zone"),
    ("zone-not-in-region", _set("aws.availabilityZones[2]", "eu-west-1a"), "trainyard:aws.availabilityZones[2]",
     "not a zone"),
    ("pool-zone-unknown", _set("nodePools[3].zones", ["us-west-2d"]), "trainyard:nodePools[3].zones[0]",
     "availabilityZones"),
    ("prod-two-zones", _set("aws.availabilityZones", ["us-west-2a", "us-west-2b"]), "trainyard:aws.availabilityZones",
     "at least 3"),
    ("bad-region", _set("aws.region", "mars-1"), "trainyard:aws.region", "is not an AWS region name"),
    ("bad-admin-arn", _set("aws.adminPrincipalArns", ["admin"]), "trainyard:aws.adminPrincipalArns[0]",
     "is not an IAM role or user ARN"),
    ("missing-aws", _delete("aws"), "trainyard:aws", "required"),
    ("missing-environment", _delete("environment"), "trainyard:environment", "required"),
    ("bad-environment", _set("environment", "production"), "trainyard:environment", "prod"),
    ("unsupported-k8s", _set("cluster.kubernetesVersion", "1.29"), "trainyard:cluster.kubernetesVersion", "1.34"),
    ("no-system-pool", lambda r: r.update(nodePools=[p for p in r["nodePools"] if p["role"] != "system"]),
     "trainyard:nodePools", "exactly one pool with role 'system'"),
    ("cilium-off-on-aws", _set("addons.cilium.enabled", False), "trainyard:addons.cilium.enabled", "only CNI"),
    ("ceph-replicas-vs-nodes", _set("addons.rookCeph.replicas", 4), "trainyard:addons.rookCeph.replicas", "minSize"),
    ("prod-unprotected", _set("protect", False), "trainyard:protect", "always protected"),
    ("prod-force-destroy", _set("buckets.forceDestroy", True), "trainyard:buckets.forceDestroy", "never"),
    ("zero-queue-weight", _set("tenants[0].weight", 0), "trainyard:tenants[0].weight", "greater than 0"),
    ("negative-queue-weight", _set("tenants[1].weight", -2), "trainyard:tenants[1].weight", "greater than 0"),
    ("two-default-tenants", _set("tenants[0].default", True), "trainyard:tenants[1].default", "at most one"),
    ("tenant-in-kube-system", _set("tenants[2].namespace", "kube-system"), "trainyard:tenants[2].namespace",
     "reserved"),
    ("bad-quantity", _set("tenants[0].capability.memory", "lots"), "trainyard:tenants[0].capability.memory",
     "quantity"),
    ("quota-below-capability", _set("tenants[0].quota.gpu", 8), "trainyard:tenants[0].quota.gpu", "below"),
    # research holds two of fleet's jobs, 1Ti and 10Gi of checkpoints.
    ("quota-storage-below-claims", _set("tenants[1].quota.storage", "1Ti"), "trainyard:tenants[1].quota.storage",
     "checkpoint claims"),
    ("quota-claims-below-jobs", _set("tenants[1].quota.claims", 1), "trainyard:tenants[1].quota.claims", "fewer"),
    ("job-unknown-tenant", _set("workloads[0].tenant", "marketing"), "trainyard:workloads[0].tenant",
     "unknown tenant"),
    ("job-unknown-pool", _set("workloads[0].nodePool", "h300"), "trainyard:workloads[0].nodePool", "unknown pool"),
    ("job-min-above-max", _set("workloads[1].minNodes", 5), "trainyard:workloads[1].minNodes", "greater than"),
    ("job-too-many-gpus", _set("workloads[0].gpusPerNode", 16), "trainyard:workloads[0].gpusPerNode", "between 1"),
    ("job-latest-image", _set("workloads[0].image", "ghcr.io/trainyard/trainer:latest"), "trainyard:workloads[0].image",
     "pinned"),
    ("job-bad-kind", _set("workloads[0].kind", "batch"), "trainyard:workloads[0].kind", "elastic"),
    ("mig-job-wrong-profile", _set("workloads[2].migProfile", "7g.80gb"), "trainyard:workloads[2].migProfile",
     "not a slice"),
    ("whole-gpu-job-on-mig-pool", _set("workloads[0].nodePool", "h100-mig"), "trainyard:workloads[0].nodePool",
     "partitions its GPUs"),
    ("job-on-system-pool", _set("workloads[0].nodePool", "system"), "trainyard:workloads[0].nodePool",
     "'gpu' pools"),
    ("missing-trainer-config", _set("workloads[0].trainerConfig", "nope.yaml"), "trainyard:workloads[0].trainerConfig",
     "workloads/configs"),
    ("smoke-on-two-nodes", _set("workloads[3].maxNodes", 2), "trainyard:workloads[3].maxNodes", "must be 1"),
    ("job-exceeds-pool", _set("workloads[1].maxNodes", 5), "trainyard:workloads[1].maxNodes", "exceeds pool"),
    ("volcano-off-with-jobs", _set("addons.volcano.enabled", False), "trainyard:addons.volcano.enabled",
     "Volcano jobs"),
    ("local-block-on-aws", _set("local", {"kubeconfigContext": "kind-x"}), "trainyard:local", "only allowed"),
    ("bad-retention", _set("addons.monitoring.retention", "30 days"), "trainyard:addons.monitoring.retention",
     "is not a retention"),
    ("autoscaling-on-smoke", _set("workloads[3].autoscaling", {"enabled": True}),
     "trainyard:workloads[3].autoscaling.enabled", "only 'elastic'"),
    ("dataset-without-alluxio", _set("addons.alluxio.enabled", False), "trainyard:workloads[0].dataset",
     "Alluxio"),
    ("bad-dataset-path", _set("workloads[0].dataset", "../etc"), "trainyard:workloads[0].dataset", "no '..'"),
    ("multi-node-without-cephfs", _set("addons.rookCeph.enabled", False), "trainyard:workloads[0].maxNodes",
     "ReadWriteMany"),
    ("bad-diag-level", _set("addons.gpuHealth.diagLevel", 5), "trainyard:addons.gpuHealth.diagLevel", "1, 2, 3 or 4"),
    ("health-memory-percent", _set("addons.gpuHealth.minMemoryPercent", 20),
     "trainyard:addons.gpuHealth.minMemoryPercent", "50"),
    ("health-wait-too-short", _set("addons.gpuHealth.waitMinutes", 1), "trainyard:addons.gpuHealth.waitMinutes",
     "5"),
    ("health-without-gpu-operator", _set("addons.gpuOperator.enabled", False), "trainyard:addons.gpuHealth.enabled",
     "GPU Operator"),
    # A node still being checked (30 min wait + the check) would be counted as stuck and failed.
    ("health-stuck-before-the-check-ends", _set("addons.gpuHealth.stuckMinutes", 45),
     "trainyard:addons.gpuHealth.stuckMinutes", "at least 60"),
    ("health-hold-too-long", _set("addons.gpuHealth.failedHoldHours", 500),
     "trainyard:addons.gpuHealth.failedHoldHours", "168"),
    ("cache-larger-than-storage-memory", _set("addons.alluxio.memoryCache", "200Gi"),
     "trainyard:addons.alluxio.memoryCache", "half of the smallest storage node"),
    # 64Gi fits half of an i4i.8xlarge alone; with a 70Gi direct-memory ceiling the worker's request does not.
    ("cache-jvm-larger-than-storage-memory", _set("addons.alluxio.workerDirectMemory", "70Gi"),
     "trainyard:addons.alluxio.memoryCache", "direct memory (70Gi, workerDirectMemory)"),
    ("bad-taint-effect", _set("nodePools[2].taints", [{"key": "dedicated", "effect": "Never"}]),
     "trainyard:nodePools[2].taints[0].effect", "NoSchedule"),
    ("tracking-db-single-zone-in-prod", _set("addons.mlflow.database.multiAz", False),
     "trainyard:addons.mlflow.database.multiAz", "second zone"),
    ("tracking-db-max-below-storage", _set("addons.mlflow.database.storageGib", 200),
     "trainyard:addons.mlflow.database.maxStorageGib", "below storageGib 200"),
    ("tracking-db-instance-class", _set("addons.mlflow.database.instanceClass", "t4g.medium"),
     "trainyard:addons.mlflow.database.instanceClass", "pattern"),
    ("tracking-db-no-backups", _set("addons.mlflow.database.backupRetentionDays", 0),
     "trainyard:addons.mlflow.database.backupRetentionDays", "greater than or equal to 1"),
    ("mlflow-no-server", _set("addons.mlflow.replicas", 0), "trainyard:addons.mlflow.replicas", "greater than"),
    # The tenant's MLflow user would be the admin, or its workspace one MLflow keeps (names.MLFLOW_RESERVED_NAMES).
    ("tenant-is-mlflow-admin", _set("tenants[2].name", "admin"), "trainyard:tenants[2].name", "MLflow keeps admin"),
    ("tenant-name-too-short-for-mlflow", _set("tenants[2].name", "x"), "trainyard:tenants[2].name",
     "under 2 characters"),
]


@pytest.mark.parametrize(("mutate", "path", "fragment"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_config_is_named_by_key_path(fleet: Raw, mutate: Callable[[Raw], None], path: str, fragment: str) -> None:
    raw = copy.deepcopy(fleet)
    mutate(raw)
    with pytest.raises(ConfigError) as caught:
        parse_settings(PROJECT, "fleet", raw)
    lines = [line for line in str(caught.value).splitlines() if line.startswith(f"  - {path}:")]
    assert lines, f"{path} not named in:\n{caught.value}"
    assert any(fragment in line for line in lines), f"{fragment!r} not in {lines}"


def test_there_are_at_least_thirty_distinct_cases() -> None:
    assert len({c[0] for c in CASES}) == len(CASES) >= 30


def test_every_problem_is_reported_at_once(fleet: Raw) -> None:
    raw = copy.deepcopy(fleet)
    for mutate in (_set("nodePools[1].minSize", 5), _set("network.vpcCidr", "10.0.0.0/8"),
                   _set("workloads[0].tenant", "nobody")):
        mutate(raw)
    with pytest.raises(ConfigError) as caught:
        parse_settings(PROJECT, "fleet", raw)
    paths = {p.path for p in caught.value.problems}
    assert {"nodePools[1].minSize", "network.vpcCidr", "workloads[0].tenant"} <= paths


@pytest.mark.parametrize("stack", available_stacks())
def test_shipped_stacks_are_valid(stack: str) -> None:
    settings = parse_settings(PROJECT, stack, _raw(stack))
    assert settings.stack == stack


def test_a_bad_stack_registers_no_resource(fleet: Raw) -> None:
    raw = copy.deepcopy(fleet)
    _set("nodePools[1].minSize", 5)(raw)
    values = {f"{PROJECT}:{k}": v if isinstance(v, str) else json.dumps(v) for k, v in raw.items()}
    recording = Recording()
    with pytest.raises(ConfigError):
        render(StackFile(stack="fleet", values=values, secret_keys=()), recording=recording)
    assert recording.resources == []


def test_cli_reports_without_traceback(tmp_path: Path, fleet: Raw) -> None:
    raw = copy.deepcopy(fleet)
    _set("nodePools[0].maxSize", 1)(raw)
    _set("nodePool", [])(raw)
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    config = {f"trainyard:{k}": v for k, v in raw.items()}
    (stacks / "Pulumi.broken.yaml").write_text(yaml.safe_dump({"config": config}))
    result = subprocess.run([sys.executable, "-m", "trainyard", "plan", "--stack", "broken", "--stacks-dir",
                             str(stacks)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "trainyard:nodePools[0].desiredSize" in result.stderr
    assert "trainyard:nodePool:" in result.stderr
    assert "nothing was created" in result.stderr


def test_a_malformed_value_does_not_hide_the_other_problems(fleet: Raw) -> None:
    raw = copy.deepcopy(fleet)
    for mutate in (_set("network.vpcCidr", "10.30.0.0/33"), _set("nodePool", []), _set("nodePools[1].minSize", 5),
                   _set("tenants[0].weight", 0)):
        mutate(raw)
    with pytest.raises(ConfigError) as caught:
        parse_settings(PROJECT, "fleet", raw)
    assert sorted(p.path for p in caught.value.problems) == [
        "network.vpcCidr", "nodePool", "nodePools[1].minSize", "tenants[0].weight"]


def test_a_malformed_value_without_default_stops_at_the_structure(fleet: Raw) -> None:
    raw = copy.deepcopy(fleet)
    _set("aws.region", "mars-1")(raw)
    _set("nodePools[1].minSize", 5)(raw)
    with pytest.raises(ConfigError) as caught:
        parse_settings(PROJECT, "fleet", raw)
    # The region has no default to check the rest against, so only the structural problem is certain.
    assert [p.path for p in caught.value.problems] == ["aws.region"]


@pytest.mark.parametrize("key", ["enabled", "repair"])
def test_gpu_health_is_refused_on_the_local_stack(key: str) -> None:
    raw = copy.deepcopy(_raw("laptop", OWNED_STACKS))
    raw["addons"]["gpuHealth"][key] = True
    with pytest.raises(ConfigError) as caught:
        parse_settings(PROJECT, "laptop", raw)
    assert f"  - trainyard:addons.gpuHealth.{key}: must be false for target 'local'" in str(caught.value)


def test_local_tracking_needs_its_database_operator() -> None:
    raw = copy.deepcopy(_raw("laptop", OWNED_STACKS))
    raw["addons"]["mlflow"] = {"enabled": True}
    raw["addons"]["cloudnativePg"] = {"enabled": False}
    with pytest.raises(ConfigError) as caught:
        parse_settings(PROJECT, "laptop", raw)
    assert "  - trainyard:addons.cloudnativePg.enabled: MLflow's database on target 'local'" in str(caught.value)
