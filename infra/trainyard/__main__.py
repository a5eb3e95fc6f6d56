"""trainyard's command line: `python -m trainyard plan --stack dev [--out DIR] [--graph FILE]`.

`plan` runs the same program `pulumi up` runs, under Pulumi's mock runtime, renders every Helm release with
the real Helm, and shows what it would create; `--rehearse` then walks it in the engine's creation order and
fails (exit 1) on the first resource that would hang or fail.
`diff` renders stacks at the working tree and at a git ref and shows what a change adds, changes and costs.
`region` prints a stack's validated AWS region, so CI configures credentials for the region the stack deploys to.
`submit` renders a tenant's own job file with the stack's code, checks it, and prints, writes or applies it;
`submit status|logs|cancel` then read or end that job on the cluster with the member's own kubeconfig.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from trainyard.config import ConfigError
from trainyard.config.mig import load_mig_catalog
from trainyard.config.release_check import recorded_digests
from trainyard.config.yaml_input import InputError
from trainyard.paths import REPO_ROOT, STACKS_DIR
from trainyard.plan import graph, report
from trainyard.plan import rehearse as rehearsal
from trainyard.plan.capacity import pool_capacity
from trainyard.plan.conformance import release_values_problems
from trainyard.plan.diff import default_base, diff_against, format_diff, resolve_ref
from trainyard.plan.helm import HELM
from trainyard.plan.images import digest_mismatches, unpinned
from trainyard.plan.recording import Recording
from trainyard.plan.rendering import RenderError
from trainyard.plan.resource_types import RELEASE
from trainyard.plan.runtime import StackFile, available_stacks, plan_stack, read_stack, settings_of
from trainyard.plan.writers import check_out, check_unique_objects, write_plan
from trainyard.safe_paths import UnsafePathError, write_file
from trainyard.submit import control
from trainyard.submit import main as submit_job

GRAPH_SUFFIXES = (".dot", ".mmd")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trainyard", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    plan = commands.add_parser("plan", help="render a stack offline: preview tree, summary, and files with --out")
    plan.add_argument("--stack", default="dev", help=f"one of: {', '.join(available_stacks())}")
    plan.add_argument("--stacks-dir", type=Path, default=STACKS_DIR, help=argparse.SUPPRESS)
    plan.add_argument("--out", type=Path, help="write resources.json, manifests/, helm/ and rendered/ here")
    plan.add_argument("--quiet", action="store_true", help="print only the summary, not the tree")
    plan.add_argument("--graph", type=Path, help="write the dependency graph here (.dot: Graphviz, .mmd: Mermaid)")
    plan.add_argument("--rehearse", action="store_true",
                      help="rehearse `pulumi up`: exit 1 naming the first resource that would hang or fail")
    diff = commands.add_parser("diff", help="compare stacks rendered at the working tree and at a git ref")
    diff.add_argument("--base", help="git ref to compare against (default: origin/main if it exists, else HEAD)")
    diff.add_argument("--stack", action="append", dest="stacks", help="repeatable; default: every stack")
    diff.add_argument("--format", choices=("markdown", "text"), default="text")
    region = commands.add_parser("region", help="print a stack's validated AWS region (CI configures credentials "
                                                 "for it)")
    region.add_argument("--stack", required=True)
    region.add_argument("--stacks-dir", type=Path, default=STACKS_DIR, help=argparse.SUPPRESS)
    job = argparse.ArgumentParser(add_help=False)  # what every submit action names: the job and its cluster
    job.add_argument("--stack", required=True, help="the stack whose cluster runs it")
    job.add_argument("--stacks-dir", type=Path, default=STACKS_DIR, help=argparse.SUPPRESS)
    job.add_argument("--job", required=True, type=Path, help="one trainyard:workloads entry as a YAML file")
    job.add_argument("--kubeconfig", type=Path, help="default: $KUBECONFIG or ~/.kube/config")
    job.add_argument("--context", help="the kubeconfig context (default: its current-context)")
    submit = commands.add_parser("submit", help="a tenant's own job: render it as the stack would, check it, then "
                                                 "print, write or apply it; then its status, logs or cancel")
    actions = submit.add_subparsers(dest="action", metavar="{apply,status,logs,cancel}")
    applying = actions.add_parser("apply", parents=[job], help="the default: print (--dry-run), write (--out) or "
                                                                "server-side apply the job's objects")
    applying.add_argument("--dry-run", action="store_true", help="print the manifests, send nothing")
    applying.add_argument("--out", type=Path, help="write the manifests into this folder, send nothing")
    applying.add_argument("--pipeline", action="store_true",
                          help="the job as an Argo WorkflowTemplate: prepare data, train, gate, register (pipeline.py)")
    applying.add_argument("--model-name", help="with --pipeline: the registered model's name (default: the job's)")
    actions.add_parser("status", parents=[job], help="the Volcano Job's phase, its PodGroup, each task's pods, the "
                                                      "last events")
    logs = actions.add_parser("logs", parents=[job], help="one pod's log (default: the first task's pod 0)")
    logs.add_argument("--task", help="the Volcano task (default: the job's first, `worker`)")
    logs.add_argument("--index", type=int, default=0, help="the pod's index in its task: pod <job>-<task>-<index>")
    logs.add_argument("--follow", "-f", action="store_true", help="keep printing until the container ends")
    logs.add_argument("--previous", "-p", action="store_true", help="the container's previous run (after a restart)")
    actions.add_parser("cancel", parents=[job], help="delete the Volcano Job (foreground); its checkpoints stay")
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["submit"] and not {*argv[1:2]} & {*actions.choices, "-h", "--help"}:
        argv = ["submit", "apply", *argv[1:]]  # `submit --stack ... --job ...` applies, as before the actions
    args = parser.parse_args(argv)
    # Config warnings (pulumi.log.warn, which the mock engine hands to logging) read like the errors below.
    logging.addLevelName(logging.WARNING, "warning")
    logging.basicConfig(format="%(levelname)s: %(message)s", level=logging.WARNING)
    try:
        if args.command == "diff":
            return _diff(args.base, args.stacks, args.format)
        if args.command == "region":
            return _region(read_stack(args.stack, args.stacks_dir))
        if args.command == "submit" and args.action == "apply":
            return submit_job(read_stack(args.stack, args.stacks_dir), args.job, dry_run=args.dry_run, out=args.out,
                              kubeconfig=args.kubeconfig, context=args.context, pipeline=args.pipeline,
                              model_name=args.model_name,
                              stacks_dir=None if args.stacks_dir == STACKS_DIR else args.stacks_dir)
        if args.command == "submit":
            return control(args.action, read_stack(args.stack, args.stacks_dir), args.job,
                           kubeconfig=args.kubeconfig, context=args.context,
                           **{k: getattr(args, k) for k in ("task", "index", "follow", "previous") if hasattr(args, k)})
        return _plan(read_stack(args.stack, args.stacks_dir), args.out, args.quiet, args.graph, args.rehearse)
    except (InputError, ConfigError) as error:
        # Bad input is the user's to fix: one message, no traceback, exit 2 (as argparse does for bad options).
        print(f"error: {error}", file=sys.stderr)
        return 2


def _diff(base: str | None, stacks: list[str] | None, fmt: str) -> int:
    available = available_stacks()
    for name in stacks or ():
        if name not in available:
            raise InputError(f"--stack {name!r}: unknown stack; stacks: {', '.join(available)}")
    ref = resolve_ref(REPO_ROOT, base) if base is not None else default_base(REPO_ROOT)
    diffs = diff_against(REPO_ROOT, ref, stacks or available)
    print(format_diff(diffs, "markdown" if fmt == "markdown" else "text", ref), end="")
    return 0


def _region(stack: StackFile) -> int:
    settings = settings_of(stack)
    if settings.aws is None:
        raise InputError(f"stack {stack.stack!r} has no AWS region: its target is {settings.target!r}")
    print(settings.aws.region)
    return 0


def _plan(stack: StackFile, out: Path | None, quiet: bool, graph_file: Path | None = None,
          rehearse: bool = False) -> int:
    stack_name = stack.stack
    recording = Recording()
    # Checked before rendering: a bad destination costs no render, and nothing is half written.
    if out is not None:
        check_out(out)
    if graph_file is not None:
        _check_writable_file(graph_file, "--graph")
    with _progress(stack_name, recording):
        planned = plan_stack(stack, recording)
    check_unique_objects(recording)
    settings, rendered = planned.settings, planned.rendered
    if unknown := release_values_problems(r.inputs for r in planned.recording.resources if r.type == RELEASE):
        raise RenderError("Helm release values the charts do not take (the chart would ignore them, so the setting "
                          "would do nothing):\n  " + "\n  ".join(unknown))
    if moving := unpinned(rendered):
        raise RenderError("images without a pinned tag (a release tag or a digest), so the plan cannot say what "
                          "would run; set their tags in the releases' values (platform/charts.yaml `images`):\n  "
                          + "\n  ".join(moving))
    if wrong := digest_mismatches(rendered, recorded_digests()):
        raise RenderError("images whose digest is not the one release data records for their tag (the digest is "
                          "what is pulled); pin both in platform/charts.yaml `images`:\n  " + "\n  ".join(wrong))
    if not quiet:
        print(report.tree(recording, stack_name))
        print()
    print(report.summary(recording, settings, pool_capacity(settings, load_mig_catalog())))
    objects = sum(len(r.objects) for r in rendered.releases.values())
    print(f"\nHelm {HELM.version} rendered {len(rendered.releases)} releases into {objects} objects "
          f"(Kubernetes {settings.cluster.kubernetes_version}, {len(rendered.api_versions)} API versions)")
    if out is not None:
        write_plan(recording, out, rendered)
        print(f"\nWrote {out}/resources.json, {out}/manifests/, {out}/helm/, {out}/rendered/, {out}/graph.mmd, "
              f"{out}/graph.dot")
    if graph_file is not None:
        dependencies = graph.build(recording)
        text = graph.to_dot(dependencies) if graph_file.suffix == ".dot" else graph.to_mermaid(dependencies)
        try:
            write_file(graph_file.parent, graph_file.name, text.encode())
        except (OSError, UnsafePathError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else None
            raise InputError(f"--graph {graph_file}: cannot be written ({reason or exc})") from None
        print(f"Wrote {graph_file}")
    if rehearse:
        result = rehearsal.rehearse(recording, rendered)
        print("\n" + rehearsal.report(result, stack_name))
        return 0 if result.passed else 1
    return 0


def _check_writable_file(path: Path, option: str) -> None:
    """A graph file goes to a new path, or over an earlier graph (same suffix), never over another kind of file."""
    if path.suffix not in GRAPH_SUFFIXES:
        raise InputError(f"{option} {path}: name it *.dot (Graphviz) or *.mmd (Mermaid)")
    if path.is_symlink():
        raise InputError(f"{option} {path}: is a symbolic link; links are never followed: give the file itself")
    if path.is_dir() or (path.exists() and not path.is_file()):
        raise InputError(f"{option} {path}: is a folder or not a regular file; give a file name")
    if not path.parent.is_dir():
        raise InputError(f"{option} {path}: folder {path.parent} does not exist")
    if not os.access(path.parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise InputError(f"{option} {path}: not writable")
    if path.exists() and not _is_graph(path):
        raise InputError(f"{option} {path}: exists and is not a graph trainyard wrote; nothing was overwritten")


def _is_graph(path: Path) -> bool:
    with path.open("rb") as handle:
        head = handle.read(32)
    return head.startswith((b"digraph trainyard {", b"flowchart LR"))


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
    # A plan makes and keeps hundreds of thousands of objects until it exits seconds later: at the default thresholds
    # the cyclic collector walked them all 8 times in `plan --stack prod --rehearse` (1.6 of 5.5 CPU-s); collecting
    # once per 200k new objects costs 0.2 CPU-s and 8 MB more at most.
    gc.set_threshold(200_000, 30, 30)
    sys.exit(main())
