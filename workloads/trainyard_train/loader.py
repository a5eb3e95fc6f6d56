"""One optimizer step's samples as micro-batches on the device, read from the shards in the global order (data.py)."""

from __future__ import annotations

import numpy as np
import torch

from .data import GlobalOrder, ShardReader, rank_slice
from .layout import MicroBatchPlan
from .loss import IGNORE_INDEX


class StepLoader:
    """One optimizer step's samples for one data-parallel rank, as (inputs, targets) micro-batches on the device.

    Every rank gets ``plan.count`` micro-batches of ``plan.rows`` rows whatever its share, so all ranks run the
    same forward passes and collectives; rows beyond the share are padding, their targets IGNORE_INDEX.
    The step's tokens are gathered into a pinned host buffer and copied to the GPU in one non-blocking
    transfer; two buffers alternate, each guarded by an event, so filling the next step's buffer never
    overwrites one whose copy the GPU has not finished. Tokens travel as int32 (half of int64's bytes).
    """

    def __init__(
        self,
        reader: ShardReader,
        order: GlobalOrder,
        *,
        global_batch: int,
        plan: MicroBatchPlan,
        dp_size: int,
        dp_rank: int,
        device: torch.device,
    ) -> None:
        self.reader, self.order = reader, order
        self.global_batch, self.plan = global_batch, plan
        self.dp_size, self.dp_rank, self.device = dp_size, dp_rank, device
        pin = device.type == "cuda"
        shape = (plan.count * plan.rows, reader.manifest.record_len)
        # Zeros: padding rows are valid token ids whatever they hold, and never change after this.
        self._buffers = [torch.zeros(shape, dtype=torch.int32, pin_memory=pin) for _ in range(2)]
        self._events: list[torch.cuda.Event | None] = [None, None]
        self._turn = 0
        self.last_record_ids = np.empty(0, dtype=np.int64)

    def step_batches(self, position: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The micro-batches of the step that starts at global sample ``position``."""
        start, count = rank_slice(position, self.global_batch, self.dp_size, self.dp_rank)
        ids = self.order.record_ids(start, count)
        self.last_record_ids = ids
        turn, self._turn = self._turn, 1 - self._turn
        host, event = self._buffers[turn], self._events[turn]
        if event is not None:
            event.synchronize()  # waits only if the GPU is two steps behind the host
        self.reader.records(ids, host[:count].numpy())
        tokens = host.to(self.device, non_blocking=True)
        if self.device.type == "cuda":
            done = torch.cuda.Event()
            done.record()
            self._events[turn] = done
        tokens = tokens.long()
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        if count < len(tokens):
            targets = targets.clone()
            targets[count:] = IGNORE_INDEX
        rows = self.plan.rows
        return [(inputs[i : i + rows], targets[i : i + rows]) for i in range(0, len(tokens), rows)]
