"""Per-GPU memory of a config at a world size, and a layout that fits a GPU: the platform's plan refuses a job with it.

    estimate(cfg, world_size=16, local_world_size=8)              -> MemoryEstimate (bytes, the busiest rank)
    check_fits(cfg, world_size=16, local_world_size=8, device_memory_bytes=80 * GiB)   # ConfigError if not
    suggest(cfg, world_size=16, local_world_size=8, device_memory_bytes=80 * GiB)     -> fitting layouts, best first

Pure Python (config and layout, no torch): the plan imports it. ``python -m trainyard_train.plan_layout`` prints it.

The terms, per rank, for mixed-precision AdamW as the trainer runs it (fp32 master weights; FSDP2 gathers them in
bf16, DDP computes under bf16 autocast):

- Model states, 16 bytes per parameter held: fp32 weights 4 + fp32 gradients 4 + Adam's two moments 8 (ZeRO,
  Rajbhandari et al. 2020, arXiv 1910.02054 §3: "(2 + 2 + K)Ψ" with K = 12 for the fp32 copy and moments; the fp32
  gradient replaces the fp16 one here). Counted tensor by tensor from the model's shapes: tensor parallel splits a
  weight's rows or columns, a pipeline rank holds its stages' tensors, FSDP2 keeps a dim-0 chunk of
  ceil(rows / dp_shard) (torch.chunk, as FSDP2 shards), DDP everything.
- Gathered: FSDP2 all-gathers one group (a block, the embedding, or norm + head) before use and prefetches the next,
  so about two groups are unsharded at once, each in the gather dtype plus its fp32 unsharded gradient before the
  reduce-scatter (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py@v2.13.0). Without pipelining that holds
  for any number of micro-batches: the loop keeps FSDP's gradient sync on, so every micro-batch's backward
  reduce-scatters into the sharded gradient (parallel/engine.py; with sync off, post_backward would keep each
  parameter's whole gradient in fp32 until the last micro-batch, 4 bytes per held parameter). Under pipelining
  torch turns sync off itself: the stage stays unsharded across its micro-batches and its gradients accumulate
  unsharded in fp32 (pipelining/stage.py backward_maybe_with_nosync: set_requires_gradient_sync(False) and
  set_reshard_after_backward(False) until the last micro-batch; _fsdp_param.py to_accumulated_grad_if_needed).
  DDP under autocast holds bf16 copies of the weights its matmuls saved for backward.
- Activations: the tensors autograd saves per block, counted from this model's forward (model.py), the method of
  Korthikanti et al. 2022 (arXiv 2205.05198 §4): norm inputs x and h (residual dtype), the normalised inputs of
  the q/k/v and w1/w3 projections, q, k, v and the attention output (SDPA's flash/efficient kernels save no
  scores, only a per-row logsumexp), wo's input, and w1, w3, silu(w1) and the product (4 x ffn). Tensor parallelism
  with sequence parallelism divides all but the two all-gathered norm outputs by tp. Full activation
  checkpointing keeps each block's input and one block's worth during recompute. Micro-batches in flight: one
  without pipelining (accumulation frees each before the next); on the first pipeline rank min(pp, m) for
  1F1B-like schedules, m for GPipe and LoopedBFS, pp(1 + (pp-1)/(pp v)) for interleaved ones (Korthikanti et al.
  2022 §4.2.3), pp + 1 for DualPipeV (DeepSeek-V3 technical report, arXiv 2412.19437, Table 2); ZBV is taken
  as 1F1B's peak (an assumption: torch's ZBVZeroBubble keeps about pp micro-batches per rank; unmeasured).
- Logits: the chunked loss (no TP, no PP, a micro-batch of more than perf.loss_chunk_tokens tokens) holds one
  chunk's fp32 logits and keeps the hidden and head-weight gradients it formed (loss.py); otherwise the
  micro-batch's logits in the compute dtype, their fp32 upcast and the fp32 log-softmax cross-entropy saves
  (divided by tp under the vocabulary-parallel loss).
- Overhead: CUDA context, NCCL buffers and allocator slack, a fixed reserve (OVERHEAD_BYTES) to be measured per
  pool: bench/gpu.py prints this estimate beside torch.cuda.max_memory_allocated.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .config import MULTI_STAGE_SCHEDULES, Config, ConfigError, ParallelConfig
from .layout import Layout, MicroBatchPlan, for_config, stage_layers
from .validate import check_launch

GiB = 2**30
MiB = 2**20
OVERHEAD_BYTES = 4 * GiB
"""CUDA context + NCCL/EFA buffers + fragmentation: an assumption (topology-and-parallelism.md B.4), not measured."""
# The GPU models of the platform's pools (infra/trainyard/config/instance_types.py GpuModel). A model's nominal
# size overstates what a job can use: nvidia-smi's memory.total, from public nvidia-smi tables naming the model
# ("NVIDIA H200 ... / 143771MiB", "NVIDIA A10G ... / 23028MiB"; the A100s' are exactly 40 and 80 GiB) ...
NVIDIA_SMI_MIB = {"A100-40GB": 40960, "A100-80GB": 81920, "H100-80GB": 81559, "H200-141GB": 143771,
                  "A10G-24GB": 23028, "L4-24GB": 23034, "L40S-48GB": 46068}
# ... and less again, the total CUDA reports (cudaMemGetInfo: what preflight.check_memory compares with, and what
# torch's out-of-memory message calls "total capacity"): the driver keeps the rest. The lowest figure found in
# public out-of-memory messages on the model, rounded down to MiB (the messages print GiB to 2 decimals).
CUDA_TOTAL_MIB = {
    "A100-40GB": 40442,  # 39.50 GiB on one A100 40 GB (github.com/TianheWu/CoSeR/issues/10)
    "A100-80GB": 81034,  # 79.14 GiB on an A100 80 GB (github.com/lianqi1008/Control-GIC/issues/6; 79.25 elsewhere)
    "H100-80GB": 81003,  # 79.11 GiB on an H100 (github.com/vllm-project/vllm/issues/27508; 79.18-79.21 elsewhere)
    "H200-141GB": 143150,  # 139.80 GiB on 8 x H200 (public training logs; 139.81 elsewhere)
}
DRIVER_RESERVE_MIB = max(NVIDIA_SMI_MIB[gpu] - mib for gpu, mib in CUDA_TOTAL_MIB.items())
"""For a model with no CUDA figure found (A10G, L4, L40S): nvidia-smi's total less the largest difference above
(886 MiB, the A100 80 GB's), an assumption until measured (bench/gpu.py prints torch.cuda.mem_get_info)."""


def gpu_memory_bytes(gpu: str) -> int:
    """What CUDA gives a job on one GPU of this model (KeyError for a model the table does not hold)."""
    return CUDA_TOTAL_MIB.get(gpu, NVIDIA_SMI_MIB[gpu] - DRIVER_RESERVE_MIB) * MiB


@dataclass(frozen=True)
class Tensor:
    """One parameter: its shape, the dim tensor parallelism splits (None: replicated), where it sits."""

    name: str
    rows: int
    cols: int
    tp_dim: int | None
    layer: int | None
    """Its block, or None for the embedding (stage 0) and the final norm and head (last stage)."""


def parameters(cfg: Config) -> list[Tensor]:
    """Every parameter of model.py's DecoderLM (the tied head shares the embedding's)."""
    m = cfg.model
    d, q, kv, f = m.d_model, m.n_heads * m.head_dim, m.kv_heads * m.head_dim, m.ffn_dim
    tensors = [Tensor("tok_embeddings.weight", m.vocab_size, d, 0, None)]
    for i in range(m.n_layers):
        tensors += [
            Tensor(f"layers.{i}.attention_norm.weight", d, 1, None, i),
            Tensor(f"layers.{i}.attention.wq.weight", q, d, 0, i),
            Tensor(f"layers.{i}.attention.wk.weight", kv, d, 0, i),
            Tensor(f"layers.{i}.attention.wv.weight", kv, d, 0, i),
            Tensor(f"layers.{i}.attention.wo.weight", d, q, 1, i),
            Tensor(f"layers.{i}.ffn_norm.weight", d, 1, None, i),
            Tensor(f"layers.{i}.feed_forward.w1.weight", f, d, 0, i),
            Tensor(f"layers.{i}.feed_forward.w3.weight", f, d, 0, i),
            Tensor(f"layers.{i}.feed_forward.w2.weight", d, f, 1, i),
        ]
    tensors.append(Tensor("norm.weight", d, 1, None, None))
    if not m.tie_embeddings:
        tensors.append(Tensor("output.weight", m.vocab_size, d, 0, None))
    return tensors


def parameter_count(cfg: Config) -> int:
    return sum(t.rows * t.cols for t in parameters(cfg))


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes on the busiest rank."""

    params: int
    grads: int
    optimizer: int
    gathered: int
    activations: int
    logits: int
    overhead: int

    @property
    def states(self) -> int:
        return self.params + self.grads + self.optimizer

    @property
    def total(self) -> int:
        return self.states + self.gathered + self.activations + self.logits + self.overhead

    def describe(self) -> str:
        parts = ", ".join(f"{k} {getattr(self, k) / GiB:.2f}" for k in
                          ("params", "grads", "optimizer", "gathered", "activations", "logits", "overhead"))
        return f"{self.total / GiB:.2f} GiB ({parts})"


def _local_elements(t: Tensor, layout: Layout) -> int:
    """Elements of this tensor on the rank holding the most of it: TP split, then FSDP's dim-0 chunk."""
    rows, cols = t.rows, t.cols
    if layout.tp > 1 and t.tp_dim == 0:
        rows //= layout.tp
    elif layout.tp > 1 and t.tp_dim == 1:
        cols //= layout.tp
    if layout.fsdp:
        rows = -(-rows // layout.dp_shard)
    return rows * cols


def _held(cfg: Config, layout: Layout, pp_rank: int) -> list[Tensor]:
    ranges = stage_layers(cfg.model.n_layers, layout.n_stages)
    stages = layout.stage_ids(pp_rank)
    layers = {i for s in stages for i in ranges[s]}
    last = layout.n_stages - 1
    held = []
    for t in parameters(cfg):
        if t.layer is not None:
            keep = t.layer in layers
        else:
            keep = (0 in stages) if t.name.startswith("tok_embeddings") else (last in stages)
        if keep:
            held.append(t)
    return held


def _in_flight(layout: Layout, plan: MicroBatchPlan, pp_rank: int) -> float:
    """Micro-batches whose activations this pipeline rank holds at its peak."""
    pp, m = layout.pp, plan.count
    if pp == 1:
        return 1.0
    if layout.schedule in ("GPipe", "LoopedBFS"):
        return float(m)
    if layout.schedule == "DualPipeV":
        return float(min(pp + 1, m))
    if layout.schedule in MULTI_STAGE_SCHEDULES - {"ZBVZeroBubble"}:
        return min(float(m), pp * (1 + (pp - 1) / (pp * layout.stages_per_rank)))
    return float(min(pp - pp_rank, m))  # 1F1B, and ZBV by assumption (see the module docstring)


def estimate(
    cfg: Config, *, world_size: int, local_world_size: int, device_type: str = "cuda", overhead_bytes: int | None = None
) -> MemoryEstimate:
    """Per-rank bytes of ``cfg`` at ``world_size`` on the busiest pipeline rank. device_type "cpu" models the CPU
    run (fp32 unless perf.precision is bf16, no reserve)."""
    layout, _ = for_config(cfg, world_size)
    ranks = [estimate_rank(cfg, world_size=world_size, pp_rank=r, device_type=device_type,
                           overhead_bytes=overhead_bytes) for r in range(layout.pp)]
    return max(ranks, key=lambda e: e.total)


def estimate_rank(
    cfg: Config, *, world_size: int, pp_rank: int, device_type: str = "cuda", overhead_bytes: int | None = None
) -> MemoryEstimate:
    """Per-rank bytes on the ranks of pipeline coordinate ``pp_rank`` (the busiest of them under uneven FSDP
    shards: torch.chunk gives the first ranks the full chunks)."""
    layout, plan = for_config(cfg, world_size)
    m = cfg.model
    bf16 = cfg.perf.precision == "bf16" or (cfg.perf.precision == "auto" and device_type == "cuda")
    compute = 2 if bf16 else 4
    gather = compute if layout.fsdp else 4
    residual = compute if layout.fsdp else 4  # under DDP autocast the residual stream stays fp32
    b, s, d, tp = plan.rows, m.seq_len, m.d_model, layout.tp
    kv, f = m.kv_heads * m.head_dim, m.ffn_dim

    held = _held(cfg, layout, pp_rank)
    elements = sum(_local_elements(t, layout) for t in held)
    unsharded = dataclasses.replace(layout, data_parallel="ddp")  # TP-local, before FSDP
    if layout.fsdp and layout.pp > 1:
        gathered = (gather + 4) * sum(_local_elements(t, unsharded) for t in held)
    elif layout.fsdp:
        groups: dict[object, int] = {}
        for t in held:
            key = t.layer if t.layer is not None else t.name.startswith("tok_embeddings")
            groups[key] = groups.get(key, 0) + _local_elements(t, unsharded)
        gathered = (gather + 4) * sum(sorted(groups.values())[-2:])
    else:
        gathered = 2 * elements if bf16 else 0  # autocast's bf16 weight copies

    n_layers = sum(1 for t in held if t.name.endswith("attention_norm.weight"))
    # CUDA's fused RMSNorm saves its input (and a per-row rstd); CPU's decomposition also keeps x * rstd.
    norm_saves = 2 if device_type == "cpu" else 1
    per_layer = b * s * (
        residual * 2 * d * norm_saves / tp  # the two norms' inputs (x and h): sequence parallel holds 1/tp of them
        + compute * 2 * d  # the two normalised projection inputs (all-gathered under tp)
        + compute * (2 * d + 2 * kv + d) / tp  # q, k, v, attention output, wo input
        + compute * 4 * f / tp  # w1, w3, silu(w1), their product
    ) + 4 * b * s * (m.n_heads + 2) / tp  # fp32 per row: SDPA's logsumexp per head, each norm's rstd
    # Full recompute keeps each block's (sequence-sharded) input, and one block's worth while recomputing.
    full_ac = cfg.parallel.ac == "full"
    kept = n_layers * b * s * residual * d / tp + per_layer if full_ac else n_layers * per_layer
    activations = int(kept * _in_flight(layout, plan, pp_rank))

    tokens = b * s
    if any(t.name == "tok_embeddings.weight" for t in held):
        activations += 8 * tokens  # the int64 token ids the embedding's backward indexes with
    logits = 0
    if any(t.name == "norm.weight" for t in held):
        # The final norm's input and rstd, and the int64 targets the loss keeps.
        logits = tokens * (residual * d * norm_saves // tp + 4 + 8)
        if tp == 1 and layout.pp == 1 and tokens > cfg.perf.loss_chunk_tokens:
            chunk = cfg.perf.loss_chunk_tokens
            logits += chunk * m.vocab_size * (4 + compute) + tokens * d * compute + m.vocab_size * d * (4 + gather)
        else:
            # Logits in the compute dtype, their fp32 upcast (none when they are fp32) and the saved log-softmax.
            upcast = 4 if compute != 4 else 0
            logits += tokens * m.vocab_size * (compute + upcast + 4) // tp

    reserve = OVERHEAD_BYTES if device_type == "cuda" else 0
    return MemoryEstimate(
        params=4 * elements, grads=4 * elements, optimizer=8 * elements, gathered=int(gathered),
        activations=activations, logits=int(logits), overhead=reserve if overhead_bytes is None else overhead_bytes,
    )  # fmt: skip


def check_fits(cfg: Config, *, world_size: int, local_world_size: int, device_memory_bytes: int) -> None:
    """ConfigError naming the parallel section when the busiest rank needs more than a GPU holds, with a layout
    that fits if there is one."""
    need = estimate(cfg, world_size=world_size, local_world_size=local_world_size)
    if need.total <= device_memory_bytes:
        return
    fits = suggest(cfg, world_size=world_size, local_world_size=local_world_size,
                   device_memory_bytes=device_memory_bytes)
    hint = f"a layout that fits: {describe_candidate(fits[0][0])} ({fits[0][1].total / GiB:.1f} GiB)" if fits else (
        "no layout fits these GPUs at this world size: more nodes, a smaller train.micro_batch_size or model")
    raise ConfigError(f"parallel: {layout_of(cfg, world_size).describe()} needs {need.describe()} per GPU at a world "
                      f"of {world_size}, more than the GPU's {device_memory_bytes / GiB:.1f} GiB; {hint}")


def layout_of(cfg: Config, world_size: int) -> Layout:
    return for_config(cfg, world_size)[0]


def describe_candidate(parallel: ParallelConfig) -> str:
    """The overrides that select this layout."""
    keys = [f"data_parallel={parallel.data_parallel}"]
    keys += [f"tp={parallel.tp}"] if parallel.tp > 1 else []
    keys += [f"pp={parallel.pp}", f"pp_schedule={parallel.pp_schedule}"] if parallel.pp > 1 else []
    keys += [f"ac={parallel.ac}"] if parallel.ac != "none" else []
    return " ".join(f"parallel.{k}" for k in keys)


def candidates(cfg: Config) -> list[ParallelConfig]:
    """The layouts suggest() tries, in the order of preference: fewest model-parallel ranks (FSDP before TP before
    PP, topology-and-parallelism.md B.4), no recompute before full activation checkpointing, DDP before FSDP."""
    found = []
    for pp in (1, 2, 4, 8, 16):
        for tp in (1, 2, 4, 8):
            for ac in ("none", "full"):
                kinds = ("ddp", "fsdp") if tp == pp == 1 else ("fsdp",)
                for kind in kinds:
                    found.append(ParallelConfig(data_parallel=kind, tp=tp, pp=pp, ac=ac))  # type: ignore[arg-type]
    return sorted(found, key=lambda p: (p.tp * p.pp, p.pp, p.ac == "full", p.data_parallel == "fsdp"))


def suggest(
    cfg: Config, *, world_size: int, local_world_size: int, device_memory_bytes: int
) -> list[tuple[ParallelConfig, MemoryEstimate]]:
    """Layouts valid for the model and the world that fit the GPU, best first."""
    fitting = []
    for parallel in candidates(cfg):
        try:
            candidate = dataclasses.replace(cfg, parallel=parallel)
            check_launch(candidate, world_size=world_size, local_world_size=local_world_size)
        except ConfigError:
            continue
        need = estimate(candidate, world_size=world_size, local_world_size=local_world_size)
        if need.total <= device_memory_bytes:
            fitting.append((parallel, need))
    return fitting
