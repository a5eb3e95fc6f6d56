"""Entry point wiring: config → process group → Trainer → exit code.

    python -m trainyard_train.preflight "$@" && exec torchrun "$@"    # the job's launch line, where "$@" is
    --nnodes=1:4 --nproc-per-node=8 --rdzv-backend=c10d --rdzv-endpoint=HOST:29400 \
        --rdzv-conf=last_call_timeout=5 --max-restarts=10 -m trainyard_train --config configs/gpt-small.yaml

A config error is one line and exit 2 (preflight.py); a stop signal ends in one committed checkpoint and no
torchrun restart (signals.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch.distributed as dist

from .config import ConfigError, check_run_dir, load_config
from .distributed import DistEnv, destroy_distributed, init_distributed
from .logs import kv, setup_logging
from .loop import Trainer
from .preflight import parse_args, report
from .signals import stop_elastic_agent


def _final_config_error(env: DistEnv, exc: ConfigError) -> int:
    """Report a config error; retrying cannot fix it, so ask torchrun to stop instead of restarting us."""
    if env.local_rank == 0:  # every rank fails alike; one request per agent is enough
        stop_elastic_agent(env)
    return report(exc)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    env = DistEnv.from_env()
    try:
        # Fail on a bad key before joining the rendezvous; under a job, preflight.py already checked this.
        cfg = load_config(args.config, args.overrides)
        check_run_dir(cfg)
    except ConfigError as exc:
        return _final_config_error(env, exc)
    log = setup_logging(env.rank, env.world_size)
    if env.shared_agent_store and env.is_main:
        log.warning(kv("shared_rendezvous_store", fix="set TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 for torchrun"))
    runtime = init_distributed(env, cfg.comm.timeout_s)
    try:
        try:
            trainer = Trainer(cfg, runtime)
        except ConfigError as exc:  # found once the data and the world size are known
            return _final_config_error(env, exc)
        code = trainer.run()
        # Leave together: a rank tearing down gloo while its peer still finishes the last commit
        # intermittently aborted ("terminate called without an active exception") on CPU.
        dist.barrier(group=runtime.cpu_group)
        return code
    finally:
        destroy_distributed()
