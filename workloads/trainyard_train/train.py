"""The trainer's entry point, each torchrun worker's `-m trainyard_train`: the config, then the run (worker.py).

    python -m trainyard_train.agent "$@"      # the job's launch line, where "$@" is torchrun's arguments:
    --nnodes=1:4 --nproc-per-node=8 --rdzv-backend=c10d --rdzv-endpoint=HOST:29400 \\
        --rdzv-conf=last_call_timeout=5 --max-restarts=10 -m trainyard_train --config configs/gpt-small.yaml

The config is checked first, before torch is imported (worker.py holds the run): a bad key is one line and
exit 2 at 0.2 CPU-s, not 2.5, in each worker of a launch the node agent did not check.
"""

from __future__ import annotations

import gc
from collections.abc import Sequence

from .config import ConfigError
from .exitcodes import CONFIG_ERROR
from .preflight import check, config_error_line, parse_args
from .signals import final_exit


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        # Fail on a bad key before joining the rendezvous; under the node agent this was checked already.
        cfg = check(args)
    except ConfigError as exc:
        return final_exit(CONFIG_ERROR, config_error_line(exc))
    # torch and all that runs on it, for a config that passed: imported with the cyclic collector off (five full
    # collections, 0.4 CPU-s) and frozen after, so no collection walks its ~480k objects again, in the run or at
    # exit (~1 CPU-s a worker). The import's few garbage cycles (~9k objects, 7 MB) stay, frozen with the rest
    # (gc.disable, then gc.freeze: https://docs.python.org/3/library/gc.html#gc.freeze).
    gc.disable()
    from .worker import train

    gc.freeze()
    gc.enable()
    return train(cfg)
