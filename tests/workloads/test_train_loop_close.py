"""An error raised inside Trainer.run (a crash, or a config error such as a diverged loss) still closes the
checkpointer: the save in flight commits and its threads stop before the caller destroys the process groups that
save is sending on (dcp.async_save runs its collectives on the checkpoint group from a thread of its own)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from trainer_launch import TINY
from trainyard_train.checkpoint import complete_checkpoints
from trainyard_train.config import ConfigError, load_config
from trainyard_train.distributed import DistEnv, destroy_distributed, init_distributed
from trainyard_train.loop import Trainer


@pytest.mark.parametrize("error", [RuntimeError("a crash in the step"), ConfigError("optim.lr: the loss is nan")])
def test_an_error_in_the_loop_still_closes_the_checkpointer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    cfg = load_config(TINY, [f"run_dir={tmp_path}", "train.steps=6", "checkpoint.interval_steps=2",
                             "checkpoint.async_save=true", "data.num_shards=2", "data.records_per_shard=64"])
    rt = init_distributed(DistEnv.from_env({}), timeout_s=60)
    try:
        trainer = Trainer(cfg, rt)
        closed: list[int] = []
        close = trainer.checkpointer.close
        step = trainer._train_step

        def closing() -> None:
            closed.append(trainer.step)
            close()

        def failing(report_memory: bool = False) -> Any:
            if trainer.step == 3:
                raise error
            return step(report_memory)

        monkeypatch.setattr(trainer.checkpointer, "close", closing)
        monkeypatch.setattr(trainer, "_train_step", failing)
        with pytest.raises(type(error)):
            trainer.run()
        assert closed == [3]
        assert [ref.step for ref in complete_checkpoints(cfg.checkpoint_dir)] == [2]  # the save in flight committed
    finally:
        destroy_distributed()
