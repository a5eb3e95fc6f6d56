"""Whether a config can run at a world size, and over a job's node range: checked before any process group exists.

    check_launch(cfg, world_size=16, local_world_size=8)        # the trainer, from torchrun's environment
    check_node_range(cfg, nproc_per_node=8, min_nodes=2, max_nodes=8)   # the platform's plan, per job
    check_torchrun_command(cfg, ["--nnodes=2:8", "--nproc-per-node=8", "-m", "trainyard_train", ...])  # a launch

Pure Python (config and layout only, no torch): the plan imports it. Each problem is a ConfigError whose message
starts with the key to change. Elastic resizing changes only the data-parallel dimension, so a layout is
elastic-safe when tp x pp divides the processes per node: every node count then resolves to whole model copies.
That does not put a copy on one node: pp is the outermost mesh dimension (layout.py), so TP groups stay on one
node while pipeline stages sit on different nodes and their sends cross the network. A block wider than a node
(k nodes) needs a node count that is a multiple of k, which torchrun's ``--nnodes=MIN:MAX`` cannot promise, so
the node range must then be a single multiple of k.
"""

from __future__ import annotations

from collections.abc import Sequence

from .config import Config, ConfigError
from .layout import MicroBatchPlan, for_config


def check_launch(cfg: Config, *, world_size: int, local_world_size: int) -> None:
    """ConfigError naming the key if ``cfg`` cannot train on ``world_size`` ranks, ``local_world_size`` per node."""
    p = cfg.parallel
    if p.tp > 1 and local_world_size % p.tp:
        # TP all-gathers and reduce-scatters on every layer's critical path: NVLink, never the network.
        raise ConfigError(f"parallel.tp: {p.tp} tensor-parallel ranks must sit on one node, and a node here runs "
                          f"{local_world_size} processes (tp must divide it)")
    block = p.tp * p.pp
    if p.data_parallel == "fsdp" and block > local_world_size:
        if block % local_world_size:
            raise ConfigError(f"parallel.pp: a model copy of tp x pp = {block} ranks must fill whole nodes of "
                              f"{local_world_size} processes")
        span = block // local_world_size
        nodes = world_size // local_world_size
        if nodes % span:
            raise ConfigError(f"parallel.pp: a model copy spans {span} nodes (tp x pp = {block}); {nodes} node(s) "
                              f"do not hold whole copies: the node count must be a multiple of {span}")
    layout, plan = for_config(cfg, world_size)
    g = cfg.train.global_batch_size
    if g < layout.dp:
        raise ConfigError(f"train.global_batch_size: {g} samples cannot give each of the {layout.dp} data-parallel "
                          f"ranks of a world of {world_size} one")
    if layout.pp > 1:
        _check_pipeline(cfg, plan, world_size, layout.dp)


def _check_pipeline(cfg: Config, plan: MicroBatchPlan, world_size: int, dp: int) -> None:
    """The micro-batch count each schedule needs (torch/distributed/pipelining/schedules.py@v2.13.0)."""
    p, n = cfg.parallel, plan.count
    where = (f"gives {n} pipeline micro-batch(es) per data-parallel rank at a world of {world_size} (dp {dp}, "
             f"global batch {cfg.train.global_batch_size})")
    fix = "lower train.micro_batch_size or raise train.global_batch_size"
    # Fewer micro-batches than pipeline ranks leave ranks idle for most of the step (bubble (pp-1)/(m+pp-1)).
    need = p.n_stages if p.pp_schedule == "DualPipeV" else p.pp
    if n < need:
        raise ConfigError(f"train.micro_batch_size: {cfg.train.micro_batch_size} {where}; {p.pp_schedule} over "
                          f"pp={p.pp} needs at least {need}: {fix}")
    if p.pp_schedule in ("Interleaved1F1B", "InterleavedZeroBubble"):
        rounds = max(1, n // p.pp)
        if n % rounds:
            raise ConfigError(f"train.micro_batch_size: {cfg.train.micro_batch_size} {where}; {p.pp_schedule} "
                              f"needs a multiple of its {rounds} rounds (n // pp): {fix}")


def check_node_range(cfg: Config, *, nproc_per_node: int, min_nodes: int, max_nodes: int) -> None:
    """check_launch at every node count torchrun's ``--nnodes=MIN:MAX`` may start the job with."""
    for nodes in range(min_nodes, max_nodes + 1):
        try:
            check_launch(cfg, world_size=nodes * nproc_per_node, local_world_size=nproc_per_node)
        except ConfigError as exc:
            raise ConfigError(f"{exc} (at {nodes} node(s) of {nproc_per_node} processes, within the job's node "
                              f"range {min_nodes}:{max_nodes})") from None


def _flag(launcher_args: Sequence[str], *names: str) -> str | None:
    """The last value of a torchrun flag, given as ``--flag=value`` or ``--flag value``."""
    value = None
    for i, item in enumerate(launcher_args):
        for name in names:
            if item == name and i + 1 < len(launcher_args):
                value = launcher_args[i + 1]
            elif item.startswith(name + "="):
                value = item.split("=", 1)[1]
    return value


def check_torchrun_command(cfg: Config, argv: Sequence[str]) -> None:
    """check_node_range for the node range and processes per node a torchrun command line asks for (its flags
    before ``-m MODULE``; torch/distributed/run.py@v2.13.0 spells them --nnodes=N|MIN:MAX, --nproc-per-node or
    --nproc_per_node, --standalone for one node). A process count of gpu, cpu or auto is only known on the node:
    the trainer checks that world itself (check_launch)."""
    items = list(argv)
    module = next((i for i in range(len(items) - 1) if items[i] == "-m"), len(items))
    launcher = items[:module]
    nproc = _flag(launcher, "--nproc-per-node", "--nproc_per_node") or "1"
    nnodes = "1" if "--standalone" in launcher else (_flag(launcher, "--nnodes") or "1")
    low, _, high = nnodes.partition(":")
    if not nproc.isdigit():
        return
    if not (low.isdigit() and (high or low).isdigit()):
        raise ConfigError(f"--nnodes: {nnodes!r} is not a node count or MIN:MAX range")
    check_node_range(cfg, nproc_per_node=int(nproc), min_nodes=int(low), max_nodes=int(high or low))
