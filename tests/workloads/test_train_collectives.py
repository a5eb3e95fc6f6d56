"""Collectives as NCCL sees them: the CPU test harness refuses CPU tensors on the default group, and gradient
metering patches nothing in torch.distributed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
import trainer_launch  # noqa: F401
from torch.distributed import distributed_c10d
from torch.nn.parallel import DistributedDataParallel
from trainyard_train.comm import register_grad_hook
from trainyard_train.config import CommConfig, ModelConfig
from trainyard_train.model import DecoderLM


@pytest.fixture
def strict_world() -> Iterator[dist.ProcessGroup]:
    """One rank, default group served for CUDA tensors only (as strict_trainer.py sets it up), plus gloo."""
    dist.init_process_group("cuda:gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield dist.new_group(backend="gloo")
    finally:
        dist.destroy_process_group()


def test_default_group_refuses_cpu_tensors_like_nccl(strict_world: dist.ProcessGroup) -> None:
    cursors = torch.zeros(4, dtype=torch.int64)
    # The pre-fix trainer merged its data cursors like this at every save; under NCCL it crashed.
    with pytest.raises(RuntimeError, match="No backend type associated with device type cpu"):
        dist.all_reduce(cursors, op=dist.ReduceOp.MAX)
    with pytest.raises(RuntimeError, match="device type cpu"):
        dist.barrier()
    dist.all_reduce(cursors, group=strict_world)  # the explicit CPU group is the way


@pytest.mark.parametrize("hook", ["allreduce", "powersgd"])
def test_metering_patches_nothing(strict_world: dist.ProcessGroup, hook: str) -> None:
    model = DistributedDataParallel(DecoderLM(ModelConfig()), process_group=strict_world)
    _, meter = register_grad_hook(model, CommConfig(hook=hook), strict_world, seed=0)
    assert dist.all_reduce is distributed_c10d.all_reduce
    tokens = torch.zeros(2, 8, dtype=torch.long)
    model(tokens, tokens).backward()
    plain = sum(p.numel() * 4 for p in model.parameters())
    assert meter.take() == plain  # DDP's own reduction (or PowerSGD warming up) moves every gradient once
