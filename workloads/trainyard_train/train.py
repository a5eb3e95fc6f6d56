"""Entry point wiring: config → process group → Trainer → exit code.

    torchrun --nnodes=1:4 --nproc-per-node=8 --rdzv-backend=c10d --rdzv-endpoint=HOST:29400 \
        --max-restarts=10 -m trainyard_train --config configs/gpt-small.yaml train.steps=20000
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import torch.distributed as dist

from .config import load_config
from .distributed import DistEnv, destroy_distributed, init_distributed
from .logs import kv, setup_logging
from .loop import Trainer


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="trainyard_train", description="Elastic DDP trainer")
    parser.add_argument("--config", help="YAML config file (defaults apply to keys it omits)")
    parser.add_argument("overrides", nargs="*", metavar="section.key=value", help="config overrides")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    cfg = load_config(args.config, args.overrides)  # fail on a bad key before joining the rendezvous
    env = DistEnv.from_env()
    log = setup_logging(env.rank, env.world_size)
    if env.shared_agent_store and env.is_main:
        log.warning(kv("shared_rendezvous_store", fix="set TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 for torchrun"))
    runtime = init_distributed(env, cfg.comm.timeout_s)
    try:
        code = Trainer(cfg, runtime).run()
        # Leave together: a rank tearing down gloo while its peer still finishes the last commit
        # intermittently aborted ("terminate called without an active exception") on CPU.
        dist.barrier(group=runtime.cpu_group)
        return code
    finally:
        destroy_distributed()
