"""DDP gradient communication and how many bytes it sends: DDP's own all-reduce, PowerSGD, or one of two
error-feedback compressors (QSGD, top-k) as DDP communication hooks.

Plain all-reduce stays on DDP's built-in C++ path: no Python comm hook, nothing wrapped. Its traffic per
optimizer step is known without watching it: every gradient is all-reduced once (accumulation steps run
under ``no_sync``), so the meter reports the gradient bytes. PowerSGD is a Python hook anyway; a thin
wrapper around it adds up, per bucket, the bytes the hook is about to send, from the same rule the hook
uses to decide what to compress. Nothing process-wide is patched.

QSGD (Alistarh et al. 2017, arXiv:1610.02132; bucketed, 512 values per norm) and top-k sparsification (Aji and
Heafield 2017, arXiv:1704.05021; with error feedback as in Stich et al. 2018, arXiv:1809.07599) are not in torch
2.13's ddp_comm_hooks. Both keep
each rank's residual, the part of its gradient not yet sent, and add it to the next step's gradient (error
feedback: what one step drops, a later one sends). Their payloads cannot be summed in flight (each rank has its own
scale, or its own indices), so each rank's payload is all-gathered and decoded by everyone: per bucket of n values,
QSGD sends n signed bytes plus a float32 norm per 512 values (about 4x less than all-reduce), top-k 8 bytes per
kept value (k = ratio x n). The residuals are rank-local, kept per parameter, and checkpointed with each rank's
state like PowerSGD's (loop.py restores them when the layout and world size are unchanged).

PowerSGD on gloo aborts the process (SIGABRT) once the gradients fill more than one DDP bucket
(pytorch/pytorch#58467; reproduced with torch 2.13: a model over DDP's 1 MiB first bucket dies at the first
compressed step), so on gloo it is refused for such models with a ConfigError; NCCL is not affected.
"""

from __future__ import annotations

import math
import threading
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
from torch.nn.parallel import DistributedDataParallel

from .config import CommConfig, ConfigError


class GradCommMeter:
    """Gradient bytes all-reduced per optimizer step. Hook callbacks may run on the autograd thread."""

    def __init__(self, fixed_bytes_per_step: int | None = None) -> None:
        self.fixed_bytes_per_step = fixed_bytes_per_step
        """Set for DDP's own all-reduce (no hook to count); None when a hook records what it sends."""
        self._lock = threading.Lock()
        self._bytes = 0

    def record(self, nbytes: int) -> None:
        with self._lock:
            self._bytes += nbytes

    def take(self) -> int:
        """Bytes since the previous call, or the plain all-reduce's fixed volume."""
        if self.fixed_bytes_per_step is not None:
            return self.fixed_bytes_per_step
        with self._lock:
            taken, self._bytes = self._bytes, 0
        return taken


def gradient_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def powersgd_bucket_bytes(state: powerSGD_hook.PowerSGDState, bucket: dist.GradBucket) -> int:
    """Bytes PowerSGD sends for one bucket: the flat bucket while warming up, else P and Q for the
    matrices worth compressing plus the rest uncompressed (the test in powerSGD_hook's _should_compress)."""
    if state.iter < state.start_powerSGD_iter:
        return bucket.buffer().numel() * bucket.buffer().element_size()
    total = 0
    for grad in bucket.gradients():
        size = grad.element_size()
        if grad.ndim <= 1:
            total += grad.numel() * size
            continue
        n = grad.shape[0]
        m = grad.numel() // n
        r = min(n, m, state.matrix_approximation_rank)
        compress = (n + m) * r * state.min_compression_rate < n * m
        total += ((n + m) * r if compress else n * m) * size
    return total


def register_grad_hook(
    model: DistributedDataParallel, cfg: CommConfig, group: dist.ProcessGroup, seed: int
) -> tuple[HookState | None, GradCommMeter]:
    """Register the configured hook; returns its state (to checkpoint: hook_state_blob), None for DDP's own
    all-reduce, and the meter."""
    if cfg.hook == "allreduce":
        # DDP's built-in reduction: the fastest path, nothing to register; every gradient goes once per step.
        return None, GradCommMeter(gradient_bytes(model.module))
    meter = GradCommMeter()
    if cfg.hook in ("qsgd", "topk"):
        return register_compression(model, cfg, group, meter), meter
    grad_bytes = gradient_bytes(model.module)
    if dist.get_backend(group) == "gloo" and grad_bytes > dist._DEFAULT_FIRST_BUCKET_BYTES:
        raise ConfigError(
            f"comm.hook: powersgd on gloo aborts once gradients span more than one DDP bucket "
            f"(pytorch/pytorch#58467); this model has {grad_bytes / 2**20:.1f} MiB of gradients, over the "
            f"{dist._DEFAULT_FIRST_BUCKET_BYTES / 2**20:.0f} MiB first bucket: use allreduce, qsgd or topk on CPU")
    state = powerSGD_hook.PowerSGDState(
        process_group=group,
        matrix_approximation_rank=cfg.powersgd_rank,
        start_powerSGD_iter=cfg.powersgd_start_iter,
        min_compression_rate=cfg.powersgd_min_compression_rate,
        random_seed=seed,
    )

    def metered_powersgd(state: powerSGD_hook.PowerSGDState, bucket: dist.GradBucket) -> Any:
        meter.record(powersgd_bucket_bytes(state, bucket))
        return powerSGD_hook.powerSGD_hook(state, bucket)

    # DDP checks a hook's annotations against dist.GradBucket / Future; this module's are strings
    # (postponed evaluation), which that check rejects, so the runtime annotations are dropped.
    metered_powersgd.__annotations__.clear()
    model.register_comm_hook(state, metered_powersgd)
    return state, meter


def register_compression(
    model: DistributedDataParallel, cfg: CommConfig, group: dist.ProcessGroup, meter: GradCommMeter
) -> ErrorFeedback:
    """Register the QSGD or top-k hook; returns its state (the residuals)."""
    names = {id(p): name for name, p in model.module.named_parameters()}
    feedback = ErrorFeedback(group, meter, names, levels=cfg.qsgd_levels, ratio=cfg.topk_ratio)
    hook = qsgd_hook if cfg.hook == "qsgd" else topk_hook

    def compressed(state: ErrorFeedback, bucket: dist.GradBucket) -> Any:
        return hook(state, bucket)

    compressed.__annotations__.clear()  # see metered_powersgd in register_grad_hook
    model.register_comm_hook(feedback, compressed)
    return feedback


def hook_state_blob(state: HookState) -> dict[str, Any]:
    """A hook's serializable, rank-local state: QSGD's or top-k's residuals; PowerSGD's own slots (error feedback,
    warm-start P/Q, iter, RNG) minus the group."""
    if isinstance(state, ErrorFeedback):
        return {name: residual.clone() for name, residual in state.residuals.items()}  # not the bucket's storage
    return {slot: getattr(state, slot) for slot in state.__slots__ if slot != "process_group"}


def restore_hook_state(state: HookState, blob: dict[str, Any]) -> None:
    """In place, so the hook already registered with DDP keeps its object and its process group."""
    if isinstance(state, ErrorFeedback):
        state.residuals = dict(blob)
        return
    for slot, value in blob.items():
        setattr(state, slot, value)


class ErrorFeedback:
    """A compression hook's state: each parameter's residual, keyed by its name (not by bucket: DDP rebuilds its
    buckets after the first step, and a resumed run starts from the initial ones again), and what the payload is
    sized by."""

    def __init__(self, group: dist.ProcessGroup, meter: GradCommMeter, names: dict[int, str], *, levels: int,
                 ratio: float) -> None:
        self.group = group
        self.meter = meter
        self.names = names
        """id(parameter) -> its name in the DDP module."""
        self.levels = levels
        self.ratio = ratio
        self.residuals: dict[str, torch.Tensor] = {}

    def _segments(self, bucket: dist.GradBucket) -> list[tuple[str, slice]]:
        """Each parameter's name and its span of the flat bucket (its gradients lie there in this order)."""
        spans, offset = [], 0
        for param, grad in zip(bucket.parameters(), bucket.gradients(), strict=True):
            spans.append((self.names[id(param)], slice(offset, offset + grad.numel())))
            offset += grad.numel()
        return spans

    def corrected(self, bucket: dist.GradBucket) -> torch.Tensor:
        """This step's gradient plus what earlier steps left unsent (float32, a copy)."""
        x = bucket.buffer().to(torch.float32, copy=True)
        for name, span in self._segments(bucket):
            residual = self.residuals.get(name)
            if residual is not None:
                x[span] += residual
        return x

    def keep(self, bucket: dist.GradBucket, residual: torch.Tensor) -> None:
        """What this step did not send, per parameter."""
        for name, span in self._segments(bucket):
            self.residuals[name] = residual[span]

    def gather(self, bucket: dist.GradBucket, payload: torch.Tensor,
               decode: Any) -> torch.futures.Future[torch.Tensor]:
        """All-gather every rank's payload; ``decode(payloads)`` gives the summed gradient for the bucket."""
        self.meter.record(payload.numel() * payload.element_size())
        world = dist.get_world_size(self.group)
        payloads = [torch.empty_like(payload) for _ in range(world)]
        work = dist.all_gather(payloads, payload, group=self.group, async_op=True)
        assert work is not None
        buffer = bucket.buffer()

        def done(fut: torch.futures.Future[Any]) -> torch.Tensor:
            fut.wait()
            buffer.copy_(decode(payloads) / world)
            return buffer

        return work.get_future().then(done)


HookState = powerSGD_hook.PowerSGDState | ErrorFeedback
"""What a registered hook keeps between steps, and what a checkpoint saves per rank."""


QSGD_CHUNK = 512
"""Values per norm: QSGD quantizes buckets of d consecutive values, each against its own norm (the paper's d = 512
in its experiments); one norm for a whole DDP bucket of millions of values would leave most of them at level 0."""


def qsgd_hook(state: ErrorFeedback, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """QSGD with s = ``levels``: each value becomes sign x a level in 0..s of its chunk's L2 norm, rounded up or
    down at random so that the expectation is the value itself; one signed byte per value, one float per chunk."""
    x = state.corrected(bucket)
    n = x.numel()
    chunks = torch.nn.functional.pad(x, (0, -n % QSGD_CHUNK)).view(-1, QSGD_CHUNK)
    norms = chunks.norm(dim=1, keepdim=True)
    scaled = torch.where(norms > 0, chunks.abs() / norms.clamp(min=torch.finfo(x.dtype).tiny), 0.0) * state.levels
    levels = torch.floor(scaled + torch.rand_like(scaled)).clamp_(max=state.levels)
    quantized = (levels * chunks.sign()).to(torch.int8)
    sent = (quantized.float() * (norms / state.levels)).flatten()[:n]
    state.keep(bucket, x - sent)
    count = norms.numel()
    payload = torch.cat([norms.flatten().view(torch.int8), quantized.flatten()])

    def decode(payloads: list[torch.Tensor]) -> torch.Tensor:
        total = torch.zeros_like(chunks)
        for p in payloads:
            scale = p[: 4 * count].view(torch.float32).view(-1, 1) / state.levels
            total.add_(p[4 * count :].view(-1, QSGD_CHUNK).float() * scale)
        return total.flatten()[:n]

    return state.gather(bucket, payload, decode)


def topk_hook(state: ErrorFeedback, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Top-k: the ``ratio`` share of values largest in magnitude, as (int32 index, float32 value) pairs."""
    x = state.corrected(bucket)
    k = max(1, math.ceil(state.ratio * x.numel()))
    indices = x.abs().topk(k, sorted=False).indices
    values = x[indices]
    residual = x.clone()
    residual[indices] = 0
    state.keep(bucket, residual)
    payload = torch.cat([indices.to(torch.int32), values.view(torch.int32)])

    def decode(payloads: list[torch.Tensor]) -> torch.Tensor:
        total = torch.zeros_like(x)
        for p in payloads:
            total.index_add_(0, p[:k].long(), p[k:].view(torch.float32))
        return total

    return state.gather(bucket, payload, decode)
