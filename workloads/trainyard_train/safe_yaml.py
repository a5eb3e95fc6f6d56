"""YAML for trainer configs: what YAML accepts, bounded in size.

Two gaps in PyYAML's SafeLoader (6.0.4) matter for a config file a person writes or a pipeline generates:

- Tabs. YAML 1.2 allows a tab wherever it separates tokens inside a line (``s-separate-in-line`` is spaces or
  tabs; spec 1.2.2 section 6.2) and before a comment, and forbids it only as indentation. PyYAML's scanner skips
  spaces alone (``scan_to_next_token``), so ``lr: 0.1<TAB># note`` fails to parse. The loader here also skips a
  tab that is separation: one with content before it on its line, or one in a run that ends in a comment or the
  line's end. A tab used as indentation is still refused, as YAML requires.
- Aliases. ``&a [x, x, ...]`` then ``&b [*a, *a, ...]`` nine levels deep is a few hundred bytes that expand to
  billions of values (the "billion laughs"); PyYAML builds it with shared references, and the first walk that
  copies it (overrides, dataclass conversion) runs out of memory. ``plain`` copies under a budget of values.
"""

from __future__ import annotations

from typing import Any

import yaml

MAX_VALUES = 100_000
"""Values (scalars, lists, mappings) a config may expand to; a real one has a few hundred."""
_LINE_BREAKS = "\0\r\n\x85\u2028\u2029"


class InvalidYamlError(ValueError):
    """Not YAML, or a document too large once its aliases are expanded."""


class _Loader(yaml.SafeLoader):
    def scan_to_next_token(self) -> None:
        while True:
            super().scan_to_next_token()
            if self.peek() != "\t" or not self._tab_separates():
                return
            while self.peek() in " \t":
                self.forward()

    def _tab_separates(self) -> bool:
        start = self.pointer
        line_start = max(self.buffer.rfind(ch, 0, start) for ch in _LINE_BREAKS) + 1
        if self.buffer[line_start:start].strip(" \t"):
            return True  # content before it on this line
        ahead = 0
        while self.peek(ahead) in " \t":
            ahead += 1
        return self.peek(ahead) == "#" or self.peek(ahead) in _LINE_BREAKS


def load(text: str) -> Any:
    try:
        return plain(yaml.load(text, Loader=_Loader))  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise InvalidYamlError(" ".join(str(exc).split())) from exc


def plain(value: Any, budget: list[int] | None = None) -> Any:
    """A deep copy with tuples as lists; refuses more than MAX_VALUES values (aliases expanded)."""
    budget = [MAX_VALUES] if budget is None else budget
    budget[0] -= 1
    if budget[0] < 0:
        raise InvalidYamlError(f"expands to more than {MAX_VALUES} values (YAML aliases repeated?)")
    if isinstance(value, dict):
        return {k: plain(v, budget) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v, budget) for v in value]
    return value
