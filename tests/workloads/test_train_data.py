"""Shard files and the per-rank stream: world-size independent position, no repeats within an epoch."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import trainer_launch  # noqa: F401
from trainyard_train.data import ShardReader, ShardStream, generate_successor_corpus
from trainyard_train.sharding import owned_shards

SHARDS, RECORDS, SEQ = 8, 16, 6


@pytest.fixture
def reader(tmp_path: Path) -> ShardReader:
    generate_successor_corpus(
        tmp_path, num_shards=SHARDS, records_per_shard=RECORDS, seq_len=SEQ, vocab_size=32, noise=0.0, seed=3
    )
    return ShardReader(tmp_path)


def test_targets_follow_the_hidden_rule(reader: ShardReader) -> None:
    stream = ShardStream(reader, list(range(SHARDS)), torch.zeros(SHARDS, dtype=torch.int64), seed=0)
    inputs, targets = stream.next_batch(32)
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


def consume(stream: ShardStream, n: int) -> list[tuple[int, int]]:
    inputs, _ = stream.next_batch(n)
    return [(int(row[0]), int(row[1])) for row in inputs]


def test_position_carries_over_from_two_ranks_to_one(tmp_path: Path) -> None:
    reader = labelled_corpus(tmp_path / "labelled")
    cursors = [torch.zeros(SHARDS, dtype=torch.int64) for _ in range(2)]
    streams = [ShardStream(reader, owned_shards(SHARDS, 2, r), cursors[r], seed=0) for r in range(2)]
    seen = [row for s in streams for row in consume(s, 20)]
    merged = torch.maximum(*cursors)  # what the trainer's MAX all-reduce computes
    assert int(merged.sum()) == 40
    single = ShardStream(reader, list(range(SHARDS)), merged.clone(), seed=0)
    rest = consume(single, SHARDS * RECORDS - 40)
    # The first epoch is covered exactly once across the resize: nothing repeated, nothing skipped.
    assert sorted(seen + rest) == [(s, i) for s in range(SHARDS) for i in range(RECORDS)]
    assert torch.equal(single.cursors, torch.full((SHARDS,), RECORDS))


def test_reader_rejects_a_truncated_shard(reader: ShardReader, tmp_path: Path) -> None:
    shard = tmp_path / "shard-00000.bin"
    shard.write_bytes(shard.read_bytes()[:-2])
    with pytest.raises(ValueError, match="manifest implies"):
        ShardReader(tmp_path).record(0, 0)


def test_stream_refuses_an_empty_share(reader: ShardReader) -> None:
    with pytest.raises(ValueError, match="owns no shards"):
        ShardStream(reader, [], torch.zeros(SHARDS, dtype=torch.int64), seed=0)


def test_generation_is_deterministic(tmp_path: Path) -> None:
    kwargs = dict(num_shards=2, records_per_shard=4, seq_len=5, vocab_size=16, noise=0.1, seed=9)
    generate_successor_corpus(tmp_path / "a", **kwargs)  # type: ignore[arg-type]
    generate_successor_corpus(tmp_path / "b", **kwargs)  # type: ignore[arg-type]
    for name in ("shard-00000.bin", "shard-00001.bin"):
        assert np.array_equal(
            np.fromfile(tmp_path / "a" / name, dtype="<u2"), np.fromfile(tmp_path / "b" / name, dtype="<u2")
        )
