"""Checkpoint save/restore time for a GPT-2-small-sized model + AdamW state (one process, local disk):
sync save, async save (blocking part and total), restore, and what the COMMIT checksums cost (CRC-32, the
trainer's, beside BLAKE2b) over the checkpoint's files. Prints numbers only.

    .venv/bin/python bench/checkpoint.py [--layers 12 --d-model 768]
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_state_dict

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workloads"))
from trainyard_train.checkpoint import corrupt_reason, file_crc32, step_dir  # noqa: E402
from trainyard_train.checkpointer import Checkpointer  # noqa: E402
from trainyard_train.config import ModelConfig  # noqa: E402
from trainyard_train.model import DecoderLM  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--d-model", type=int, default=768)
    args = parser.parse_args()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    group = dist.new_group(backend="gloo")
    model = DecoderLM(
        ModelConfig(vocab_size=32768, seq_len=1024, d_model=args.d_model, n_layers=args.layers, n_heads=12)
    )
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.zeros(1, 8, dtype=torch.long)).sum().backward()
    optimizer.step()  # materialize Adam moments so they are part of the checkpoint
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    size = sum(t.numel() * t.element_size() for t in _tensors(state))
    print(f"params {sum(p.numel() for p in model.parameters()) / 1e6:.1f} M, checkpoint {size / 2**20:.0f} MiB")
    with tempfile.TemporaryDirectory() as tmp:
        for async_save in (False, True):
            ckpt = Checkpointer(
                Path(tmp) / str(async_save), keep_last=2, async_save=async_save, group=group, is_main=True
            )
            started = time.perf_counter()
            ckpt.save(1, state, {"world_size": 1})
            blocking = time.perf_counter() - started
            ckpt.wait()
            total = time.perf_counter() - started
            mode = "async" if async_save else "sync"
            print(
                f"{mode:>5} save: blocking {blocking:.2f} s, committed after {total:.2f} s "
                f"({size / 2**20 / total:.0f} MiB/s)"
            )
            started = time.perf_counter()
            ckpt.load_latest(lambda _r, _m: state, lambda _s: None)
            print(f"{mode:>5} restore (checksums verified): {time.perf_counter() - started:.2f} s")
        _checksum_cost(step_dir(Path(tmp) / "False", 1))
    dist.destroy_process_group()


def _checksum_cost(path: Path) -> None:
    files = [f for f in path.iterdir() if f.is_file() and f.name != "COMMIT"]
    size = sum(f.stat().st_size for f in files)
    for name, digest in (("crc32", file_crc32), ("blake2b", _blake2b)):
        started = time.perf_counter()
        for f in files:
            digest(f)
        seconds = time.perf_counter() - started
        print(f"{name:>7} over the checkpoint ({size / 2**20:.0f} MiB, page cache): {seconds:.2f} s "
              f"({size / 2**20 / seconds:.0f} MiB/s)")  # fmt: skip
    started = time.perf_counter()
    assert corrupt_reason(path) is None
    print(f"verify before load (crc32, rank 0): {time.perf_counter() - started:.2f} s")


def _blake2b(path: Path) -> str:
    digest = hashlib.blake2b()
    with open(path, "rb") as handle:
        while chunk := handle.read(8 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _tensors(tree: object) -> list[torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, dict):
        return [t for v in tree.values() for t in _tensors(v)]
    if isinstance(tree, (list, tuple)):
        return [t for v in tree for t in _tensors(v)]
    return []


if __name__ == "__main__":
    main()
