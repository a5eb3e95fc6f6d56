"""How CI reaches an AWS stack's cluster (issue 9, item 11): stack config says it, placeholders are refused."""

from __future__ import annotations

from typing import Any

import pytest
from owned_stacks import FLEET, Stack, stack_raw, stacks_where
from trainyard.config import ConfigError
from trainyard.config.load import parse_settings
from trainyard.plan.runtime import PROJECT

# The tests' fleet, then every AWS stack stacks/ holds; the refusals edit the fleet (environment prod).
AWS = stacks_where(lambda s: s.is_aws)


def _problems(stack: str, raw: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_settings(PROJECT, stack, raw)
    return [line.removeprefix("  - ") for line in str(caught.value).splitlines() if line.startswith("  - ")]


def _outside_prod() -> dict[str, Any]:
    raw = stack_raw(FLEET)
    raw["environment"] = "staging"
    return raw


@pytest.mark.parametrize("stack", AWS)
def test_every_aws_stack_names_its_deploy_role_and_api_path(stack: Stack) -> None:
    settings = parse_settings(PROJECT, stack[0], stack_raw(stack))
    assert settings.deploy is not None
    assert settings.deploy.role_arn.startswith("arn:aws:iam::") and ":role/" in settings.deploy.role_arn
    if settings.deploy.api_access == "public":
        assert settings.network.public_access_cidrs
    else:
        assert settings.deploy.runner_cidrs and not settings.network.public_access_cidrs


@pytest.mark.parametrize("placeholder", ["203.0.113.0/24", "198.51.100.0/24", "192.0.2.0/24", "203.0.113.8/29"])
@pytest.mark.parametrize("stack", AWS)
def test_documentation_ranges_are_refused(stack: Stack, placeholder: str) -> None:
    raw = stack_raw(stack)
    raw["network"]["publicAccessCidrs"] = [placeholder]
    problems = _problems(stack[0], raw)
    assert any(p.startswith("trainyard:network.publicAccessCidrs[0]:") and "RFC 5737" in p for p in problems)


def test_open_endpoint_needs_an_explicit_yes_outside_prod() -> None:
    raw = _outside_prod()
    raw["network"]["publicAccessCidrs"] = ["0.0.0.0/0"]
    assert any("allowAnyPublicAccess" in p for p in _problems("fleet", raw))
    raw["network"]["allowAnyPublicAccess"] = True
    parse_settings(PROJECT, "fleet", raw)
    prod = stack_raw(FLEET)
    prod["network"].update(publicAccessCidrs=["0.0.0.0/0"], allowAnyPublicAccess=True)
    assert any("prod may not open" in p for p in _problems("fleet", prod))


@pytest.mark.parametrize(("change", "path", "fragment"), [
    (lambda r: r.pop("deploy"), "trainyard:deploy", "required"),
    (lambda r: r["network"].update(publicAccessCidrs=[]), "trainyard:network.publicAccessCidrs", "required"),
    (lambda r: r["deploy"].update(apiAccess="private"), "trainyard:network.publicAccessCidrs", "must be empty"),
    (lambda r: (r["deploy"].update(apiAccess="private"), r["network"].update(publicAccessCidrs=[])),
     "trainyard:deploy.runnerCidrs", "required"),
    (lambda r: r["deploy"].update(runnerCidrs=["10.200.0.0/24"]), "trainyard:deploy.runnerCidrs", "only used"),
    (lambda r: r["deploy"].update(roleArn="arn:aws:iam::111122223333:user/ci"), "trainyard:deploy.roleArn",
     "is not an IAM role ARN"),
    (lambda r: r["deploy"].update(roleArn=r["aws"]["adminPrincipalArns"][0]), "trainyard:deploy.roleArn",
     "list it once"),
], ids=["missing", "public-without-cidrs", "private-with-public", "private-without-runner", "runner-on-public",
        "not-a-role", "also-admin"])
def test_deploy_problems_name_their_key(change: Any, path: str, fragment: str) -> None:
    raw = stack_raw(FLEET)
    change(raw)
    problems = _problems("fleet", raw)
    assert any(p.startswith(f"{path}:") and fragment in p for p in problems), problems


def test_private_access_is_a_valid_choice() -> None:
    raw = stack_raw(FLEET)
    raw["network"]["publicAccessCidrs"] = []
    raw["deploy"].update(apiAccess="private", runnerCidrs=["10.200.0.0/24"],
                         runner={"labels": ["self-hosted", "linux", "trainyard-vpc"]})
    raw["deploy"].pop("preview", None)
    settings = parse_settings(PROJECT, "fleet", raw)
    assert settings.deploy is not None and settings.deploy.runner_cidrs == ["10.200.0.0/24"]


# ---------------------------------------------------------------------------- the runner reaches the endpoint
# GitHub's standard hosted runners have no fixed egress address and run outside the VPC (docs.github.com, "About
# GitHub-hosted runners"); static IPs are a larger-runner feature ("About larger runners"); a self-hosted runner
# may sit in the VPC.


def _private(raw: dict[str, Any]) -> None:
    raw["network"]["publicAccessCidrs"] = []
    raw["deploy"].update(apiAccess="private", runnerCidrs=["10.200.0.0/24"])


@pytest.mark.parametrize(("change", "path", "fragment"), [
    (lambda r: r["deploy"].pop("runner"), "trainyard:deploy.runner", "required"),
    (lambda r: r["deploy"].update(runner={"labels": ["ubuntu-24.04"]}), "trainyard:deploy.runner",
     "no fixed egress address"),
    (lambda r: r["deploy"].update(runner={"labels": ["ubuntu-latest"]}), "trainyard:deploy.runner",
     "no fixed egress address"),
    (lambda r: r["deploy"].update(runner={"labels": ["ubuntu-24.04-arm"]}), "trainyard:deploy.runner",
     "standard hosted runners"),
    (lambda r: (_private(r), r["deploy"].update(runner={"labels": ["trainyard-deploy"]})), "trainyard:deploy.runner",
     "only a self-hosted runner"),
    (lambda r: (_private(r), r["deploy"].update(runner={"labels": ["ubuntu-24.04"]})), "trainyard:deploy.runner",
     "outside the VPC"),
    (lambda r: r["deploy"].update(preview={"repository": "o/r", "runner": {"labels": ["ubuntu-24.04"]}}),
     "trainyard:deploy.preview.runner", "no fixed egress address"),
    (lambda r: r["deploy"].update(runner={"labels": ["bad label"]}), "trainyard:deploy.runner.labels[0]",
     "not a runner label"),
    (lambda r: r["deploy"].update(runner={"labels": []}), "trainyard:deploy.runner.labels", "at least 1"),
    (lambda r: r["deploy"].update(preview={"repository": "not-a-repo"}), "trainyard:deploy.preview.repository",
     "<owner>/<name>"),
], ids=["missing", "standard", "latest", "standard-arm", "larger-on-private", "standard-on-private",
        "preview-standard", "bad-label", "no-label", "bad-repository"])
def test_a_runner_that_cannot_reach_the_endpoint_is_refused(change: Any, path: str, fragment: str) -> None:
    raw = stack_raw(FLEET)
    change(raw)
    problems = _problems("fleet", raw)
    assert any(p.startswith(f"{path}:") and fragment in p for p in problems), problems


def test_runners_that_reach_the_endpoint_are_accepted() -> None:
    # A larger runner (an organisation's label, or a group) on the public endpoint; a self-hosted runner on either.
    for runner in ({"labels": ["linux-16-core-static"]}, {"group": "deployers", "labels": ["linux"]},
                   {"labels": ["self-hosted", "linux"]}):
        raw = stack_raw(FLEET)
        raw["deploy"]["runner"] = runner
        parse_settings(PROJECT, "fleet", raw)
    # A standard hosted runner reaches an endpoint open to everyone (outside prod, said explicitly).
    raw = _outside_prod()
    raw["deploy"]["runner"] = {"labels": ["ubuntu-24.04"]}
    raw["network"].update(publicAccessCidrs=["0.0.0.0/0"], allowAnyPublicAccess=True)
    parse_settings(PROJECT, "fleet", raw)
    # However the list spells "everyone" (review finding 8: the union, as every exposure rule judges it).
    raw["network"]["publicAccessCidrs"] = ["0.0.0.0/1", "128.0.0.0/1"]
    parse_settings(PROJECT, "fleet", raw)
