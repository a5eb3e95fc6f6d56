"""Token shard files on disk and the per-rank stream that reads them.

Layout of a data directory::

    manifest.json        written last: {"num_shards", "records_per_shard", "record_len", "vocab_size", ...}
    shard-00000.bin      uint16 tokens, records_per_shard x record_len, little-endian

The synthetic corpus is a toy language: a hidden permutation ``succ`` of the vocabulary, each next token
is ``succ[previous]`` except with probability ``noise`` a uniform random token. A model that learns the
rule drops from ln(vocab) to about the noise entropy, which a tiny transformer does in a few hundred
CPU steps.

Data position is one cursor per shard (records consumed from it, across epochs). The cursor vector
does not depend on the world size, so a checkpoint taken with 2 ranks resumes exactly on 1 or 3.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .config import Config
from .sharding import shard_key

MANIFEST = "manifest.json"
_DTYPE = np.dtype("<u2")


@dataclass(frozen=True)
class Manifest:
    num_shards: int
    records_per_shard: int
    record_len: int
    vocab_size: int

    @classmethod
    def read(cls, data_dir: Path) -> Manifest:
        raw = json.loads((data_dir / MANIFEST).read_text())
        return cls(
            num_shards=int(raw["num_shards"]),
            records_per_shard=int(raw["records_per_shard"]),
            record_len=int(raw["record_len"]),
            vocab_size=int(raw["vocab_size"]),
        )


def _atomic_write_bytes(path: Path, payload: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(payload)
    os.replace(tmp, path)


def generate_successor_corpus(
    data_dir: Path,
    *,
    num_shards: int,
    records_per_shard: int,
    seq_len: int,
    vocab_size: int,
    noise: float,
    seed: int,
) -> Manifest:
    """Write the synthetic corpus; the manifest goes last so a crash leaves no half-valid directory."""
    data_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    successor = rng.permutation(vocab_size)
    record_len = seq_len + 1
    for shard in range(num_shards):
        tokens = np.empty((records_per_shard, record_len), dtype=np.int64)
        tokens[:, 0] = rng.integers(0, vocab_size, records_per_shard)
        noisy = rng.random((records_per_shard, record_len)) < noise
        random_tokens = rng.integers(0, vocab_size, (records_per_shard, record_len))
        for t in range(1, record_len):
            tokens[:, t] = np.where(noisy[:, t], random_tokens[:, t], successor[tokens[:, t - 1]])
        _atomic_write_bytes(data_dir / f"{shard_key(shard)}.bin", tokens.astype(_DTYPE).tobytes())
    manifest = Manifest(num_shards, records_per_shard, record_len, vocab_size)
    meta = {**manifest.__dict__, "generator": "successor", "noise": noise, "seed": seed}
    _atomic_write_bytes(data_dir / MANIFEST, json.dumps(meta, indent=2).encode())
    return manifest


def generate_for(cfg: Config, data_dir: Path) -> Manifest:
    """The corpus at the sizes a trainer config asks for (its data and model settings)."""
    return generate_successor_corpus(
        data_dir,
        num_shards=cfg.data.num_shards,
        records_per_shard=cfg.data.records_per_shard,
        seq_len=cfg.model.seq_len,
        vocab_size=cfg.model.vocab_size,
        noise=cfg.data.noise,
        seed=cfg.data.seed,
    )


class ShardReader:
    """Memory-maps shard files lazily; only the shards a rank owns are ever opened."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.manifest = Manifest.read(data_dir)
        self._maps: dict[int, np.ndarray] = {}

    def record(self, shard: int, index: int) -> np.ndarray:
        if shard not in self._maps:
            m = self.manifest
            path = self.data_dir / f"{shard_key(shard)}.bin"
            expected = m.records_per_shard * m.record_len * _DTYPE.itemsize
            if path.stat().st_size != expected:
                raise ValueError(f"{path}: {path.stat().st_size} bytes, manifest implies {expected}")
            self._maps[shard] = np.memmap(path, dtype=_DTYPE, mode="r", shape=(m.records_per_shard, m.record_len))
        return self._maps[shard][index]


class ShardStream:
    """Yields micro-batches from this rank's shards, always from the least-consumed shard first.

    Reading the least-consumed shard keeps cursors level, so a shard that changes owner on resize is
    not left far behind. Within a shard, each epoch visits records in a seeded permutation.
    """

    def __init__(self, reader: ShardReader, owned: list[int], cursors: torch.Tensor, seed: int) -> None:
        if not owned:
            raise ValueError(
                f"this rank owns no shards ({reader.manifest.num_shards} shards in total); "
                "use more shards than ranks (>= 8 per rank keeps the hash balanced)"
            )
        if cursors.shape != (reader.manifest.num_shards,):
            raise ValueError(f"cursor vector has shape {tuple(cursors.shape)}, expected one per shard")
        self.reader = reader
        self.owned = owned
        self.cursors = cursors
        self.seed = seed
        self._orders: dict[tuple[int, int], np.ndarray] = {}

    def _order(self, shard: int, epoch: int) -> np.ndarray:
        key = (shard, epoch)
        if key not in self._orders:
            if len(self._orders) > 4 * len(self.owned):
                self._orders.clear()  # bound memory: only the current epoch's orders are hot
            rng = np.random.default_rng([self.seed, shard, epoch])
            self._orders[key] = rng.permutation(self.reader.manifest.records_per_shard)
        return self._orders[key]

    def next_batch(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        per_shard = self.reader.manifest.records_per_shard
        rows = []
        for _ in range(batch_size):
            shard = min(self.owned, key=lambda s: (int(self.cursors[s]), s))
            cursor = int(self.cursors[shard])
            epoch, offset = divmod(cursor, per_shard)
            rows.append(self.reader.record(shard, int(self._order(shard, epoch)[offset])))
            self.cursors[shard] = cursor + 1
        batch = torch.from_numpy(np.stack(rows).astype(np.int64))
        return batch[:, :-1], batch[:, 1:]
