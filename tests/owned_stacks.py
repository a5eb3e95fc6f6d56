"""The stacks the tests own (tests/fixtures/stacks): fixed expectations are about these, never about stacks/, which
users edit (a test of a sample stack derives what it expects from that stack's data)."""

from __future__ import annotations

from pathlib import Path

OWNED_STACKS = Path(__file__).resolve().parent / "fixtures" / "stacks"
