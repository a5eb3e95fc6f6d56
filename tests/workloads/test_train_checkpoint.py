"""Checkpoint discovery, torn detection and retention with fake directories; DCP save/load in-process."""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import trainer_launch  # noqa: F401
from trainyard_train.checkpoint import (
    COMMIT,
    CheckpointRef,
    complete_checkpoints,
    corrupt_reason,
    list_step_dirs,
    plan_retention,
    read_commit,
    step_dir,
    torn_reason,
    write_commit,
)
from trainyard_train.checkpointer import Checkpointer
from trainyard_train.config import ConfigError


def fake_checkpoint(root: Path, step: int, commit: bool = True) -> Path:
    path = step_dir(root, step)
    path.mkdir(parents=True)
    (path / ".metadata").write_bytes(b"m" * 10)
    (path / "__0_0.distcp").write_bytes(b"x" * 100)
    if commit:
        write_commit(path, {"step": step, "world_size": 2})
    return path


def test_discovery_orders_by_step_and_skips_foreign_entries(tmp_path: Path) -> None:
    for step in (100, 20, 3):
        fake_checkpoint(tmp_path, step)
    (tmp_path / "step-latest").mkdir()
    (tmp_path / "notes.txt").write_text("x")
    assert [r.step for r in list_step_dirs(tmp_path)] == [3, 20, 100]
    assert list_step_dirs(tmp_path / "missing") == []


def test_torn_reasons(tmp_path: Path) -> None:
    assert torn_reason(fake_checkpoint(tmp_path, 1, commit=False)) == "commit marker missing"
    truncated = fake_checkpoint(tmp_path, 2)
    (truncated / "__0_0.distcp").write_bytes(b"x" * 40)
    assert "40 bytes, commit recorded 100" in str(torn_reason(truncated))
    missing = fake_checkpoint(tmp_path, 3)
    (missing / ".metadata").unlink()
    assert torn_reason(missing) == ".metadata missing"
    garbled = fake_checkpoint(tmp_path, 4)
    (garbled / COMMIT).write_text("{not json")
    assert str(torn_reason(garbled)).startswith("commit marker unreadable")
    assert torn_reason(fake_checkpoint(tmp_path, 5)) is None
    assert [r.step for r in complete_checkpoints(tmp_path)] == [5]


def test_commit_is_written_atomically_with_file_sizes(tmp_path: Path) -> None:
    path = fake_checkpoint(tmp_path, 7)
    assert not (path / f"{COMMIT}.tmp").exists()
    assert (path / COMMIT).read_text().count('"__0_0.distcp": 100') == 1


def test_commit_checksums_catch_flipped_bytes_of_unchanged_size(tmp_path: Path) -> None:
    path = fake_checkpoint(tmp_path, 8)
    assert read_commit(path)["crc32"]["__0_0.distcp"] == f"{zlib.crc32(b'x' * 100):08x}"
    assert corrupt_reason(path) is None
    (path / "__0_0.distcp").write_bytes(b"x" * 50 + b"y" + b"x" * 49)
    assert torn_reason(path) is None  # same size: the stat check cannot see it
    assert str(corrupt_reason(path)).startswith("__0_0.distcp crc32 ")


def refs(*steps: int) -> list[CheckpointRef]:
    return [CheckpointRef(s, Path(f"step-{s:08d}")) for s in steps]


def test_retention_keeps_last_k_complete_and_inflight_newer_dirs() -> None:
    all_dirs = refs(10, 20, 25, 30, 40, 50)
    complete = refs(10, 20, 30, 40)  # 25 torn and older than the newest complete; 50 may be in flight
    victims = plan_retention(all_dirs, complete, keep_last=2)
    assert [v.step for v in victims] == [10, 20, 25]


def test_retention_with_nothing_complete_deletes_nothing() -> None:
    assert plan_retention(refs(10, 20), [], keep_last=2) == []


@pytest.fixture
def single_process_group() -> Iterator[dist.ProcessGroup]:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield dist.new_group(backend="gloo")
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("async_save", [False, True])
def test_save_commit_retain_and_fall_back(
    tmp_path: Path, single_process_group: dist.ProcessGroup, async_save: bool
) -> None:
    ckpt = Checkpointer(tmp_path, keep_last=2, async_save=async_save, group=single_process_group, is_main=True)
    weights = torch.zeros(4)
    for step in (1, 2, 3):
        weights.fill_(step)
        ckpt.save(step, {"w": weights, "step": step}, {"world_size": 1})
        weights.fill_(-1)  # mutating right after save must not leak into an async checkpoint
    ckpt.wait()
    assert [r.step for r in complete_checkpoints(tmp_path)] == [2, 3]  # keep_last=2 purged step 1

    (step_dir(tmp_path, 3) / ".metadata").write_bytes(b"\0" * (step_dir(tmp_path, 3) / ".metadata").stat().st_size)
    loaded: dict[str, object] = {}

    def make_state(_ref: CheckpointRef, _meta: dict) -> dict:
        return {"w": torch.empty(4), "step": 0}

    result = ckpt.load_latest(make_state, loaded.update)
    assert result is not None and result[0].step == 2 and result[1]["world_size"] == 1
    assert loaded["step"] == 2 and torch.equal(loaded["w"], torch.full((4,), 2.0))  # type: ignore[arg-type]


def test_intact_checksums_but_unparsable_files_still_fall_back(
    tmp_path: Path, single_process_group: dist.ProcessGroup
) -> None:
    """A checkpoint whose checksums pass but DCP cannot load (a COMMIT without checksums) is skipped too."""
    ckpt = Checkpointer(tmp_path, keep_last=3, async_save=False, group=single_process_group, is_main=True)
    for step in (1, 2):
        ckpt.save(step, {"w": torch.full((2,), float(step))}, {"world_size": 1})
    newest = step_dir(tmp_path, 2)
    commit = read_commit(newest)
    (newest / COMMIT).write_text(json.dumps({k: v for k, v in commit.items() if k != "crc32"}))
    (newest / ".metadata").write_bytes(b"\0" * (newest / ".metadata").stat().st_size)
    result = ckpt.load_latest(lambda _r, _m: {"w": torch.empty(2)}, lambda _s: None)
    assert result is not None and result[0].step == 1


def test_refuses_to_start_over_when_no_complete_checkpoint_loads(
    tmp_path: Path, single_process_group: dist.ProcessGroup
) -> None:
    ckpt = Checkpointer(tmp_path, keep_last=2, async_save=False, group=single_process_group, is_main=True)
    ckpt.save(1, {"w": torch.ones(2)}, {"world_size": 1})
    metadata = step_dir(tmp_path, 1) / ".metadata"
    metadata.write_bytes(b"\0" * metadata.stat().st_size)
    # Final (the config-error class), naming the key and the step: no retry would read these files differently.
    with pytest.raises(ConfigError, match=r"^run_dir: no checkpoint under .* \(step-00000001: .*refusing to start"):
        ckpt.load_latest(lambda _r, _m: {"w": torch.empty(2)}, lambda _s: None)
    assert (
        Checkpointer(
            tmp_path / "empty", keep_last=2, async_save=False, group=single_process_group, is_main=True
        ).load_latest(lambda _r, _m: {}, lambda _s: None)
        is None
    )
