"""Graceful stop on SIGTERM (spot reclaim, pod deletion) and SIGUSR1 (operator request).

The handler only sets a flag; the loop finishes the current step, agrees with the other ranks to stop,
saves and exits. A watchdog enforces the grace period: if the save hangs (a dead peer, a stuck
filesystem) the process exits anyway, leaving at worst a torn checkpoint that resume ignores.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from types import FrameType

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
