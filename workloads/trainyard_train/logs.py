"""Rank-prefixed, key=value logging: rank 0 logs INFO, the other ranks only WARNING and above."""

from __future__ import annotations

import logging
import sys
from typing import Any

LOGGER_NAME = "trainyard_train"


def setup_logging(rank: int, world_size: int) -> logging.Logger:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter(f"%(asctime)s [rank {rank}/{world_size}] %(levelname)s %(message)s", "%H:%M:%S")
    )
    logger = logging.getLogger(LOGGER_NAME)
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    return logger


def kv(event: str, **fields: Any) -> str:
    """``event k=v k=v``: greppable by humans, parseable by log pipelines."""
    parts = [event]
    for key, value in fields.items():
        parts.append(f"{key}={value:.4g}" if isinstance(value, float) else f"{key}={value}")
    return " ".join(parts)
