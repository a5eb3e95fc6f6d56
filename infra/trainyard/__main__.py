"""trainyard's command line: `python -m trainyard plan --stack dev [--out DIR] [--graph FILE]`.

`plan` runs the same program `pulumi up` runs, under Pulumi's mock runtime, and shows what it would create;
`--rehearse` then walks it in the engine's creation order and fails (exit 1) on the first resource that would
hang or fail.
`diff` renders stacks at the working tree and at a git ref and shows what a change adds, changes and costs.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from trainyard.config import ConfigError
from trainyard.config.mig import load_mig_catalog
from trainyard.paths import REPO_ROOT, STACKS_DIR
from trainyard.plan import graph, report
from trainyard.plan import rehearse as rehearsal
from trainyard.plan.capacity import pool_capacity
from trainyard.plan.diff import default_base, diff_against, format_diff
from trainyard.plan.recording import Recording
from trainyard.plan.runtime import StackFile, available_stacks, read_stack, render, settings_of
from trainyard.plan.writers import write_plan


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trainyard", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    plan = commands.add_parser("plan", help="render a stack offline: preview tree, summary, and files with --out")
    plan.add_argument("--stack", default="dev", help=f"one of: {', '.join(available_stacks())}")
    plan.add_argument("--stacks-dir", type=Path, default=STACKS_DIR, help=argparse.SUPPRESS)
    plan.add_argument("--out", type=Path, help="write resources.json, manifests/ and helm/ here")
    plan.add_argument("--quiet", action="store_true", help="print only the summary, not the tree")
    plan.add_argument("--graph", type=Path, help="write the dependency graph here (.dot: Graphviz, else Mermaid)")
    plan.add_argument("--rehearse", action="store_true",
                      help="rehearse `pulumi up`: exit 1 naming the first resource that would hang or fail")
    diff = commands.add_parser("diff", help="compare stacks rendered at the working tree and at a git ref")
    diff.add_argument("--base", help="git ref to compare against (default: origin/main if it exists, else HEAD)")
    diff.add_argument("--stack", action="append", dest="stacks", help="repeatable; default: every stack")
    diff.add_argument("--format", choices=("markdown", "text"), default="text")
    args = parser.parse_args(argv)
    if args.command == "diff":
        return _diff(args.base, args.stacks or available_stacks(), args.format)
    return _plan(read_stack(args.stack, args.stacks_dir), args.out, args.quiet, args.graph, args.rehearse)


def _diff(base: str | None, stacks: list[str], fmt: str) -> int:
    ref = base or default_base(REPO_ROOT)
    print(format_diff(diff_against(REPO_ROOT, ref, stacks), "markdown" if fmt == "markdown" else "text", ref), end="")
    return 0


def _plan(stack: StackFile, out: Path | None, quiet: bool, graph_file: Path | None = None,
          rehearse: bool = False) -> int:
    stack_name = stack.stack
    recording = Recording()
    try:
        settings = settings_of(stack)
        with _progress(stack_name, recording):
            render(stack, recording=recording)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if not quiet:
        print(report.tree(recording, stack_name))
        print()
    print(report.summary(recording, settings, pool_capacity(settings, load_mig_catalog())))
    if out is not None:
        write_plan(recording, out)
        print(f"\nWrote {out}/resources.json, {out}/manifests/, {out}/helm/, {out}/graph.mmd, {out}/graph.dot")
    if graph_file is not None:
        dependencies = graph.build(recording)
        text = graph.to_dot(dependencies) if graph_file.suffix == ".dot" else graph.to_mermaid(dependencies)
        graph_file.write_text(text)
        print(f"Wrote {graph_file}")
    if rehearse:
        result = rehearsal.rehearse(recording)
        print("\n" + rehearsal.report(result, stack_name))
        return 0 if result.passed else 1
    return 0


@contextmanager
def _progress(stack: str, recording: Recording) -> Iterator[None]:
    """A status line on a terminal when rendering takes more than a moment."""
    done = threading.Event()

    def show() -> None:
        start = time.monotonic()
        while not done.wait(0.2):
            if time.monotonic() - start > 0.5:
                print(f"\rrendering {stack}: {len(recording.resources)} resources", end="", file=sys.stderr)
        print("\r\033[K", end="", file=sys.stderr)

    thread = threading.Thread(target=show, daemon=True) if sys.stderr.isatty() else None
    if thread:
        thread.start()
    try:
        yield
    finally:
        done.set()
        if thread:
            thread.join()


if __name__ == "__main__":
    sys.exit(main())
