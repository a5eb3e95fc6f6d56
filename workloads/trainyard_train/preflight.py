"""Check a trainer command line before torchrun starts: `python -m trainyard_train.preflight ARGS...`.

ARGS are torchrun's arguments, ending in ``-m trainyard_train --config FILE key=value...``. The trainer
part is loaded and validated as the trainer would (config file, keys, types, values, a writable run_dir).
Exit 0 when it is valid; else one line naming the key on stderr and exit CONFIG_ERROR_EXIT_CODE (2).

Why before torchrun: its elastic agent restarts the worker group after *any* worker failure, up to
--max-restarts (torch/distributed/elastic/agent/server/api.py, ``_invoke_run``), and its own exit code
does not carry the worker's. A config error found inside a worker would be retried, and could not be
told apart from a crash by the Volcano job. The job's launch line runs this first:
``python -m trainyard_train.preflight "$@" && exec torchrun "$@"``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .config import CONFIG_ERROR_EXIT_CODE, ConfigError, check_run_dir, load_config

MODULE = "trainyard_train"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The trainer's own command line (also used by train.main)."""
    parser = argparse.ArgumentParser(prog="trainyard_train", description="Elastic DDP trainer")
    parser.add_argument("--config", help="YAML config file (defaults apply to keys it omits)")
    parser.add_argument("overrides", nargs="*", metavar="section.key=value", help="config overrides")
    return parser.parse_args(argv)


def report(exc: ConfigError) -> int:
    """One line, no traceback; the final exit code."""
    print(f"trainyard_train: config error: {exc}", file=sys.stderr)
    return CONFIG_ERROR_EXIT_CODE


def trainer_argv(argv: Sequence[str]) -> list[str]:
    """The arguments after ``-m trainyard_train`` (the whole list when that is absent: a plain trainer line)."""
    items = list(argv)
    for i in range(len(items) - 1):
        if items[i] == "-m" and items[i + 1] == MODULE:
            return items[i + 2 :]
    return items


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(trainer_argv(sys.argv[1:] if argv is None else argv))
    try:
        check_run_dir(load_config(args.config, args.overrides))
    except ConfigError as exc:
        return report(exc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
