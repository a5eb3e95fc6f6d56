"""All-reduce bus-bandwidth check: does the fabric between the ranks carry what the instance type promises?

    torchrun --nnodes=2 --nproc-per-node=8 ... -m trainyard_train.commcheck --min-busbw-gbps 80

Every rank all-reduces (sum, float32, in place) one buffer at each size from --min-bytes to --max-bytes, growing by
--step-factor: --warmup-iters untimed, then --iters timed. The figures are nccl-tests' (doc/PERFORMANCE.md):

    algbw = S / t                   S: bytes per rank, t: mean time of one all-reduce (averaged over the ranks,
                                    nccl-tests' default `-a 1`)
    busbw = algbw * 2(n-1)/n        n: ranks; the traffic each rank's link carries, comparable across world sizes

in GB/s = 10^9 bytes/s, like nccl-tests' columns. Each size is then checked once: rank r contributes r+1, every
element must come back as n(n+1)/2 ("#wrong"). Exit status: 0 when nothing is wrong and, with
--min-busbw-gbps, the bus bandwidth at the largest size reaches it; 1 otherwise; 2 for a bad command line.

On GPUs (NCCL) buffers live on `cuda:LOCAL_RANK` and CUDA events time the loop on the stream the collectives
are ordered on; on CPU (gloo) a wall clock does. Self-contained on purpose: it shares nothing with the trainer,
so a broken trainer never hides a working fabric or the reverse.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NoReturn

import torch
import torch.distributed as dist

PROG = "python -m trainyard_train.commcheck"
ELEMENT = torch.float32
ELEMENT_BYTES = 4
GB = 1e9  # nccl-tests' GB/s: src/all_reduce.cu divides bytes by 1.0E9
_SIZE = re.compile(r"([0-9]+)([KMG]?)B?", re.IGNORECASE)
_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}
# Defaults: nccl-tests' usual sweep on GPUs; on CPU, gloo over loopback takes seconds per large size.
GPU_MAX_BYTES = 1024**3
CPU_MAX_BYTES = 16 * 1024**2


class _Parser(argparse.ArgumentParser):
    """Bad input is one line naming the flag and what it accepts, exit 2 (no usage dump, no traceback)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def size_bytes(text: str) -> int:
    """'8', '8B', '64K', '128M', '1G' (binary multiples, as nccl-tests' -b/-e) in bytes."""
    match = _SIZE.fullmatch(text.strip())
    if match is None or int(match.group(1)) == 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size: a positive whole number of bytes, "
                                         "optionally with K, M or G (binary), such as 8, 64K, 1G")
    value = int(match.group(1)) * _UNITS[match.group(2).upper()]
    if value % ELEMENT_BYTES:
        raise argparse.ArgumentTypeError(f"{text!r} is not a multiple of {ELEMENT_BYTES} bytes (float32 elements)")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return value


def _non_negative_int(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 0")
    return int(text)


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number >= 0")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="All-reduce bus bandwidth over a range of sizes (nccl-tests' figures).")
    parser.add_argument("--min-bytes", type=size_bytes, default=8, help="smallest size per rank (default 8)")
    parser.add_argument("--max-bytes", type=size_bytes, default=None,
                        help=f"largest size per rank (default {GPU_MAX_BYTES // 1024**3}G on GPUs, "
                             f"{CPU_MAX_BYTES // 1024**2}M on CPU)")
    parser.add_argument("--step-factor", type=_positive_int, default=2,
                        help="multiply the size by this between steps (default 2; at least 2)")
    parser.add_argument("--warmup-iters", type=_non_negative_int, default=5, help="untimed all-reduces per size")
    parser.add_argument("--iters", type=_positive_int, default=20, help="timed all-reduces per size")
    parser.add_argument("--min-busbw-gbps", type=_non_negative_float, default=0.0,
                        help="fail unless busbw at the largest size reaches this many GB/s (10^9 bytes/s, as "
                             "nccl-tests' busbw column); 0 (default) reports without a threshold")
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.step_factor < 2:
        parser.error(f"argument --step-factor: must be at least 2 (got {args.step_factor})")
    if args.max_bytes is not None and args.max_bytes < args.min_bytes:
        parser.error(f"argument --max-bytes: {args.max_bytes} is below --min-bytes {args.min_bytes}")
    return args


def sizes(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    """min, min*f, min*f^2, ... up to max; max itself is always measured (the threshold is checked there)."""
    out = [min_bytes]
    while out[-1] * factor <= max_bytes:
        out.append(out[-1] * factor)
    if out[-1] != max_bytes:
        out.append(max_bytes)
    return out


def bus_factor(ranks: int) -> float:
    """nccl-tests' all-reduce correction (doc/PERFORMANCE.md, "AllReduce"): each rank moves 2(n-1)/n of S."""
    return 2 * (ranks - 1) / ranks


@dataclass(frozen=True, slots=True)
class Result:
    size: int
    seconds: float  # mean time of one all-reduce, averaged over the ranks
    ranks: int
    wrong: int

    @property
    def algbw(self) -> float:
        return self.size / self.seconds / GB

    @property
    def busbw(self) -> float:
        return self.algbw * bus_factor(self.ranks)


def _timed(buffer: torch.Tensor, warmup: int, iters: int) -> float:
    """Seconds per all-reduce on this rank."""
    for _ in range(warmup):
        dist.all_reduce(buffer)
    if buffer.is_cuda:
        # A blocking all_reduce makes the current stream wait for NCCL's, so events on it bracket the whole loop.
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            dist.all_reduce(buffer)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1000 / iters
    began = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(buffer)
    return (time.perf_counter() - began) / iters


def _wrong(buffer: torch.Tensor, rank: int, ranks: int) -> int:
    """Elements that do not come back as 1 + 2 + ... + n after one all-reduce of rank+1 (exact in float32)."""
    buffer.fill_(rank + 1)
    dist.all_reduce(buffer)
    return int((buffer != ranks * (ranks + 1) / 2).sum().item())


def measure(size: int, work: torch.Tensor, warmup: int, iters: int) -> Result:
    rank, ranks = dist.get_rank(), dist.get_world_size()
    buffer = work[: size // ELEMENT_BYTES]
    # Zeros stay zeros however often they are summed: no overflow to inf on large worlds.
    buffer.zero_()
    seconds = _timed(buffer, warmup, iters)
    wrong = _wrong(buffer, rank, ranks)
    totals = torch.tensor([seconds, float(wrong)], dtype=torch.float64, device=work.device)
    dist.all_reduce(totals)
    return Result(size=size, seconds=totals[0].item() / ranks, ranks=ranks, wrong=int(totals[1].item()))


def header(backend: str, ranks: int, local_ranks: int, args: argparse.Namespace) -> str:
    return "\n".join([
        f"# commcheck: all_reduce sum float32 in place, backend {backend}, {ranks} ranks "
        f"({local_ranks} per node), warmup {args.warmup_iters}, iters {args.iters}",
        f"# {'size':>12} {'count':>12} {'type':>6} {'redop':>5} {'time':>10} {'algbw':>8} {'busbw':>8} {'#wrong':>6}",
        f"# {'(B)':>12} {'(elements)':>12} {'':>6} {'':>5} {'(us)':>10} {'(GB/s)':>8} {'(GB/s)':>8} {'':>6}",
    ])


def row(result: Result) -> str:
    return (f"  {result.size:>12} {result.size // ELEMENT_BYTES:>12} {'float':>6} {'sum':>5} "
            f"{result.seconds * 1e6:>10.2f} {result.algbw:>8.3f} {result.busbw:>8.3f} {result.wrong:>6}")


def verdict(results: Sequence[Result], min_busbw: float) -> tuple[int, str]:
    """(exit code, closing lines) from the sweep; the threshold applies to the largest size only."""
    last = results[-1]
    lines = [f"# Avg bus bandwidth    : {sum(r.busbw for r in results) / len(results):.3f} GB/s",
             f"# Largest size         : {last.size} B, busbw {last.busbw:.3f} GB/s"]
    wrong = sum(r.wrong for r in results)
    failed = wrong > 0
    if wrong:
        lines.append(f"# FAIL: {wrong} elements came back wrong")
    if min_busbw > 0:
        ok = last.busbw >= min_busbw
        failed |= not ok
        lines.append(f"# {'PASS' if ok else 'FAIL'}: busbw {last.busbw:.3f} GB/s at {last.size} B "
                     f"{'>=' if ok else '<'} threshold {min_busbw:.3f} GB/s")
    elif not wrong:
        lines.append("# PASS: all results correct (no --min-busbw-gbps threshold)")
    return (1 if failed else 0), "\n".join(lines)


def _init() -> tuple[torch.device, str, int]:
    """(device, backend, processes per node): NCCL on this rank's GPU when there is one, else gloo on CPU."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if torch.cuda.is_available():
        device, backend = torch.device("cuda", local_rank), "nccl"
        torch.cuda.set_device(device)
    else:
        device, backend = torch.device("cpu"), "gloo"
    if "WORLD_SIZE" in os.environ:
        dist.init_process_group(backend=backend, device_id=device if backend == "nccl" else None)
    else:
        # Plain `python -m`: one rank (busbw is 0 by the formula: there is no link to measure).
        dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1)
    return device, backend, local_ranks


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    device, backend, local_ranks = _init()
    try:
        default_max = GPU_MAX_BYTES if backend == "nccl" else CPU_MAX_BYTES
        max_bytes = args.max_bytes or max(default_max, args.min_bytes)
        steps = sizes(args.min_bytes, max_bytes, args.step_factor)
        work = torch.empty(max_bytes // ELEMENT_BYTES, dtype=ELEMENT, device=device)
        main_rank = dist.get_rank() == 0
        if main_rank:
            print(header(backend, dist.get_world_size(), local_ranks, args), flush=True)
        results = []
        for size in steps:
            results.append(measure(size, work, args.warmup_iters, args.iters))
            if main_rank:
                print(row(results[-1]), flush=True)
        code, closing = verdict(results, args.min_busbw_gbps)
        if main_rank:
            print(closing, flush=True)
        # Every rank holds the same averaged figures, so every rank exits with the same code.
        return code
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
