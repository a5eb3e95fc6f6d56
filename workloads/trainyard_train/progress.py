"""A JSON-lines progress file (rank 0): one object per event, appended at once, so a killed run still
leaves an exact record of which steps completed and which checkpoints committed."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


class ProgressLog:
    """Opens the file per event: events are at most one per step, and nothing is lost on SIGKILL."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.listeners: list[Callable[[dict[str, Any]], None]] = []
        """Called with each event written (tracking.Tracker.record): they must not block."""
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, event: str, **fields: Any) -> None:
        record = {"event": event, "time": time.time(), **fields}
        if self.path is not None:
            with open(self.path, "a") as handle:
                handle.write(json.dumps(record) + "\n")
        for listener in self.listeners:
            listener(record)


def read_progress(path: Path) -> list[dict[str, Any]]:
    events = []
    for line in path.read_text().splitlines():
        if line.strip():
            events.append(json.loads(line))
    return events
