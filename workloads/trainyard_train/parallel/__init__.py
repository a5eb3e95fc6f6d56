"""Layouts: tensor, pipeline and (fully sharded or replicated) data parallelism, composed as torchtitan does.

The training loop sees one ``ParallelModel`` (engine.py) whatever the layout; layout.py resolves the degrees
and validate.py checks a launch against them before any process group exists.
"""

from .engine import ParallelModel

__all__ = ["ParallelModel"]
