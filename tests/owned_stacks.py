"""The stacks the tests own (tests/fixtures/stacks): fixed expectations are about these, never about stacks/, which
users edit (a test of a sample stack derives what it expects from that stack's data)."""

from __future__ import annotations

import gc
import hashlib
import pickle
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from trainyard.config import Settings
from trainyard.config.load import decode_value
from trainyard.plan.recording import Recording
from trainyard.plan.runtime import (
    STACKS_DIR,
    StackFile,
    StackPlan,
    available_stacks,
    plan_stack,
    read_stack,
    settings_of,
)

OWNED_STACKS = Path(__file__).resolve().parent / "fixtures" / "stacks"

# A stack as (name, folder): an owned stack or one of stacks/.
Stack = tuple[str, Path]
FLEET: Stack = ("fleet", OWNED_STACKS)
LAPTOP: Stack = ("laptop", OWNED_STACKS)


@cache
def stack_file(stack: Stack) -> StackFile:
    return read_stack(*stack)


@cache
def stack_settings(stack: Stack) -> Settings:
    return settings_of(stack_file(stack))


@cache
def planned(stack: Stack) -> StackPlan:
    """The stack as `plan` sees it, planned once per test process for every test file that reads it: edit a copy
    (dataclasses.replace, copy.deepcopy), never the plan itself (the session ends with edited_plans())."""
    plan = plan_stack(stack_file(stack))
    _PLANNED[stack] = _digest(plan)
    # The plan lives as long as the process: out of the collector's way, full collections no longer walk its
    # objects (they were a third of the CPU of files reading plans).
    gc.collect()
    gc.freeze()
    return plan


def edited_plans() -> list[str]:
    """The stacks whose once-per-process plan differs from what planning gave: a test edited it, not a copy."""
    return [stack[0] for stack, digest in _PLANNED.items() if _digest(planned(stack)) != digest]


_PLANNED: dict[Stack, str] = {}


def _digest(plan: StackPlan) -> str:
    return hashlib.sha256(pickle.dumps((plan.recording, plan.rendered), protocol=5)).hexdigest()


def recording(stack: Stack) -> Recording:
    """Every registration of the stack's program (`planned(stack).recording`: the same one, never to be edited)."""
    return planned(stack).recording


def stack_raw(stack: Stack) -> dict[str, Any]:
    """The stack's project values without the `trainyard:` prefix, decoded: a fresh copy for a test to edit."""
    return {k.split(":", 1)[1]: decode_value(v) for k, v in stack_file(stack).values.items()}


def sample_stacks() -> list[Stack]:
    """Every stack in stacks/, as the user has them today."""
    return [(name, STACKS_DIR) for name in available_stacks()]


def stacks_where(has: Callable[[Settings], bool]) -> list[Any]:
    """Test parameters: every owned stack, then every sample stack, whose settings `has` the feature under test.

    At least one owned stack has it, so the test runs whatever users do to stacks/.
    """
    owned = [s for s in (FLEET, LAPTOP) if has(stack_settings(s))]
    assert owned, "no stack in tests/fixtures/stacks has the feature under test: add it to one"
    samples = [s for s in sample_stacks() if has(stack_settings(s))]
    return [pytest.param(stack, id=stack[0]) for stack in [*owned, *samples]]


def fleet_and_samples_where(has: Callable[[Settings], bool]) -> list[Any]:
    """As stacks_where, with the fleet alone of the owned stacks (where the laptop would add a render and no case)."""
    assert has(stack_settings(FLEET)), "the fleet (tests/fixtures/stacks) lacks the feature under test: add it"
    return [pytest.param(stack, id=stack[0]) for stack in [FLEET, *sample_stacks()] if has(stack_settings(stack))]


def every_stack() -> list[Any]:
    """Test parameters: the owned stacks, then every sample stack."""
    return stacks_where(lambda _: True)
