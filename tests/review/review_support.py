"""Shared by the review tests: each stack rendered once per session, and the policy pack on the import path."""

from __future__ import annotations

import sys
from pathlib import Path

from owned_stacks import Stack, recording
from trainyard.plan.recording import Recording
from trainyard.plan.runtime import STACKS_DIR, available_stacks

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "policy"))

STACKS = available_stacks()


def rendered(stack: str) -> Recording:
    return recording((stack, STACKS_DIR))


def rendered_stack(stack: Stack) -> Recording:
    """An owned stack or one of stacks/ (the suite's one render of it: owned_stacks.recording)."""
    return recording(stack)
