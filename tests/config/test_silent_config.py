"""Config that used to be dropped without a word: a namespace nobody reads, an empty zone list, a quota the queue
caps first. The first two are refused by key; the third is said as a warning (see rules.notices for why)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from owned_stacks import OWNED_STACKS
from trainyard.config import ConfigError
from trainyard.config.load import decode_value, parse_settings
from trainyard.config.rules import notices
from trainyard.plan.recording import Recording
from trainyard.plan.runtime import PROJECT, read_stack, render, settings_of


def _stack(tmp_path: Path, edit: Any) -> Path:
    """A copy of the tests' own stack with `edit(config)` applied."""
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    document = yaml.safe_load((OWNED_STACKS / "Pulumi.owned.yaml").read_text())
    edit(document["config"])
    (stacks / "Pulumi.owned.yaml").write_text(yaml.safe_dump(document, sort_keys=False))
    return stacks


def _problems(stacks: Path) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        settings_of(read_stack("owned", stacks))
    return str(caught.value).splitlines()[1:]


def test_the_owned_stack_is_valid_and_quiet() -> None:
    settings = settings_of(read_stack("owned", OWNED_STACKS))
    assert notices(settings) == []


@pytest.mark.parametrize(("key", "hint"), [
    ("trainyrd:buckets", "did you mean trainyard:buckets?"),
    ("awss:region", "did you mean aws:region?"),
    ("aws-native:region", "namespaces read: trainyard, aws (aws:region only), pulumi"),
    ("acme:anything", "namespaces read: trainyard, aws (aws:region only), pulumi"),
])
def test_an_unknown_namespace_is_refused_with_the_closest_one(tmp_path: Path, key: str, hint: str) -> None:
    stacks = _stack(tmp_path, lambda config: config.update({key: {"forceDestroy": True}}))
    (line,) = _problems(stacks)
    assert line.startswith(f"  - {key}: unknown config namespace {key.split(':')[0]!r}")
    assert hint in line


def test_pulumi_up_refuses_it_too_before_registering_anything(tmp_path: Path) -> None:
    stack = read_stack("owned", _stack(tmp_path, lambda config: config.update({"trainyrd:buckets": {}})))
    recording = Recording()
    with pytest.raises(ConfigError, match=r"trainyrd:buckets: unknown config namespace 'trainyrd'"):
        render(stack, recording=recording)  # the program's own load_settings, as `pulumi up` runs it
    assert recording.resources == []


def test_keys_something_reads_are_accepted(tmp_path: Path) -> None:
    keys = {"aws:region": "us-west-2", "pulumi:tags": {"team": "ml"}, "pulumi:disable-default-providers": ["*"]}
    stacks = _stack(tmp_path, lambda config: config.update(keys))
    assert settings_of(read_stack("owned", stacks)).stack == "owned"


# The program's providers are explicit, and an explicit provider reads no stack config (pulumi/pulumi-aws#1307).
@pytest.mark.parametrize(("key", "value", "instead"), [
    ("aws:profile", "prod", "set AWS_PROFILE where pulumi runs"),
    ("aws:allowedAccountIds", ["111122223333"], "set trainyard:aws.allowedAccountIds"),
    ("aws:defaultTags", {"tags": {"team": "ml"}}, "set trainyard:aws.tags"),
    ("aws:assumeRoles", [{"roleArn": "arn:aws:iam::111122223333:role/x"}], "from the environment"),
    ("kubernetes:context", "kind-other", "set trainyard:local.kubeconfigContext"),
    ("kubernetes:enableServerSideApply", "true", "the kubeconfig the program builds"),
])
def test_a_provider_key_no_provider_reads_is_refused_with_what_to_set(tmp_path: Path, key: str, value: Any,
                                                                       instead: str) -> None:
    (line,) = _problems(_stack(tmp_path, lambda config: config.update({key: value})))
    namespace = key.split(":")[0]
    assert line.startswith(f"  - {key}: the program's {namespace} provider is explicit and reads no stack config")
    assert instead in line


def test_a_random_key_is_refused_as_reaching_nothing(tmp_path: Path) -> None:
    (line,) = _problems(_stack(tmp_path, lambda config: config.update({"random:unused": "x"})))
    assert line == "  - random:unused: pulumi-random has no provider settings, so this would reach nothing"


def _allowed(accounts: list[Any]) -> Any:
    return lambda config: config["trainyard:aws"].update(allowedAccountIds=accounts)


def test_allowed_accounts_must_hold_the_deploy_roles_account(tmp_path: Path) -> None:
    (line,) = _problems(_stack(tmp_path, _allowed(["444455556666"])))
    assert line == ("  - trainyard:aws.allowedAccountIds: does not hold deploy.roleArn's account '111122223333': "
                    "the provider would refuse every deployment with that role's credentials")


def test_an_unquoted_account_id_is_refused_by_key(tmp_path: Path) -> None:
    (line,) = _problems(_stack(tmp_path, _allowed([111122223333])))
    assert line.startswith("  - trainyard:aws.allowedAccountIds[0]: ")
    assert "111122223333 is not an AWS account ID: write its 12 digits in quotes" in line


def test_allowed_accounts_reach_the_programs_aws_provider(tmp_path: Path) -> None:
    recording = render(read_stack("owned", _stack(tmp_path, _allowed(["111122223333"]))))
    (provider,) = [r for r in recording.resources if r.type == "pulumi:providers:aws"]
    assert json.loads(provider.inputs["allowedAccountIds"]) == ["111122223333"]


def test_the_unknown_namespace_is_reported_with_the_other_problems(tmp_path: Path) -> None:
    def edit(config: dict[str, Any]) -> None:
        config["trainyrd:buckets"] = {}
        config["trainyard:tenants"][0]["weight"] = 0
    lines = _problems(_stack(tmp_path, edit))
    assert [line.split(":", 2)[:2] for line in lines] == [["  - trainyrd", "buckets"],
                                                          ["  - trainyard", "tenants[0].weight"]]


def test_empty_zones_are_refused_by_key(tmp_path: Path) -> None:
    stacks = _stack(tmp_path, lambda config: config["trainyard:nodePools"][2].update(zones=[]))
    (line,) = _problems(stacks)
    assert line.startswith("  - trainyard:nodePools[2].zones: is empty")
    assert "leave zones out for every zone of aws.availabilityZones" in line


def _raw(stacks: Path) -> dict[str, Any]:
    values = read_stack("owned", stacks).values
    return {k.split(":", 1)[1]: decode_value(v) for k, v in values.items() if k.startswith(f"{PROJECT}:")}


def test_a_quota_above_the_queue_capability_is_a_notice_per_resource(tmp_path: Path) -> None:
    def edit(config: dict[str, Any]) -> None:
        config["trainyard:tenants"][0]["quota"].update(gpu=24, memory="8Ti")
    settings = parse_settings(PROJECT, "owned", _raw(_stack(tmp_path, edit)))
    assert [(n.path, n.message.split(":")[0]) for n in notices(settings)] == [
        ("tenants[0].quota.gpu", "24 is above the queue capability 16"),
        ("tenants[0].quota.memory", "8Ti is above the queue capability 4096Gi"),
    ]


def test_no_notice_where_either_side_is_unlimited(tmp_path: Path) -> None:
    def edit(config: dict[str, Any]) -> None:
        config["trainyard:tenants"][1]["quota"] = {"gpu": 32, "cpu": "64"}  # capability sets gpu only
        config["trainyard:tenants"][0]["quota"].update(gpu=0)
    settings = parse_settings(PROJECT, "owned", _raw(_stack(tmp_path, edit)))
    assert [n.path for n in notices(settings)] == ["tenants[1].quota.gpu"]


@pytest.mark.slow
def test_the_plan_prints_the_notice_as_a_warning(tmp_path: Path) -> None:
    stacks = _stack(tmp_path, lambda config: config["trainyard:tenants"][0]["quota"].update(gpu=24))
    result = subprocess.run([sys.executable, "-m", "trainyard", "plan", "--stack", "owned", "--quiet",
                             "--stacks-dir", str(stacks)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert ("warning: trainyard:tenants[0].quota.gpu: 24 is above the queue capability 16: the tenant's queued jobs "
            "stop at 16") in result.stderr
