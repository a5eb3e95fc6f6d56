"""Read a YAML file a person wrote, bounded: one clear message for anything but a small, plain document.

PyYAML's safe loader already refuses `!!python/` tags, but it expands aliases without limit (a "billion laughs"
file holds a few hundred bytes), keeps the last of two equal keys, takes any scalar as a key and recurses as deep
as the file nests. Stack files need none of that, so the reader refuses it, naming the file and line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from trainyard.escape import escaped

# A stack file is a few KiB (prod: under 5); these bounds are 50 times that and keep a hostile one cheap to refuse:
# bench/config_input.py prints the times.
MAX_BYTES = 256 * 1024
MAX_NODES = 20_000
MAX_DEPTH = 64

_Loader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_STR_TAG = "tag:yaml.org,2002:str"
_MERGE_TAG = "tag:yaml.org,2002:merge"


class InputError(ValueError):
    """A file or command-line value the program refuses; the message says where and what, for one line of output
    (non-ASCII and control characters shown escaped)."""

    def __init__(self, message: str) -> None:
        super().__init__(escaped(message))


def load_yaml(path: Path, shown: str | None = None) -> Any:
    """The document in `path` as plain data (None when empty), or InputError naming `shown` (default: path)."""
    where = shown or str(path)
    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            raise InputError(f"{where}: {size} bytes; a stack file may hold at most {MAX_BYTES} bytes")
        data = path.read_bytes()[:MAX_BYTES + 1]
    except OSError as exc:
        raise InputError(f"{where}: cannot be read ({exc.strerror or exc})") from None
    if len(data) > MAX_BYTES:
        raise InputError(f"{where}: more than {MAX_BYTES} bytes; a stack file may hold at most that")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise InputError(f"{where}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})") \
            from None
    loader = _Loader(text)
    try:
        # Parser events first: a cheap pass that stops at the first alias or bound, before any node is built.
        _scan(text, where)
        node = loader.get_single_node()
        if node is None:
            return None
        _check_tree(node, where)
        return loader.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        at = f"{where}:{mark.line + 1}:{mark.column + 1}" if mark is not None else where
        raise InputError(f"{at}: invalid YAML: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise InputError(f"{where}: invalid YAML: {exc}") from None
    finally:
        loader.dispose()


def _scan(text: str, where: str) -> None:
    depth = 0
    for count, event in enumerate(yaml.parse(text, Loader=_Loader), start=1):
        at = f"{where}:{event.start_mark.line + 1}" if event.start_mark is not None else where
        if isinstance(event, yaml.AliasEvent):
            raise InputError(f"{at}: YAML alias *{event.anchor}; a stack file may not use aliases: write the value out")
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                raise InputError(f"{at}: nested more than {MAX_DEPTH} levels deep")
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
        if count > 2 * MAX_NODES:
            raise InputError(f"{at}: more than {MAX_NODES} YAML values; a stack file is far smaller")


def _check_tree(root: yaml.Node, where: str) -> None:
    """Refuse aliases, deep nesting, too many nodes, non-string and duplicate keys; iterative, so never recursive."""
    seen: set[int] = set()
    stack: list[tuple[yaml.Node, int]] = [(root, 1)]
    while stack:
        node, depth = stack.pop()
        at = f"{where}:{node.start_mark.line + 1}"
        if id(node) in seen:
            # The composer hands an alias back as the anchored node itself: a second visit is an alias.
            raise InputError(f"{at}: this value is reused through a YAML alias (*name); a stack file may not use "
                             "aliases: write the value out")
        seen.add(id(node))
        if len(seen) > MAX_NODES:
            raise InputError(f"{at}: more than {MAX_NODES} YAML values; a stack file is far smaller")
        if depth > MAX_DEPTH:
            raise InputError(f"{at}: nested more than {MAX_DEPTH} levels deep")
        if isinstance(node, yaml.MappingNode):
            keys: set[str] = set()
            for key, value in node.value:
                key_at = f"{where}:{key.start_mark.line + 1}"
                if key.tag == _MERGE_TAG:
                    raise InputError(f"{key_at}: merge keys (<<) need a YAML alias, which a stack file may not use")
                if not (isinstance(key, yaml.ScalarNode) and key.tag == _STR_TAG):
                    shown = key.value if isinstance(key, yaml.ScalarNode) else type(key).__name__
                    raise InputError(f"{key_at}: key {shown!r} is not a string; quote it")
                if key.value in keys:
                    raise InputError(f"{key_at}: key {key.value!r} appears twice in the same map")
                keys.add(key.value)
                stack += [(key, depth + 1), (value, depth + 1)]
        elif isinstance(node, yaml.SequenceNode):
            stack += [(item, depth + 1) for item in node.value]
