"""A parallel layout resolved at a world size, and how one step's global batch splits over it.

Pure Python (no torch): the trainer, validate.py, planner.py and the platform's plan all import it.

Ranks are numbered as torchtitan's ``ParallelDims`` orders its mesh, ``(pp, dp_replicate, dp_shard, tp)`` with
tp innermost (pytorch/torchtitan@v0.2.2 torchtitan/distributed/parallel_dims.py). torchrun numbers ranks
``node_rank * nproc_per_node + local_rank``, so a TP group is consecutive ranks on one node whenever tp divides
the processes per node, and the pipeline dimension is the one that crosses nodes first: a rank's pipeline peers
are ``world / pp`` ranks apart, on another node as soon as the world spans more than one (torchtitan's choice:
P2P sends need the least bandwidth). A node then holds slices of several model copies, not one whole copy.

Any world size. A step consumes ``G`` samples (train.global_batch_size). Data-parallel rank ``r`` of ``D`` takes a
contiguous share of ``G // D`` or ``G // D + 1`` of them. Every rank runs the same number of micro-batches,
``n = ceil(ceil(G / D) / micro_batch_size)``, each of ``ceil(ceil(G / D) / n)`` rows; a rank with a smaller share
pads its last micro-batch(es) with rows whose targets are ignored. The loss is the sum of per-token
cross-entropies over the global batch divided by ``G * seq_len``, so each rank's gradient contribution is exactly
its share of the fixed-batch gradient, and the count of forward passes, FSDP all-gathers and reduce-scatters and
pipeline sends is the same on every rank (a rank doing one more all-gather than its peers would hang NCCL).
"""

from __future__ import annotations

from dataclasses import dataclass

from .config import V_SCHEDULES, Config, ConfigError, ParallelConfig


@dataclass(frozen=True)
class Layout:
    """Degrees of each mesh dimension at one world size."""

    data_parallel: str
    """ddp or fsdp (config parallel.data_parallel)."""
    pp: int
    dp_replicate: int
    dp_shard: int
    tp: int
    stages_per_rank: int = 1
    schedule: str = "1F1B"

    @property
    def dp(self) -> int:
        """Data-parallel ranks: each reads its own share of the global batch."""
        return self.dp_replicate * self.dp_shard

    @property
    def world_size(self) -> int:
        return self.pp * self.dp * self.tp

    @property
    def model_parallel(self) -> int:
        """Ranks that hold one copy of the model between them (a TP x PP block)."""
        return self.tp * self.pp

    @property
    def n_stages(self) -> int:
        return self.pp * self.stages_per_rank

    @property
    def fsdp(self) -> bool:
        return self.data_parallel == "fsdp"

    def describe(self) -> str:
        dims = [f"pp{self.pp}"] if self.pp > 1 else []
        if self.fsdp:
            dims += [f"dp_replicate{self.dp_replicate}"] if self.dp_replicate > 1 else []
            dims += [f"dp_shard{self.dp_shard}"]
        else:
            dims += [f"ddp{self.dp}"]
        dims += [f"tp{self.tp}"] if self.tp > 1 else []
        schedule = f" {self.schedule}" if self.pp > 1 else ""
        stages = f" {self.stages_per_rank} stages per rank" if self.stages_per_rank > 1 else ""
        return "x".join(dims) + schedule + stages

    def stage_ids(self, pp_rank: int) -> list[int]:
        """The pipeline stages this pp rank runs: loop order ``r, r + pp, ...`` or V order ``r, 2pp - 1 - r``
        (torch.distributed.pipelining generate_stage_to_rank_mapping, styles "loop" and "v")."""
        if self.stages_per_rank == 1:
            return [pp_rank]
        if self.schedule in V_SCHEDULES:
            return [pp_rank, self.n_stages - 1 - pp_rank]
        return [pp_rank + s * self.pp for s in range(self.stages_per_rank)]


def resolve(parallel: ParallelConfig, world_size: int) -> Layout:
    """The layout at this world size; ConfigError naming the key whose degree does not fit it."""
    p = parallel
    if p.data_parallel == "ddp":
        return Layout("ddp", pp=1, dp_replicate=world_size, dp_shard=1, tp=1)
    model_parallel = p.tp * p.pp
    if world_size % model_parallel:
        key = "parallel.pp" if p.pp > 1 else "parallel.tp"
        raise ConfigError(f"{key}: tp x pp = {model_parallel} ranks do not divide the world of {world_size}")
    dp = world_size // model_parallel
    replicate, shard = p.dp_replicate, p.dp_shard
    if replicate == -1 or shard == -1:
        fixed, key = (shard, "parallel.dp_shard") if replicate == -1 else (replicate, "parallel.dp_replicate")
        if dp % fixed:
            raise ConfigError(f"{key}: {fixed} does not divide the {dp} data-parallel ranks of a world of "
                              f"{world_size} (tp x pp = {model_parallel})")
        replicate, shard = (dp // fixed, fixed) if replicate == -1 else (fixed, dp // fixed)
    elif replicate * shard != dp:
        raise ConfigError(f"parallel.dp_shard: dp_replicate x dp_shard = {replicate * shard} is not the {dp} "
                          f"data-parallel ranks of a world of {world_size}; set one of them to -1")
    return Layout("fsdp", pp=p.pp, dp_replicate=replicate, dp_shard=shard, tp=p.tp,
                  stages_per_rank=p.stages_per_rank, schedule=p.pp_schedule)


@dataclass(frozen=True)
class MicroBatchPlan:
    count: int
    """Micro-batches per step, the same on every data-parallel rank (under pipelining: pipeline micro-batches)."""
    rows: int
    """Rows of each micro-batch; rows beyond a rank's share are padding whose targets are ignored."""


def micro_batch_plan(global_batch: int, micro_batch: int, dp: int) -> MicroBatchPlan:
    """As few micro-batches as micro_batch allows for the largest share, each as small as the share allows."""
    largest = -(-global_batch // dp)
    count = -(-largest // micro_batch)
    return MicroBatchPlan(count=count, rows=-(-largest // count))


def rank_share(global_batch: int, dp: int, dp_rank: int) -> tuple[int, int]:
    """(offset into the step's samples, count) for one data-parallel rank: shares differ by at most one."""
    base, extra = divmod(global_batch, dp)
    return dp_rank * base + min(dp_rank, extra), base + (1 if dp_rank < extra else 0)


def stage_layers(n_layers: int, n_stages: int) -> list[range]:
    """Contiguous layer ranges per stage, sizes differing by at most one (the earlier stages get the extra)."""
    base, extra = divmod(n_layers, n_stages)
    ranges, start = [], 0
    for stage in range(n_stages):
        size = base + (1 if stage < extra else 0)
        ranges.append(range(start, start + size))
        start += size
    return ranges


def for_config(cfg: Config, world_size: int) -> tuple[Layout, MicroBatchPlan]:
    layout = resolve(cfg.parallel, world_size)
    return layout, micro_batch_plan(cfg.train.global_batch_size, cfg.train.micro_batch_size, layout.dp)
