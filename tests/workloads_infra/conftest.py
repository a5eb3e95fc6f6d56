"""Module-scoped renders for the workload tests (see jobs_render for what is real and what is a double)."""

from __future__ import annotations

import pytest
from jobs_render import rendered
from trainyard.plan.recording import Recording


@pytest.fixture(scope="module")
def prod() -> Recording:
    return rendered("prod")


@pytest.fixture(scope="module")
def local() -> Recording:
    return rendered("local")
