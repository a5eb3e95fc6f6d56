"""One worker's run of a checked config (train.py): the layout and memory against this world, the process group,
the checkpoint export, the tracker and the Trainer, ending in an exit code (exitcodes.py).

A config error only this world, the data or the checkpoints reveal is one line and exit 2, and the node agent
ends instead of restarting the workers; a stop signal ends in one committed checkpoint and exit 143 (signals.py).
"""

from __future__ import annotations

import torch.distributed as dist

from .config import Config, ConfigError
from .distributed import DistEnv, Runtime, destroy_distributed, init_distributed
from .exitcodes import CONFIG_ERROR
from .export import CheckpointExport, ExportTarget, ExportWatcher
from .logs import kv, setup_logging
from .loop import Trainer
from .preflight import check_memory, check_resumable, config_error_line
from .signals import final_exit
from .tracking import start_tracker
from .validate import check_launch

TRACKER_CLOSE_S = 15.0


def _exported(cfg: Config, runtime: Runtime) -> ExportWatcher | None:
    """With an export target: restore an empty run_dir from the bucket's newest committed copy (rank 0, before
    anyone looks), then upload each new commit from rank 0's watcher thread (export.py)."""
    target = ExportTarget.from_env()
    if target is None:
        return None
    export = CheckpointExport(target, cfg.checkpoint.keep_last) if runtime.env.is_main else None
    if export is not None:
        export.restore_if_empty(cfg.checkpoint_dir)
    dist.barrier(group=runtime.cpu_group)
    check_resumable(cfg)  # what came from the bucket must be this model's run too
    return ExportWatcher(export, cfg.checkpoint_dir).start() if export is not None else None


def train(cfg: Config) -> int:
    """This worker's run of a config that passed ``preflight.check``; its exit code."""
    env = DistEnv.from_env()
    try:
        # The layout against this world (torchrun's environment), before any process group exists.
        check_launch(cfg, world_size=env.world_size, local_world_size=env.local_world_size)
        check_memory(cfg, world_size=env.world_size, local_world_size=env.local_world_size, local_rank=env.local_rank)
    except ConfigError as exc:
        return final_exit(CONFIG_ERROR, config_error_line(exc))
    log = setup_logging(env.rank, env.world_size)
    if env.shared_agent_store and env.is_main:
        log.warning(kv("shared_rendezvous_store", fix="set TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 for torchrun"))
    runtime = init_distributed(env, cfg.comm.timeout_s)
    watcher = None
    tracker = start_tracker(cfg, env.is_main)  # None unless MLFLOW_TRACKING_URI is set (rank 0 only)
    failed = True
    try:
        try:
            watcher = _exported(cfg, runtime)
            trainer = Trainer(cfg, runtime)
            if tracker is not None:
                trainer.progress.listeners.append(tracker.record)
            code = trainer.run()
            failed = False
        except ConfigError as exc:  # found once the data, the world size and the checkpoints are known
            return final_exit(CONFIG_ERROR, config_error_line(exc))
        finally:
            if watcher is not None:  # the last commit's upload, within the stop's grace period
                watcher.close(cfg.shutdown.grace_period_s)
            if tracker is not None:  # after the upload: its reference names the exported copy
                tracker.close(min(TRACKER_CLOSE_S, cfg.shutdown.grace_period_s), failed=failed)
        # Leave together: a rank tearing down gloo while its peer still finishes the last commit
        # intermittently aborted ("terminate called without an active exception") on CPU.
        dist.barrier(group=runtime.cpu_group)
        return code
    finally:
        destroy_distributed()
