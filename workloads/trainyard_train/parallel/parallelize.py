"""Tensor parallelism, activation checkpointing, torch.compile and FSDP2 on one model part, in torchtitan's order.

torchtitan applies TP, then activation checkpointing, then per-block compile, then FSDP
(pytorch/torchtitan@v0.2.2 torchtitan/models/llama3/infra/parallelize.py, parallelize_llama); the functions here
do the same on a (meta-device) DecoderLM or one pipeline stage of it, whose absent ends are None.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from ..model import DecoderLM


def apply_tp(model: DecoderLM, tp_mesh: DeviceMesh) -> None:
    """Megatron-style TP with sequence parallelism (torchtitan's plan).

    Between blocks the hidden states are sharded by sequence (Shard(1)): the norms run on 1/tp of the tokens,
    the attention and FFN inputs are all-gathered (Replicate), q/k/v/w1/w3 split their output features (local
    heads), wo/w2 reduce-scatter back to sequence shards. The embedding splits the vocabulary (rows) and the head
    its outputs: logits stay sharded by vocabulary for a vocabulary-parallel loss (loss_parallel).
    """
    top: dict[str, ParallelStyle] = {}
    if model.tok_embeddings is not None:
        top["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))
    if model.norm is not None:
        top["norm"] = SequenceParallel()
    if model.output is not None:
        # Local logits [batch, seq, vocab / tp]: the loss wraps them back into a DTensor (engine.py), so a
        # pipeline stage hands plain tensors to torch.distributed.pipelining.
        top["output"] = ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1))
    if top:
        parallelize_module(model, tp_mesh, top)
    block_plan: dict[str, ParallelStyle] = {
        "attention_norm": SequenceParallel(),
        # The rope table (second input) is a plain replicated buffer: no layout.
        "attention": PrepareModuleInput(input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None)),
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
        "ffn_norm": SequenceParallel(),
        "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w3": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
    }
    for block in model.layers.values():
        parallelize_module(block, tp_mesh, block_plan)


def apply_ac(model: DecoderLM) -> None:
    """Full activation checkpointing per block: each block keeps its input and recomputes the rest in backward.
    No RNG state is preserved: the model has no dropout."""
    for key, block in list(model.layers.items()):
        model.layers[key] = checkpoint_wrapper(block, preserve_rng_state=False)


def apply_compile(model: DecoderLM) -> None:
    """torch.compile each block in place (parameter names unchanged), fullgraph as torchtitan compiles them."""
    for block in model.layers.values():
        block.compile(fullgraph=True)


def apply_fsdp(
    model: DecoderLM, dp_mesh: DeviceMesh, *, param_dtype: torch.dtype | None, reshard_after_forward: bool
) -> None:
    """FSDP2 per block, the embedding, the norm + head, then the root (for whatever is left).

    Parameters are sharded over dp_mesh (2-D for HSDP: replicated over its first dimension, sharded over its
    second); they are all-gathered in param_dtype and gradients reduce-scattered in fp32. Under pipelining a
    stage's parameters stay gathered across its micro-batches (reshard_after_forward=False, torchtitan's choice),
    because each micro-batch's backward would gather them again.
    """
    mp_policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)

    def shard(module: nn.Module | Sequence[nn.Module], reshard: bool) -> None:
        fully_shard(module if isinstance(module, nn.Module) else list(module), mesh=dp_mesh, mp_policy=mp_policy,
                    reshard_after_forward=reshard)

    if model.tok_embeddings is not None:
        shard(model.tok_embeddings, reshard_after_forward)
    for block in model.layers.values():
        shard(block, reshard_after_forward)
    ends = [m for m in (model.norm, model.output) if m is not None]
    if ends:
        # Their backward starts as soon as their forward ends: resharding in between would only gather again.
        shard(ends, False)
    shard(model, reshard_after_forward)
