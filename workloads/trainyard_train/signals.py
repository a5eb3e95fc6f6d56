"""Graceful stop on SIGTERM (spot reclaim, pod deletion) and SIGUSR1 (operator request).

The handler only sets a flag; the loop finishes the current step, agrees with the other ranks to stop,
saves and exits. A watchdog enforces the grace period: if the save hangs (a dead peer, a stuck
filesystem) the process exits anyway, leaving at worst a torn checkpoint that resume ignores.

A stop must not be undone by torchrun: its agent restarts the workers after any worker failure while
restarts remain (``_invoke_run`` in torch/distributed/elastic/agent/server/api.py), whatever the exit
code. So once the checkpoint is committed, a worker that received the signal itself sends SIGTERM to its
agent (its parent process): the agent raises SignalException, terminates its workers and exits instead
of restarting them. A signal thus stops the node it was delivered on, as a spot reclaim does; ranks on
other nodes, which stopped only to save together, exit 143 and their agents carry on with the nodes left.
When the agent got SIGTERM first (``kill <torchrun>``, pod deletion) it is already shutting down and
forwarded the signal to its workers; their SIGTERM back only restarts its wait for them.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from types import FrameType

from .distributed import DistEnv
from .logs import LOGGER_NAME, kv

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
# Exit code of a run stopped by a signal: non-zero, so neither torchrun nor the Volcano job treats an
# unfinished run as complete; 128 + SIGTERM as for a process killed by it.
PREEMPTED_EXIT_CODE = 143
GRACE_EXPIRED_EXIT_CODE = 124
log = logging.getLogger(LOGGER_NAME)


class StopRequest:
    def __init__(self, grace_period_s: float) -> None:
        self.grace_period_s = grace_period_s
        self.signal_name: str | None = None
        self.received_at: float | None = None
        self._watchdog: threading.Timer | None = None

    @property
    def requested(self) -> bool:
        return self.signal_name is not None

    @property
    def signalled_here(self) -> bool:
        """This process got the signal (rather than agreeing to stop with a peer that did)."""
        return self.signal_name in {sig.name for sig in STOP_SIGNALS}

    def install(self) -> None:
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        self.begin(signal.Signals(signum).name)

    def begin(self, reason: str) -> None:
        """Start stopping: on a signal here, or when the ranks agreed that some rank got one.

        Every rank arms its own watchdog, because a rank that was not signalled can still hang in a
        collective with a peer that is already gone."""
        if self.requested:
            return
        self.signal_name = reason
        self.received_at = time.monotonic()
        self._watchdog = threading.Timer(self.grace_period_s, self._expire)
        self._watchdog.daemon = True
        self._watchdog.start()

    def _expire(self) -> None:
        log.error(kv("grace_period_expired", seconds=self.grace_period_s, signal=self.signal_name))
        logging.shutdown()
        os._exit(GRACE_EXPIRED_EXIT_CODE)  # no cleanup: a half-written checkpoint has no COMMIT anyway

    def cancel(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()


def stop_elastic_agent(env: DistEnv) -> None:
    """Ask this node's torchrun agent to shut down rather than restart the workers (see module docstring)."""
    if env.elastic_agent:
        log.warning(kv("stopping_torchrun_agent", pid=os.getppid(), reason="final stop, not a crash"))
        os.kill(os.getppid(), signal.SIGTERM)
