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

With --node-labels (the fabric check passes the EKS network-topology labels, top layer first), each node's first
rank reads its node's labels from the API server ($NODE_NAME, the pod's service account) and rank 0 prints which of
those layers all nodes share, so the bandwidth can be read against where the ranks ran; a failure to read them is
reported, never fatal.

On GPUs (NCCL) buffers live on `cuda:LOCAL_RANK` and CUDA events time the loop on the stream the collectives
are ordered on; on CPU (gloo) a wall clock does. Self-contained on purpose: it shares nothing with the trainer,
so a broken trainer never hides a working fabric or the reverse.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import ssl
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
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
# The pod's node (downward API spec.nodeName) and where Kubernetes mounts the service account's token and CA.
NODE_ENV = "NODE_NAME"
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


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
    parser.add_argument("--node-labels", type=lambda text: [k for k in text.split(",") if k], default=[],
                        help="comma-separated node label keys, top network layer first: report which ones all "
                             "nodes share (needs $NODE_NAME and a service account that may get nodes)")
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


def node_labels(name: str, account: Path = SERVICE_ACCOUNT_DIR) -> dict[str, str]:
    """The labels of node `name`, read from the API server with the pod's service account (OSError if not)."""
    host = os.environ.get("KUBERNETES_SERVICE_HOST")
    if not host:
        raise OSError("not in a cluster: KUBERNETES_SERVICE_HOST is not set")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    request = urllib.request.Request(f"https://{host}:{port}/api/v1/nodes/{urllib.parse.quote(name)}",
                                     headers={"Authorization": f"Bearer {(account / 'token').read_text().strip()}"})
    context = ssl.create_default_context(cafile=str(account / "ca.crt"))
    with urllib.request.urlopen(request, context=context, timeout=10) as response:
        labels = json.load(response).get("metadata", {}).get("labels") or {}
    return {str(k): str(v) for k, v in labels.items()}


def topology_line(nodes: Mapping[str, Mapping[str, str] | str], keys: Sequence[str]) -> str:
    """What the nodes have in common among `keys` (top layer first), from {node: labels, or why they are unknown}."""
    unknown = {node: why for node, why in nodes.items() if isinstance(why, str)}
    if unknown:
        return "# topology: unknown (" + "; ".join(f"{n}: {why}" for n, why in sorted(unknown.items())) + ")"
    labels = [label for label in nodes.values() if not isinstance(label, str)]
    unlabelled = sorted(n for n, label in nodes.items() if not isinstance(label, str) and keys[0] not in label)
    if unlabelled:
        return f"# topology: no {keys[0]} label on {', '.join(unlabelled)} (no EC2 network topology for its type)"
    shared = []
    for key in keys:
        values = {label.get(key) for label in labels}
        if len(values) != 1 or None in values:
            break
        shared.append(f"{key}={values.pop()}")
    apart = keys[len(shared)] if len(shared) < len(keys) else None
    count = f"{len(nodes)} node" + ("s share" if len(nodes) != 1 else " has")
    return (f"# topology: {count} " + (", ".join(shared) or "no layer")
            + (f"; they differ from {apart}" if apart else ""))


def report_topology(keys: Sequence[str], local_rank: int) -> str | None:
    """Collective: every node's labels (read by its first rank) gathered everywhere; rank 0's line, or None."""
    entry: tuple[str, dict[str, str] | str] | None = None
    if local_rank == 0:
        name = os.environ.get(NODE_ENV, "")
        try:
            entry = (name, node_labels(name)) if name else (f"rank {dist.get_rank()}", f"${NODE_ENV} not set")
        except (OSError, ValueError) as exc:
            entry = (name, f"node labels unreadable: {exc}")
    entries: list[tuple[str, dict[str, str] | str] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(entries, entry)
    if dist.get_rank() != 0:
        return None
    return topology_line({node: value for e in entries if e is not None for node, value in [e]}, keys)


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
        if args.node_labels and (line := report_topology(args.node_labels, int(os.environ.get("LOCAL_RANK", "0")))):
            print(line, flush=True)
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
    gc.freeze()  # torch's import-time objects out of every full collection (as in train.main)
    sys.exit(main())
