"""The fabric-check keys: refused by key path when the check could not run, silent where there is no EFA pool."""

from __future__ import annotations

from typing import Any

import pytest
from trainyard.config import ConfigError
from trainyard.config.load import decode_value, parse_settings
from trainyard.plan.runtime import PROJECT, read_stack

Raw = dict[str, Any]


def _raw(stack: str) -> Raw:
    return {k.split(":", 1)[1]: decode_value(v) for k, v in read_stack(stack).values.items()}


def _problems(raw: Raw, stack: str = "prod") -> dict[str, str]:
    with pytest.raises(ConfigError) as caught:
        parse_settings(PROJECT, stack, raw)
    return {p.path: p.message for p in caught.value.problems}


def test_every_efa_pool_is_checked_and_no_other() -> None:
    raw = _raw("prod")
    prod = parse_settings(PROJECT, "prod", raw)
    efa_pools = [p["name"] for p in raw["nodePools"] if p.get("efa")]
    assert efa_pools and [p.name for p in prod.fabric_checked_pools] == efa_pools
    for stack in ("dev", "local"):
        assert parse_settings(PROJECT, stack, _raw(stack)).fabric_checked_pools == []


def test_switching_it_off_checks_nothing() -> None:
    raw = _raw("prod")
    raw["fabricCheck"] = {"enabled": False}
    assert parse_settings(PROJECT, "prod", raw).fabric_checked_pools == []


def test_image_is_required_while_a_pool_has_efa() -> None:
    raw = _raw("staging")
    del raw["fabricCheck"]
    assert "required while a pool has efa" in _problems(raw, "staging")["fabricCheck.image"]


def test_image_must_be_pinned() -> None:
    raw = _raw("prod")
    raw["fabricCheck"]["image"] = "ghcr.io/trainyard/trainer:latest"
    assert "pinned" in _problems(raw)["fabricCheck.image"]


def test_the_checks_run_outside_every_tenant() -> None:
    """The checks have their own namespace and queue: no key chooses a tenant, and no tenant may take their names."""
    raw = _raw("prod")
    raw["fabricCheck"]["tenant"] = "research"
    assert "fabricCheck.tenant" in _problems(raw)
    raw = _raw("prod")
    raw["tenants"][0]["name"] = "fabric-check"
    assert "the fabric check's own queue and namespace" in _problems(raw)["tenants[0]"]
    raw = _raw("prod")
    raw["tenants"][0]["namespace"] = "trainyard-fabric-check"
    assert "the fabric check's own queue and namespace" in _problems(raw)["tenants[0]"]


def test_a_pool_of_one_node_cannot_be_checked() -> None:
    raw = _raw("staging")
    pool = next(i for i, p in enumerate(raw["nodePools"]) if p.get("efa"))
    raw["nodePools"][pool]["maxSize"] = 1
    raw["nodePools"][pool]["desiredSize"] = 1
    assert "at least 2" in _problems(raw, "staging")[f"nodePools[{pool}].maxSize"]


def test_check_job_names_neither_collide_nor_overflow() -> None:
    raw = _raw("prod")
    raw["workloads"][0]["name"] = "fabric-check-h100"
    assert "fabric check" in _problems(raw)["nodePools[2].name"]
    raw = _raw("prod")
    long_name = "h" * 45
    raw["nodePools"][2]["name"] = long_name
    for job in raw["workloads"]:
        if job.get("nodePool") == "h100":
            job["nodePool"] = long_name
    assert "longer than 52" in _problems(raw)["nodePools[2].name"]

