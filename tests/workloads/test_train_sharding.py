"""Jump consistent hash over a stable key hash: balance, minimal movement, cross-process stability."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import trainer_launch
from trainyard_train.sharding import jump_hash, owned_shards, stable_hash64

KEYS = [stable_hash64(f"sample-{i}") for i in range(100_000)]


def test_balance_over_eight_buckets() -> None:
    counts = Counter(jump_hash(k, 8) for k in KEYS)
    assert set(counts) == set(range(8))
    assert max(counts.values()) / (len(KEYS) / 8) < 1.03


def test_growing_eight_to_nine_moves_about_one_ninth_only_to_the_new_bucket() -> None:
    moved = [(jump_hash(k, 8), jump_hash(k, 9)) for k in KEYS]
    changed = [(a, b) for a, b in moved if a != b]
    assert all(b == 8 for _, b in changed)  # nothing shuffles between surviving buckets
    fraction = len(changed) / len(KEYS)
    assert abs(fraction - 1 / 9) < 0.01, fraction


def test_shrinking_moves_only_keys_of_the_removed_bucket() -> None:
    for k in KEYS[:20_000]:
        before, after = jump_hash(k, 9), jump_hash(k, 8)
        assert before == after or before == 8


def test_key_hash_is_identical_across_processes() -> None:
    code = "from trainyard_train.sharding import stable_hash64; print(stable_hash64('shard-00042'))"
    env = {**trainer_launch.subprocess_env(), "PYTHONHASHSEED": "random"}
    outputs = {subprocess.check_output([sys.executable, "-c", code], env=env, text=True) for _ in range(3)}
    assert outputs == {f"{stable_hash64('shard-00042')}\n"}


def test_owned_shards_partition_the_shards() -> None:
    parts = [owned_shards(64, 4, r) for r in range(4)]
    assert sorted(s for p in parts for s in p) == list(range(64))
    assert all(parts)
