"""DDP gradient communication: plain all-reduce or PowerSGD, both metered.

Both hooks issue their collectives through ``torch.distributed.all_reduce`` on the dedicated gradient
group, so wrapping that one function and filtering on the group counts exactly the bytes the hook
sends, PowerSGD's P and Q factors and its uncompressed vectors included, and nothing else.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel

from .config import CommConfig


class GradCommMeter:
    """Counts bytes all-reduced on one process group. Hook callbacks may run on other threads."""

    def __init__(self, group: dist.ProcessGroup) -> None:
        self.group = group
        self._lock = threading.Lock()
        self._bytes = 0

    def record(self, tensor: torch.Tensor) -> None:
        with self._lock:
            self._bytes += tensor.numel() * tensor.element_size()

    def take(self) -> int:
        """Bytes since the previous call (one optimizer step's worth when called once per step)."""
        with self._lock:
            taken, self._bytes = self._bytes, 0
        return taken


_meters: list[GradCommMeter] = []


def _install_all_reduce_tap() -> None:
    if getattr(dist.all_reduce, "_trainyard_tap", False):
        return
    original = dist.all_reduce

    @functools.wraps(original)
    def tapped(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        group = kwargs.get("group", args[1] if len(args) > 1 else None)
        for meter in _meters:
            if group is meter.group:
                meter.record(tensor)
        return original(tensor, *args, **kwargs)

    tapped._trainyard_tap = True  # type: ignore[attr-defined]
    dist.all_reduce = tapped


def attach_meter(group: dist.ProcessGroup) -> GradCommMeter:
    _install_all_reduce_tap()
    meter = GradCommMeter(group)
    _meters.append(meter)
    return meter


def register_grad_hook(
    model: DistributedDataParallel, cfg: CommConfig, group: dist.ProcessGroup, seed: int
) -> powerSGD_hook.PowerSGDState | None:
    """Register the configured hook; returns the PowerSGD state (to checkpoint) or None."""
    if cfg.hook == "allreduce":
        # Same math as DDP's built-in C++ all-reduce, but routed through Python so it can be metered.
        model.register_comm_hook(group, default_hooks.allreduce_hook)
        return None
    state = powerSGD_hook.PowerSGDState(
        process_group=group,
        matrix_approximation_rank=cfg.powersgd_rank,
        start_powerSGD_iter=cfg.powersgd_start_iter,
        min_compression_rate=cfg.powersgd_min_compression_rate,
        random_seed=seed,
    )
    model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    return state


def powersgd_state_blob(state: powerSGD_hook.PowerSGDState) -> dict[str, Any]:
    """The hook's own serializable state (error feedback, warm-start P/Q, iter, RNG), minus the group."""
    return {slot: getattr(state, slot) for slot in state.__slots__ if slot != "process_group"}


def restore_powersgd_state(state: powerSGD_hook.PowerSGDState, blob: dict[str, Any]) -> None:
    """In place, so the hook already registered with DDP keeps its object and its process group."""
    for slot, value in blob.items():
        setattr(state, slot, value)
