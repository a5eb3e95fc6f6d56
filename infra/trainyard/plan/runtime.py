"""Run the real program under Pulumi's mock runtime with a stack's config, as `pulumi up` would run it."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi
from pulumi.runtime import settings as runtime_settings

from trainyard import program
from trainyard.config.load import decode_value, parse_settings
from trainyard.config.model import Settings
from trainyard.config.yaml_input import InputError, load_yaml
from trainyard.paths import REPO_ROOT, STACKS_DIR
from trainyard.plan.placeholders import PlaceholderMocks
from trainyard.plan.recording import SECRET, Recording, RecordingMonitor
from trainyard.plan.rendering import RenderedStack, render_releases

PROJECT = "trainyard"
DEFAULT_REGION = "us-east-1"
# Pulumi stack names: 1-100 letters, digits, `-`, `_` and `.` (the CLI's "stack names are limited to 100 characters
# and may only contain alphanumeric, hyphens, underscores, or periods"; pulumi/pulumi#1381). Starting with a letter or
# digit as well, so a name never reads as an option or a hidden file, and never holds a path separator.
_STACK_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")


@dataclass(frozen=True)
class StackFile:
    """A `stacks/Pulumi.<stack>.yaml` as the CLI would hand it to the program."""

    stack: str
    values: dict[str, str]  # "project:key" -> value as the engine passes it (objects as JSON text)
    secret_keys: tuple[str, ...]

    @property
    def region(self) -> str:
        aws = self.values.get(f"{PROJECT}:aws")
        return str(json.loads(aws).get("region", DEFAULT_REGION)) if aws else DEFAULT_REGION


def available_stacks(stacks_dir: Path = STACKS_DIR) -> list[str]:
    return sorted(p.name.removeprefix("Pulumi.").removesuffix(".yaml") for p in stacks_dir.glob("Pulumi.*.yaml"))


def read_stack(stack: str, stacks_dir: Path = STACKS_DIR) -> StackFile:
    """The stack's config as the CLI hands it to the program, or InputError naming the file, line and problem."""
    available = available_stacks(stacks_dir)
    if not _STACK_NAME.fullmatch(stack) or stack not in available:
        raise InputError(f"unknown stack {stack!r}; stacks in {stacks_dir}: {', '.join(available) or 'none'}")
    path = stacks_dir / f"Pulumi.{stack}.yaml"
    shown = _shown(path)
    document = load_yaml(path, shown)
    if document is None:
        document = {}
    if not isinstance(document, dict):
        raise InputError(f"{shown}: expected a map with a 'config:' key, got a {_kind(document)}")
    config = document.get("config") or {}
    if not isinstance(config, dict):
        raise InputError(f"{shown}: 'config:' must be a map of 'project:key: value', got a {_kind(config)}")
    declared_secret = _secret_keys()
    values: dict[str, str] = {}
    secrets: list[str] = []
    for key, value in config.items():
        full = key if ":" in key else f"{PROJECT}:{key}"
        if isinstance(value, dict) and set(value) == {"secure"}:
            # Ciphertext only the stack's secrets provider can open: the plan shows that it is set, never what.
            values[full] = SECRET
            secrets.append(full)
            continue
        if full in declared_secret:
            # As the Pulumi CLI refuses it: a key declared secret in Pulumi.yaml never sits in a file in clear.
            raise InputError(f"{shown}: {full} is declared `secret: true` in Pulumi.yaml and must be encrypted: "
                             f"set it with `pulumi config set --secret {full.split(':', 1)[1]}`")
        try:
            values[full] = value if isinstance(value, str) else json.dumps(value)
        except TypeError:
            raise InputError(f"{shown}: {full} holds a YAML date or binary value somewhere; quote it as a string") \
                from None
    return StackFile(stack=stack, values=values, secret_keys=tuple(secrets))


def _shown(path: Path) -> str:
    return str(path.relative_to(REPO_ROOT)) if path.resolve().is_relative_to(REPO_ROOT) else str(path)


def _kind(value: object) -> str:
    return "string" if isinstance(value, str) else type(value).__name__


def _secret_keys() -> frozenset[str]:
    """`project:key` of every key Pulumi.yaml declares `secret: true`."""
    project = load_yaml(REPO_ROOT / "Pulumi.yaml", "Pulumi.yaml") or {}
    declared = project.get("config") or {}
    return frozenset(f"{PROJECT}:{key}" for key, spec in declared.items()
                     if isinstance(spec, dict) and spec.get("secret") is True)


def settings_of(stack: StackFile) -> Settings:
    """The stack's Settings, validated exactly as the program validates them."""
    prefix = f"{PROJECT}:"
    raw = {k[len(prefix):]: decode_value(v) for k, v in stack.values.items() if k.startswith(prefix)}
    return parse_settings(PROJECT, stack.stack, raw, aws_region=stack.values.get("aws:region"),
                          other_keys=[k for k in stack.values if not k.startswith(prefix)])


def render(stack: StackFile, entrypoint: Callable[[], Any] = program.main,
           recording: Recording | None = None) -> Recording:
    """Run `entrypoint` (by default exactly what infra/__main__.py runs) and record every registration.

    Pass `recording` to watch it fill while the program runs (the CLI's progress line does).
    """
    # A fresh root stack per run: the runtime keeps it in a context variable between runs in one process.
    runtime_settings.ROOT.set(None)
    pulumi.runtime.set_all_config(stack.values, list(stack.secret_keys))
    mocks = PlaceholderMocks(region=stack.region)
    monitor = RecordingMonitor(mocks, recording)
    pulumi.runtime.set_mocks(mocks, project=PROJECT, stack=stack.stack, preview=False, monitor=monitor)
    run = pulumi.runtime.test(lambda: _run_and_collect_exports(entrypoint, monitor.recording))  # type: ignore[no-untyped-call]
    run()
    return monitor.recording


@dataclass(frozen=True)
class StackPlan:
    """One stack as `plan` sees it: its settings, every registration, and what each Helm release renders."""

    stack: StackFile
    settings: Settings
    recording: Recording
    rendered: RenderedStack


def plan_stack(stack: StackFile, recording: Recording | None = None) -> StackPlan:
    """Run the program and render its Helm releases with the real Helm (RenderError when a chart refuses).

    The one way code and tests get a stack's rendered objects: `plan_stack(read_stack("prod")).rendered`.
    """
    settings = settings_of(stack)
    recording = render(stack, recording=recording)
    return StackPlan(stack, settings, recording, render_releases(recording, settings.cluster.kubernetes_version))


def _run_and_collect_exports(entrypoint: Callable[[], Any], recording: Recording) -> pulumi.Output[None]:
    """Run the program, then resolve its stack exports (the mock engine never registers them)."""
    entrypoint()
    root = runtime_settings.get_root_resource()
    exports: dict[str, Any] = dict(getattr(root, "outputs", {}))

    async def collect() -> None:
        for key, value in sorted(exports.items()):
            output = pulumi.Output.from_input(value)
            resolved = await output.future()
            recording.outputs[key] = SECRET if await output.is_secret() else resolved

    return pulumi.Output.from_input(asyncio.ensure_future(collect()))
