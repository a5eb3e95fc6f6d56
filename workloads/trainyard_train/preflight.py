"""Validate a trainer command line as the trainer would, before any process group exists.

``check`` is what the trainer runs first (train.py) and what the node agent runs before torchrun starts
(agent.py): the config file, its keys, types and values, a writable run_dir, and a run_dir that holds no run
of a different model. ``python -m trainyard_train.preflight TORCHRUN_ARGS...`` checks a job's command line
without running it: exit 0, or one line naming the key on stderr and exit 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence

from .checkpoint import complete_checkpoints, read_commit
from .config import Config, ConfigError, check_run_dir, load_config
from .data import MANIFEST, Manifest
from .exitcodes import CONFIG_ERROR
from .export import ExportTarget
from .metrics import resolve_port
from .validate import check_torchrun_command

RUN_MODEL_KEY = "model"
"""The commit marker's copy of the model section: what a resumed run must match (loop.Trainer.save)."""
TUNABLE_MODEL_KEYS = frozenset({"dropout"})
"""Model keys a resumed run may change: they shape no tensor."""


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
