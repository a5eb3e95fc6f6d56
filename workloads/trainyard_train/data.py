"""Token shard files on disk and the global, seeded sample order the trainer reads them in.

Layout of a data directory::

    manifest.json        written last: {"num_shards", "records_per_shard", "record_len", "vocab_size", ...}
    shard-00000.bin      uint16 tokens, records_per_shard x record_len, little-endian

The synthetic corpus is a toy language: a hidden permutation ``succ`` of the vocabulary, each next token
is ``succ[previous]`` except with probability ``noise`` a uniform random token. A model that learns the
rule drops from ln(vocab) to about the noise entropy, which a tiny transformer does in a few hundred
CPU steps.

Order. Records are numbered globally (``shard * records_per_shard + index``). Epoch ``e`` visits all of
them in one permutation seeded by ``(seed, e)``; the run reads that sequence front to back, so the data
position is a single number, the samples consumed ``p``, independent of the world size. A step takes
positions ``[p, p+G)`` (``G`` = global batch); data-parallel rank ``r`` takes its contiguous share of them
(shares differ by at most one) and splits it into micro-batches (loader.py). A resize changes only how a step's
positions are split, never which positions a step consumes, so a resumed run neither repeats nor skips a sample,
whatever the world size and however it relates to the shard count. No torch here: the node agent's preflight
reads the manifest before torch is imported.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .config import Config, ConfigError
from .layout import rank_share

MANIFEST = "manifest.json"
TOKEN_DTYPE = np.dtype("<u2")


@dataclass(frozen=True)
class Manifest:
    num_shards: int
    records_per_shard: int
    record_len: int
    vocab_size: int
    content_sha256: str | None = None
    """SHA-256 of the text the shards were made from (prepare.py); None for the synthetic corpus."""

    @classmethod
    def read(cls, data_dir: Path) -> Manifest:
        """The manifest, or a ConfigError naming the file (a truncated upload, a foreign file, missing keys)."""
        path = data_dir / MANIFEST
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            sizes = {name: raw[name] for name in ("num_shards", "records_per_shard", "record_len", "vocab_size")}
        except FileNotFoundError as exc:
            raise ConfigError(f"data.path: {path} is missing") from exc
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
            reason = f"no {exc}" if isinstance(exc, KeyError) else str(exc)
            raise ConfigError(f"data.path: {path} is not a dataset manifest ({reason})") from exc
        bad = [k for k, v in sizes.items() if not isinstance(v, int) or isinstance(v, bool) or v < 1]
        if bad:
            raise ConfigError(f"data.path: {path}: {', '.join(bad)} must be positive integers")
        digest = raw.get("content_sha256")
        return cls(**sizes, content_sha256=digest if isinstance(digest, str) else None)


def shard_key(shard_index: int) -> str:
    """A shard's file stem."""
    return f"shard-{shard_index:05d}"


def atomic_write_bytes(path: Path, payload: bytes) -> None:
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
        atomic_write_bytes(data_dir / f"{shard_key(shard)}.bin", tokens.astype(TOKEN_DTYPE).tobytes())
    manifest = Manifest(num_shards, records_per_shard, record_len, vocab_size)
    meta = {**manifest.__dict__, "generator": "successor", "noise": noise, "seed": seed}
    atomic_write_bytes(data_dir / MANIFEST, json.dumps(meta, indent=2).encode())
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
    """Memory-maps shard files lazily and reads records by global record id."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.manifest = Manifest.read(data_dir)
        self._maps: dict[int, np.ndarray] = {}

    @property
    def num_records(self) -> int:
        return self.manifest.num_shards * self.manifest.records_per_shard

    def record(self, shard: int, index: int) -> np.ndarray:
        if shard not in self._maps:
            m = self.manifest
            path = self.data_dir / f"{shard_key(shard)}.bin"
            expected = m.records_per_shard * m.record_len * TOKEN_DTYPE.itemsize
            if path.stat().st_size != expected:
                raise ValueError(f"{path}: {path.stat().st_size} bytes, manifest implies {expected}")
            self._maps[shard] = np.memmap(path, dtype=TOKEN_DTYPE, mode="r", shape=(m.records_per_shard, m.record_len))
        return self._maps[shard][index]

    def records(self, record_ids: np.ndarray, out: np.ndarray) -> None:
        """Copy the records with these global ids into ``out`` (rows x record_len)."""
        per_shard = self.manifest.records_per_shard
        for row, record_id in enumerate(record_ids.tolist()):
            out[row] = self.record(*divmod(record_id, per_shard))


class GlobalOrder:
    """Global sample position -> record id: one seeded permutation of all records per epoch."""

    def __init__(self, num_records: int, seed: int) -> None:
        self.num_records = num_records
        self.seed = seed
        self._epoch = -1
        self._perm = np.empty(0, dtype=np.int64)

    def _permutation(self, epoch: int) -> np.ndarray:
        if epoch != self._epoch:  # positions only move forward: one epoch's permutation is hot at a time
            self._perm = np.random.default_rng([self.seed, epoch]).permutation(self.num_records)
            self._epoch = epoch
        return self._perm

    def record_ids(self, start: int, count: int) -> np.ndarray:
        """Record ids at global positions ``[start, start + count)``, crossing epochs as needed."""
        ids = np.empty(count, dtype=np.int64)
        done = 0
        while done < count:
            epoch, offset = divmod(start + done, self.num_records)
            take = min(count - done, self.num_records - offset)
            ids[done : done + take] = self._permutation(epoch)[offset : offset + take]
            done += take
        return ids


def rank_slice(position: int, global_batch: int, dp_size: int, dp_rank: int) -> tuple[int, int]:
    """(first global position, count) this data-parallel rank consumes in the step that starts at ``position``:
    contiguous shares that differ by at most one sample (layout.py)."""
    offset, count = rank_share(global_batch, dp_size, dp_rank)
    return position + offset, count
