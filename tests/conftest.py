"""Suite-wide options and policy.

Options live here, not in tests/acceptance/, so `pytest --kubeconfig ...` works from the root. Policy: the suite
needs the verified upstream data (`tools/upstream.py sync`) and the pinned Helm (`tools/helm.py install`), and
only the live-cluster acceptance tests may skip; any other skip is reported as a failure, so a missing tool or
data set can never pass unnoticed.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from pathlib import Path
from types import ModuleType

import pytest
from owned_stacks import edited_plans
from tool_scripts import load_tool
from trainyard.config.yaml_input import InputError
from trainyard.plan.conformance import upstream_dir
from trainyard.plan.helm import helm_binary

REPO = Path(__file__).resolve().parents[1]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("trainyard acceptance")
    group.addoption("--kubeconfig", help="kubeconfig of the cluster to check (or $TRAINYARD_KUBECONFIG)")
    group.addoption("--stack", help="stack the cluster was deployed from (or $TRAINYARD_STACK; default dev)")


def pytest_sessionstart(session: pytest.Session) -> None:
    try:
        helm_binary()  # every plan renders its charts with it
    except InputError as missing:
        pytest.exit(str(missing), returncode=2)
    cache = upstream_dir(REPO)
    if not load_tool("upstream").is_verified(cache):
        pytest.exit(f"upstream data in {cache} is missing or not verified against tools/upstream.lock.yaml: run "
                    "`python tools/upstream.py sync` (internet, or --from a mirror such as ../shared/upstream)",
                    returncode=2)


@pytest.fixture(scope="session")
def upstream_tool() -> ModuleType:
    return load_tool("upstream")


@pytest.fixture(scope="session", autouse=True)
def shared_plans_stay_as_planned() -> Iterator[None]:
    """The once-per-process plans (owned_stacks.planned) are read by many files in whatever order xdist runs them: a
    test that edits one instead of a copy fails the session, here, rather than some later test somewhere else."""
    yield
    edited = edited_plans()
    assert not edited, f"a test edited the shared plan of {edited} (owned_stacks.planned): edit a copy"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport,
                                                                                             pytest.TestReport]:
    report = yield
    if report.skipped and not hasattr(report, "wasxfail") and item.get_closest_marker("acceptance") is None:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"only live-cluster acceptance tests may skip; this one skipped: {reason}"
    return report
