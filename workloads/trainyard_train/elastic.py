"""torchrun's elastic agent behind the exit-code contract (agent.py runs it once the command line is checked).

Why not plain torchrun: its signal handler (``_terminate_process_handler`` in
torch/distributed/elastic/multiprocessing/api.py, torch 2.13) raises ``SignalException`` on *every* signal,
so a second SIGTERM that arrives while the agent is already waiting for its workers to exit (``_close``)
aborts that wait: torchrun prints a traceback, exits 1 and leaves the workers running. Here the first signal
starts the shutdown and later ones are logged and ignored; the workers learn from the control directory
that the agent is already stopping and do not signal it again. torchrun itself also exits 1 on any signal
and on any worker failure, which would make a config error look like a crash to the Volcano job.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from types import FrameType

from torch.distributed import DistNetworkError
from torch.distributed import run as torchrun
from torch.distributed.elastic.multiprocessing import api as mp_api
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.elastic.rendezvous import RendezvousConnectionError

from .exitcodes import CRASH, FINAL_WORKER_CODES, STORE_LOST, signal_exit_code
from .signals import EXIT_CODE_FILE, STOPPING_FILE

PROG = "trainyard_train.agent"
# torch 2.13: the c10d backend turns every failed store call into RendezvousConnectionError
# (rendezvous/c10d_rendezvous_backend.py _call_store), which the agent's monitor loop re-raises
# (dynamic_rendezvous.py num_nodes_waiting); the agent's own store calls raise DistNetworkError.
STORE_ERRORS = (RendezvousConnectionError, DistNetworkError)


def store_error(exc: BaseException) -> BaseException | None:
    """The store failure `exc` is, or was raised while handling: after one, torch's agent stops its workers
    (SimpleElasticAgent.run's `finally`), and their stop signals this agent, so a SignalException replaces it."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, STORE_ERRORS):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def say(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


class NodeAgent:
    def __init__(self, control: Path) -> None:
        self.control = control
        self.stopping: signal.Signals | None = None

    def on_signal(self, signum: int, _frame: FrameType | None) -> None:
        """Replaces torch's handler: the first signal starts the shutdown, later ones must not abort it."""
        sig = signal.Signals(signum)
        if self.stopping is not None:
            say(f"got {sig.name} while stopping on {self.stopping.name}: still waiting for the workers")
            return
        self.stopping = sig
        (self.control / STOPPING_FILE).touch()
        raise mp_api.SignalException(f"Process {os.getpid()} got signal: {sig}", sigval=sig)

    def requested_code(self) -> int | None:
        try:
            return int((self.control / EXIT_CODE_FILE).read_text())
        except (OSError, ValueError):  # no request, or one torn by a crash mid-write
            return None

    def run(self, argv: list[str]) -> int:
        args = torchrun.parse_args(argv)
        # torch registers this module attribute as the handler each time it starts the workers (PContext.start).
        mp_api._terminate_process_handler = self.on_signal  # type: ignore[assignment]
        try:
            torchrun.run(args)
        except Exception as exc:  # noqa: BLE001 - every failure gets a code; a lost store decides it
            if (lost := store_error(exc)) is None:
                return self.exit_code(exc)
            say(f"{type(lost).__name__}: {lost}: the rendezvous store is unreachable (exit {STORE_LOST})")
            return STORE_LOST
        return 0

    def exit_code(self, exc: Exception) -> int:
        """The code for what ended torchrun's run, the store being fine."""
        if isinstance(exc, mp_api.SignalException):
            code = self.requested_code() or signal_exit_code(exc.sigval)
            say(f"stopped by {exc.sigval.name}, workers shut down (exit {code})")
            return code
        if isinstance(exc, ChildFailedError):
            codes = sorted({failure.exitcode for failure in exc.failures.values()})
            final = [c for c in codes if c in FINAL_WORKER_CODES]
            code = self.requested_code() or (final[0] if final else CRASH)
            say(f"workers failed with exit codes {codes} and no restarts left (exit {code})")
            return code
        # Other rendezvous errors: one line, the crash class.
        say(f"{type(exc).__name__}: {exc} (exit {CRASH})")
        return CRASH
