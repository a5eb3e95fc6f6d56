"""Validate a trainer command line as the trainer would, before any process group exists.

``check`` is what the trainer runs first (train.py) and what the node agent runs before torchrun starts
(agent.py): the config file, its keys, types and values, a writable run_dir, and a run_dir that holds no run
of a different model. ``python -m trainyard_train.preflight TORCHRUN_ARGS...`` checks a job's command line
without running it: exit 0, or one line naming the key on stderr and exit 2. Once the world size is known (each
worker, before the process group), ``check_memory`` refuses a config the memory planner says cannot fit.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from .checkpoint import complete_checkpoints, read_commit
from .config import Config, ConfigError, check_run_dir, load_config
from .data import MANIFEST, Manifest
from .exitcodes import CONFIG_ERROR
from .export import ExportTarget
from .metrics import resolve_port
from .planner import GiB, check_fits, estimate, layout_of
from .validate import check_torchrun_command

RUN_MODEL_KEY = "model"
"""The commit marker's copy of the model section: what a resumed run must match (loop.Trainer.save)."""
TUNABLE_MODEL_KEYS = frozenset({"dropout"})
"""Model keys a resumed run may change: they shape no tensor."""
CGROUP_MEMORY_MAX = Path("/sys/fs/cgroup/memory.max")
"""The container's memory limit, or "max" (https://docs.kernel.org/admin-guide/cgroup-v2.html, memory.max)."""


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The trainer's own command line (also used by train.main)."""
    parser = argparse.ArgumentParser(prog="trainyard_train", description="Elastic DDP trainer")
    parser.add_argument("--config", help="YAML config file (defaults apply to keys it omits)")
    parser.add_argument("overrides", nargs="*", metavar="section.key=value", help="config overrides")
    return parser.parse_args(argv)


def report(exc: ConfigError) -> int:
    """One line, no traceback; the final exit code."""
    print(config_error_line(exc), file=sys.stderr, flush=True)
    return CONFIG_ERROR


def config_error_line(exc: ConfigError) -> str:
    return f"trainyard_train: config error: {exc}"


def trainer_argv(argv: Sequence[str]) -> list[str]:
    """The arguments after ``-m MODULE`` (torchrun's own flags come before it); the whole list without one."""
    items = list(argv)
    for i in range(len(items) - 2, -1, -1):
        if items[i] == "-m":
            return items[i + 2 :]
    return items


def check_resumable(cfg: Config) -> None:
    """A run_dir whose newest complete checkpoint belongs to another model cannot be resumed: say so now
    instead of failing inside DCP's load (or, worse, silently starting over)."""
    complete = complete_checkpoints(cfg.checkpoint_dir)
    if not complete:
        return
    newest = complete[-1]
    try:
        saved = read_commit(newest.path).get(RUN_MODEL_KEY)
    except (OSError, ValueError):
        return  # torn markers are the checkpointer's to skip, with a warning
    if not isinstance(saved, dict):
        return
    current = dataclasses.asdict(cfg.model)
    changed = sorted(k for k in (current.keys() | saved.keys()) - TUNABLE_MODEL_KEYS if current.get(k) != saved.get(k))
    if changed:
        diff = ", ".join(f"model.{k}: {saved.get(k)!r} in the run, {current.get(k)!r} now" for k in changed)
        raise ConfigError(f"run_dir: {cfg.run_dir} holds a run of another model ({newest.path.name}: {diff}); "
                          "use a new run_dir, or set the model back")


def check_data(cfg: Config) -> None:
    """A dataset the run cannot read is found now, not by every worker after the rendezvous."""
    if (cfg.data_dir / MANIFEST).exists():
        Manifest.read(cfg.data_dir)
    elif not cfg.data.generate:
        raise ConfigError(f"data.path: {cfg.data_dir / MANIFEST} is missing and data.generate is false")


def host_memory_bytes() -> int:
    """The memory this node's processes share: physical RAM, or less under a cgroup limit (a pod's)."""
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        limit = CGROUP_MEMORY_MAX.read_text().strip()
    except OSError:
        return physical
    return min(physical, int(limit)) if limit.isdigit() else physical


def check_memory(cfg: Config, *, world_size: int, local_world_size: int, local_rank: int) -> None:
    """A config the memory planner says cannot fit is refused before anything is allocated, instead of dying in
    an allocation after the rendezvous (or, at absurd sizes, in a tensor-size overflow). On CUDA the busiest
    rank's estimate, whose reserve covers the context and NCCL buffers, against the whole GPU as the platform's
    plan does for a pool; on CPU the node's processes together against the host's memory."""
    import torch  # only the workers ask: the node agent's checks above run before torch is imported

    if torch.cuda.is_available():  # the device init_distributed picks
        _, device_bytes = torch.cuda.mem_get_info(local_rank)
        check_fits(cfg, world_size=world_size, local_world_size=local_world_size, device_memory_bytes=device_bytes)
        return
    need = estimate(cfg, world_size=world_size, local_world_size=local_world_size, device_type="cpu")
    host = host_memory_bytes()
    if need.total * local_world_size > host:
        node = f", {need.total * local_world_size / GiB:.2f} GiB for this node's {local_world_size} processes" if (
            local_world_size > 1) else ""
        raise ConfigError(f"parallel: {layout_of(cfg, world_size).describe()} needs {need.describe()} per process "
                          f"on CPU at a world of {world_size}{node}, more than the host's {host / GiB:.2f} GiB; a "
                          "smaller model or train.micro_batch_size, or more nodes")


def check(args: argparse.Namespace) -> Config:
    cfg = load_config(args.config, args.overrides)
    resolve_port(cfg.metrics.port)
    ExportTarget.from_env()
    check_run_dir(cfg)
    check_resumable(cfg)
    check_data(cfg)
    return cfg


def check_command_line(argv: Sequence[str]) -> Config:
    cfg = check(parse_args(trainer_argv(argv)))
    check_torchrun_command(cfg, argv)  # the layout against every node count the launch may start with
    return cfg


def main(argv: Sequence[str] | None = None) -> int:
    try:
        check_command_line(sys.argv[1:] if argv is None else argv)
    except ConfigError as exc:
        return report(exc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
