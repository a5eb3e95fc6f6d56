"""DDP gradient communication (DDP's own all-reduce, or PowerSGD) and how many bytes it sends.

Plain all-reduce stays on DDP's built-in C++ path: no Python comm hook, nothing wrapped. Its traffic per
optimizer step is known without watching it: every gradient is all-reduced once (accumulation steps run
under ``no_sync``), so the meter reports the gradient bytes. PowerSGD is a Python hook anyway; a thin
wrapper around it adds up, per bucket, the bytes the hook is about to send, from the same rule the hook
uses to decide what to compress. Nothing process-wide is patched.
"""

from __future__ import annotations

import threading
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
from torch.nn.parallel import DistributedDataParallel

from .config import CommConfig


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
) -> tuple[powerSGD_hook.PowerSGDState | None, GradCommMeter]:
    """Register the configured hook; returns the PowerSGD state (to checkpoint) or None, and the meter."""
    if cfg.hook == "allreduce":
        # DDP's built-in reduction: the fastest path, nothing to register; every gradient goes once per step.
        return None, GradCommMeter(gradient_bytes(model.module))
    meter = GradCommMeter()
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


def powersgd_state_blob(state: powerSGD_hook.PowerSGDState) -> dict[str, Any]:
    """The hook's own serializable state (error feedback, warm-start P/Q, iter, RNG), minus the group."""
    return {slot: getattr(state, slot) for slot in state.__slots__ if slot != "process_group"}


def restore_powersgd_state(state: powerSGD_hook.PowerSGDState, blob: dict[str, Any]) -> None:
    """In place, so the hook already registered with DDP keeps its object and its process group."""
    for slot, value in blob.items():
        setattr(state, slot, value)
