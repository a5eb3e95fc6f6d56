"""Gradient accumulation under FSDP2 holds no unsharded gradient between micro-batches, as the planner counts.

With gradient sync off, FSDP2 keeps every parameter's whole gradient (upcast to fp32 under mixed precision) from
the first micro-batch's backward to the last (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py@v2.13.0
post_backward; _fsdp_param.py to_accumulated_grad_if_needed): 4 bytes per parameter the planner does not count.
The trainer reduce-scatters every micro-batch instead, so between micro-batches each gradient sits in its shard.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.distributed.fsdp import FSDPModule, fully_shard
from trainer_launch import TINY
from trainyard_train.config import load_config
from trainyard_train.distributed import DistEnv, Runtime, destroy_distributed, init_distributed
from trainyard_train.layout import for_config
from trainyard_train.loop import autocast_dtype
from trainyard_train.parallel import ParallelModel
from trainyard_train.planner import estimate_rank


@pytest.fixture
def runtime() -> Iterator[Runtime]:
    rt = init_distributed(DistEnv.from_env({}), timeout_s=60)
    try:
        yield rt
    finally:
        destroy_distributed()


def unsharded_gradient_bytes(model: ParallelModel) -> int:
    """Bytes of gradients FSDP2 holds outside the sharded parameters (its accumulator or the unsharded .grad)."""
    total = 0
    for part in model.parts:
        for module in part.modules():
            if not isinstance(module, FSDPModule):
                continue
            group: Any = fully_shard.state(module)._fsdp_param_group  # type: ignore[attr-defined]
            for param in group.fsdp_params if group is not None else []:
                unsharded = getattr(param, "_unsharded_param", None)  # made at the first all-gather
                for grad in (param.unsharded_accumulated_grad, None if unsharded is None else unsharded.grad):
                    if grad is not None:
                        total += grad.numel() * grad.element_size()
    return total


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_fsdp_accumulation_keeps_gradients_sharded_between_micro_batches(runtime: Runtime, precision: str) -> None:
    overrides = ["parallel.data_parallel=fsdp", f"perf.precision={precision}", "train.micro_batch_size=4"]
    cfg = load_config(TINY, overrides)
    layout, plan = for_config(cfg, world_size=1)
    assert plan.count == 4
    model = ParallelModel(cfg, runtime, layout, plan, autocast_dtype(cfg, runtime.device))
    held: list[int] = []
    sharded: list[bool] = []

    def before_forward(module: torch.nn.Module, args: Any) -> None:
        held.append(unsharded_gradient_bytes(model))
        sharded.append(all(p.grad is not None for p in model.params))

    model.parts[0].register_forward_pre_hook(before_forward)
    tokens = torch.randint(0, cfg.model.vocab_size, (plan.rows, cfg.model.seq_len + 1))
    model.forward_backward([(tokens[:, :-1], tokens[:, 1:])] * plan.count)
    assert held == [0] * plan.count  # before every micro-batch: no whole gradient kept from the previous one
    assert sharded == [False] + [True] * (plan.count - 1)  # each backward reduce-scattered into the shards
    planned = estimate_rank(cfg, world_size=1, pp_rank=0, device_type="cpu")
    assert sum(p.grad.numel() * p.grad.element_size() for p in model.params) == planned.grads
