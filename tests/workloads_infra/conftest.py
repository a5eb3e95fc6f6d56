"""Module-scoped renders for the workload tests (see jobs_render for what is real and what is a double)."""

from __future__ import annotations

import pytest
from jobs_render import rendered
from owned_stacks import OWNED_STACKS
from trainyard.plan.recording import Recording


@pytest.fixture(scope="module")
def fleet() -> Recording:
    """The AWS stack the tests own (tests/fixtures/stacks/Pulumi.fleet.yaml): one job of each kind."""
    return rendered("fleet", OWNED_STACKS)


@pytest.fixture(scope="module")
def laptop() -> Recording:
    """The local stack the tests own (tests/fixtures/stacks/Pulumi.laptop.yaml)."""
    return rendered("laptop", OWNED_STACKS)
