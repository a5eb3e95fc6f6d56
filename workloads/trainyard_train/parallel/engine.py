"""The model as the training loop sees it, in any layout: forward + backward of one step, clipping, state dicts.

``build`` makes the mesh and the model parts this rank holds, in torchtitan's order: meta-device model, pipeline
split, then per part tensor parallel, activation checkpointing, compile and FSDP2, then materialise and initialise
(init_weights: the same values in every layout). DDP, the data-parallel-only layout, wraps a materialised model.

Loss and gradients. ``forward_backward`` runs the step's micro-batches and returns this rank's contribution to the
global mean loss: the summed cross-entropy of its tokens divided by the global token count (layout.py), on the
ranks that report it (last pipeline stage, first tensor-parallel rank) and zero elsewhere, so one all-reduce over
the world gives the mean. Backward runs on that sum times dp: DDP and FSDP average gradients over the dp ranks, so
each rank's gradient enters with weight exactly its share of the global batch. DDP reduces once per step (no_sync
until the last micro-batch: its buckets are the accumulator, no extra memory). FSDP reduce-scatters every
micro-batch into the sharded gradient, as torchtitan's accumulation loop does (train.py train_step): with gradient
sync off FSDP2 would keep each parameter's whole gradient, in fp32, from the first micro-batch to the last
(torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py@v2.13.0 post_backward), 4 bytes per TP-local parameter
more than the planner counts, the memory FSDP is there to save. Pipelining reduces after its schedule (stage.py
turns sync off until the last micro-batch itself; the planner counts that accumulator).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.parallel import loss_parallel
from torch.nn import functional
from torch.nn.parallel import DistributedDataParallel

from ..config import Config, ConfigError
from ..distributed import Runtime
from ..layout import Layout, MicroBatchPlan
from ..loss import IGNORE_INDEX
from ..model import DecoderLM, init_weights
from .parallelize import apply_ac, apply_compile, apply_fsdp, apply_tp
from .pipeline import build_schedule, split_stages

MESH_DIMS = ("pp", "dp_replicate", "dp_shard", "tp")
# Optimizer state keyed by parameter name, not by position: a checkpoint then loads into any split of the
# parameters between model parts (torchtitan components/optimizer.py; without it, loading into another pipeline
# layout fails with "Missing optimizer state for parameter").
_FLAT = StateDictOptions(flatten_optimizer_state_dict=True)


def build_mesh(layout: Layout, device_type: str) -> DeviceMesh:
    """The (pp, dp_replicate, dp_shard, tp) mesh. On CPU every dimension is gloo explicitly: the default group
    may be one that serves no CPU tensors (the CPU tests make it refuse them, as NCCL does)."""
    shape = (layout.pp, layout.dp_replicate, layout.dp_shard, layout.tp)
    override: dict[int | str, Any] | None = {d: "gloo" for d in MESH_DIMS} if device_type == "cpu" else None
    return init_device_mesh(device_type, shape, mesh_dim_names=MESH_DIMS, backend_override=override)


def _local(loss: torch.Tensor) -> torch.Tensor:
    return loss.to_local() if isinstance(loss, DTensor) else loss


class ParallelModel:
    """The parts of the model this rank holds and how one step runs over them."""

    def __init__(self, cfg: Config, rt: Runtime, layout: Layout, plan: MicroBatchPlan,
                 param_dtype: torch.dtype | None) -> None:
        self.cfg, self.rt, self.layout, self.plan = cfg, rt, layout, plan
        self.autocast = param_dtype if not layout.fsdp else None
        """DDP computes in the autocast dtype from fp32 weights; FSDP gathers the weights in it instead."""
        tokens = cfg.train.global_batch_size * cfg.model.seq_len
        self.loss_scale = layout.dp / tokens
        """Backward multiplier of a summed cross-entropy: dp cancels DDP's and FSDP's gradient average."""
        self.report_scale = 1.0 / tokens
        self.mesh: DeviceMesh | None = None
        self._ddp: DistributedDataParallel | None = None
        self._schedule: Any = None
        self.has_first = self.has_last = True
        self.tp_rank = 0
        if layout.fsdp:
            self.parts = self._build_fsdp(param_dtype)
        else:
            self.parts = [self._build_ddp()]
        self.reports_loss = self.has_last and self.tp_rank == 0
        self.params = [p for part in self.parts for p in part.parameters()]
        for part in self.parts:
            part.train()  # once: the loop never evaluates (and walking the modules every step costs)

    # -- building -----------------------------------------------------------------------------------------

    def _meta_model(self) -> DecoderLM:
        with torch.device("meta"):
            return DecoderLM(self.cfg.model, loss_chunk_tokens=self.cfg.perf.loss_chunk_tokens)

    def _materialise(self, part: DecoderLM) -> None:
        part.to_empty(device=self.rt.device)
        init_weights(part, seed=self.cfg.train.seed)

    def _build_ddp(self) -> DecoderLM:
        cfg, rt = self.cfg, self.rt
        model = self._meta_model()
        self._materialise(model)
        if cfg.parallel.ac == "full":
            apply_ac(model)
        if cfg.perf.compile:
            # Compiled, then wrapped: DDP's optimizer splits the graph at bucket boundaries so communication
            # overlaps compute (https://pytorch.org/docs/stable/notes/ddp.html, TorchDynamo DDP).
            model.compile()
        if self.layout.dp > 1:
            # One process has nothing to reduce: no DDP wrapper, no reducer hooks, no bucket copies.
            self._ddp = DistributedDataParallel(
                model,
                device_ids=[rt.device.index] if rt.device.type == "cuda" else None,
                process_group=rt.device_group,
                # Gradients live in the all-reduce buckets: no second copy of them, no copy in and out.
                gradient_as_bucket_view=True,
            )
        return model

    def _build_fsdp(self, param_dtype: torch.dtype | None) -> list[DecoderLM]:
        cfg, layout = self.cfg, self.layout
        if cfg.perf.compile and layout.tp > 1 and self.rt.device.type == "cpu":
            # Found in torch 2.13 (topology-and-parallelism.md B.3): "'Tensor' object has no attribute
            # '_local_tensor'" in DTensor's backward. Unverified on CUDA, where it stays allowed.
            raise ConfigError("perf.compile: compiled blocks fail under tensor parallelism on CPU (DTensor backward); "
                              "set perf.compile=false or parallel.tp=1")
        self.mesh = mesh = build_mesh(layout, self.rt.device.type)
        self.tp_rank = mesh["tp"].get_local_rank()
        dp_mesh = mesh["dp_replicate", "dp_shard"] if layout.dp_replicate > 1 else mesh["dp_shard"]
        whole = self._meta_model()
        staged = split_stages(whole, layout, mesh["pp"].get_local_rank()) if layout.pp > 1 else [(0, whole)]
        for _, part in staged:
            if layout.tp > 1:
                apply_tp(part, mesh["tp"])
            if cfg.parallel.ac == "full":
                apply_ac(part)
            if cfg.perf.compile:
                apply_compile(part)
            apply_fsdp(part, dp_mesh, param_dtype=param_dtype, reshard_after_forward=layout.pp == 1)
            self._materialise(part)
        if layout.pp > 1:
            self._schedule, self.has_first, self.has_last = build_schedule(
                staged, layout, n_microbatches=self.plan.count, loss_fn=self._pipeline_loss,
                device=self.rt.device, group=mesh["pp"].get_group(),
            )  # fmt: skip
        return [part for _, part in staged]

    # -- one step -----------------------------------------------------------------------------------------

    def _cross_entropy(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Summed CE of full logits, or under TP of vocabulary-sharded local logits (run inside loss_parallel)."""
        if self.layout.tp > 1:
            assert self.mesh is not None
            logits = DTensor.from_local(logits, self.mesh["tp"], [Shard(-1)], run_check=False)
        return functional.cross_entropy(
            logits.flatten(0, 1).float(), targets.flatten(), reduction="sum", ignore_index=IGNORE_INDEX
        )

    def _pipeline_loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self._cross_entropy(output, targets) * self.loss_scale

    def _loss_context(self) -> contextlib.AbstractContextManager[Any]:
        # Vocabulary-parallel cross-entropy: forward and backward must both run inside it.
        return loss_parallel() if self.layout.tp > 1 else contextlib.nullcontext()

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(self.rt.device.type, dtype=self.autocast)

    def _gradient_sync(self, enabled: bool) -> contextlib.AbstractContextManager[Any]:
        """DDP's no_sync between micro-batches; FSDP keeps its sync on (see the module docstring)."""
        return self._ddp.no_sync() if self._ddp is not None and not enabled else contextlib.nullcontext()

    def forward_backward(self, batches: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """Run the step's micro-batches; this rank's share of the step's mean loss (0 where not reported)."""
        total = self._pipelined(batches) if self._schedule is not None else self._accumulated(batches)
        if not self.reports_loss:
            return torch.zeros((), device=self.rt.device)
        return total * self.report_scale

    def _accumulated(self, batches: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        model = self._ddp if self._ddp is not None else self.parts[0]
        total = torch.zeros((), device=self.rt.device)
        last = len(batches) - 1
        for i, (inputs, targets) in enumerate(batches):
            with self._gradient_sync(i == last), self._loss_context():
                with self._autocast():
                    # Under TP a vocabulary-parallel loss on local logits; else the head's chunked loss (loss.py).
                    tp = self.layout.tp > 1
                    loss = self._cross_entropy(model(inputs), targets) if tp else model(inputs, targets)
                (loss * self.loss_scale).backward()
            total += _local(loss).detach()
        return total

    def _pipelined(self, batches: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        inputs = torch.cat([b[0] for b in batches])
        targets = torch.cat([b[1] for b in batches])
        losses: list[torch.Tensor] = []
        kwargs: dict[str, Any] = {"target": targets if self.has_last else None,
                                  "losses": losses if self.has_last else None}
        with self._loss_context():
            if self.has_first:
                self._schedule.step(inputs, **kwargs)
            else:
                self._schedule.step(**kwargs)
        if not losses:
            return torch.zeros((), device=self.rt.device)
        return torch.stack([_local(loss).detach() for loss in losses]).sum() / self.loss_scale

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Clip by the norm of the whole model's gradient: sharded norms are reduced (DTensor), and under
        pipelining the squared norms of the stages are summed (torchtitan distributed/utils.py)."""
        params = [p for p in self.params if p.grad is not None]
        norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None], foreach=True)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        if self.layout.pp > 1:
            assert self.mesh is not None
            squared = norm**2
            dist.all_reduce(squared, group=self.mesh["pp"].get_group())
            norm = squared.sqrt()
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm, foreach=True)
        return norm

    # -- checkpoint state ---------------------------------------------------------------------------------

    def state_dict(self, optimizers: Sequence[torch.optim.Optimizer]) -> tuple[dict[str, Any], dict[str, Any]]:
        """Model and optimizer state of every part, merged and keyed by parameter name: DCP reshards it into any
        layout and world size on load."""
        model: dict[str, Any] = {}
        optim: dict[str, Any] = {}
        for part, optimizer in zip(self.parts, optimizers, strict=True):
            model.update(get_model_state_dict(part))
            optim.update(get_optimizer_state_dict(part, optimizer, options=_FLAT))
        return model, optim

    def load_state_dict(
        self, model: dict[str, Any], optim: dict[str, Any], optimizers: Sequence[torch.optim.Optimizer]
    ) -> None:
        for part, optimizer in zip(self.parts, optimizers, strict=True):
            set_model_state_dict(part, model, options=StateDictOptions(strict=False))
            set_optimizer_state_dict(part, optimizer, optim, options=_FLAT)

    # -- accounting ---------------------------------------------------------------------------------------

    def local_bytes(self, optimizers: Sequence[torch.optim.Optimizer]) -> dict[str, int]:
        """Bytes this rank holds in parameters, gradients and optimizer state (its shards only)."""

        def size(t: torch.Tensor) -> int:
            local = _local(t)
            return local.numel() * local.element_size()

        params = self.params
        state = [v for o in optimizers for s in o.state.values() for v in s.values()
                 if isinstance(v, torch.Tensor) and v.dim() > 0]
        return {
            "params": sum(size(p) for p in params),
            "grads": sum(size(p.grad) for p in params if p.grad is not None),
            "optimizer": sum(size(v) for v in state),
        }

    def gradient_bytes(self) -> int:
        """fp32 gradient bytes this rank hands to the data-parallel reduction per step (FSDP reduce-scatters the
        unsharded gradient of its TP-local parameters, every micro-batch unless pipelining)."""
        if self.layout.dp == 1:
            return 0
        local = sum(_local(p).numel() for p in self.params)
        if not self.layout.fsdp:
            return 4 * local
        return 4 * local * self.layout.dp_shard * (self.plan.count if self._schedule is None else 1)

    @property
    def ddp(self) -> DistributedDataParallel | None:
        return self._ddp

    @property
    def dp_rank(self) -> int:
        """Which share of the global batch this rank reads; tensor and pipeline peers read the same one."""
        if self.mesh is None:
            return self.rt.env.rank
        replica, shard = self.mesh["dp_replicate"].get_local_rank(), self.mesh["dp_shard"].get_local_rank()
        return replica * self.layout.dp_shard + shard
