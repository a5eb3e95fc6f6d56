"""Shard files and the global sample order: the same samples per step at any world size, every record
once per epoch."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import trainer_launch  # noqa: F401
from trainyard_train.data import GlobalOrder, ShardReader, generate_successor_corpus, rank_slice
from trainyard_train.layout import micro_batch_plan
from trainyard_train.loader import StepLoader
from trainyard_train.loss import IGNORE_INDEX

SHARDS, RECORDS, SEQ = 8, 16, 6


@pytest.fixture
def reader(tmp_path: Path) -> ShardReader:
    generate_successor_corpus(
        tmp_path, num_shards=SHARDS, records_per_shard=RECORDS, seq_len=SEQ, vocab_size=32, noise=0.0, seed=3
    )
    return ShardReader(tmp_path)


def test_targets_follow_the_hidden_rule(reader: ShardReader) -> None:
    inputs, targets = loader(reader, 1, 0, global_batch=32, micro=32).step_batches(0)[0]
    assert torch.equal(inputs[:, 1:], targets[:, :-1])
    pairs = {(int(a), int(b)) for a, b in zip(inputs.flatten(), targets.flatten(), strict=True)}
    assert len({a for a, _ in pairs}) == len(pairs)  # noise=0: each token has exactly one successor


def labelled_corpus(path: Path) -> ShardReader:
    """Record i of shard s starts with tokens (s, i), so every read names its origin."""
    path.mkdir()
    for shard in range(SHARDS):
        records = np.zeros((RECORDS, SEQ + 1), dtype="<u2")
        records[:, 0], records[:, 1] = shard, np.arange(RECORDS)
        (path / f"shard-{shard:05d}.bin").write_bytes(records.tobytes())
    manifest = {"num_shards": SHARDS, "records_per_shard": RECORDS, "record_len": SEQ + 1, "vocab_size": 32}
    (path / "manifest.json").write_text(json.dumps(manifest))
    return ShardReader(path)


def loader(reader: ShardReader, world_size: int, rank: int, global_batch: int = 24, micro: int = 4) -> StepLoader:
    order = GlobalOrder(reader.num_records, seed=5)
    return StepLoader(
        reader,
        order,
        global_batch=global_batch,
        plan=micro_batch_plan(global_batch, micro, world_size),
        dp_size=world_size,
        dp_rank=rank,
        device=torch.device("cpu"),
    )


def consumed(reader: ShardReader, world_size: int, step: int) -> list[tuple[int, int]]:
    """(shard, index) of every sample step ``step`` reads, rank by rank, from the tokens themselves; padding
    rows (all targets ignored) are not samples."""
    rows = []
    for rank in range(world_size):
        for inputs, targets in loader(reader, world_size, rank).step_batches(step * 24):
            rows += [(int(row[0]), int(row[1])) for row, t in zip(inputs, targets, strict=True)
                     if (t != IGNORE_INDEX).all()]
    return rows


def test_steps_read_the_same_samples_at_any_world_size(tmp_path: Path) -> None:
    reader = labelled_corpus(tmp_path / "labelled")
    for step in (0, 3, 7):
        by_world = {w: consumed(reader, w, step) for w in (1, 2, 3, 5, 6, 7, 12)}  # uneven shares; 12 > 8 shards
        assert all(len(rows) == 24 for rows in by_world.values())
        assert len({tuple(rows) for rows in by_world.values()}) == 1, step  # same samples, same order


def test_each_epoch_visits_every_record_once_in_a_new_order(tmp_path: Path) -> None:
    reader = labelled_corpus(tmp_path / "labelled")
    total = SHARDS * RECORDS  # 128 records; steps of 24 straddle epoch boundaries
    stream = [row for step in range(16) for row in consumed(reader, 3, step)]
    epochs = [stream[e * total : (e + 1) * total] for e in range(len(stream) // total)]
    everything = sorted((s, i) for s in range(SHARDS) for i in range(RECORDS))
    assert len(epochs) == 3 and all(sorted(epoch) == everything for epoch in epochs)
    assert epochs[0] != epochs[1] != epochs[2]


def test_record_ids_match_positions_across_epochs() -> None:
    order = GlobalOrder(10, seed=1)
    whole = order.record_ids(0, 30)
    assert np.array_equal(np.concatenate([order.record_ids(s, 7) for s in range(0, 28, 7)]), whole[:28])
    assert np.array_equal(GlobalOrder(10, seed=1).record_ids(25, 5), whole[25:])  # fresh process, same answer


def test_rank_slices_tile_the_step() -> None:
    assert [rank_slice(96, 24, 3, r) for r in range(3)] == [(96, 8), (104, 8), (112, 8)]
    assert [rank_slice(0, 24, 5, r) for r in range(5)] == [(0, 5), (5, 5), (10, 5), (15, 5), (20, 4)]


def test_every_rank_runs_the_same_micro_batches_and_pads_the_smaller_share(reader: ShardReader) -> None:
    # 24 samples over 5 ranks, at most 4 per forward: shares 5 5 5 5 4, each 2 micro-batches of 3 rows.
    shapes, kept = set(), []
    for rank in range(5):
        batches = loader(reader, 5, rank).step_batches(0)
        shapes.add(tuple(tuple(inputs.shape) for inputs, _ in batches))
        kept.append(sum(int((targets != IGNORE_INDEX).all(dim=1).sum()) for _, targets in batches))
        padded = [t for _, t in batches for t in t if (t == IGNORE_INDEX).any()]
        assert all((t == IGNORE_INDEX).all() for t in padded)  # a row is a sample or wholly padding
    assert shapes == {((3, SEQ), (3, SEQ))}
    assert kept == [5, 5, 5, 5, 4]


def test_reader_rejects_a_truncated_shard(reader: ShardReader, tmp_path: Path) -> None:
    shard = tmp_path / "shard-00000.bin"
    shard.write_bytes(shard.read_bytes()[:-2])
    with pytest.raises(ValueError, match="manifest implies"):
        ShardReader(tmp_path).record(0, 0)


def test_generation_is_deterministic(tmp_path: Path) -> None:
    kwargs = dict(num_shards=2, records_per_shard=4, seq_len=5, vocab_size=16, noise=0.1, seed=9)
    generate_successor_corpus(tmp_path / "a", **kwargs)  # type: ignore[arg-type]
    generate_successor_corpus(tmp_path / "b", **kwargs)  # type: ignore[arg-type]
    for name in ("shard-00000.bin", "shard-00001.bin"):
        assert np.array_equal(
            np.fromfile(tmp_path / "a" / name, dtype="<u2"), np.fromfile(tmp_path / "b" / name, dtype="<u2")
        )
