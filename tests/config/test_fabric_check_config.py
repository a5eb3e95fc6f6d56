"""The fabric-check keys: refused by key path when the check could not run, silent where there is no EFA pool."""

from __future__ import annotations

from typing import Any

import pytest
from owned_stacks import FLEET, Stack, every_stack, stack_file
from trainyard.config import ConfigError
from trainyard.config.load import decode_value, parse_settings
from trainyard.plan.runtime import PROJECT

Raw = dict[str, Any]


def _raw(stack: Stack = FLEET) -> Raw:
    """A stack's config as parse_settings takes it (a fresh copy each time: tests edit it)."""
    return {k.split(":", 1)[1]: decode_value(v) for k, v in stack_file(stack).values.items()}


def _problems(raw: Raw, stack: str = "fleet") -> dict[str, str]:
    return {path: messages[-1] for path, messages in _all_problems(raw, stack).items()}


def _all_problems(raw: Raw, stack: str) -> dict[str, list[str]]:
    with pytest.raises(ConfigError) as caught:
        parse_settings(PROJECT, stack, raw)
    found: dict[str, list[str]] = {}
    for problem in caught.value.problems:
        found.setdefault(problem.path, []).append(problem.message)
    return found


def _efa_pools(raw: Raw) -> list[tuple[int, dict[str, Any]]]:
    return [(i, pool) for i, pool in enumerate(raw["nodePools"]) if pool.get("efa")]


@pytest.mark.parametrize("stack", every_stack())
def test_every_efa_pool_is_checked_and_no_other(stack: Stack) -> None:
    raw = _raw(stack)
    efa = [pool["name"] for pool in raw.get("nodePools", []) if pool.get("efa")]
    expected = efa if raw.get("fabricCheck", {}).get("enabled", True) else []
    assert [p.name for p in parse_settings(PROJECT, stack[0], raw).fabric_checked_pools] == expected


def test_switching_it_off_checks_nothing() -> None:
    raw = _raw()
    raw["fabricCheck"] = {"enabled": False}
    assert parse_settings(PROJECT, "fleet", raw).fabric_checked_pools == []


def test_image_is_required_while_a_pool_has_efa() -> None:
    raw = _raw()
    del raw["fabricCheck"]
    assert "required while a pool has efa" in _problems(raw)["fabricCheck.image"]


def test_image_must_be_pinned() -> None:
    raw = _raw()
    raw["fabricCheck"]["image"] = "ghcr.io/trainyard/trainer:latest"
    assert "pinned" in _problems(raw)["fabricCheck.image"]


def test_the_checks_run_outside_every_tenant() -> None:
    """The checks have their own namespace and queue: no key chooses a tenant, and no tenant may take their names."""
    raw = _raw()
    raw["fabricCheck"]["tenant"] = "research"
    assert "fabricCheck.tenant" in _problems(raw)
    raw = _raw()
    raw["tenants"][0]["name"] = "fabric-check"
    assert "the fabric check's own queue and namespace" in _problems(raw)["tenants[0]"]
    raw = _raw()
    raw["tenants"][0]["namespace"] = "trainyard-fabric-check"
    assert "the fabric check's own queue and namespace" in _problems(raw)["tenants[0]"]


def test_a_pool_of_one_node_cannot_be_checked() -> None:
    raw = _raw()
    pool = next(i for i, p in enumerate(raw["nodePools"]) if p.get("efa"))
    raw["nodePools"][pool]["maxSize"] = 1
    raw["nodePools"][pool]["desiredSize"] = 1
    assert "at least 2" in _problems(raw)[f"nodePools[{pool}].maxSize"]


def test_check_job_names_neither_collide_nor_overflow() -> None:
    raw = _raw()
    index, pool = _efa_pools(raw)[0]
    raw["workloads"][0]["name"] = f"fabric-check-{pool['name']}"
    assert "fabric check" in _problems(raw)[f"nodePools[{index}].name"]
    raw = _raw()
    index, pool = _efa_pools(raw)[0]
    long_name = "h" * 45
    for job in raw["workloads"]:
        if job.get("nodePool") == pool["name"]:
            job["nodePool"] = long_name
    pool["name"] = long_name
    assert "longer than 52" in _problems(raw)[f"nodePools[{index}].name"]

