"""Process-group setup from the torchrun environment; nothing here hard-codes a world size."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistEnv:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    group_rank: int
    """Index of this node (agent) in the current rendezvous."""
    restart_count: int
    """TORCHELASTIC_RESTART_COUNT: how many times the agent restarted the workers."""
    max_restarts: int
    run_id: str
    under_torchrun: bool
    shared_agent_store: bool
    """torchrun's store outlives worker restarts; stale keys in it can break the restarted group."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> DistEnv:
        env = os.environ if env is None else env

        def num(name: str, default: int) -> int:
            return int(env.get(name, default))

        return cls(
            rank=num("RANK", 0),
            local_rank=num("LOCAL_RANK", 0),
            world_size=num("WORLD_SIZE", 1),
            local_world_size=num("LOCAL_WORLD_SIZE", 1),
            group_rank=num("GROUP_RANK", 0),
            restart_count=num("TORCHELASTIC_RESTART_COUNT", 0),
            max_restarts=num("TORCHELASTIC_MAX_RESTARTS", 0),
            run_id=env.get("TORCHELASTIC_RUN_ID", "standalone"),
            under_torchrun="TORCHELASTIC_RUN_ID" in env or "MASTER_ADDR" in env,
            shared_agent_store=env.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
        )

    @property
    def is_main(self) -> bool:
        return self.rank == 0


@dataclass(frozen=True)
class Runtime:
    env: DistEnv
    device: torch.device
    grad_group: dist.ProcessGroup
    """Carries only gradient reductions, so a meter can count exactly what the comm hook sends."""
    checkpoint_group: dist.ProcessGroup
    """Gloo group for async checkpoint collectives, which run on a background thread."""


def init_distributed(env: DistEnv, timeout_s: float) -> Runtime:
    if torch.cuda.is_available():
        device = torch.device("cuda", env.local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    timeout = timedelta(seconds=timeout_s)
    if env.under_torchrun:
        dist.init_process_group(backend=backend, timeout=timeout, device_id=device if backend == "nccl" else None)
    else:
        # Plain `python -m trainyard_train`: a one-process world needs no rendezvous.
        dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    grad_group = dist.new_group(backend=backend, timeout=timeout)
    checkpoint_group = dist.new_group(backend="gloo", timeout=timeout)
    return Runtime(env=env, device=device, grad_group=grad_group, checkpoint_group=checkpoint_group)


def destroy_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
