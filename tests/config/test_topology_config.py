"""Stack config for network topology and reserved capacity: each wrong setting is named by its key path.

The mutations start from the tests' fleet stack (tests/fixtures/stacks) and find pools and jobs by what they are (an
EFA pool in a placement group, a spot pool, an autoscaling job), not by name or index.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
from owned_stacks import FLEET, stack_file
from trainyard.config import ConfigError
from trainyard.config.instance_types import INSTANCE_TYPES
from trainyard.config.load import decode_value, parse_settings
from trainyard.config.model import Settings
from trainyard.config.rules import co_located
from trainyard.plan.runtime import PROJECT

Raw = dict[str, Any]


@pytest.fixture(scope="module")
def fleet() -> Raw:
    return {k.split(":", 1)[1]: decode_value(v) for k, v in stack_file(FLEET).values.items()}


def _index(items: list[dict[str, Any]], test: Callable[[dict[str, Any]], bool], what: str) -> int:
    found = [i for i, item in enumerate(items) if test(item)]
    if not found:
        pytest.fail(f"the fleet stack has no {what} for this case")
    return found[0]


def _gpu_pool(raw: Raw, *, spot: bool) -> int:
    return _index(raw["nodePools"], lambda p: p["role"] == "gpu" and not p.get("migLayout") and p.get("efa", False)
                  and ("spot" in p.get("capacityTypes", ["on-demand"])) == spot, f"EFA pool (spot={spot})")


def _multi_node_job(raw: Raw, pool: int | None = None) -> int:
    """A multi-node elastic job, moved onto `pool` when given, with autoscaling off."""
    j = _index(raw["workloads"], lambda w: w["kind"] == "elastic" and w.get("maxNodes", 1) > 1, "multi-node job")
    job = raw["workloads"][j]
    job["autoscaling"] = {"enabled": False}
    if pool is not None:
        target = raw["nodePools"][pool]
        job["nodePool"] = target["name"]
        job["maxNodes"] = min(job["maxNodes"], target["maxSize"])
        job["minNodes"] = min(job.get("minNodes", 1), job["maxNodes"])
    return j


def _problems(raw: Raw) -> dict[str, str]:
    with pytest.raises(ConfigError) as caught:
        parse_settings(PROJECT, "fleet", raw)
    return {p.path: p.message for p in caught.value.problems}


def _reservation(pool: dict[str, Any], **extra: Any) -> dict[str, Any]:
    zone = (pool.get("zones") or ["us-west-2a"])[0]
    return {"id": "cr-0123456789abcdef0", "instanceType": pool["instanceTypes"][0], "zone": zone,
            "instanceCount": 1, **extra}


def _block(pool: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return _reservation(pool, **{"type": "capacity-block", "upfrontFeeUsd": 1000.0, "durationHours": 24, **extra})


def _hard_job_on_a_placement_group(fleet: Raw, tier: int) -> tuple[Raw, int, int]:
    """A copy of the fleet with an on-demand GPU pool in one placement group and a multi-node job on it, hard
    topology at `tier`: (raw, pool, job index)."""
    raw = copy.deepcopy(fleet)
    p = _gpu_pool(raw, spot=False)
    pool = raw["nodePools"][p]
    pool.update(placementGroup=True, zones=pool.get("zones", ["us-west-2a"])[:1],
                instanceTypes=pool["instanceTypes"][:1])
    j = _multi_node_job(raw, p)
    raw["workloads"][j]["networkTopology"] = {"mode": "hard", "highestTier": tier}
    return raw, p, j


def test_hard_on_a_co_located_pool_is_accepted(fleet: Raw) -> None:
    raw, p, j = _hard_job_on_a_placement_group(fleet, 3)
    settings = parse_settings(PROJECT, "fleet", raw)
    assert settings.workloads[j].network_topology is not None
    assert co_located(settings.node_pools[p])


@pytest.mark.parametrize("tier", [1, 2])
def test_hard_below_the_top_tier_of_a_co_located_pool_is_refused(fleet: Raw, tier: int) -> None:
    """A placement group or a Capacity Block is close together, not under one layer-3 or layer-2 network node: a
    hard job bound to such a tier may never bind on the nodes Karpenter launches for it (review-topology-bringup
    finding 3)."""
    raw, _, j = _hard_job_on_a_placement_group(fleet, tier)
    assert "only its top tier (3)" in _problems(raw).get(f"workloads[{j}].networkTopology.highestTier", "")


@pytest.mark.parametrize(("case", "key", "fragment"), [
    ("one-node", "networkTopology", "one node"),
    ("hard-no-tier", "networkTopology.highestTier", "required in hard mode"),
    ("soft-tier", "networkTopology.highestTier", "no effect in soft mode"),
    ("hard-grows", "networkTopology.mode", "cannot grow"),
    ("hard-spot", "networkTopology.mode", "spot pool"),
    ("hard-anywhere", "networkTopology.mode", "co-located"),
    ("hard-two-types", "networkTopology.mode", "co-located"),
    ("hard-unlabelled", "networkTopology.mode", "no EC2 network topology"),
])
def test_network_topology_problems(fleet: Raw, case: str, key: str, fragment: str) -> None:
    raw = copy.deepcopy(fleet)
    if case == "one-node":
        j = _index(raw["workloads"], lambda w: w.get("maxNodes", 1) == 1, "one-node job")
        raw["workloads"][j]["networkTopology"] = {"mode": "soft"}
    elif case in ("hard-no-tier", "soft-tier", "hard-grows"):
        j = _multi_node_job(raw)
        raw["workloads"][j]["networkTopology"] = {
            "hard-no-tier": {"mode": "hard"}, "soft-tier": {"mode": "soft", "highestTier": 2},
            "hard-grows": {"mode": "hard", "highestTier": 3}}[case]
        raw["workloads"][j]["autoscaling"] = {"enabled": case == "hard-grows"}
    else:
        p = _gpu_pool(raw, spot=case == "hard-spot")
        pool = raw["nodePools"][p]
        if case == "hard-anywhere":
            pool["placementGroup"] = False
        if case == "hard-two-types":
            pool.update(placementGroup=True, zones=pool.get("zones", ["us-west-2a"])[:1],
                        instanceTypes=["p5e.48xlarge", "p5en.48xlarge"])
        if case == "hard-unlabelled":
            pool.update(instanceTypes=["g5.48xlarge"], placementGroup=True, zones=pool.get("zones", ["x"])[:1])
        j = _multi_node_job(raw, p)
        raw["workloads"][j]["networkTopology"] = {"mode": "hard", "highestTier": 3}
    problems = _problems(raw)
    path = f"workloads[{j}].{key}"
    assert fragment in problems.get(path, ""), problems


@pytest.mark.parametrize(("case", "key", "fragment"), [
    ("reserved-alone", "capacityTypes", "needs capacityReservations"),
    ("not-reserved", "capacityReservations", "need 'reserved'"),
    ("wrong-type", "capacityReservations[0].instanceType", "not one of the pool's instanceTypes"),
    ("wrong-zone", "capacityReservations[0].zone", "not a zone the pool launches in"),
    ("block-unpriced", "capacityReservations[0].upfrontFeeUsd", "required for a capacity-block"),
    ("odcr-priced", "capacityReservations[0].durationHours", "only for type 'capacity-block'"),
    ("over-max", "maxSize", "reserved instances"),
    ("bad-id", "capacityReservations[0].id", "cr-"),
    ("twice", "capacityReservations", "listed twice"),
    ("big-block", "capacityReservations[0].instanceCount", "at most 64"),
    ("desired-above-reserved", "desiredSize", "no more than its"),
])
def test_capacity_reservation_problems(fleet: Raw, case: str, key: str, fragment: str) -> None:
    raw = copy.deepcopy(fleet)
    p = _gpu_pool(raw, spot=False)
    pool = raw["nodePools"][p]
    pool["capacityTypes"] = ["reserved"]
    pool["desiredSize"] = 1
    pool["capacityReservations"] = [{
        "reserved-alone": None, "not-reserved": _reservation(pool), "wrong-type": _reservation(pool,
        instanceType="p4d.24xlarge" if pool["instanceTypes"][0] != "p4d.24xlarge" else "p5.48xlarge"),
        "wrong-zone": _reservation(pool, zone="us-west-2x"), "block-unpriced": _block(pool, upfrontFeeUsd=None),
        "odcr-priced": _reservation(pool, durationHours=24), "over-max": _reservation(pool, instanceCount=400),
        "bad-id": _reservation(pool, id="cr_1"), "twice": _reservation(pool),
        "big-block": _block(pool, instanceCount=65), "desired-above-reserved": _reservation(pool),
    }[case]]
    if case == "big-block":
        pool["maxSize"] = 65
    if case == "desired-above-reserved":
        pool["desiredSize"] = pool["maxSize"] = 2
    if case == "reserved-alone":
        pool["capacityReservations"] = []
    if case == "not-reserved":
        pool["capacityTypes"] = ["on-demand"]
    if case == "twice":
        pool["capacityReservations"] *= 2
    pool["capacityReservations"] = [{k: v for k, v in r.items() if v is not None}
                                    for r in pool["capacityReservations"]]
    problems = _problems(raw)
    path = f"nodePools[{p}].{key}"
    assert fragment in problems.get(path, ""), problems


def test_a_capacity_block_pool_is_co_located_and_an_odcr_one_is_not(fleet: Raw) -> None:
    raw = copy.deepcopy(fleet)
    p = _gpu_pool(raw, spot=False)
    pool = raw["nodePools"][p]
    pool.update(capacityTypes=["reserved"], placementGroup=False, desiredSize=1, capacityReservations=[_block(pool)])
    settings: Settings = parse_settings(PROJECT, "fleet", raw)
    assert co_located(settings.node_pools[p])
    pool["capacityReservations"] = [_reservation(pool)]
    assert not co_located(parse_settings(PROJECT, "fleet", raw).node_pools[p])


def test_network_layers_come_from_the_ec2_topology_list() -> None:
    # EC2 User Guide, ec2-instance-topology-prerequisites.html: 3 network nodes for these, none listed for g5/g6.
    assert {n for n, t in INSTANCE_TYPES.items() if t.network_layers == 3} == {
        "p4d.24xlarge", "p4de.24xlarge", "p5.48xlarge", "p5e.48xlarge", "p5en.48xlarge", "g6e.xlarge", "g6e.12xlarge"}


def test_a_spot_job_whose_grace_outlasts_the_notice_is_refused(fleet: Raw) -> None:
    raw = copy.deepcopy(fleet)
    j = _multi_node_job(raw, _gpu_pool(raw, spot=True))
    raw["workloads"][j]["checkpointGraceSeconds"] = 100
    parse_settings(PROJECT, "fleet", raw)  # 100 s + Karpenter's 20 s fit the two minutes
    raw["workloads"][j]["checkpointGraceSeconds"] = 101
    assert "interruption notice leaves 100s" in _problems(raw).get(f"workloads[{j}].checkpointGraceSeconds", "")
