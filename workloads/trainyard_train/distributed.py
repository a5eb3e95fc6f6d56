"""Process-group setup from the torchrun environment; nothing here hard-codes a world size."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

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
    elastic_agent: bool
    """Started by torchrun's elastic agent, which is then the parent process."""
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
            elastic_agent="TORCHELASTIC_RUN_ID" in env,
            shared_agent_store=env.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
        )

    @property
    def is_main(self) -> bool:
        return self.rank == 0


@dataclass(frozen=True)
class Runtime:
    """The groups every trainer collective names explicitly; nothing uses the default group implicitly.

    On CUDA the default group is NCCL, which serves CUDA tensors only: a CPU tensor sent there fails with
    "No backend type associated with device type cpu". So device tensors go to ``device_group`` and CPU
    tensors (DCP's object collectives, host-side metadata) to ``cpu_group``. The CPU tests start the default
    group with a backend map that serves no CPU tensors (tests/workloads/strict_trainer.py), so a collective
    that slips onto the default group fails there as it would under NCCL.
    """

    env: DistEnv
    device: torch.device
    device_group: dist.ProcessGroup
    """Gradients (DDP) and per-step stats: NCCL on CUDA (the default group), gloo on CPU."""
    cpu_group: dist.ProcessGroup
    """Gloo: host-side collectives of the training thread (barriers, per-rank reports)."""
    checkpoint_group: dist.ProcessGroup
    """Gloo, the checkpointer's alone: `dcp.async_save` runs `save`, collectives included, on a thread of its
    own (torch/distributed/checkpoint/state_dict_saver.py), and two threads sending on one group at once
    mismatch their collectives (the memory report's all-gather against a save in flight hung until timeout)."""


def init_distributed(env: DistEnv, timeout_s: float) -> Runtime:
    timeout = timedelta(seconds=timeout_s)
    if torch.cuda.is_available():
        device = torch.device("cuda", env.local_rank)
        torch.cuda.set_device(device)
        # device_id binds the NCCL communicator to this GPU at init (eager init, no guessing in barrier()).
        # https://pytorch.org/docs/stable/distributed.html#torch.distributed.init_process_group
        init_kwargs: dict[str, Any] = {"backend": "nccl", "device_id": device}
    else:
        device = torch.device("cpu")
        init_kwargs = {"backend": "gloo"}
    if not env.under_torchrun:
        # Plain `python -m trainyard_train`: a one-process world needs no rendezvous.
        init_kwargs.update(store=dist.HashStore(), rank=0, world_size=1)
    dist.init_process_group(timeout=timeout, **init_kwargs)
    # On CPU the device group is a gloo group of its own, so the default group can be made to refuse CPU
    # tensors in tests; on CUDA the default NCCL group is it (no second communicator's memory).
    device_group = dist.group.WORLD if device.type == "cuda" else dist.new_group(backend="gloo", timeout=timeout)
    cpu_group = dist.new_group(backend="gloo", timeout=timeout)
    checkpoint_group = dist.new_group(backend="gloo", timeout=timeout)
    assert device_group is not None
    return Runtime(env=env, device=device, device_group=device_group, cpu_group=cpu_group,
                   checkpoint_group=checkpoint_group)


def destroy_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
