"""Values AWS, Kubernetes or the platform would reject are refused offline; values they accept are accepted."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from owned_stacks import FLEET, stack_raw
from trainyard.config import ConfigError, rules
from trainyard.config.load import parse_settings, platform_namespaces
from trainyard.config.mig import load_mig_catalog
from trainyard.paths import TRAINER_CONFIGS_DIR
from trainyard.plan.runtime import PROJECT

Raw = dict[str, Any]


@pytest.fixture(scope="module")
def fleet() -> Raw:
    """The tests' own prod-environment stack: the cases below name its pools, tenants and jobs by index."""
    return stack_raw(FLEET)


def _problems(raw: Raw, stack: str = "fleet", aws_region: str | None = None) -> list[str]:
    try:
        parse_settings(PROJECT, stack, raw, aws_region=aws_region)
    except ConfigError as error:
        return str(error).splitlines()[1:]
    return []


def _job(key: str, value: Any) -> Callable[[Raw], None]:
    return lambda raw: raw["workloads"][0].__setitem__(key, value)


def _pool(i: int, key: str, value: Any) -> Callable[[Raw], None]:
    return lambda raw: raw["nodePools"][i].__setitem__(key, value)


def _tenant(i: int, key: str, value: Any) -> Callable[[Raw], None]:
    return lambda raw: raw["tenants"][i].__setitem__(key, value)


def _at(section: str, key: str, value: Any) -> Callable[[Raw], None]:
    return lambda raw: raw.setdefault(section, {}).__setitem__(key, value)


def _quota(**change: str) -> Callable[[Raw], None]:
    """The first tenant's quota: its capability with `change` (the fleet's tenants set none)."""
    def apply(raw: Raw) -> None:
        tenant = raw["tenants"][0]
        tenant["quota"] = {**tenant["capability"], **change}
    return apply


# (id, mutation of the fleet, key path named, fragment of the message)
REFUSED: list[tuple[str, Callable[[Raw], None], str, str]] = [
    # 1. trainerConfig names a file of workloads/configs/, never a path.
    ("config-absolute", _job("trainerConfig", "/etc/os-release"), "workloads[0].trainerConfig", "no folders"),
    ("config-dotdot", _job("trainerConfig", "../../pyproject.toml"), "workloads[0].trainerConfig", "no folders"),
    ("config-subfolder", _job("trainerConfig", "configs/tiny.yaml"), "workloads[0].trainerConfig", "no folders"),
    ("config-dotdot-yaml", _job("trainerConfig", "../configs/tiny.yaml"), "workloads[0].trainerConfig",
     "available: " + ", ".join(sorted(p.name for p in TRAINER_CONFIGS_DIR.glob("*.yaml")))),
    ("config-hidden", _job("trainerConfig", ".tiny.yaml"), "workloads[0].trainerConfig", "no folders"),
    ("config-not-yaml", _job("trainerConfig", "README.md"), "workloads[0].trainerConfig", "available:"),
    ("config-backslash", _job("trainerConfig", "..\\..\\x.yaml"), "workloads[0].trainerConfig", "no folders"),
    ("config-home", _job("trainerConfig", "~/.aws/credentials"), "workloads[0].trainerConfig", "no folders"),
    # 5. names and numbers AWS or Kubernetes would reject.
    ("pool-name-long", _pool(0, "name", "s" * 50), "nodePools[0].name", "EKS node group name"),
    ("label-value-space", _pool(2, "labels", {"team": "ml platform"}), "nodePools[2].labels.team", "label value"),
    ("label-value-bang", _pool(2, "labels", {"team": "ml!"}), "nodePools[2].labels.team", "label value"),
    ("label-value-long", _pool(2, "labels", {"team": "a" * 64}), "nodePools[2].labels.team", "label value"),
    ("label-value-dash-end", _pool(2, "labels", {"team": "ml-"}), "nodePools[2].labels.team", "label value"),
    ("taint-value-space", _pool(2, "taints", [{"key": "k", "value": "a b"}]), "nodePools[2].taints[0].value",
     "label value"),
    ("tag-key-aws", lambda r: r["aws"]["tags"].update({"aws:cost": "x"}), "aws.tags", "reserved 'aws:'"),
    ("tag-key-AWS", lambda r: r["aws"]["tags"].update({"AWS:cost": "x"}), "aws.tags", "reserved 'aws:'"),
    ("tag-key-long", lambda r: r["aws"]["tags"].update({"k" * 129: "x"}), "aws.tags", "tag key"),
    ("tag-value-bad", lambda r: r["aws"]["tags"].update({"team": "a;b"}), "aws.tags.team", "tag value"),
    ("max-size-huge", _pool(0, "maxSize", 4294967296), "nodePools[0].maxSize", "less than or equal to 450"),
    ("max-size-bool", _pool(0, "maxSize", True), "nodePools[0].maxSize", "valid integer"),
    ("min-size-bool", _pool(1, "minSize", False), "nodePools[1].minSize", "valid integer"),
    ("max-size-float", _pool(0, "maxSize", 2.5), "nodePools[0].maxSize", "valid integer"),
    ("max-size-text", _pool(0, "maxSize", "3"), "nodePools[0].maxSize", "valid integer"),
    ("weight-huge", _tenant(0, "weight", 10**9), "tenants[0].weight", "less than or equal to 1000"),
    ("weight-bool", _tenant(0, "weight", True), "tenants[0].weight", "valid integer"),
    ("gpus-bool", _job("gpusPerNode", True), "workloads[0].gpusPerNode", "valid integer"),
    ("max-nodes-huge", _job("maxNodes", 10**7), "workloads[0].maxNodes", "less than or equal to"),
    ("efa-as-number", _pool(2, "efa", 1), "nodePools[2].efa", "valid boolean"),
    ("efa-as-word", _pool(2, "efa", "yes"), "nodePools[2].efa", "valid boolean"),
    ("protect-as-word", lambda r: r.update(protect="yes"), "protect", "valid boolean"),
    ("quantity-bool", lambda r: r["tenants"][0]["capability"].update(cpu=True), "tenants[0].capability.cpu",
     "valid string"),
    ("too-many-pools", lambda r: r["nodePools"].extend([copy.deepcopy(r["nodePools"][2])] * 40), "nodePools",
     "at most 30"),
    ("too-many-labels", _pool(2, "labels", {f"k{i}": "v" for i in range(60)}), "nodePools[2].labels",
     "at most 50"),
    # 6. rules of the platform.
    ("service-cidr-public", _at("network", "serviceCidr", "8.8.0.0/16"), "network.serviceCidr", "between /12 and /24"),
    ("service-cidr-too-big", _at("network", "serviceCidr", "10.0.0.0/8"), "network.serviceCidr", "between /12"),
    ("service-cidr-too-small", _at("network", "serviceCidr", "172.20.0.0/25"), "network.serviceCidr",
     "between /12"),
    ("service-cidr-cgnat", _at("network", "serviceCidr", "100.64.0.0/16"), "network.serviceCidr", "10.0.0.0/8"),
    ("one-az", lambda r: r["aws"].update(availabilityZones=["us-west-2a"]), "aws.availabilityZones",
     "at least 2 items"),
    ("tenant-in-monitoring", _tenant(2, "namespace", "monitoring"), "tenants[2].namespace", "reserved"),
    ("tenant-in-rook-ceph", _tenant(2, "namespace", "rook-ceph"), "tenants[2].namespace", "reserved"),
    ("tenant-in-volcano", _tenant(2, "namespace", "volcano-system"), "tenants[2].namespace", "reserved"),
    ("tenant-in-data", _tenant(2, "namespace", "trainyard-data"), "tenants[2].namespace", "reserved"),
    ("tenant-named-gpu-operator", lambda r: r["tenants"][2].update(name="gpu-operator", namespace=None),
     "tenants[2].name", "reserved"),
    ("quota-cpu-below", _quota(cpu="100"), "tenants[0].quota.cpu", "below"),
    ("quota-memory-below", _quota(memory="1Ti"), "tenants[0].quota.memory", "below"),
    ("quota-memory-units", _quota(memory="24000G"), "tenants[0].quota.memory", "below"),
    # 7. confusing messages become clear ones.
    ("k8s-version-float-typo", _at("cluster", "kubernetesVersion", 1.3), "cluster.kubernetesVersion",
     "write the version quoted"),
]


@pytest.mark.parametrize(("mutate", "path", "fragment"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_refused_with_the_key_named(fleet: Raw, mutate: Callable[[Raw], None], path: str, fragment: str) -> None:
    raw = copy.deepcopy(fleet)
    mutate(raw)
    lines = [line for line in _problems(raw) if line.startswith(f"  - trainyard:{path}")]
    assert lines, f"{path} not named in {_problems(raw)}"
    assert any(fragment in line for line in lines), lines


@pytest.mark.parametrize(("stack", "fragment"), [
    ("Prod_EU", "lowercase"), ("prod.eu", "lowercase"), ("-prod", "lowercase"), ("x" * 45, "too long"),
    ("abcdefghijk", "EventBridge rule name"),
])
def test_a_stack_name_that_makes_invalid_aws_names_is_refused(fleet: Raw, stack: str, fragment: str) -> None:
    lines = _problems(copy.deepcopy(fleet), stack=stack)
    assert any(line.startswith("  - (stack name):") and fragment in line for line in lines), lines


def test_the_longest_accepted_stack_name_is_accepted(fleet: Raw) -> None:
    assert _problems(copy.deepcopy(fleet), stack="a" * 10) == []


def test_aws_region_must_agree_with_the_stack_region(fleet: Raw) -> None:
    assert _problems(copy.deepcopy(fleet), aws_region="us-west-2") == []
    lines = _problems(copy.deepcopy(fleet), aws_region="us-east-1")
    assert any("trainyard:aws.region" in line and "aws:region 'us-east-1'" in line for line in lines), lines


def test_platform_namespaces_come_from_the_catalogue() -> None:
    taken = platform_namespaces()
    assert {"monitoring", "rook-ceph", "gpu-operator", "volcano-system", "trainyard-data"} <= taken


def test_a_trainer_config_linking_out_of_the_folder_is_refused(tmp_path: Path, fleet: Raw) -> None:
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / "tiny.yaml").write_text("x: 1\n")
    (configs / "escape.yaml").symlink_to("/etc/os-release")
    settings = parse_settings(PROJECT, "fleet", copy.deepcopy(fleet))
    job = settings.workloads[0].model_copy(update={"trainer_config": "escape.yaml"})
    problems = rules.check(settings.model_copy(update={"workloads": [job]}), load_mig_catalog(), configs)
    assert [p.path for p in problems if "escape.yaml" in p.message] == ["workloads[0].trainerConfig"]
    assert rules.check(settings.model_copy(update={"workloads": [job.model_copy(
        update={"trainer_config": "tiny.yaml"})]}), load_mig_catalog(), configs) == []
    assert TRAINER_CONFIGS_DIR.is_dir()


# Valid configs that were refused or confusing.
ACCEPTED: list[tuple[str, Callable[[Raw], None], Callable[[Any], bool]]] = [
    ("cpu-unquoted", lambda r: r["tenants"][0]["capability"].update(cpu=2304),
     lambda s: s.tenants[0].capability.cpu == "2304"),
    ("cpu-fraction", lambda r: r["tenants"][2]["capability"].update(cpu=0.5),
     lambda s: s.tenants[2].capability.cpu == "0.5"),
    ("memory-unquoted-bytes", lambda r: r["tenants"][2]["capability"].update(memory=1073741824),
     lambda s: s.tenants[2].capability.memory == "1073741824"),
    ("k8s-version-unquoted", _at("cluster", "kubernetesVersion", 1.34),
     lambda s: s.cluster.kubernetes_version == "1.34"),
    ("k8s-version-133-unquoted", _at("cluster", "kubernetesVersion", 1.33),
     lambda s: s.cluster.kubernetes_version == "1.33"),
    ("desired-defaults-to-min", lambda r: r["nodePools"][0].pop("desiredSize"),
     lambda s: s.node_pools[0].desired_size == s.node_pools[0].min_size > 0),
    ("desired-gpu-pool-defaults-to-zero", lambda r: r["nodePools"][2].pop("desiredSize"),
     lambda s: s.node_pools[2].desired_size == 0),
    ("protect-text-true", lambda r: r.update(protect="true"), lambda s: s.protect is True),
    ("label-value-empty", _pool(2, "labels", {"team": ""}), lambda s: s.node_pools[2].labels == {"team": ""}),
    ("tag-with-colon", lambda r: r["aws"]["tags"].update({"cost:center": "ml/1"}),
     lambda s: s.aws.tags["cost:center"] == "ml/1"),
    ("service-cidr-24", _at("network", "serviceCidr", "192.168.10.0/24"),
     lambda s: s.network.service_cidr == "192.168.10.0/24"),
    ("service-cidr-12", _at("network", "serviceCidr", "172.16.0.0/12"),
     lambda s: s.network.service_cidr == "172.16.0.0/12"),
]


@pytest.mark.parametrize(("mutate", "holds"), [c[1:] for c in ACCEPTED], ids=[c[0] for c in ACCEPTED])
def test_accepted(fleet: Raw, mutate: Callable[[Raw], None], holds: Callable[[Any], bool]) -> None:
    raw = copy.deepcopy(fleet)
    mutate(raw)
    assert holds(parse_settings(PROJECT, "fleet", raw))


def test_every_case_class_has_several_cases() -> None:
    assert len(REFUSED) >= 40 and len(ACCEPTED) >= 10
