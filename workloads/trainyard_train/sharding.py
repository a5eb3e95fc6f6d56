"""Which rank owns which data shard: jump consistent hash over a stable 64-bit key hash.

torchrun numbers ranks 0..W-1 with no gaps, which is exactly jump hash's bucket model: going from W to
W+1 ranks moves only ~1/(W+1) of the shards (the optimum), and every process, on any node, computes
the same owner because the key hash is BLAKE2b, not Python's per-process salted ``hash()``.
"""

from __future__ import annotations

import hashlib

_MASK64 = (1 << 64) - 1
# Lamping & Veach, "A Fast, Minimal Memory, Consistent Hash Algorithm" (2014): 64-bit LCG multiplier.
_LCG_MULTIPLIER = 2862933555777941757


def stable_hash64(key: str | bytes) -> int:
    """A 64-bit hash that is identical in every process and on every machine."""
    data = key.encode() if isinstance(key, str) else key
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def jump_hash(key: int, num_buckets: int) -> int:
    """Bucket in [0, num_buckets) for a 64-bit key; growing the bucket count moves a minimal set of keys."""
    if num_buckets < 1:
        raise ValueError(f"num_buckets must be >= 1, got {num_buckets}")
    key &= _MASK64
    bucket, candidate = -1, 0
    while candidate < num_buckets:
        bucket = candidate
        key = (key * _LCG_MULTIPLIER + 1) & _MASK64
        candidate = int((bucket + 1) * (float(1 << 31) / float((key >> 33) + 1)))
    return bucket


def shard_key(shard_index: int) -> str:
    """The stable identity of a shard: its file name, so ownership follows the data, not list order."""
    return f"shard-{shard_index:05d}"


def shard_owner(shard_index: int, world_size: int) -> int:
    return jump_hash(stable_hash64(shard_key(shard_index)), world_size)


def owned_shards(num_shards: int, world_size: int, rank: int) -> list[int]:
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside world of size {world_size}")
    return [s for s in range(num_shards) if shard_owner(s, world_size) == rank]
