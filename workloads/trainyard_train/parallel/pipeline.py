"""Pipeline parallelism: split a meta-device DecoderLM into stages and build a torch.distributed.pipelining schedule.

As torchtitan does it (pytorch/torchtitan@v0.2.2 torchtitan/distributed/pipeline_parallel.py): each stage is a
copy of the whole meta model with the layers and ends it does not own deleted, so parameter names stay those of
the unsplit model and a checkpoint reshards between pipeline layouts by name.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.distributed import ProcessGroup
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import PipelineScheduleSingle, _PipelineSchedule, get_schedule_class

from ..layout import Layout, stage_layers
from ..model import DecoderLM


def split_stages(model: DecoderLM, layout: Layout, pp_rank: int) -> list[tuple[int, DecoderLM]]:
    """(stage id, stage model) for each stage this pp rank runs; the first stage keeps the embedding, the last
    the final norm and head."""
    ranges = stage_layers(len(model.layers), layout.n_stages)
    stages = []
    for stage_id in layout.stage_ids(pp_rank):
        part = copy.deepcopy(model)
        keep = {str(i) for i in ranges[stage_id]}
        for key in list(part.layers):
            if key not in keep:
                del part.layers[key]
        if stage_id != 0:
            part.tok_embeddings = None
        if stage_id != layout.n_stages - 1:
            part.norm = None
            part.output = None
        stages.append((stage_id, part))
    return stages


def build_schedule(
    parts: Sequence[tuple[int, nn.Module]],
    layout: Layout,
    *,
    n_microbatches: int,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    device: torch.device,
    group: ProcessGroup,
) -> tuple[_PipelineSchedule, bool, bool]:
    """The schedule, and whether this rank holds the first and the last stage.

    Gradients are summed over micro-batches (scale_grads=False): loss_fn returns each micro-batch's share of the
    global-batch loss already (engine.py), as torchtitan scales by the global token count.
    """
    stages = [PipelineStage(part, stage_id, layout.n_stages, device, group=group) for stage_id, part in parts]
    schedule_class = get_schedule_class(layout.schedule)
    first = stages[0] if issubclass(schedule_class, PipelineScheduleSingle) else stages
    schedule = schedule_class(first, n_microbatches=n_microbatches, loss_fn=loss_fn, scale_grads=False)
    return schedule, any(s.is_first for s in stages), any(s.is_last for s in stages)
