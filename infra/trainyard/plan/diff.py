"""What a change does to each stack: resources added/changed/removed, capacity and cost deltas, and the CRDs of a
chart's crds/ that the change alters but `pulumi up` does not apply (`crd_upgrades`).

The comparison (`diff_stack`) is a pure function over two renders; `render_at` produces a render of any git ref
by running that ref's own code in a subprocess, so a diff never mixes base and head code.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from trainyard.config.yaml_input import InputError
from trainyard.plan.capacity import HOURS_PER_MONTH, PoolCapacity
from trainyard.plan.crd_upgrades import CrdNotApplied, not_applied
from trainyard.plan.recording import ResourceRecord
from trainyard.plan.rendering import chart_trees

Format = Literal["markdown", "text"]
# Options that change what the engine does with a resource, compared alongside its inputs.
_OPTIONS = ("parent", "provider", "depends_on", "protect", "retain_on_delete", "deleted_with", "replace_on_changes",
            "delete_before_replace")


@dataclass(frozen=True)
class StackRender:
    """One stack rendered at one revision: its resources and its pools (empty when the stack does not exist)."""

    resources: tuple[ResourceRecord, ...] = ()
    pools: tuple[PoolCapacity, ...] = ()
    exists: bool = True


@dataclass(frozen=True)
class PoolDelta:
    name: str
    nodes: int
    gpus: int
    slices: int
    hourly_usd: float
    upfront_usd: float = 0.0


@dataclass(frozen=True)
class StackDiff:
    stack: str
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    changed: dict[str, tuple[str, ...]] = field(default_factory=dict)  # URN -> changed paths
    pools: tuple[PoolDelta, ...] = ()
    crds: tuple[CrdNotApplied, ...] = ()  # CRDs the change alters that Helm's upgrade leaves as they are

    @property
    def hourly_usd(self) -> float:
        return sum(p.hourly_usd for p in self.pools)

    @property
    def monthly_usd(self) -> float:
        return self.hourly_usd * HOURS_PER_MONTH

    @property
    def upfront_usd(self) -> float:
        return sum(p.upfront_usd for p in self.pools)

    @property
    def empty(self) -> bool:
        return not (self.added or self.removed or self.changed or self.pools or self.crds)


def changed_paths(before: Any, after: Any, prefix: str = "") -> list[str]:
    """Dotted paths (list items as `[i]`) where two JSON values differ, as deep as both sides are containers."""
    if isinstance(before, dict) and isinstance(after, dict):
        paths: list[str] = []
        for key in sorted(set(before) | set(after), key=str):
            child = f"{prefix}.{key}" if prefix else str(key)
            if key not in before or key not in after:
                paths.append(child)
            else:
                paths += changed_paths(before[key], after[key], child)
        return paths
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        return [p for i, (b, a) in enumerate(zip(before, after, strict=True))
                for p in changed_paths(b, a, f"{prefix}[{i}]")]
    return [] if before == after else [prefix or "(value)"]


def record_changes(before: ResourceRecord, after: ResourceRecord) -> tuple[str, ...]:
    paths = changed_paths(before.inputs, after.inputs)
    paths += [f"options.{name}" for name in _OPTIONS if getattr(before, name) != getattr(after, name)]
    return tuple(paths)


def pool_deltas(base: Sequence[PoolCapacity], head: Sequence[PoolCapacity]) -> tuple[PoolDelta, ...]:
    """Per pool (by name), head minus base at desired size; pools that did not move are left out."""
    before = {p.name: p for p in base}
    after = {p.name: p for p in head}
    deltas = []
    for name in [*after, *(n for n in before if n not in after)]:
        b, a = before.get(name), after.get(name)
        delta = PoolDelta(
            name=name,
            nodes=(a.desired_nodes if a else 0) - (b.desired_nodes if b else 0),
            gpus=(a.gpus if a else 0) - (b.gpus if b else 0),
            slices=(a.slices if a else 0) - (b.slices if b else 0),
            hourly_usd=round((a.hourly_usd if a else 0.0) - (b.hourly_usd if b else 0.0), 4),
            upfront_usd=round((a.upfront_usd if a else 0.0) - (b.upfront_usd if b else 0.0), 2),
        )
        if (delta.nodes, delta.gpus, delta.slices, delta.hourly_usd, delta.upfront_usd) != (0, 0, 0, 0.0, 0.0):
            deltas.append(delta)
    return tuple(deltas)


def diff_stack(stack: str, base: StackRender, head: StackRender, crds: Sequence[CrdNotApplied] = ()) -> StackDiff:
    before = {r.urn: r for r in base.resources}
    after = {r.urn: r for r in head.resources}
    changed = {urn: paths for urn in sorted(set(before) & set(after))
               if (paths := record_changes(before[urn], after[urn]))}
    return StackDiff(
        stack=stack,
        added=tuple(sorted(set(after) - set(before))),
        removed=tuple(sorted(set(before) - set(after))),
        changed=changed,
        pools=pool_deltas(base.pools, head.pools),
        crds=tuple(crds),
    )


# ---- formatting -------------------------------------------------------------------------------------------------

def _short(urn: str) -> str:
    """`type::name`, the part of a URN a reviewer reads (the stack and project are the same on every line)."""
    parts = urn.split("::")
    return f"{parts[-2].rsplit('$', 1)[-1]}::{parts[-1]}" if len(parts) >= 2 else urn


def _signed(value: float, money: bool = False) -> str:
    return f"{value:+,.2f}" if money else f"{value:+d}"


def format_diff(diffs: Sequence[StackDiff], fmt: Format = "markdown", base_ref: str = "") -> str:
    markdown = fmt == "markdown"
    lines = [f"## trainyard plan diff against `{base_ref}`" if markdown else f"trainyard plan diff against {base_ref}"]
    for d in diffs:
        lines += ["", f"### {d.stack}" if markdown else f"== {d.stack} =="]
        if d.empty:
            lines.append("No changes.")
            continue
        lines.append(f"{len(d.added)} to add, {len(d.changed)} to change, {len(d.removed)} to remove; "
                     f"cost {_signed(d.hourly_usd, True)} $/h ({_signed(d.monthly_usd, True)} $/month)"
                     + (f", {_signed(d.upfront_usd, True)} $ up front (Capacity Blocks, paid at purchase)"
                        if d.upfront_usd else ""))
        lines += _resource_lines(d, markdown)
        if d.pools:
            lines += _pool_lines(d, markdown)
        if d.crds:
            lines += ["", "CRDs `pulumi up` will not apply (Helm installs a chart's crds/ on a release's first install "
                      "only): apply each before `pulumi up`:", *(f"{'-' if markdown else ' '} {c}" for c in d.crds)]
    return "\n".join(lines) + "\n"


def _resource_lines(d: StackDiff, markdown: bool) -> list[str]:
    rows = [("+", urn, "") for urn in d.added] + [("~", urn, ", ".join(paths)) for urn, paths in d.changed.items()]
    rows += [("-", urn, "") for urn in d.removed]
    if not rows:
        return []
    if not markdown:
        return [f"  {op} {_short(urn)}" + (f"  [{detail}]" if detail else "") for op, urn, detail in rows]
    body = [f"| `{op}` | `{_short(urn)}` | {detail.replace('|', '&#124;')} |" for op, urn, detail in rows]
    return ["", "<details><summary>Resources</summary>", "", "| | resource | changed inputs |", "|---|---|---|",
            *body, "", "</details>"]


def _pool_lines(d: StackDiff, markdown: bool) -> list[str]:
    cells = [(p.name, _signed(p.nodes), _signed(p.gpus), _signed(p.slices), _signed(p.hourly_usd, True),
              _signed(p.hourly_usd * HOURS_PER_MONTH, True), _signed(p.upfront_usd, True)) for p in d.pools]
    header = ("pool", "nodes", "GPUs", "MIG slices", "$/h", "$/month", "up-front $")
    if markdown:
        return ["", "| " + " | ".join(header) + " |", "|---|--:|--:|--:|--:|--:|--:|",
                *("| " + " | ".join(c) + " |" for c in cells)]
    return ["  " + "".join(f"{h:>12}" for h in header), *("  " + "".join(f"{c:>12}" for c in row) for row in cells)]


# ---- rendering a revision ---------------------------------------------------------------------------------------

# Runs inside the revision's own tree; prints {stack: {...}} as JSON. It uses only the plan API, so a base that
# predates capacity estimates still diffs its resources.
_BAD_INPUT = 3  # the render script's exit status for a stack it refuses (message on stderr)
_RENDER_SCRIPT = """
import contextlib, dataclasses, io, json, sys
import trainyard
from pathlib import Path
root = Path(sys.argv[1]).resolve()
if not Path(trainyard.__file__).resolve().is_relative_to(root):
    sys.exit(f"imported trainyard from {trainyard.__file__}, not from {root}")
from trainyard.plan.runtime import available_stacks, read_stack, render, settings_of
result = {}
for name in sys.argv[2:]:
    if name not in available_stacks():
        result[name] = None
        continue
    try:
        stack = read_stack(name)
        with contextlib.redirect_stdout(io.StringIO()):
            recording = render(stack)
    except Exception as exc:
        # Bad config at this revision is the user's to fix: its message, not a traceback (see _BAD_INPUT).
        if type(exc).__name__ not in ("ConfigError", "InputError"):
            raise
        print(f"stack {name}: {exc}", file=sys.stderr)
        sys.exit(3)
    try:
        from trainyard.config.mig import load_mig_catalog
        from trainyard.plan.capacity import pool_capacity
        pools = [dataclasses.asdict(p) for p in pool_capacity(settings_of(stack), load_mig_catalog())]
    except ImportError:
        pools = []
    result[name] = {"resources": [r.as_json() for r in recording.resources], "pools": pools}
print(json.dumps(result))
"""


def _record(data: dict[str, Any]) -> ResourceRecord:
    return ResourceRecord(urn=data["urn"], type=data["type"], name=data["name"], custom=bool(data.get("custom", True)),
                          parent=data.get("parent"), provider=data.get("provider"),
                          depends_on=tuple(data.get("depends_on", ())), protect=bool(data.get("protect")),
                          retain_on_delete=bool(data.get("retain_on_delete")), deleted_with=data.get("deleted_with"),
                          inputs=data.get("inputs", {}),
                          replace_on_changes=tuple(data.get("replace_on_changes", ())),
                          delete_before_replace=bool(data.get("delete_before_replace")),
                          custom_timeouts=dict(data.get("custom_timeouts", {})))


def parse_renders(payload: str) -> dict[str, StackRender]:
    renders: dict[str, StackRender] = {}
    for name, data in json.loads(payload).items():
        if data is None:
            renders[name] = StackRender(exists=False)
            continue
        resources = tuple(_record(r) for r in data["resources"])
        renders[name] = StackRender(resources=resources, pools=tuple(PoolCapacity(**p) for p in data["pools"]))
    return renders


def render_tree(root: Path, stacks: Sequence[str], revision: str | None = None) -> dict[str, StackRender]:
    """Render `stacks` with the code in `root` (a checkout: root/infra/trainyard), in a fresh interpreter.

    `revision`: the git ref `root` was checked out from. Its code is the user's choice of base, so any failure to
    render there (a revision older than the plan API, its own bug) is one message naming it, not a traceback.
    """
    env = {**os.environ, "PYTHONPATH": str(root / "infra")}
    done = subprocess.run([sys.executable, "-c", _RENDER_SCRIPT, str(root), *stacks], cwd=root, env=env,
                          capture_output=True, text=True, check=False)
    where = f"--base {revision}" if revision is not None else f"rendering at {root}"
    if done.returncode == _BAD_INPUT:
        raise InputError(f"{where}: {done.stderr.strip()}")
    try:
        if done.returncode != 0:
            raise RuntimeError(f"rendering {', '.join(stacks)} in {root} failed:\n{done.stderr[-4000:]}")
        return parse_renders(done.stdout.strip().splitlines()[-1])
    except (RuntimeError, ValueError, KeyError, TypeError, IndexError) as error:
        if revision is None:
            raise
        last = (done.stderr.strip().splitlines() or [str(error)])[-1]
        raise InputError(f"{where}: `trainyard diff` cannot render this revision ({last}); it predates the plan "
                         "API or fails on its own: compare against a later commit") from None


def resolve_ref(repo: Path, ref: str) -> str:
    """`ref` when git knows it as a commit, else InputError (checked before anything is rendered)."""
    if ref.startswith("-") or _git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}").returncode != 0:
        raise InputError(f"--base {ref!r}: not a commit, branch or tag in {repo} (try `git fetch`, or HEAD)")
    return ref


def default_base(repo: Path) -> str:
    has_origin = _git(repo, "rev-parse", "--verify", "--quiet", "origin/main").returncode == 0
    return "origin/main" if has_origin else "HEAD"


@contextmanager
def checkout(repo: Path, ref: str) -> Iterator[Path]:
    """`ref`'s files in a temporary directory (git archive: no worktree bookkeeping left behind in the repo)."""
    with tempfile.TemporaryDirectory(prefix="trainyard-base-") as tmp:
        archive = _git(repo, "archive", "--format=tar", ref)
        if archive.returncode != 0:
            raise InputError(f"--base {ref}: git archive failed: {archive.stderr.decode(errors='replace').strip()}")
        # Python's tarfile with the data filter: no member may land outside `tmp` (absolute names, `..`, links
        # pointing out), whatever the revision holds.
        try:
            with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
                tar.extractall(tmp, filter="data")
        except tarfile.TarError as error:
            raise InputError(f"--base {ref}: its files cannot be unpacked safely ({error})") from None
        yield Path(tmp)


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    try:
        return subprocess.run(["git", *args], cwd=repo, capture_output=True, check=False)
    except OSError as error:
        raise InputError(f"`trainyard diff` needs git: {error.strerror or error}") from None


def diff_against(repo: Path, ref: str, stacks: Sequence[str]) -> list[StackDiff]:
    head = render_tree(repo, stacks)
    with checkout(repo, ref) as base_root:
        base = render_tree(base_root, stacks, revision=ref)
        crds = {s: [replace(c, source=c.source.relative_to(repo)) if c.source.is_relative_to(repo) else c
                    for c in not_applied(base_root / "plans" / s, repo / "plans" / s, chart_trees(head[s].resources))]
                for s in stacks}
    return [diff_stack(s, base.get(s, StackRender(exists=False)), head[s], crds[s]) for s in stacks]
