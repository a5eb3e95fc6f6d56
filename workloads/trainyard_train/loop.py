"""The training loop: any layout (parallel/), checkpoint/resume, graceful stop, metrics.

The loop does not know the layout: ``ParallelModel.forward_backward`` runs the step's micro-batches (DDP, FSDP2,
tensor or pipeline parallel, reducing gradients once per step), then the optimizers step, then one tiny
all-reduce on the device group carries the mean loss and the stop vote, so all ranks stop at the same step
whichever of them was signalled. Reading that result is the step's only host synchronisation.

Collectives always name their group (see distributed.Runtime): device tensors on ``device_group``, CPU
ones (barriers, reports) on ``cpu_group``, the checkpointer's on ``checkpoint_group`` (an async save sends from
its own thread), the layout's on its mesh groups. Nothing is sent on the default group implicitly.

Checkpoints hold model and optimizer state keyed by parameter name (parallel/engine.py), so a run resumes in any
layout and at any world size. A compression hook's state is rank-local: PowerSGD's (error feedback, warm-start
factors, its step counter and RNG) and QSGD's or top-k's residuals (comm.py). It is saved per rank and restored when
the layout, the world size and the hook are unchanged; otherwise it is re-initialized, because each residual
belongs to one rank's share of the global batch and, with the batch split differently, no longer matches any rank's
gradient stream. A fresh PowerSGD state runs ``powersgd_start_iter`` plain all-reduce steps again before
compressing, which is the warm-up PowerSGD is designed around; fresh residuals start from zero, as at step 0.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import pickle
import time
from typing import Any

import torch
import torch.distributed as dist
import yaml
from torch.optim.lr_scheduler import LambdaLR

from . import layout
from .checkpoint import CheckpointRef
from .checkpointer import Checkpointer
from .comm import GradCommMeter, hook_state_blob, register_grad_hook, restore_hook_state
from .config import Config, ConfigError
from .data import MANIFEST, GlobalOrder, ShardReader, generate_for
from .distributed import Runtime
from .exitcodes import STOPPED
from .loader import StepLoader
from .logs import LOGGER_NAME, kv
from .metrics import TrainMetrics, resolve_port
from .parallel import ParallelModel
from .preflight import RUN_MODEL_KEY
from .progress import ProgressLog
from .signals import StopRequest, final_exit

log = logging.getLogger(LOGGER_NAME)


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


def autocast_dtype(cfg: Config, device: torch.device) -> torch.dtype | None:
    """The autocast dtype, or None for plain fp32."""
    if cfg.perf.precision == "bf16" or (cfg.perf.precision == "auto" and device.type == "cuda"):
        return torch.bfloat16
    return None


def prepare_data(cfg: Config, rt: Runtime) -> ShardReader:
    # One writer per node: generation is deterministic and every file lands by atomic rename, so two
    # nodes generating into the same shared volume write identical bytes.
    if rt.env.local_rank == 0 and not (cfg.data_dir / MANIFEST).exists():
        if not cfg.data.generate:
            raise ConfigError(f"data.path: {cfg.data_dir / MANIFEST} missing and data.generate is false")
        generate_for(cfg, cfg.data_dir)
    dist.barrier(group=rt.cpu_group)
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
        self.layout, self.plan = layout.for_config(cfg, env.world_size)
        torch.manual_seed(cfg.train.seed)
        if rt.device.type == "cuda":
            # https://pytorch.org/docs/stable/notes/cuda.html#tensorfloat-32-tf32-on-ampere-and-later-devices
            torch.set_float32_matmul_precision("high" if cfg.perf.tf32 else "highest")

        reader = prepare_data(cfg, rt)
        self.model = ParallelModel(cfg, rt, self.layout, self.plan, autocast_dtype(cfg, rt.device))
        self.loader = StepLoader(
            reader,
            GlobalOrder(reader.num_records, seed=cfg.train.seed),
            global_batch=cfg.train.global_batch_size,
            plan=self.plan,
            dp_size=self.layout.dp,
            dp_rank=self.model.dp_rank,
            device=rt.device,
        )
        self.trace_file = cfg.run_dir_path / "trace" / f"rank-{env.rank}.jsonl" if cfg.data.trace else None
        if self.trace_file is not None:
            self.trace_file.parent.mkdir(parents=True, exist_ok=True)

        # One optimizer (and schedule) per model part, as torchtitan's OptimizersContainer: a pipeline rank may
        # hold several stages, and each part's state is keyed by its own parameter names.
        self.optimizers = [
            torch.optim.AdamW(
                part.parameters(),
                lr=cfg.optim.lr,
                betas=cfg.optim.betas,
                weight_decay=cfg.optim.weight_decay,
                fused=cfg.perf.fused_adamw,
            )
            for part in self.model.parts
        ]
        lr_factor = warmup_cosine(cfg.optim.warmup_steps, cfg.train.steps, cfg.optim.min_lr_ratio)
        self.schedulers = [LambdaLR(optimizer, lr_factor) for optimizer in self.optimizers]
        self.hook_state = None
        if self.model.ddp is not None:
            self.hook_state, self.meter = register_grad_hook(
                self.model.ddp, cfg.comm, rt.device_group, seed=cfg.train.seed
            )
        else:
            self.meter = GradCommMeter(self.model.gradient_bytes())
            if cfg.comm.hook != "allreduce":
                log.info(kv("comm_hook_unused", hook=cfg.comm.hook, reason="one data-parallel rank: nothing to reduce"))
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
        """The data position: samples consumed, the same number at every world size (and if the global
        batch size changes between runs, the next step still starts where the last one ended)."""

    # -- checkpoint state -------------------------------------------------------------------------

    def _state(self, rank_local: bool) -> dict[str, Any]:
        model_sd, optim_sd = self.model.state_dict(self.optimizers)
        state: dict[str, Any] = {
            "model": model_sd,
            "optim": optim_sd,
            "scheduler": self.schedulers[0].state_dict(),  # every part's schedule is the same function of step
            # World-size independent: the step, and the global sample position it implies.
            "progress": {"step": self.step, "samples": self.samples},
            "config": self.cfg.to_yaml(),
        }
        if rank_local:
            # Pickled by us because DCP restores objects with weights_only loading, which refuses the
            # hook's numpy RNG. Only this job's own checkpoints are ever read back.
            blob = {
                "torch_rng": torch.get_rng_state(),
                "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
                "comm_hook": None if self.hook_state is None else (self.cfg.comm.hook,
                                                                     hook_state_blob(self.hook_state)),
            }
            state["rank_local"] = {str(self.rt.env.rank): pickle.dumps(blob)}
        return state

    def _meta(self) -> dict[str, Any]:
        """The commit marker's fields: the layout this run saved in, and the model it is (preflight checks it)."""
        return {"world_size": self.rt.env.world_size, "layout": self.layout.describe(), "samples": self.samples,
                RUN_MODEL_KEY: dataclasses.asdict(self.cfg.model)}

    def save(self) -> None:
        self.checkpointer.save(self.step, self._state(rank_local=True), self._meta())
        self.progress.write(
            "checkpoint", step=self.step, samples=self.samples, blocking_seconds=self.checkpointer.last_blocking_seconds
        )

    def restore(self) -> CheckpointRef | None:
        here = self._meta()

        def same_layout(meta: dict[str, Any]) -> bool:
            # Global rank r is the same mesh coordinate only in the same layout at the same world size.
            return meta.get("world_size") == here["world_size"] and meta.get("layout") == here["layout"]

        def make_state(_ref: CheckpointRef, meta: dict[str, Any]) -> dict[str, Any]:
            return self._state(rank_local=same_layout(meta))

        def apply(state: dict[str, Any]) -> None:
            self.model.load_state_dict(state["model"], state["optim"], self.optimizers)
            for scheduler in self.schedulers:
                scheduler.load_state_dict(state["scheduler"])
            self.step = int(state["progress"]["step"])
            self.samples = int(state["progress"]["samples"])
            changed = changed_keys(yaml.safe_load(state["config"]), yaml.safe_load(self.cfg.to_yaml()))
            if changed:
                log.warning(kv("config_changed_since_checkpoint", keys=",".join(changed), using="current"))
            self._restore_rank_local(state.get("rank_local"))

        loaded = self.checkpointer.load_latest(make_state, apply)
        if loaded is not None:
            ref, meta = loaded
            log.info(kv("resumed", step=self.step, samples=self.samples, saved_world_size=meta.get("world_size"),
                        saved_layout=meta.get("layout")))
            return ref
        return None

    def _restore_rank_local(self, rank_local: dict[str, Any] | None) -> None:
        if rank_local is None:
            # Another layout or world size: re-seed per rank from the step so the run stays reproducible.
            torch.manual_seed(self.cfg.train.seed + 1_000_003 * self.step + self.rt.env.rank)
            if self.hook_state is not None:
                log.info(kv(f"{self.cfg.comm.hook}_state_reinitialized", reason="layout or world size changed"))
            return
        blob = pickle.loads(rank_local[str(self.rt.env.rank)])
        torch.set_rng_state(blob["torch_rng"])
        if blob["cuda_rng"] is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(blob["cuda_rng"])
        if self.hook_state is None:
            return
        saved = blob.get("comm_hook")
        if saved is not None and saved[0] == self.cfg.comm.hook:
            restore_hook_state(self.hook_state, saved[1])
        else:
            log.info(kv(f"{self.cfg.comm.hook}_state_reinitialized", reason="the checkpoint has none of this hook's"))

    # -- training ---------------------------------------------------------------------------------

    def _train_step(self, report_memory: bool = False) -> tuple[float, bool, float | None]:
        """The step's mean loss, whether any rank was asked to stop, and the gradient norm before clipping (None
        without clipping)."""
        cfg, device = self.cfg, self.rt.device
        batches = self.loader.step_batches(self.samples)
        if self.trace_file is not None:
            self._trace(self.loader.last_record_ids.tolist())
        loss = self.model.forward_backward(batches)
        norm = self.model.clip_grad_norm_(cfg.optim.grad_clip) if cfg.optim.grad_clip > 0 else None
        for optimizer in self.optimizers:
            optimizer.step()
        if report_memory:
            self._report_memory()  # now every rank holds its parameters, gradients and optimizer state
        for scheduler in self.schedulers:
            scheduler.step()
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self.samples += cfg.train.global_batch_size
        # Each rank's loss is its share of the step's mean (zero where not reported): the sum is the mean.
        stats = torch.stack([loss, torch.tensor(float(self.stop.requested), device=device)])
        if self.rt.env.world_size > 1:  # alone, the rank's own loss and vote are already the answer
            dist.all_reduce(stats, group=self.rt.device_group)
        if norm is not None:  # the whole model's norm, the same on every rank: read, not reduced
            stats = torch.cat([stats, norm.reshape(1).to(stats.dtype)])
        mean_loss, votes, *grad_norm = stats.tolist()  # the step's one host sync
        return mean_loss, votes > 0, grad_norm[0] if grad_norm else None

    def _report_memory(self) -> None:
        """Once per run: the bytes each rank holds, by layout (benches, planner checks). In the second step, so
        the CUDA peak includes a forward and backward with the optimizer state allocated."""
        held: dict[str, Any] = self.model.local_bytes(self.optimizers)
        if self.rt.device.type == "cuda":
            held["max_allocated"] = torch.cuda.max_memory_allocated()
        per_rank: list[Any] = [None] * self.rt.env.world_size
        dist.all_gather_object(per_rank, held, group=self.rt.cpu_group)
        self.progress.write("memory", step=self.step + 1, layout=self.layout.describe(), ranks=per_rank)

    def _trace(self, record_ids: list[int]) -> None:
        assert self.trace_file is not None
        entry = {"step": self.step + 1, "rank": self.rt.env.rank, "world_size": self.rt.env.world_size}
        with open(self.trace_file, "a") as handle:
            handle.write(json.dumps({**entry, "records": record_ids}) + "\n")

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
            layout=self.layout.describe(),
            accum=self.plan.count,
            micro_rows=self.plan.rows,
            hook=cfg.comm.hook,
            data_sha256=self.loader.reader.manifest.content_sha256,  # which data this run saw (prepare.py)
        )
        self.metrics.start(
            world_size=env.world_size,
            restart_count=env.restart_count,
            last_checkpoint_time=lambda: self.checkpointer.last_commit_time,
            last_checkpoint_seconds=lambda: self.checkpointer.last_commit_seconds,
            grace_period_s=cfg.shutdown.grace_period_s,
        )
        port = resolve_port(cfg.metrics.port)
        if env.is_main and port:
            self.metrics.serve(port)
        try:
            stopped = self._train(saved=self.step if resumed else None)
        except BaseException:
            # The caller destroys the process groups next: a save in flight must not be sending on them then.
            self.checkpointer.close_after_error()
            raise
        self.stop.cancel()
        if stopped:
            log.warning(kv("stopped", step=self.step, signal=self.stop.signal_name))
            self.progress.write("stopped", step=self.step, signal=self.stop.signal_name)
            if self.stop.signalled_here:  # the checkpoint is committed: now keep torchrun from restarting us
                return final_exit(STOPPED)
            return STOPPED
        self.progress.write("done", step=self.step, samples=self.samples)
        return 0

    def _train(self, saved: int | None) -> bool:
        """Steps until done or stopped, then the last checkpoint, committed; whether a stop ended it."""
        cfg = self.cfg
        last_saved = saved
        stopped = False
        report_at = min(self.step + 2, cfg.train.steps)
        while self.step < cfg.train.steps:
            started = time.perf_counter()
            loss, stopped, grad_norm = self._train_step(report_memory=self.step + 1 == report_at)
            elapsed = time.perf_counter() - started
            if not math.isfinite(loss):  # the same mean on every rank: all stop here, nothing saved
                raise ConfigError(f"optim.lr: the loss is {loss} at step {self.step}; training diverged "
                                  f"(lr {cfg.optim.lr}, grad_clip {cfg.optim.grad_clip}): lower optim.lr")
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
                    grad_norm=grad_norm,
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
        self.checkpointer.close()
        return stopped
