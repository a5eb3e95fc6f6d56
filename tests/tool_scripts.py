"""tools/*.py scripts as modules, for tests that call their functions (tools/ holds scripts, not a package)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

TOOLS = Path(__file__).resolve().parents[1] / "tools"


def load_tool(name: str) -> ModuleType:
    """tools/<name>.py, loaded once per session (registered in sys.modules, which its dataclasses need)."""
    module_name = f"trainyard_tool_{name}"
    if (loaded := sys.modules.get(module_name)) is not None:
        return loaded
    spec = importlib.util.spec_from_file_location(module_name, TOOLS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module
