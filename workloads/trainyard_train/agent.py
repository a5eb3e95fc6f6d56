"""The node agent: torchrun's elastic agent behind the exit-code contract the Volcano job's policies read.

    python -m trainyard_train.agent TORCHRUN_ARGS... -m trainyard_train --config FILE key=value...

It takes torchrun's command line unchanged and exits with one of ``exitcodes.py``'s codes:

1. The trainer part of the line is validated first (preflight.py): a config error is one line and exit 2,
   before any rendezvous and before torch is imported.
2. torchrun's agent (elastic.py) then runs the workers and restarts them after a crash, as torchrun does. An unreachable
   rendezvous store (its host, worker-0's agent, is gone, or never came up) ends the agent with STORE_LOST.
3. A worker that finds a final condition after the rendezvous (a config error only the world size or the
   data reveal, a run directory it must not touch, a diverged loss, a signal delivered to it) prints its line
   first, then asks this agent to end with that code (``signals.final_exit``): it writes the code into the
   agent's control directory and sends SIGTERM. Restarting would only repeat it.
4. SIGTERM to the agent (the kubelet stopping the pod, Ctrl-C) shuts the workers down with the same signal,
   waits for them to commit their checkpoint (``--shutdown-timeout``), and exits 143 without a traceback.
"""

from __future__ import annotations

import gc
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from .config import ConfigError
from .preflight import check_command_line, report
from .signals import AGENT_DIR_ENV


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        check_command_line(argv)
    except ConfigError as exc:
        return report(exc)
    gc.disable()  # torch's import with the collector off, frozen after (as in train.main; its ~7k garbage stay)
    from .elastic import NodeAgent  # torch: 1.5 CPU-s that a refused line never pays

    gc.freeze()
    gc.enable()
    control = Path(tempfile.mkdtemp(prefix="trainyard-agent-"))
    os.environ[AGENT_DIR_ENV] = str(control)
    try:
        return NodeAgent(control).run(argv)
    finally:
        shutil.rmtree(control, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
