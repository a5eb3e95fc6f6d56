"""Acceptance against a live cluster after `pulumi up`: pytest tests/acceptance --kubeconfig PATH --stack prod.

Without --kubeconfig (or $TRAINYARD_KUBECONFIG) every test here skips.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from cluster_access import Cluster
from trainyard.config.model import Settings
from trainyard.plan.recording import Recording
from trainyard.plan.runtime import read_stack, render, settings_of


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.acceptance)


def _option(config: pytest.Config, name: str, env: str) -> str | None:
    # getoption with a default: when pytest starts above tests/, this conftest loads after option parsing.
    value = config.getoption(name, default=None)
    return str(value) if value else os.environ.get(env)


@pytest.fixture(scope="session")
def stack_name(pytestconfig: pytest.Config) -> str:
    return _option(pytestconfig, "stack", "TRAINYARD_STACK") or "dev"


@pytest.fixture(scope="session")
def cluster(pytestconfig: pytest.Config) -> Cluster:
    kubeconfig = _option(pytestconfig, "kubeconfig", "TRAINYARD_KUBECONFIG")
    if not kubeconfig:
        pytest.skip("acceptance needs a live cluster: pass --kubeconfig PATH or set TRAINYARD_KUBECONFIG")
    if shutil.which("kubectl") is None:
        pytest.fail("kubectl is not on PATH")
    if not Path(kubeconfig).is_file():
        pytest.fail(f"kubeconfig {kubeconfig} does not exist")
    return Cluster(kubeconfig)


@pytest.fixture(scope="session")
def plan(stack_name: str, cluster: Cluster) -> Recording:
    """What the stack declares, rendered offline: the names and layouts the cluster should show."""
    return render(read_stack(stack_name))


@pytest.fixture(scope="session")
def settings(stack_name: str, cluster: Cluster) -> Settings:
    return settings_of(read_stack(stack_name))
