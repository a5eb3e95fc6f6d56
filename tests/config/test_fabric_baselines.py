"""Every EFA instance type has a fabric-check threshold, derived the documented way from its baseline."""

from __future__ import annotations

import pytest
from trainyard.config.instance_types import (
    FABRIC_BASELINES,
    INSTANCE_TYPES,
    LINK_FRACTION,
    PUBLISHED_FRACTION,
    fabric_threshold,
)


def test_every_efa_instance_type_has_a_baseline() -> None:
    efa = {name for name, it in INSTANCE_TYPES.items() if it.efa_interfaces}
    assert set(FABRIC_BASELINES) == efa


@pytest.mark.parametrize("name", sorted(FABRIC_BASELINES))
def test_threshold_is_a_fraction_of_the_published_figure_or_of_the_link(name: str) -> None:
    baseline = FABRIC_BASELINES[name]
    assert baseline.source
    if baseline.published_busbw_gbps is None:
        assert baseline.min_busbw_gbps == pytest.approx(LINK_FRACTION * baseline.efa_gbps / 8, abs=0.05)
    else:
        assert baseline.min_busbw_gbps == pytest.approx(PUBLISHED_FRACTION * baseline.published_busbw_gbps, abs=0.05)
    # Far above what NCCL over TCP sockets reaches, so a fallback can never pass.
    assert baseline.min_busbw_gbps > 5


def test_published_figures_as_read() -> None:
    # aws-samples/awsome-distributed-training micro-benchmarks/nccl-tests/README.md, 2 nodes, 1073741824 B.
    assert FABRIC_BASELINES["p4de.24xlarge"].published_busbw_gbps == 76.79
    assert FABRIC_BASELINES["p5.48xlarge"].published_busbw_gbps == 436.95
    assert fabric_threshold(["p5.48xlarge"], 32) == 327.7


def test_a_mixed_pool_is_held_to_its_weakest_type_with_the_interfaces_its_pods_get() -> None:
    assert fabric_threshold(["p4d.24xlarge", "p4de.24xlarge"], 4) == 57.6
    # p5e has 32 interfaces and p5en 16: pods get 16, half of a p5e's EFA bandwidth.
    assert fabric_threshold(["p5e.48xlarge", "p5en.48xlarge"], 16) == 120.0
    assert fabric_threshold(["p5en.48xlarge"], 16) == 240.0
    with pytest.raises(ValueError, match="no fabric baseline for g6.xlarge"):
        fabric_threshold(["p5.48xlarge", "g6.xlarge"], 32)
