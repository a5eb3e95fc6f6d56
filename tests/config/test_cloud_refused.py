"""Issue 24: public exposure judged by the addresses a list opens, full-match checks, and values AWS, Kubernetes or
Karpenter would refuse (or that could never run) refused offline, each naming its key.

Every case mutates a stack the tests own (tests/fixtures/stacks), finding what it changes by role and kind.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
from owned_stacks import OWNED_STACKS, Stack, sample_stacks, stack_file
from trainyard.config import ConfigError
from trainyard.config.exposure import internet_addresses, opens_to_anyone
from trainyard.config.load import decode_value, parse_settings
from trainyard.plan.runtime import PROJECT, read_stack

Raw = dict[str, Any]
Change = Callable[[Raw], str]  # mutates the raw stack, returns the key path the problem must name


def _raw(stack: str) -> Raw:
    """An owned stack's config: `fleet`, `laptop`, or `fleet-dev` (the fleet as a dev environment)."""
    name, _, environment = stack.partition("-")
    raw = _decoded((name, OWNED_STACKS))
    return {**raw, "environment": environment} if environment else raw


def _decoded(stack: Stack) -> Raw:
    return {k.split(":", 1)[1]: decode_value(v) for k, v in stack_file(stack).values.items()}


def _problems(raw: Raw, stack: str) -> list[str]:
    try:
        parse_settings(PROJECT, stack, raw)
    except ConfigError as error:
        return [line.removeprefix("  - ") for line in str(error).splitlines()[1:]]
    return []


def _index(raw: Raw, section: str, test: Callable[[Raw], bool]) -> int:
    return next(i for i, item in enumerate(raw[section]) if test(item))


def _pool(role: str, *, mig: bool | None = None, efa: bool | None = None) -> Callable[[Raw], int]:
    def find(raw: Raw) -> int:
        return _index(raw, "nodePools", lambda p: p["role"] == role
                      and (mig is None or ("migLayout" in p) == mig) and (efa is None or bool(p.get("efa")) == efa))
    return find


def refused(stack: str, change: Change, fragment: str) -> None:
    raw = copy.deepcopy(_raw(stack))
    path = change(raw)
    problems = _problems(raw, stack)
    named = [p for p in problems if p.startswith(f"{PROJECT}:{path}")]
    assert named and any(fragment in p for p in named), (path, fragment, problems)


def accepted(stack: str, change: Change) -> None:
    raw = copy.deepcopy(_raw(stack))
    change(raw)
    assert _problems(raw, stack) == []


# ---- public exposure: the union of the CIDRs ---------------------------------------------------------------------

SPLITS = {
    "halves": ["0.0.0.0/1", "128.0.0.0/1"],
    "most-of-ipv4": ["0.0.0.0/1", "128.0.0.0/2", "192.0.0.0/3"],
    "one-half": ["0.0.0.0/1"],
    "sixteen-eighths": [f"{i * 16}.0.0.0/4" for i in range(14)],
    "netmask-spelling": ["0.0.0.0/0.0.0.0"],
    "two-eighths": ["11.0.0.0/8", "12.0.0.0/8"],
    "duplicates-hide-nothing": ["0.0.0.0/2", "0.0.0.0/2", "64.0.0.0/2", "128.0.0.0/2", "192.0.0.0/2"],
}


def _public(cidrs: list[str]) -> Change:
    def change(raw: Raw) -> str:
        raw["network"]["publicAccessCidrs"] = cidrs
        raw["network"].pop("allowAnyPublicAccess", None)
        # An entry that opens it alone is named by its index; a list that opens it only together, as a whole.
        alone = [i for i, c in enumerate(cidrs) if opens_to_anyone([c])]
        return f"network.publicAccessCidrs[{alone[0]}]:" if alone else "network.publicAccessCidrs:"
    return change


@pytest.mark.parametrize("cidrs", SPLITS.values(), ids=SPLITS.keys())
@pytest.mark.parametrize("stack", ["fleet", "fleet-dev"])
def test_a_split_open_endpoint_is_refused_like_0_0_0_0_0(stack: str, cidrs: list[str]) -> None:
    refused(stack, _public(cidrs), "prod may not open" if stack == "fleet" else "allowAnyPublicAccess")


def test_outside_prod_allow_any_public_access_still_means_it() -> None:
    def change(raw: Raw) -> str:
        _public(SPLITS["halves"])(raw)
        raw["network"]["allowAnyPublicAccess"] = True
        return ""
    accepted("fleet-dev", change)


@pytest.mark.parametrize("cidrs", [["52.34.18.0/28"], ["52.0.0.0/8"], ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"],
                                   [f"52.34.{i}.0/24" for i in range(40)]])
def test_real_allow_lists_are_accepted(cidrs: list[str]) -> None:
    accepted("fleet", lambda raw: (raw["network"].__setitem__("publicAccessCidrs", cidrs), "")[1])


def test_private_runner_ranges_are_judged_the_same_way() -> None:
    def private(cidrs: list[str]) -> Change:
        def change(raw: Raw) -> str:
            # A private endpoint is reached from a self-hosted runner in (or routed to) the VPC (config/rules.py
            # runner_problem), previews included.
            self_hosted = {"labels": ["self-hosted", "trainyard-vpc"]}
            raw["deploy"].update(apiAccess="private", runnerCidrs=cidrs, runner=self_hosted)
            raw["deploy"].get("preview", {}).pop("runner", None)
            raw["network"]["publicAccessCidrs"] = []
            return "deploy.runnerCidrs"
        return change
    refused("fleet", private(["0.0.0.0/1", "128.0.0.0/1"]), "private API endpoint's security group")
    accepted("fleet", private(["10.200.0.0/16"]))


def test_the_union_counts_internet_addresses_once() -> None:
    assert internet_addresses(["0.0.0.0/0"]) == internet_addresses(SPLITS["halves"]) \
        == internet_addresses(SPLITS["most-of-ipv4"])
    assert internet_addresses(["10.0.0.0/8", "10.0.0.0/9", "192.168.0.0/16"]) == 0
    assert internet_addresses(["52.34.18.0/28", "52.34.18.0/29"]) == 16
    assert not opens_to_anyone(["1.0.0.0/8"]) and opens_to_anyone(["1.0.0.0/8", "2.0.0.0/32"])


# ---- full matches: a trailing newline is part of the value --------------------------------------------------------

def _set(path: Callable[[Raw], tuple[Any, str, str]], value: Any) -> Change:
    def change(raw: Raw) -> str:
        container, key, shown = path(raw)
        container[key] = value
        return shown
    return change


def _job_key(key: str) -> Callable[[Raw], tuple[Any, str, str]]:
    return lambda raw: (raw["workloads"][0], key, f"workloads[0].{key}")


NEWLINES: dict[str, Change] = {
    "tenant-name": lambda raw: (raw["tenants"][0].__setitem__("name", raw["tenants"][0]["name"] + "\n"),
                                "tenants[0].name")[1],
    "image-latest": _set(_job_key("image"), "ghcr.io/trainyard/trainer:latest\n"),
    "image-tag": _set(_job_key("image"), "ghcr.io/trainyard/trainer:0.1.0\n"),
    "trainer-config": _set(_job_key("trainerConfig"), "tiny.yaml\n"),
    "dataset": _set(_job_key("dataset"), "successor-v1\n"),
    "region": lambda raw: (raw["aws"].__setitem__("region", raw["aws"]["region"] + "\n"), "aws.region")[1],
    "role-arn": lambda raw: (raw["deploy"].__setitem__("roleArn", raw["deploy"]["roleArn"] + "\n"),
                             "deploy.roleArn")[1],
    "admin-arn": lambda raw: (raw["aws"]["adminPrincipalArns"].__setitem__(0, raw["aws"]["adminPrincipalArns"][0]
                                                                          + "\n"), "aws.adminPrincipalArns[0]")[1],
    "retention": lambda raw: (raw["addons"]["monitoring"].__setitem__("retention", "30d\n"),
                              "addons.monitoring.retention")[1],
    "tag-value": lambda raw: (raw["aws"]["tags"].__setitem__("team", "ml\n"), "aws.tags.team")[1],
}


def _label(value: str) -> Change:
    def change(raw: Raw) -> str:
        i = _pool("system")(raw)
        raw["nodePools"][i]["labels"] = {"team": value}
        return f"nodePools[{i}].labels.team"
    return change


NEWLINES["label-value"] = _label("ml\n")


def _label_key(key: str) -> Change:
    def change(raw: Raw) -> str:
        i = _pool("system")(raw)
        raw["nodePools"][i]["labels"] = {key: "x"}
        return f"nodePools[{i}].labels"
    return change


NEWLINES["label-key"] = _label_key("team\n")


@pytest.mark.parametrize("change", NEWLINES.values(), ids=NEWLINES.keys())
def test_a_value_with_a_trailing_newline_is_refused(change: Change) -> None:
    raw = copy.deepcopy(_raw("fleet"))
    path = change(raw)
    problems = _problems(raw, "fleet")
    assert any(p.startswith(f"{PROJECT}:{path}") for p in problems), (path, problems)


def test_a_stack_name_with_a_newline_is_unknown() -> None:
    with pytest.raises(ValueError, match="unknown stack"):
        read_stack("fleet\n", OWNED_STACKS)


# ---- values the cloud refuses ------------------------------------------------------------------------------------

def _arn(path: str, value: str) -> Change:
    def change(raw: Raw) -> str:
        if path == "deploy.roleArn":
            raw["deploy"]["roleArn"] = value
        else:
            raw["aws"]["adminPrincipalArns"][0] = value
        return path
    return change


ROLE = "arn:aws:iam::111122223333:role/"
ARNS = {
    "bogus-partition": ("arn:aws-bogus:iam::111122223333:role/deploy", "is no AWS partition"),
    "china-partition": ("arn:aws-cn:iam::111122223333:role/deploy", "partition 'aws-cn'"),
    "govcloud-partition": ("arn:aws-us-gov:iam::111122223333:role/deploy", "partition 'aws-us-gov'"),
    "empty-partition": ("arn::iam::111122223333:role/deploy", "is not an IAM"),
    "name-65": (ROLE + "r" * 65, "65 characters; 1-64"),
    "path-and-name-65": (ROLE + "team/ci/" + "r" * 65, "65 characters; 1-64"),
    "cyrillic-a": (ROLE + "\u0430dmin", "is not an IAM"),
    "zero-width": (ROLE + "ad\u200bmin", "is not an IAM"),
    "short-account": ("arn:aws:iam::11112222333:role/deploy", "is not an IAM"),
    "empty-name": (ROLE, "is not an IAM"),
    "double-slash": ("arn:aws:iam::111122223333:role//deploy", "is not an IAM"),
    "sts-session": ("arn:aws:sts::111122223333:assumed-role/deploy/ci", "is not an IAM"),
}


@pytest.mark.parametrize(("value", "fragment"), ARNS.values(), ids=ARNS.keys())
@pytest.mark.parametrize("path", ["deploy.roleArn", "aws.adminPrincipalArns[0]"])
def test_an_arn_aws_would_refuse_is_named(path: str, value: str, fragment: str) -> None:
    refused("fleet", _arn(path, value), fragment)


@pytest.mark.parametrize("value", [ROLE + "r" * 64, ROLE + "team/ci/deploy", ROLE + "a+b=c,d.e@f_g-h"])
def test_an_arn_aws_accepts_is_accepted(value: str) -> None:
    accepted("fleet", _arn("deploy.roleArn", value))


@pytest.mark.parametrize(("region", "fragment"), [
    ("cn-north-1", "partition 'aws-cn'"), ("us-gov-west-1", "partition 'aws-us-gov'"),
    ("us-isob-east-1", "partition 'aws-iso-b'"), ("xx-north-1", "not an AWS region"), ("us-west-2 ", "not an AWS"),
])
def test_a_region_outside_the_programs_partition_is_refused(region: str, fragment: str) -> None:
    def change(raw: Raw) -> str:
        raw["aws"]["region"] = region
        return "aws.region"
    refused("fleet", change, fragment)


def _pool_labels(role: str, labels: dict[str, str], **which: bool) -> Change:
    def change(raw: Raw) -> str:
        i = _pool(role, **which)(raw)
        raw["nodePools"][i]["labels"] = labels
        key = next(iter(labels))
        return f"nodePools[{i}].labels" + ("" if "\n" in key else f".{key}")
    return change


GPU_LABELS_REFUSED = {
    "node-role": ("node-role.kubernetes.io/gpu", "domain Karpenter reserves"),
    "kubernetes-io": ("kubernetes.io/team", "domain Karpenter reserves"),
    "k8s-io": ("example.k8s.io/team", "domain Karpenter reserves"),
    "karpenter-sh": ("karpenter.sh/team", "domain Karpenter reserves"),
    "karpenter-aws": ("karpenter.k8s.aws/team", "domain Karpenter reserves"),
    "suffix-match": ("evilkubernetes.io/team", "domain Karpenter reserves"),
    "nodepool": ("karpenter.sh/nodepool", "set by Karpenter"),
    "hostname": ("kubernetes.io/hostname", "set by Karpenter"),
    "program-role": ("trainyard.io/role", "set by trainyard"),
}


@pytest.mark.parametrize(("key", "fragment"), GPU_LABELS_REFUSED.values(), ids=GPU_LABELS_REFUSED.keys())
def test_a_gpu_pool_label_karpenter_refuses_is_named(key: str, fragment: str) -> None:
    refused("fleet", _pool_labels("gpu", {key: "x"}, mig=False), fragment)


@pytest.mark.parametrize("key", ["node.kubernetes.io/team", "node-restriction.kubernetes.io/team", "kops.k8s.io/x",
                                 "example.com/team", "team", "topology.kubernetes.io/zone"])
def test_a_gpu_pool_label_karpenter_takes_is_accepted(key: str) -> None:
    value = "us-west-2a" if key.startswith("topology") else "x"
    accepted("fleet", _pool_labels("gpu", {key: value}, mig=False))


MANAGED_LABELS_REFUSED = {
    "node-role": ({"node-role.kubernetes.io/storage": "x"}, "the kubelet refuses"),
    "node-restriction": ({"node-restriction.kubernetes.io/x": "x"}, "the kubelet refuses"),
    "k8s-io": ({"k8s.io/x": "x"}, "the kubelet refuses"),
    "key-over-63": ({"example.com/" + "k" * 52: "x"}, "takes at most 63"),
    "empty-value": ({"example.com/team": ""}, "no empty label value"),
    "program-pool": ({"trainyard.io/pool": "x"}, "set by trainyard"),
}


@pytest.mark.parametrize(("labels", "fragment"), MANAGED_LABELS_REFUSED.values(), ids=MANAGED_LABELS_REFUSED.keys())
@pytest.mark.parametrize("role", ["system", "storage"])
def test_a_node_group_label_the_kubelet_or_eks_refuses_is_named(role: str, labels: dict[str, str],
                                                                fragment: str) -> None:
    refused("fleet", _pool_labels(role, labels), fragment)


@pytest.mark.parametrize("key", ["node.kubernetes.io/team", "kubelet.kubernetes.io/x", "example.com/team"])
def test_a_node_group_label_the_kubelet_takes_is_accepted(key: str) -> None:
    accepted("fleet", _pool_labels("system", {key: "x"}))


@pytest.mark.parametrize(("key", "fragment"), [
    ("example.com/" + "n" * 64, "64 characters; 1-63"),
    ("a" * 254 + "/team", "253"),
    ("a/b/c", "at most one '/'"),
    ("/team", "non-empty prefix"),
    ("Example.com/team", "no DNS subdomain"),
    ("team-", "starting and ending"),
])
def test_a_label_key_kubernetes_refuses_is_named(key: str, fragment: str) -> None:
    def change(raw: Raw) -> str:
        i = _pool("gpu", mig=False)(raw)
        raw["nodePools"][i]["labels"] = {key: "x"}
        return f"nodePools[{i}].labels"
    refused("fleet", change, fragment)


def _taints(role: str, taints: list[dict[str, str]], field: str = "", **which: bool) -> Change:
    def change(raw: Raw) -> str:
        i = _pool(role, **which)(raw)
        raw["nodePools"][i]["taints"] = taints
        return f"nodePools[{i}].taints[{len(taints) - 1}]{field}"
    return change


DEDICATED = {"key": "example.com/dedicated", "value": "ml", "effect": "NoSchedule"}


@pytest.mark.parametrize("role", ["system", "gpu"])
def test_a_repeated_taint_is_refused(role: str) -> None:
    refused("fleet", _taints(role, [DEDICATED, {**DEDICATED, "value": "other"}], mig=False) if role == "gpu"
            else _taints(role, [DEDICATED, DEDICATED]), "repeats taints[0]")
    accepted("fleet", _taints(role, [DEDICATED, {**DEDICATED, "effect": "NoExecute"}]))


@pytest.mark.parametrize("key", ["trainyard.io/gpu-health", "trainyard.io/gpu-health-failed",
                                 "node.cilium.io/agent-not-ready"])
def test_a_taint_the_platform_manages_is_refused(key: str) -> None:
    refused("fleet", _taints("gpu", [{"key": key, "value": "pending", "effect": "NoSchedule"}], ".key", mig=False),
            "the platform sets and removes itself")


def test_a_node_group_taint_key_over_63_is_refused() -> None:
    taint = {"key": "example.com/" + "t" * 52, "effect": "NoSchedule"}
    refused("fleet", _taints("storage", [taint], ".key"), "takes at most 63")
    accepted("fleet", _taints("gpu", [taint], mig=False))


@pytest.mark.parametrize("value", [True, False, 1.0, 2.5, "1"])
def test_diag_level_takes_a_whole_number_only(value: Any) -> None:
    def change(raw: Raw) -> str:
        raw.setdefault("addons", {}).setdefault("gpuHealth", {})["diagLevel"] = value
        return "addons.gpuHealth.diagLevel"
    refused("fleet", change, "whole number" if isinstance(value, bool | float) else "1, 2, 3 or 4")


def _gpu_operator_off(raw: Raw) -> None:
    raw.setdefault("addons", {}).update(gpuOperator={"enabled": False}, gpuHealth={"enabled": False})


def test_gpu_jobs_while_the_gpu_operator_is_off_would_hang() -> None:
    def change(raw: Raw) -> str:
        _gpu_operator_off(raw)
        return f"workloads[{_index(raw, 'workloads', lambda j: j.get('gpusPerNode', 0) > 0)}]"
    refused("fleet", change, "would hang Pending")

    def mig(raw: Raw) -> str:
        _gpu_operator_off(raw)
        return f"workloads[{_index(raw, 'workloads', lambda j: j['kind'] == 'mig')}]"
    refused("fleet", mig, "would hang Pending")

    def fabric(raw: Raw) -> str:
        _gpu_operator_off(raw)
        return f"nodePools[{_pool('gpu', efa=True)(raw)}].efa"
    refused("fleet", fabric, "fabric check takes whole GPUs")

    def layout(raw: Raw) -> str:
        _gpu_operator_off(raw)
        return f"nodePools[{_pool('gpu', mig=True)(raw)}].migLayout"
    refused("fleet", layout, "mig-manager")


def test_efa_on_a_mig_pool_would_hang_its_fabric_check() -> None:
    def change(raw: Raw) -> str:
        i = _pool("gpu", mig=True)(raw)
        raw["nodePools"][i]["efa"] = True
        return f"nodePools[{i}].efa"
    refused("fleet", change, "would hang Pending")

    def check_off(raw: Raw) -> str:
        change(raw)
        raw["fabricCheck"] = {"enabled": False}
        return ""
    assert not [p for p in _problems(_mutated("fleet", check_off), "fleet") if "would hang" in p]


def _mutated(stack: str, change: Change) -> Raw:
    raw = copy.deepcopy(_raw(stack))
    change(raw)
    return raw


@pytest.mark.parametrize(("key", "fragment"), [
    ("karpenter.sh/discovery", "pick subnets and security groups"),
    ("kubernetes.io/role/elb", "pick subnets and security groups"),
    ("kubernetes.io/cluster/trainyard-fleet", "pick subnets and security groups"),
    ("trainyard.io/stack", "trainyard sets on every resource"),
    ("managed-by", "trainyard sets on every resource"),
])
def test_a_stack_wide_tag_a_controller_discovers_by_is_refused(key: str, fragment: str) -> None:
    def change(raw: Raw) -> str:
        raw["aws"]["tags"][key] = "trainyard-fleet"
        return f"aws.tags.{key}"
    refused("fleet", change, fragment)
    accepted("fleet", lambda raw: (raw["aws"]["tags"].__setitem__("example.com/owner", "ml"), "")[1])


# ---- every key of a stack, given a hostile value, ends in the config report and never in a traceback ---------------

HOSTILE: list[Any] = [None, True, 0, -1, 10**12, 1.5, float("nan"), float("inf"), "", "x", "x\n", "\u0430", "a" * 300,
                      "../x", "*", "default", [], {}, ["a"], {"a": 1}]


def _leaves(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [path] if path else []
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        found += _leaves(value, (*path, key))
    return found


def _hostile_cases() -> list[tuple[str, Raw, tuple[Any, ...]]]:
    """Every key of the owned stacks, then each key a sample stack has that none of them has (list items alike)."""
    cases, seen = [], set()
    for name, raw in [("fleet", _raw("fleet")), ("laptop", _raw("laptop")),
                      *((stack[0], _decoded(stack)) for stack in sample_stacks())]:
        owned = name in ("fleet", "laptop")
        for path in _leaves(raw):
            kind = tuple("#" if isinstance(key, int) else key for key in path)
            if owned or kind not in seen:
                cases.append((name, raw, path))
            seen.add(kind)
    return cases


def test_a_hostile_value_anywhere_is_a_config_problem_not_a_crash() -> None:
    crashes = []
    for stack, base, path in _hostile_cases():
        for value in HOSTILE:
            raw = copy.deepcopy(base)
            node = raw
            for key in path[:-1]:
                node = node[key]
            node[path[-1]] = copy.deepcopy(value)
            try:
                parse_settings(PROJECT, stack, raw)
            except ConfigError:
                pass
            except Exception as error:  # noqa: BLE001 - the point: nothing but ConfigError may escape
                crashes.append(f"{stack}: {path} = {value!r}: {error!r}")
    assert crashes == []


@pytest.mark.parametrize(("stack", "kind"), [("fleet", "mig"), ("fleet", "elastic"), ("fleet", "smoke"),
                                             ("laptop", None)])
def test_a_shm_the_pods_memory_cannot_hold_is_named(stack: str, kind: str | None) -> None:
    def change(raw: Raw) -> str:
        i = _index(raw, "workloads", lambda j: kind is None or j["kind"] == kind)
        raw["workloads"][i]["shmSize"] = "4Ti"  # more than any node here has
        return f"workloads[{i}].shmSize"
    refused(stack, change, "leaves no memory in the pod's")
