"""The node agent's code for an unreachable rendezvous store, which the elastic jobs' policy maps to RestartJob."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from torch.distributed import DistNetworkError
from torch.distributed.elastic.multiprocessing import api as mp_api
from torch.distributed.elastic.rendezvous import RendezvousConnectionError, RendezvousTimeoutError
from trainyard.workloads.launch import CRASH_EXIT_CODE, STORE_LOST_EXIT_CODE
from trainyard_train import elastic
from trainyard_train.exitcodes import CRASH, STOPPED, STORE_LOST
from trainyard_train.signals import EXIT_CODE_FILE

ARGV = ["--nnodes=2:2", "--rdzv-backend=c10d", "--rdzv-endpoint=job-worker-0.job.ns.svc:29400", "-m",
        "trainyard_train"]


def test_the_plan_and_the_trainer_agree_on_the_code() -> None:
    assert (STORE_LOST_EXIT_CODE, CRASH_EXIT_CODE) == (STORE_LOST, CRASH)


@pytest.mark.parametrize("error", [
    # What torch 2.13's c10d backend raises for any failed store call (c10d_rendezvous_backend.py _call_store).
    RendezvousConnectionError("The connection to the C10d store has failed. See inner exception for details."),
    # What the agent's own store calls raise when worker-0's TCPStore is gone.
    DistNetworkError("failed to recv, got 0 bytes"),
], ids=["rendezvous", "store"])
def test_losing_the_store_ends_the_agent_with_the_store_lost_code(
        error: Exception, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """worker-0 hosts the store: every other agent fails on it. The old agent exited 1 (RestartPod: one retry per
    surviving pod); STORE_LOST restarts the job once (review-incluster finding 1)."""
    def lost(_args: object) -> None:
        raise error

    monkeypatch.setattr(elastic.torchrun, "run", lost)
    assert elastic.NodeAgent(tmp_path).run(ARGV) == STORE_LOST
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"{elastic.PROG}: {type(error).__name__}: ") and line.endswith(f"(exit {STORE_LOST})")


def test_a_stop_signal_raised_after_the_store_was_lost_keeps_the_store_lost_code(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After the store error torch's agent stops its workers (SimpleElasticAgent.run's `finally`); each worker then
    asks this agent to stop with 143 and signals it, so a SignalException replaces the store error in flight."""
    def lost_then_stopped(_args: object) -> None:
        try:
            raise RendezvousConnectionError("The connection to the C10d store has failed.")
        finally:
            (tmp_path / EXIT_CODE_FILE).write_text(str(STOPPED))
            raise mp_api.SignalException("got signal: SIGTERM", sigval=signal.SIGTERM)

    monkeypatch.setattr(elastic.torchrun, "run", lost_then_stopped)
    assert elastic.NodeAgent(tmp_path).run(ARGV) == STORE_LOST


def test_other_rendezvous_failures_stay_crashes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def late(_args: object) -> None:
        raise RendezvousTimeoutError("the rendezvous did not complete in time")

    monkeypatch.setattr(elastic.torchrun, "run", late)
    assert elastic.NodeAgent(tmp_path).run(ARGV) == CRASH
