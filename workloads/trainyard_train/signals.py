"""Graceful stop on SIGTERM (spot reclaim, pod deletion) and SIGUSR1 (operator request), and the worker's side
of the node agent's exit-code protocol (agent.py).

The handler only sets a flag; the loop finishes the current step, agrees with the other ranks to stop,
saves and exits. A watchdog enforces the grace period: if the save hangs (a dead peer, a stuck
filesystem) the process exits anyway, leaving at worst a torn checkpoint that resume ignores.

A stop must not be undone by torchrun: its agent restarts the workers after any worker failure while
restarts remain (``_invoke_run`` in torch/distributed/elastic/agent/server/api.py), whatever the exit code.
So once the checkpoint is committed, a worker that received the signal itself asks its agent to end with
the stop code (``final_exit``), as a config error does. A signal thus stops the node it was delivered on, as
a spot reclaim does; ranks on other nodes, which stopped only to save together, exit 143 and their agents
carry on with the nodes left. When the agent got SIGTERM first (the kubelet stopping the pod) it is already
shutting down and forwarded the signal to its workers; its control directory says so, and nobody signals
it a second time.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType

from .exitcodes import GRACE_EXPIRED
from .logs import LOGGER_NAME, kv

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
AGENT_DIR_ENV = "TRAINYARD_AGENT_DIR"
"""The node agent's control directory, inherited by its workers: ``exit-code`` holds a worker's final request,
``stopping`` exists once the agent is shutting down."""
EXIT_CODE_FILE = "exit-code"
STOPPING_FILE = "stopping"
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
        if self.signalled_here or agent_stopping():
            # This node is stopping: its agent ends with 124, not 143 (a committed stop) or a restart. A rank
            # that stopped only with a signalled peer still exits to its agent's restart, as a crash does.
            final_exit(GRACE_EXPIRED)
        logging.shutdown()
        os._exit(GRACE_EXPIRED)  # no cleanup: a half-written checkpoint has no COMMIT anyway

    def cancel(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()


def agent_stopping() -> bool:
    """The node agent is shutting down (it got the signal, or a worker asked it to end)."""
    control = os.environ.get(AGENT_DIR_ENV)
    if not control:
        return False
    return (Path(control) / STOPPING_FILE).exists()


def final_exit(code: int, line: str | None = None) -> int:
    """End the run with ``code`` instead of letting torchrun restart the workers; returns ``code``.

    The first local rank to get here records the code in the agent's control directory, prints ``line``,
    then sends SIGTERM to its agent (its parent), in that order: the agent's shutdown signal must not cut the
    line short. Later ranks of the node print nothing (one line per node). Without the agent
    (``python -m trainyard_train``, plain torchrun) it only prints; when the agent is already stopping it does
    not signal it again.
    """
    control = os.environ.get(AGENT_DIR_ENV)
    root = Path(control) if control else None
    if root is not None:
        try:
            fd = os.open(root / EXIT_CODE_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return code
        with os.fdopen(fd, "w") as handle:
            handle.write(str(code))
    if line is not None:
        print(line, file=sys.stderr, flush=True)
    if root is not None and not agent_stopping():
        log.warning(kv("stopping_node_agent", pid=os.getppid(), exit_code=code))
        os.kill(os.getppid(), signal.SIGTERM)
    return code
