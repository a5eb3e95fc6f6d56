"""The trainer's exit codes: a contract with the Volcano job's policies (infra/trainyard/workloads/volcano.py).

The node agent (agent.py) exits with one of these, and so does the pod:

| code | meaning | the job's policy |
|---|---|---|
| 0 | the configured steps are done | none: the pod Succeeds and counts toward `minSuccess` |
| 1 | a crash retrying may fix: torchrun out of restarts, a rendezvous that did not complete | RestartPod |
| 2 | final: a config error (before or after the rendezvous), an incompatible or unloadable run in | TerminateJob |
|   | run_dir, a diverged loss | |
| 75 | the rendezvous store is unreachable: its host, worker-0's agent, is gone, so every agent fails | RestartJob |
| 124 | the shutdown grace period ran out before the checkpoint committed | RestartPod |
| 143 | stopped by a signal (SIGTERM: pod deletion, eviction, spot reclaim); the checkpoint is committed | RestartPod |
"""

from __future__ import annotations

import signal

DONE = 0
CRASH = 1
CONFIG_ERROR = 2
"""As for a command-line usage error (argparse exits 2 too, and it is just as final)."""
STORE_LOST = 75
"""EX_TEMPFAIL (sysexits.h): the c10d store went with worker-0 (launch.py), so every other agent ends with this.
The job restarts whole once, and the later agents' failures, arriving while it restarts, are free (Volcano v1.15.1
pkg/controllers/job/state/restarting.go); as RestartPod each of them would cost one retry."""
GRACE_EXPIRED = 124
STOPPED = 128 + signal.SIGTERM
"""Non-zero, so neither torchrun nor the Volcano job treats an unfinished run as complete (and two graceful
stops cannot reach the job's `minSuccess`); 128 + SIGTERM, as for a process killed by it."""
FINAL_WORKER_CODES = (CONFIG_ERROR,)
"""Worker exit codes that no restart can fix: the agent passes them on instead of CRASH."""


def signal_exit_code(sig: signal.Signals) -> int:
    return 128 + int(sig)
