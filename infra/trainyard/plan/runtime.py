"""Run the real program under Pulumi's mock runtime with a stack's config, as `pulumi up` would run it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi
import yaml
from pulumi.runtime import settings as runtime_settings

from trainyard import program
from trainyard.config.load import decode_value, parse_settings
from trainyard.config.model import Settings
from trainyard.paths import STACKS_DIR
from trainyard.plan.placeholders import PlaceholderMocks
from trainyard.plan.recording import SECRET, Recording, RecordingMonitor

PROJECT = "trainyard"
DEFAULT_REGION = "us-east-1"


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
    path = stacks_dir / f"Pulumi.{stack}.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"no stack file {path}; stacks: {', '.join(available_stacks(stacks_dir))}")
    document = yaml.safe_load(path.read_text()) or {}
    values: dict[str, str] = {}
    secrets: list[str] = []
    for key, value in (document.get("config") or {}).items():
        full = key if ":" in key else f"{PROJECT}:{key}"
        if isinstance(value, dict) and set(value) == {"secure"}:
            # Ciphertext only the stack's secrets provider can open: the plan shows that it is set, never what.
            values[full] = SECRET
            secrets.append(full)
        else:
            values[full] = value if isinstance(value, str) else json.dumps(value)
    return StackFile(stack=stack, values=values, secret_keys=tuple(secrets))


def settings_of(stack: StackFile) -> Settings:
    """The stack's Settings, validated exactly as the program validates them."""
    prefix = f"{PROJECT}:"
    raw = {k[len(prefix):]: decode_value(v) for k, v in stack.values.items() if k.startswith(prefix)}
    return parse_settings(PROJECT, stack.stack, raw)


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
    pulumi.runtime.test(lambda: _run_and_collect_exports(entrypoint, monitor.recording))()
    return monitor.recording


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
