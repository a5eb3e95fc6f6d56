"""Fixtures for the trainer tests; the launch helpers live in trainer_launch.py."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest
from trainer_launch import Launch


@pytest.fixture
def cleanup_launches() -> Iterator[list[Launch]]:
    """Kill any launch a failing test left behind (its whole session: agent and workers)."""
    launches: list[Launch] = []
    yield launches
    for launched in launches:
        if launched.proc.poll() is None:
            os.killpg(launched.proc.pid, signal.SIGKILL)
            launched.proc.wait()
