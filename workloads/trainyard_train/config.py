"""Typed, frozen training config: a YAML file plus ``a.b=value`` overrides.

Every section is a frozen dataclass validated in ``__post_init__``; errors name the dotted key so a
typo in a 40-line YAML file or a CLI override is found at once, before any process group exists.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from . import safe_yaml


class ConfigError(ValueError):
    """A config file or override is invalid; the message names the offending key."""


def _require(ok: bool, key: str, why: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: {why}")


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """A Llama-style decoder (model.py): RMSNorm, rotary positions, SwiGLU, grouped-query attention."""

    vocab_size: int = 64
    seq_len: int = 32
    """Context length; every data record holds seq_len + 1 tokens (inputs and shifted targets)."""
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 0
    """Key/value heads; 0 means n_heads (multi-head attention), fewer shares each between query heads (GQA)."""
    ffn_hidden: int = 0
    """SwiGLU hidden width; 0 means Llama's rule, 8·d_model/3 rounded up to a multiple of 64."""
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    """Share the token embedding with the output head (data_parallel: ddp only: FSDP and pipeline stages
    hold the two apart)."""

    def __post_init__(self) -> None:
        for name in ("vocab_size", "seq_len", "d_model", "n_layers", "n_heads"):
            _require(getattr(self, name) >= 1, f"model.{name}", "must be >= 1")
        for name in ("n_kv_heads", "ffn_hidden"):
            _require(getattr(self, name) >= 0, f"model.{name}", "must be >= 0 (0: derived)")
        _require(self.vocab_size <= 65536, "model.vocab_size", "tokens are stored as uint16 (<= 65536)")
        _require(self.d_model % self.n_heads == 0, "model.d_model", "must be divisible by model.n_heads")
        _require((self.d_model // self.n_heads) % 2 == 0, "model.n_heads",
                 "d_model / n_heads must be even (rotary embeddings rotate pairs of channels)")
        _require(self.n_heads % self.kv_heads == 0, "model.n_kv_heads", "must divide model.n_heads")
        _require(self.rope_theta > 0, "model.rope_theta", "must be > 0")
        _require(self.norm_eps > 0, "model.norm_eps", "must be > 0")

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def ffn_dim(self) -> int:
        if self.ffn_hidden:
            return self.ffn_hidden
        return -(-8 * self.d_model // 3 // 64) * 64


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    path: str = "data/tokens"
    """Directory of token shard files plus manifest.json (relative paths resolve against run_dir)."""
    generate: bool = True
    """Generate the synthetic successor-rule corpus if the directory has no manifest (rank 0 writes it)."""
    num_shards: int = 32
    records_per_shard: int = 256
    noise: float = 0.1
    """Probability that the next token is uniform noise instead of the hidden successor rule."""
    seed: int = 1234
    """Seeds the generated corpus and, with train.seed, the sample order."""
    trace: bool = False
    """Append the record ids each rank reads per step to run_dir/trace/rank-R.jsonl (tests, audits)."""

    def __post_init__(self) -> None:
        _require(bool(self.path), "data.path", "must not be empty")
        _require(self.num_shards >= 1, "data.num_shards", "must be >= 1")
        _require(self.records_per_shard >= 1, "data.records_per_shard", "must be >= 1")
        _require(0.0 <= self.noise <= 1.0, "data.noise", "must be in [0, 1]")


@dataclass(frozen=True, kw_only=True)
class OptimConfig:
    lr: float = 3e-3
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.95)
    warmup_steps: int = 10
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0
    """Max global grad norm; 0 disables clipping."""

    def __post_init__(self) -> None:
        _require(self.lr > 0, "optim.lr", "must be > 0")
        _require(self.weight_decay >= 0, "optim.weight_decay", "must be >= 0")
        _require(all(0.0 <= b < 1.0 for b in self.betas), "optim.betas", "each must be in [0, 1)")
        _require(self.warmup_steps >= 0, "optim.warmup_steps", "must be >= 0")
        _require(0.0 <= self.min_lr_ratio <= 1.0, "optim.min_lr_ratio", "must be in [0, 1]")
        _require(self.grad_clip >= 0, "optim.grad_clip", "must be >= 0")


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    steps: int = 200
    """Optimizer steps to reach; a resumed run continues until this global step."""
    global_batch_size: int = 16
    """Samples per optimizer step, constant across world sizes: data-parallel ranks take shares that differ by
    at most one sample, and the loss is normalised by the global token count (layout.py, micro_batch_plan)."""
    micro_batch_size: int = 4
    """Upper bound on the samples one forward pass holds (under pipelining: one pipeline micro-batch)."""
    seed: int = 0
    log_every: int = 1

    def __post_init__(self) -> None:
        _require(self.steps >= 1, "train.steps", "must be >= 1")
        _require(self.micro_batch_size >= 1, "train.micro_batch_size", "must be >= 1")
        _require(self.global_batch_size >= 1, "train.global_batch_size", "must be >= 1")
        _require(self.log_every >= 1, "train.log_every", "must be >= 1")


@dataclass(frozen=True, kw_only=True)
class PerfConfig:
    precision: Literal["auto", "bf16", "fp32"] = "auto"
    """auto: bf16 on CUDA, fp32 on CPU. bf16 is autocast under DDP, and under FSDP weights gathered in bf16 with
    gradients reduced in fp32."""
    compile: bool = False
    """torch.compile the model under DDP, each block under FSDP (CUDA; on CPU it works but compiles for minutes)."""
    fused_adamw: bool = True
    """AdamW's fused kernel (one launch for all parameters; CUDA and CPU)."""
    tf32: bool = True
    """TF32 for fp32 matmuls on CUDA (Ampere and newer); no effect on CPU."""
    loss_chunk_tokens: int = 4096
    """Tokens per chunk of the output projection + cross-entropy; bounds the fp32 logits held at once."""

    def __post_init__(self) -> None:
        _require(self.precision in ("auto", "bf16", "fp32"), "perf.precision", "must be 'auto', 'bf16' or 'fp32'")
        _require(self.loss_chunk_tokens >= 1, "perf.loss_chunk_tokens", "must be >= 1")


PP_SCHEDULES = ("1F1B", "GPipe", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")
# Schedules that run several stages per pipeline rank (torch/distributed/pipelining/schedules.py@v2.13.0,
# PipelineScheduleMulti); the V-shaped ones place exactly two per rank, first and last on pp rank 0.
MULTI_STAGE_SCHEDULES = frozenset(
    {"Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"}
)
V_SCHEDULES = frozenset({"ZBVZeroBubble", "DualPipeV"})


@dataclass(frozen=True, kw_only=True)
class ParallelConfig:
    """How the world splits into pipeline x data-parallel x tensor-parallel ranks (parallel/, layout.py).

    The degrees multiply to the world size; one data-parallel degree may be -1 (the rest of the world), so an
    elastic job resizes only the data-parallel dimension. Tensor parallel is the innermost dimension, so its
    groups are consecutive ranks on one node; pipeline parallel is the outermost.
    """

    data_parallel: Literal["ddp", "fsdp"] = "ddp"
    """ddp: replicas, all-reduced gradients (the data-parallel-only layout, PowerSGD possible); fsdp: FSDP2
    fully_shard per block, required for tensor or pipeline parallelism."""
    dp_replicate: int = 1
    """fsdp: replica groups of HSDP (gradients all-reduced between them); -1: the rest of the world."""
    dp_shard: int = -1
    """fsdp: ranks one copy of the model states is sharded over; -1: the rest of the world."""
    tp: int = 1
    """Tensor-parallel degree: attention heads, FFN width and vocabulary split over tp ranks on one node, with
    sequence parallelism on the norms and residuals (each rank holds 1/tp of the sequence there)."""
    pp: int = 1
    """Pipeline stages' ranks: layers split into pp (x stages_per_rank) contiguous stages."""
    pp_schedule: Literal[
        "1F1B", "GPipe", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"
    ] = "1F1B"
    pp_stages_per_rank: int = 2
    """Stages per pipeline rank for the interleaved and looped schedules (the V schedules need exactly 2)."""
    ac: Literal["none", "full"] = "none"
    """Activation checkpointing per block: full keeps each block's input and recomputes the rest in backward."""

    def __post_init__(self) -> None:
        for name in ("dp_replicate", "dp_shard"):
            value = getattr(self, name)
            _require(value >= 1 or value == -1, f"parallel.{name}", "must be >= 1, or -1 for the rest of the world")
        _require(not (self.dp_replicate == -1 and self.dp_shard == -1), "parallel.dp_replicate",
                 "only one of dp_replicate and dp_shard can be -1")
        for name in ("tp", "pp"):
            _require(getattr(self, name) >= 1, f"parallel.{name}", "must be >= 1")
        if self.data_parallel == "ddp":
            why = "needs parallel.data_parallel: fsdp (DDP is the data-parallel-only layout)"
            _require(self.tp == 1, "parallel.tp", why)
            _require(self.pp == 1, "parallel.pp", why)
            _require(self.dp_replicate == 1 and self.dp_shard == -1, "parallel.dp_replicate",
                     "DDP has one data-parallel dimension, the whole world: leave dp_replicate and dp_shard unset")
        if self.pp_schedule in V_SCHEDULES:
            _require(self.pp_stages_per_rank == 2, "parallel.pp_stages_per_rank",
                     f"{self.pp_schedule} places exactly 2 stages per rank")
        elif self.pp_schedule in MULTI_STAGE_SCHEDULES:
            _require(self.pp_stages_per_rank >= 2, "parallel.pp_stages_per_rank",
                     f"{self.pp_schedule} runs several stages per rank: must be >= 2")

    @property
    def stages_per_rank(self) -> int:
        return self.pp_stages_per_rank if self.pp > 1 and self.pp_schedule in MULTI_STAGE_SCHEDULES else 1

    @property
    def n_stages(self) -> int:
        return self.pp * self.stages_per_rank


@dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
    interval_steps: int = 50
    keep_last: int = 3
    async_save: bool = False

    def __post_init__(self) -> None:
        _require(self.interval_steps >= 1, "checkpoint.interval_steps", "must be >= 1")
        # The newest checkpoint may be the one being written or found torn: always keep a fallback.
        _require(self.keep_last >= 2, "checkpoint.keep_last", "must be >= 2 so a complete fallback survives")


@dataclass(frozen=True, kw_only=True)
class CommConfig:
    hook: Literal["allreduce", "powersgd", "qsgd", "topk"] = "allreduce"
    """qsgd and topk: error-feedback compression hooks (comm.py)."""
    powersgd_rank: int = 4
    powersgd_start_iter: int = 10
    """Plain all-reduce for the first steps: DDP rebuilds buckets after step 1 and early gradients matter."""
    powersgd_min_compression_rate: float = 2.0
    qsgd_levels: int = 127
    """Quantization levels per sign (QSGD's s); up to 127, one signed byte per gradient value."""
    topk_ratio: float = 0.01
    """Fraction of each bucket's gradient values sent (the largest in magnitude)."""
    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        hooks = typing.get_args(typing.get_type_hints(CommConfig)["hook"])
        _require(self.hook in hooks, "comm.hook", f"must be one of {list(hooks)}")
        _require(1 <= self.qsgd_levels <= 127, "comm.qsgd_levels", "must be in [1, 127] (one signed byte)")
        _require(0.0 < self.topk_ratio <= 1.0, "comm.topk_ratio", "must be in (0, 1]")
        _require(self.powersgd_rank >= 1, "comm.powersgd_rank", "must be >= 1")
        _require(self.powersgd_start_iter >= 2, "comm.powersgd_start_iter", "PowerSGD needs >= 2 warm-up steps")
        _require(self.powersgd_min_compression_rate >= 1, "comm.powersgd_min_compression_rate", "must be >= 1")
        _require(self.timeout_s > 0, "comm.timeout_s", "must be > 0")


@dataclass(frozen=True, kw_only=True)
class ShutdownConfig:
    grace_period_s: float = 100.0
    """Time from SIGTERM/SIGUSR1 to exit; spot instances give 120 s, so keep a margin."""

    def __post_init__(self) -> None:
        _require(self.grace_period_s > 0, "shutdown.grace_period_s", "must be > 0")


@dataclass(frozen=True, kw_only=True)
class MetricsConfig:
    port: int = 9108
    """Prometheus port on rank 0; 0 disables. The TRAINYARD_METRICS_PORT env var overrides it."""

    def __post_init__(self) -> None:
        _require(0 <= self.port <= 65535, "metrics.port", "must be in [0, 65535]")


@dataclass(frozen=True, kw_only=True)
class Config:
    run_dir: str = "runs/default"
    """Holds checkpoints/ and progress.jsonl; must be shared by all nodes (RWX volume in the cluster)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    perf: PerfConfig = field(default_factory=PerfConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    comm: CommConfig = field(default_factory=CommConfig)
    shutdown: ShutdownConfig = field(default_factory=ShutdownConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)

    def __post_init__(self) -> None:
        _require(bool(self.run_dir), "run_dir", "must not be empty")
        self._check_layout_fits_model()

    def _check_layout_fits_model(self) -> None:
        """What a layout needs of the model, decidable without a world size (validate.py checks the rest)."""
        m, p = self.model, self.parallel
        if self.comm.hook != "allreduce":
            # DDP communication hooks do not exist under FSDP2 (reduce-scatter of flat shards, not buckets).
            _require(p.data_parallel == "ddp", "comm.hook", f"{self.comm.hook} is a DDP hook: needs "
                     "parallel.data_parallel: ddp (under fsdp gradients are reduce-scattered by FSDP2)")
        if m.tie_embeddings:
            _require(p.data_parallel == "ddp", "model.tie_embeddings", "needs parallel.data_parallel: ddp (FSDP "
                     "shards and pipeline stages hold the embedding and the head apart)")
        if p.tp > 1:
            # Colwise q/k/v/w1/w3 split heads and FFN width; the vocabulary-parallel embedding and head split
            # the vocabulary; sequence parallel splits the sequence (torchtitan parallel_dims.seq_len_divisor).
            sizes = (("n_heads", m.n_heads), ("n_kv_heads", m.kv_heads), ("ffn_hidden", m.ffn_dim),
                     ("vocab_size", m.vocab_size))
            for key, size in sizes:
                _require(size % p.tp == 0, f"model.{key}", f"{size} does not split over parallel.tp={p.tp} ranks")
            _require(m.seq_len % p.tp == 0, "model.seq_len",
                     f"{m.seq_len} does not split over parallel.tp={p.tp} ranks (sequence parallel)")
        _require(m.n_layers >= p.n_stages, "model.n_layers",
                 f"{m.n_layers} layers cannot fill {p.n_stages} pipeline stages (pp x stages per rank)")

    @property
    def run_dir_path(self) -> Path:
        return Path(self.run_dir)

    @property
    def data_dir(self) -> Path:
        path = Path(self.data.path)
        return path if path.is_absolute() else Path(self.run_dir) / path

    @property
    def checkpoint_dir(self) -> Path:
        return Path(self.run_dir) / "checkpoints"

    @property
    def progress_file(self) -> Path:
        return Path(self.run_dir) / "progress.jsonl"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(safe_yaml.plain(self.to_dict()), sort_keys=False)  # tuples as lists


def _coerce(value: Any, annotation: Any, key: str) -> Any:
    origin = typing.get_origin(annotation)
    if origin is Literal:
        _require(value in typing.get_args(annotation), key, f"must be one of {list(typing.get_args(annotation))}")
        return value
    if origin is tuple:
        item_types = typing.get_args(annotation)
        _require(
            isinstance(value, Sequence) and not isinstance(value, str) and len(value) == len(item_types),
            key,
            f"expected a list of {len(item_types)} items, got {value!r}",
        )
        return tuple(_coerce(v, t, f"{key}[{i}]") for i, (v, t) in enumerate(zip(value, item_types, strict=True)))
    if annotation is bool:
        _require(isinstance(value, bool), key, f"expected true/false, got {value!r}")
        return value
    if annotation is int:
        _require(isinstance(value, int) and not isinstance(value, bool), key, f"expected an integer, got {value!r}")
        return value
    if annotation is float:
        if isinstance(value, str):  # PyYAML reads 1e-4 (no dot) as a string; accept it as a number
            with contextlib.suppress(ValueError):
                value = float(value)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        _require(ok, key, f"expected a number, got {value!r}")
        # .inf / .nan are YAML floats, and no setting here means anything by them (an infinite lr trains to NaN).
        _require(math.isfinite(value), key, f"must be a finite number, got {value!r}")
        return float(value)
    if annotation is str:
        _require(isinstance(value, str), key, f"expected a string, got {value!r}")
        return value
    raise TypeError(f"{key}: unsupported annotation {annotation!r}")  # a bug in this module, not user input


def _build(cls: type[Any], raw: Mapping[str, Any], prefix: str) -> Any:
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    for name in raw:
        _require(name in fields, f"{prefix}{name}", f"unknown key (known: {', '.join(sorted(fields))})")
    kwargs: dict[str, Any] = {}
    for name, value in raw.items():
        key = f"{prefix}{name}"
        annotation = hints[name]
        if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
            _require(isinstance(value, Mapping), key, "expected a mapping")
            kwargs[name] = _build(annotation, value, f"{key}.")
        else:
            kwargs[name] = _coerce(value, annotation, key)
    try:
        return cls(**kwargs)
    except TypeError as exc:  # e.g. a required field missing
        raise ConfigError(f"{prefix or '<root>'}: {exc}") from exc


def apply_overrides(raw: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply ``a.b=value`` strings (value parsed as YAML) to a nested mapping, returning a new one."""
    try:
        result: dict[str, Any] = safe_yaml.plain(dict(raw))
    except safe_yaml.InvalidYamlError as exc:
        raise ConfigError(f"<config>: {exc}") from exc
    for item in overrides:
        key, sep, text = item.partition("=")
        _require(bool(sep) and bool(key), item, "overrides look like section.key=value")
        node = result
        parts = key.split(".")
        _require(all(parts), key, "empty key in the dotted path")
        for depth, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            _require(isinstance(child, dict), ".".join(parts[: depth + 1]), "is not a section")
            node = child
        try:
            node[parts[-1]] = safe_yaml.load(text)
        except safe_yaml.InvalidYamlError as exc:
            raise ConfigError(f"{key}: {text!r} is not a YAML value ({exc})") from exc
    return result


def parse_config(raw: Mapping[str, Any], overrides: Sequence[str] = ()) -> Config:
    merged = apply_overrides(dict(raw), overrides)
    built: Config = _build(Config, merged, "")
    return built


def load_config(path: str | Path | None, overrides: Sequence[str] = ()) -> Config:
    raw: Any = {}
    if path is not None:
        try:
            raw = safe_yaml.load(Path(path).read_text(encoding="utf-8")) or {}
        except OSError as exc:
            raise ConfigError(f"--config: cannot read {path}: {exc.strerror or exc}") from exc
        except UnicodeDecodeError as exc:
            raise ConfigError(f"--config: {path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
        except safe_yaml.InvalidYamlError as exc:
            raise ConfigError(f"--config: {path} is not valid YAML: {exc}") from exc
        _require(isinstance(raw, dict), str(path), "top level must be a mapping")
    return parse_config(raw, overrides)


def check_run_dir(cfg: Config) -> None:
    """run_dir must be creatable and writable (checkpoints, progress); fail naming the key, not a path error."""
    path = cfg.run_dir_path
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
        raise ConfigError(f"run_dir: {path} is not writable ({getattr(exc, 'strerror', None) or exc})") from exc
