"""Fixtures for the trainer tests; the launch helpers live in trainer_launch.py."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest
from moto.server import ThreadedMotoServer
from trainer_launch import Launch, free_port


@pytest.fixture
def cleanup_launches() -> Iterator[list[Launch]]:
    """Kill any launch a failing test left behind (its whole session: agent and workers)."""
    launches: list[Launch] = []
    yield launches
    for launched in launches:
        if launched.proc.poll() is None:
            os.killpg(launched.proc.pid, signal.SIGKILL)
            launched.proc.wait()


@pytest.fixture(scope="module")
def s3_server() -> Iterator[str]:
    """An S3-compatible server on localhost (moto's server mode): its endpoint URL."""
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()
