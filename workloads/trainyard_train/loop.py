"""The training loop: DDP, gradient accumulation, checkpoint/resume, graceful stop, metrics.

Per optimizer step every rank runs ``accum`` micro-batches; gradients are reduced only on the last
(``no_sync`` before it), then one tiny all-reduce carries the mean loss and the stop vote, so all ranks
stop at the same step whichever of them was signalled.

PowerSGD state (error feedback, warm-start factors, its step counter and RNG) is rank-local. It is
saved per rank and restored when the world size is unchanged; after a resize it is re-initialized,
because each residual belongs to one rank's share of the data and, with shard owners reassigned,
no longer matches any rank's gradient stream. The fresh state runs ``powersgd_start_iter`` plain
all-reduce steps again before compressing, which is the warm-up PowerSGD is designed around.
"""

from __future__ import annotations

import contextlib
import logging
import math
import pickle
import time
from typing import Any

import torch
import torch.distributed as dist
import yaml
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel
from torch.optim.lr_scheduler import LambdaLR

from .checkpoint import Checkpointer, CheckpointRef
from .comm import attach_meter, powersgd_state_blob, register_grad_hook, restore_powersgd_state
from .config import Config, ConfigError
from .data import MANIFEST, ShardReader, ShardStream, generate_for
from .distributed import Runtime
from .logs import LOGGER_NAME, kv
from .metrics import TrainMetrics, resolve_port
from .model import DecoderLM, lm_loss
from .progress import ProgressLog
from .sharding import owned_shards
from .signals import PREEMPTED_EXIT_CODE, StopRequest

log = logging.getLogger(LOGGER_NAME)


def accumulation_steps(global_batch: int, micro_batch: int, world_size: int) -> int:
    """Micro-steps per optimizer step that keep the global batch fixed at this world size."""
    per_rank, rem = divmod(global_batch, world_size * micro_batch)
    if rem or per_rank == 0:
        raise ConfigError(
            f"train.global_batch_size: {global_batch} is not a multiple of "
            f"world_size ({world_size}) x train.micro_batch_size ({micro_batch})"
        )
    return per_rank


def changed_keys(old: Any, new: Any, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two nested config mappings."""
    if isinstance(old, dict) and isinstance(new, dict):
        keys = sorted(set(old) | set(new))
        return [k for key in keys for k in changed_keys(old.get(key), new.get(key), f"{prefix}{key}.")]
    return [] if old == new else [prefix.rstrip(".")]


def warmup_cosine(warmup: int, total: int, min_ratio: float) -> Any:
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def prepare_data(cfg: Config, local_rank: int) -> ShardReader:
    # One writer per node: generation is deterministic and every file lands by atomic rename, so two
    # nodes generating into the same shared volume write identical bytes.
    if local_rank == 0 and not (cfg.data_dir / MANIFEST).exists():
        if not cfg.data.generate:
            raise FileNotFoundError(f"{cfg.data_dir / MANIFEST} missing and data.generate is false")
        generate_for(cfg, cfg.data_dir)
    dist.barrier()
    reader = ShardReader(cfg.data_dir)
    m = reader.manifest
    if m.record_len != cfg.model.seq_len + 1 or m.vocab_size > cfg.model.vocab_size:
        raise ConfigError(
            f"data.path: records of {m.record_len} tokens over vocab {m.vocab_size} do not fit "
            f"model.seq_len={cfg.model.seq_len} / model.vocab_size={cfg.model.vocab_size}"
        )
    return reader


class Trainer:
    def __init__(self, cfg: Config, rt: Runtime) -> None:
        self.cfg = cfg
        self.rt = rt
        env = rt.env
        self.accum = accumulation_steps(cfg.train.global_batch_size, cfg.train.micro_batch_size, env.world_size)
        torch.manual_seed(cfg.train.seed)

        reader = prepare_data(cfg, env.local_rank)
        self.cursors = torch.zeros(reader.manifest.num_shards, dtype=torch.int64)
        owned = owned_shards(reader.manifest.num_shards, env.world_size, env.rank)
        self.stream = ShardStream(reader, owned, self.cursors, seed=cfg.data.seed)

        model = DecoderLM(cfg.model).to(rt.device)
        self.model = DistributedDataParallel(model, device_ids=[rt.device.index] if rt.device.type == "cuda" else None)
        self.optimizer = torch.optim.AdamW(
            model.parameters(), lr=cfg.optim.lr, betas=cfg.optim.betas, weight_decay=cfg.optim.weight_decay
        )
        self.scheduler = LambdaLR(
            self.optimizer, warmup_cosine(cfg.optim.warmup_steps, cfg.train.steps, cfg.optim.min_lr_ratio)
        )
        self.powersgd = register_grad_hook(self.model, cfg.comm, rt.grad_group, seed=cfg.train.seed)
        self.meter = attach_meter(rt.grad_group)
        self.checkpointer = Checkpointer(
            cfg.checkpoint_dir,
            keep_last=cfg.checkpoint.keep_last,
            async_save=cfg.checkpoint.async_save,
            group=rt.checkpoint_group,
            is_main=env.is_main,
        )
        self.stop = StopRequest(cfg.shutdown.grace_period_s)
        self.progress = ProgressLog(cfg.progress_file if env.is_main else None)
        self.metrics = TrainMetrics()
        self.step = 0
        self.samples = 0

    # -- checkpoint state -------------------------------------------------------------------------

    def _state(self, rank_local: bool) -> dict[str, Any]:
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        state: dict[str, Any] = {
            "model": model_sd,
            "optim": optim_sd,
            "scheduler": self.scheduler.state_dict(),
            # World-size independent: per-shard cursors, and the global sample count they sum to.
            "progress": {"step": self.step, "samples": self.samples, "cursors": self.cursors.clone()},
            "config": self.cfg.to_yaml(),
        }
        if rank_local:
            # Pickled by us because DCP restores objects with weights_only loading, which refuses the
            # hook's numpy RNG. Only this job's own checkpoints are ever read back.
            blob = {
                "torch_rng": torch.get_rng_state(),
                "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
                "powersgd": powersgd_state_blob(self.powersgd) if self.powersgd is not None else None,
            }
            state["rank_local"] = {str(self.rt.env.rank): pickle.dumps(blob)}
        return state

    def _merged_cursors(self) -> None:
        # Each rank advanced only the shards it owns and cursors never decrease: MAX merges them.
        dist.all_reduce(self.cursors, op=dist.ReduceOp.MAX)

    def save(self) -> None:
        self._merged_cursors()
        meta = {"world_size": self.rt.env.world_size, "samples": self.samples}
        self.checkpointer.save(self.step, self._state(rank_local=True), meta)
        self.progress.write("checkpoint", step=self.step, samples=self.samples, cursor_sum=int(self.cursors.sum()))

    def restore(self) -> CheckpointRef | None:
        world_size = self.rt.env.world_size

        def make_state(_ref: CheckpointRef, meta: dict[str, Any]) -> dict[str, Any]:
            return self._state(rank_local=meta.get("world_size") == world_size)

        def apply(state: dict[str, Any]) -> None:
            set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
            self.scheduler.load_state_dict(state["scheduler"])
            progress = state["progress"]
            self.step, self.samples = int(progress["step"]), int(progress["samples"])
            self.cursors.copy_(progress["cursors"])
            changed = changed_keys(yaml.safe_load(state["config"]), yaml.safe_load(self.cfg.to_yaml()))
            if changed:
                log.warning(kv("config_changed_since_checkpoint", keys=",".join(changed), using="current"))
            self._restore_rank_local(state.get("rank_local"))

        loaded = self.checkpointer.load_latest(make_state, apply)
        if loaded is not None:
            ref, meta = loaded
            log.info(kv("resumed", step=self.step, samples=self.samples, saved_world_size=meta.get("world_size")))
            return ref
        return None

    def _restore_rank_local(self, rank_local: dict[str, Any] | None) -> None:
        if rank_local is None:
            # Resized world: re-seed per rank from the step so the run stays reproducible.
            torch.manual_seed(self.cfg.train.seed + 1_000_003 * self.step + self.rt.env.rank)
            if self.powersgd is not None:
                log.info(kv("powersgd_state_reinitialized", reason="world size changed"))
            return
        blob = pickle.loads(rank_local[str(self.rt.env.rank)])
        torch.set_rng_state(blob["torch_rng"])
        if blob["cuda_rng"] is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(blob["cuda_rng"])
        if self.powersgd is not None and blob["powersgd"] is not None:
            restore_powersgd_state(self.powersgd, blob["powersgd"])

    # -- training ---------------------------------------------------------------------------------

    def _train_step(self) -> tuple[float, bool]:
        cfg, device = self.cfg, self.rt.device
        self.model.train()
        loss_sum = torch.zeros((), device=device)
        for micro in range(self.accum):
            inputs, targets = (
                t.to(device, non_blocking=True) for t in self.stream.next_batch(cfg.train.micro_batch_size)
            )
            # Gradients are reduced once per optimizer step: skip DDP's all-reduce on earlier micro-steps.
            sync = contextlib.nullcontext() if micro == self.accum - 1 else self.model.no_sync()
            with sync:
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                    loss = lm_loss(self.model(inputs), targets) / self.accum
                loss.backward()
            loss_sum += loss.detach()
        if cfg.optim.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.optim.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self.samples += cfg.train.global_batch_size
        stats = torch.stack([loss_sum, torch.tensor(float(self.stop.requested), device=device)])
        dist.all_reduce(stats)
        return float(stats[0]) / self.rt.env.world_size, bool(stats[1] > 0)

    def run(self) -> int:
        cfg, env = self.cfg, self.rt.env
        log.info("resolved config\n" + cfg.to_yaml())
        self.stop.install()
        resumed = self.restore()
        self.progress.write(
            "start",
            step=self.step,
            samples=self.samples,
            world_size=env.world_size,
            restart_count=env.restart_count,
            resumed_from=str(resumed.path) if resumed else None,
            accum=self.accum,
            hook=cfg.comm.hook,
        )
        self.metrics.start(
            world_size=env.world_size,
            restart_count=env.restart_count,
            last_checkpoint_time=lambda: self.checkpointer.last_commit_time,
        )
        port = resolve_port(cfg.metrics.port)
        if env.is_main and port:
            self.metrics.serve(port)
        last_saved = self.step if resumed else None
        stopped = False
        while self.step < cfg.train.steps:
            started = time.perf_counter()
            loss, stopped = self._train_step()
            elapsed = time.perf_counter() - started
            grad_bytes = self.meter.take()
            self.metrics.record_step(self.step, loss, cfg.train.global_batch_size / elapsed)
            if self.step % cfg.train.log_every == 0 or stopped:
                self.progress.write(
                    "step",
                    step=self.step,
                    loss=loss,
                    samples=self.samples,
                    seconds=elapsed,
                    grad_bytes=grad_bytes,
                )
                log.info(kv("step", step=self.step, loss=loss, sps=cfg.train.global_batch_size / elapsed))
            self.checkpointer.poll()
            if stopped:
                self.stop.begin("peer-signal")  # arms this rank's watchdog if it was not signalled itself
                break
            if self.step % cfg.checkpoint.interval_steps == 0:
                self.save()
                last_saved = self.step
        if last_saved != self.step:
            self.save()
        self.checkpointer.wait()
        self.stop.cancel()
        if stopped:
            log.warning(kv("stopped", step=self.step, signal=self.stop.signal_name))
            self.progress.write("stopped", step=self.step, signal=self.stop.signal_name)
            return PREEMPTED_EXIT_CODE
        self.progress.write("done", step=self.step, samples=self.samples)
        return 0
