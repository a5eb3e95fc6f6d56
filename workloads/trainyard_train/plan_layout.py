"""Memory per GPU of a trainer config, and the layouts that fit: `python -m trainyard_train.plan_layout`.

    python -m trainyard_train.plan_layout --config workloads/configs/llama-7b.yaml --gpu H100-80GB --nodes 2:8
    python -m trainyard_train.plan_layout --config workloads/configs/gpt-small.yaml --gpu-memory-gib 24 \\
        --gpus-per-node 1 parallel.data_parallel=fsdp

Checks the config's own layout over the node range (validate.check_node_range), prints the busiest rank's bytes at
the smallest node count (where FSDP shards least), and the layouts that fit at that count, best first.
Exit 0 when the config's layout fits, 1 when it does not, 2 for a config error (one line naming the key).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .config import ConfigError, load_config
from .exitcodes import CONFIG_ERROR
from .planner import (
    NVIDIA_SMI_MIB,
    GiB,
    describe_candidate,
    estimate,
    gpu_memory_bytes,
    layout_of,
    parameter_count,
    suggest,
)
from .validate import check_node_range

PROG = "python -m trainyard_train.plan_layout"
SHOWN = 5


def _nodes(text: str) -> tuple[int, int]:
    low, _, high = text.partition(":")
    try:
        first, last = int(low), int(high or low)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a node count or range such as 2 or 2:8") from None
    if not 1 <= first <= last:
        raise argparse.ArgumentTypeError(f"{text!r}: need 1 <= MIN <= MAX")
    return first, last


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="trainer config file")
    memory = parser.add_mutually_exclusive_group(required=True)
    memory.add_argument("--gpu", choices=sorted(NVIDIA_SMI_MIB), help="GPU model of the pool (its memory as CUDA "
                        "reports it, planner.py)")
    memory.add_argument("--gpu-memory-gib", type=float, help="memory of one GPU, GiB")
    parser.add_argument("--gpus-per-node", type=int, default=8, help="processes (GPUs) per node (default 8)")
    parser.add_argument("--nodes", type=_nodes, default=(1, 1), help="node count or MIN:MAX range (default 1)")
    parser.add_argument("--all", action="store_true", help=f"list every fitting layout, not the best {SHOWN}")
    parser.add_argument("overrides", nargs="*", metavar="section.key=value", help="config overrides")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    device = gpu_memory_bytes(args.gpu) if args.gpu else int(args.gpu_memory_gib * GiB)
    gib = device / GiB
    per_node, (first, last) = args.gpus_per_node, args.nodes
    world = first * per_node
    try:
        cfg = load_config(args.config, args.overrides)
        check_node_range(cfg, nproc_per_node=per_node, min_nodes=first, max_nodes=last)
        need = estimate(cfg, world_size=world, local_world_size=per_node)
    except ConfigError as exc:
        print(f"{PROG}: config error: {exc}", file=sys.stderr)
        return CONFIG_ERROR
    m = cfg.model
    print(f"model: {parameter_count(cfg) / 1e9:.3f}B parameters, {m.n_layers} layers of {m.d_model}; global batch "
          f"{cfg.train.global_batch_size} x {m.seq_len} tokens, micro-batches of at most {cfg.train.micro_batch_size}")
    print(f"GPU: {args.gpu or 'custom'} {gib:.2f} GiB; nodes {first}:{last} x {per_node} processes")
    fits = need.total <= device
    print(f"config layout {layout_of(cfg, world).describe()} (ac {cfg.parallel.ac}) at {first} node(s): busiest rank "
          f"{need.describe()}: {'fits' if fits else 'does NOT fit'}")
    found = suggest(cfg, world_size=world, local_world_size=per_node, device_memory_bytes=device)
    shown = found if args.all else found[:SHOWN]
    print(f"layouts that fit at {first} node(s), best first ({len(shown)} of {len(found)}):")
    for parallel, candidate in shown:
        print(f"  {describe_candidate(parallel)}: {candidate.describe()}")
    if not found:
        print("  none: more nodes, a smaller train.micro_batch_size or a smaller model")
    return 0 if fits else 1


if __name__ == "__main__":
    raise SystemExit(main())
