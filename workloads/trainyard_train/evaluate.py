"""The pipeline's validation gate: measure a trained checkpoint, pass it or stop the workflow with the numbers.

    python -m trainyard_train.evaluate --config C [KEY=VALUE]... --out evaluation.json \\
        [--checkpoints DIR] [--data DIR] [--records N] \\
        [--min-accuracy 0.85] [--max-latency-ms 50] [--max-memory-gb 2]

It loads the newest committed checkpoint of ``run_dir/checkpoints`` (or ``--checkpoints``) into the config's model
on one device (DCP reshards whatever layout it was saved in) and measures, on the first ``--records`` records of
``--data`` (a held-out dataset; default: the run's own ``data.path``):

- quality: top-1 next-token accuracy (and the mean loss);
- latency: the median milliseconds of one forward over one record, after warm-up (CUDA synchronised);
- memory: the peak bytes the evaluation held: CUDA's peak allocation on a GPU, the process's peak RSS on CPU.

The defaults are the seed design's example gate (accuracy >= 0.85, latency < 50 ms, memory < 2 GB). Every number,
the thresholds, the checkpoint and the dataset's manifest hash go to ``--out`` (JSON, the register step's input).
Exit 0 when every threshold holds; GATE_FAILED with one line naming each failed measure otherwise; CONFIG_ERROR
(one line naming the key or file) when the inputs are unusable.
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import statistics
import sys
import time
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from .checkpoint import CheckpointRef, complete_checkpoints
from .config import Config, ConfigError, load_config
from .data import ShardReader
from .exitcodes import CONFIG_ERROR
from .model import IGNORE_INDEX, DecoderLM

GATE_FAILED = 3
"""The model was measured and does not pass: final, not a crash to retry (the workflow stops here)."""
LATENCY_WARMUP = 3
LATENCY_RUNS = 20


@dataclass(frozen=True)
class Thresholds:
    min_accuracy: float = 0.85
    max_latency_ms: float = 50.0
    max_memory_gb: float = 2.0


@dataclass(frozen=True)
class Measured:
    accuracy: float
    loss: float
    latency_ms: float
    memory_bytes: int
    records: int


def failures(measured: Measured, limits: Thresholds) -> list[str]:
    """Each threshold the measurements miss, as ``name value op limit``."""
    missed = []
    if measured.accuracy < limits.min_accuracy:
        missed.append(f"accuracy {measured.accuracy:.4f} < min_accuracy {limits.min_accuracy}")
    if measured.latency_ms >= limits.max_latency_ms:
        missed.append(f"latency_ms {measured.latency_ms:.2f} >= max_latency_ms {limits.max_latency_ms}")
    if measured.memory_bytes >= limits.max_memory_gb * 1e9:
        missed.append(f"memory_bytes {measured.memory_bytes} >= max_memory_gb {limits.max_memory_gb} GB")
    return missed


def newest_checkpoint(root: Path) -> CheckpointRef:
    committed = complete_checkpoints(root, warn=True)
    if not committed:
        raise ConfigError(f"--checkpoints: no committed checkpoint under {root}")
    return committed[-1]


def load_model(cfg: Config, ref: CheckpointRef, device: torch.device) -> DecoderLM:
    """The config's model with the checkpoint's weights, on one device, in eval mode."""
    model = DecoderLM(cfg.model)
    state = {"model": model.state_dict()}
    try:
        with warnings.catch_warnings():  # DCP warns on every single-process load (state_dict_loader.load): intended
            warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
            dcp.load(state, checkpoint_id=str(ref.path), no_dist=True)
    except (CheckpointException, RuntimeError, KeyError, ValueError) as exc:  # CheckpointException: a BaseException
        detail = " ".join(str(exc).split())[-300:]  # DCP lists every rank's traceback: the cause is at the end
        raise ConfigError(f"--checkpoints: {ref.path} does not load into model.* of the config ({detail})") from None
    model.load_state_dict(state["model"])
    return model.to(device).eval()


def _peak_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


@torch.no_grad()
def measure(model: DecoderLM, reader: ShardReader, records: int, device: torch.device) -> Measured:
    count = min(records, reader.num_records)
    rows = np.empty((count, reader.manifest.record_len), dtype=np.int64)
    reader.records(np.arange(count), rows)
    batch = torch.from_numpy(rows).to(device)
    tokens, targets = batch[:, :-1], batch[:, 1:]
    correct = total = 0
    loss_sum = 0.0
    for start in range(0, count, 32):
        logits = model(tokens[start:start + 32])
        target = targets[start:start + 32]
        counted = target != IGNORE_INDEX
        correct += int(((logits.argmax(-1) == target) & counted).sum())
        total += int(counted.sum())
        loss_sum += float(torch.nn.functional.cross_entropy(
            logits.float().flatten(0, 1), target.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"))
    one = tokens[:1]
    timings = []
    threads = torch.get_num_threads()
    if device.type == "cpu":
        # One record's latency on one intra-op thread: with more, each op waits at the threads' barrier for a thread
        # a busy host has not scheduled (a 0.45 ms forward took 6.6 ms with two threads sharing one loaded core).
        torch.set_num_threads(1)
    try:
        for run in range(LATENCY_WARMUP + LATENCY_RUNS):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            started = time.perf_counter()
            model(one)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if run >= LATENCY_WARMUP:
                timings.append((time.perf_counter() - started) * 1000)
    finally:
        torch.set_num_threads(threads)
    return Measured(accuracy=correct / total, loss=loss_sum / total, latency_ms=statistics.median(timings),
                    memory_bytes=_peak_memory(device), records=count)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m trainyard_train.evaluate", description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True, help="the trainer config the checkpoint was trained with")
    parser.add_argument("--out", required=True, type=Path, help="where the evaluation JSON goes")
    parser.add_argument("--checkpoints", type=Path, help="default: run_dir/checkpoints")
    parser.add_argument("--data", type=Path, help="a held-out dataset directory; default: the config's data.path")
    parser.add_argument("--records", type=int, default=256)
    defaults = Thresholds()
    parser.add_argument("--min-accuracy", type=float, default=defaults.min_accuracy)
    parser.add_argument("--max-latency-ms", type=float, default=defaults.max_latency_ms)
    parser.add_argument("--max-memory-gb", type=float, default=defaults.max_memory_gb)
    parser.add_argument("overrides", nargs="*", help="KEY=VALUE config overrides, as for the trainer")
    return parser.parse_intermixed_args(argv)  # overrides may sit between the options, as in the trainer's line


def evaluate(args: argparse.Namespace) -> dict[str, Any]:
    cfg = load_config(args.config, args.overrides)
    if args.records < 1:
        raise ConfigError(f"--records: must be at least 1, got {args.records}")
    limits = Thresholds(args.min_accuracy, args.max_latency_ms, args.max_memory_gb)
    ref = newest_checkpoint(args.checkpoints or cfg.checkpoint_dir)
    reader = ShardReader(args.data or cfg.data_dir)
    m = reader.manifest
    if m.record_len != cfg.model.seq_len + 1 or m.vocab_size > cfg.model.vocab_size:
        raise ConfigError(f"--data: records of {m.record_len} tokens over vocab {m.vocab_size} do not fit "
                          f"model.seq_len={cfg.model.seq_len} / model.vocab_size={cfg.model.vocab_size}")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    measured = measure(load_model(cfg, ref, device), reader, args.records, device)
    missed = failures(measured, limits)
    return {"passed": not missed, "failures": missed, "metrics": asdict(measured), "thresholds": asdict(limits),
            "checkpoint": {"step": ref.step, "path": str(ref.path)}, "data": str(reader.data_dir),
            "data_sha256": m.content_sha256, "device": device.type}


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        result = evaluate(args)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    except (ConfigError, OSError) as exc:
        print(f"evaluate: {exc}", file=sys.stderr)
        return CONFIG_ERROR
    numbers = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in result["metrics"].items())
    if result["passed"]:
        print(f"gate passed: {numbers}")
        return 0
    print(f"gate failed: {'; '.join(result['failures'])} ({numbers})", file=sys.stderr)
    return GATE_FAILED


if __name__ == "__main__":
    gc.freeze()  # torch's import-time objects out of every full collection (as in train.main)
    raise SystemExit(main())
