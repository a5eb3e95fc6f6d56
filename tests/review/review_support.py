"""Shared by the review tests: each stack rendered once per session, and the policy pack on the import path."""

from __future__ import annotations

import sys
from functools import cache
from pathlib import Path

from trainyard.plan.recording import Recording
from trainyard.plan.runtime import available_stacks, read_stack, render

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "policy"))

STACKS = available_stacks()


@cache
def rendered(stack: str) -> Recording:
    return render(read_stack(stack))
