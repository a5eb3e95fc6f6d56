"""Shared by the review tests: each stack rendered once per session, and the policy pack on the import path."""

from __future__ import annotations

import sys
from functools import cache
from pathlib import Path

from owned_stacks import Stack, stack_file
from trainyard.plan.recording import Recording
from trainyard.plan.runtime import STACKS_DIR, available_stacks, read_stack, render

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "policy"))

STACKS = available_stacks()


@cache
def rendered(stack: str) -> Recording:
    return render(read_stack(stack))


@cache
def rendered_stack(stack: Stack) -> Recording:
    """An owned stack or one of stacks/ (sharing `rendered`'s render of a sample)."""
    name, folder = stack
    return rendered(name) if folder == STACKS_DIR else render(stack_file(stack))
