"""Reserved capacity in the plan's cost: ODCRs per hour whether used or not, Capacity Blocks up front.

EC2 bills an On-Demand Capacity Reservation at the on-demand rate of every reserved instance, running or not, and
charges a Capacity Block's price in full when it is bought (EC2 User Guide, capacity-blocks-extend.html: "The price
of a Capacity Block offering is charged up front"). The pools here are built from the first EFA pool of the tests'
fleet stack.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest
from owned_stacks import FLEET, stack_file
from trainyard.config.instance_types import INSTANCE_TYPES
from trainyard.config.load import decode_value, parse_settings
from trainyard.config.mig import load_mig_catalog
from trainyard.config.model import Settings
from trainyard.plan.capacity import PoolCapacity, pool_capacity, price_note
from trainyard.plan.diff import StackRender, diff_stack, format_diff
from trainyard.plan.recording import Recording
from trainyard.plan.report import summary
from trainyard.plan.runtime import PROJECT

Raw = dict[str, Any]


@pytest.fixture(scope="module")
def fleet() -> Raw:
    return {k.split(":", 1)[1]: decode_value(v) for k, v in stack_file(FLEET).values.items()}


def _with_pool(raw: Raw, **changes: Any) -> tuple[Settings, str]:
    raw = copy.deepcopy(raw)
    pool = next(p for p in raw["nodePools"]
                if p["role"] == "gpu" and p.get("efa") and not p.get("capacityReservations"))
    pool.update(changes)
    return parse_settings(PROJECT, "fleet", raw), pool["name"]


def _row(settings: Settings, name: str) -> PoolCapacity:
    return next(p for p in pool_capacity(settings, load_mig_catalog()) if p.name == name)


def _reservation(count: int, **extra: Any) -> dict[str, Any]:
    return {"id": "cr-0123456789abcdef0", "instanceType": "p5.48xlarge", "zone": "us-west-2a",
            "instanceCount": count, **extra}


P5 = INSTANCE_TYPES["p5.48xlarge"].on_demand_hourly_usd
BASE = {"instanceTypes": ["p5.48xlarge"], "zones": ["us-west-2a"], "maxSize": 8}


def test_an_odcr_costs_its_reserved_instances_even_at_zero_nodes(fleet: Raw) -> None:
    settings, name = _with_pool(fleet, **BASE, capacityTypes=["reserved"], desiredSize=0,
                                capacityReservations=[_reservation(3)])
    row = _row(settings, name)
    assert row.desired_nodes == 0
    assert row.hourly_usd == pytest.approx(3 * P5)
    assert row.upfront_usd == 0


def test_nodes_beyond_the_reservation_are_priced_as_unreserved(fleet: Raw) -> None:
    settings, name = _with_pool(fleet, **BASE, capacityTypes=["reserved", "on-demand"], desiredSize=5,
                                capacityReservations=[_reservation(3)])
    assert _row(settings, name).hourly_usd == pytest.approx(3 * P5 + 2 * P5)


def test_a_capacity_block_is_paid_up_front_and_adds_nothing_per_hour(fleet: Raw) -> None:
    block = _reservation(4, type="capacity-block", upfrontFeeUsd=12345.5, durationHours=168)
    settings, name = _with_pool(fleet, **BASE, capacityTypes=["reserved"], desiredSize=4, placementGroup=False,
                                capacityReservations=[block])
    row = _row(settings, name)
    assert (row.hourly_usd, row.monthly_usd, row.upfront_usd) == (0, 0, 12345.5)
    assert "paid once at purchase" in price_note(settings)
    text = summary(Recording(), settings, pool_capacity(settings, load_mig_catalog()))
    assert "up-front $" in text and "12,346" in text


def test_the_diff_shows_a_new_block_up_front(fleet: Raw) -> None:
    base_settings, name = _with_pool(fleet, **BASE)
    block = _reservation(4, type="capacity-block", upfrontFeeUsd=5000.0, durationHours=24)
    head_settings, _ = _with_pool(fleet, **BASE, capacityTypes=["reserved"], desiredSize=4, placementGroup=False,
                                  capacityReservations=[block])
    catalog = load_mig_catalog()
    base = StackRender(pools=tuple(pool_capacity(base_settings, catalog)))
    head = StackRender(pools=tuple(pool_capacity(head_settings, catalog)))
    diff = diff_stack("fleet", base, head)
    [delta] = diff.pools
    assert delta.name == name and delta.upfront_usd == 5000.0
    # The pool's four nodes leave spot/on-demand pricing for the prepaid block.
    assert delta.hourly_usd == pytest.approx(-_row(base_settings, name).hourly_usd)
    assert "+5,000.00 $ up front (Capacity Blocks, paid at purchase)" in format_diff([diff], "text", "base")


def test_an_older_revision_without_reservation_fields_still_reads_back() -> None:
    """plan diff reads a base revision's pools as JSON: fields it predates take their defaults."""
    row = PoolCapacity(name="p", role="gpu", instance_type="p5.48xlarge", capacity="on-demand", min_nodes=0,
                       desired_nodes=2, max_nodes=2, gpus_per_node=8, mig_layout=None, slices_per_node=0,
                       hourly_usd_per_node=P5)
    old = {k: v for k, v in dataclasses.asdict(row).items()
           if k not in ("reserved_nodes", "reserved_hourly_usd", "upfront_usd")}
    assert PoolCapacity(**old).hourly_usd == pytest.approx(2 * P5)
