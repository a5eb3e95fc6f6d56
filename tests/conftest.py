"""Suite-wide options. They live here, not in tests/acceptance/, so `pytest --kubeconfig ...` works from the root."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("trainyard acceptance")
    group.addoption("--kubeconfig", help="kubeconfig of the cluster to check (or $TRAINYARD_KUBECONFIG)")
    group.addoption("--stack", help="stack the cluster was deployed from (or $TRAINYARD_STACK; default dev)")
