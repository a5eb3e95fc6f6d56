"""The resource dependency graph of a recording, as Mermaid and Graphviz DOT.

Edges are `depends_on` (solid) and parent -> child (dotted); nodes are grouped into one cluster per layer.
A production stack has hundreds of resources, which no reader follows as a picture, so above `FULL_GRAPH_LIMIT`
every resource is folded into its nearest component (and component-less resources stay): the picture then shows
how components depend on each other, which is what a review of the wiring needs.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from trainyard.plan.recording import Recording, ResourceRecord
from trainyard.plan.report import LAYERS, layer_of

FULL_GRAPH_LIMIT = 80


@dataclass(frozen=True)
class Graph:
    nodes: dict[str, tuple[str, str]]  # URN -> (label, layer)
    depends: frozenset[tuple[str, str]]  # (dependent, dependency)
    contains: frozenset[tuple[str, str]]  # (parent, child)
    collapsed: bool


def build(recording: Recording, limit: int = FULL_GRAPH_LIMIT) -> Graph:
    by_urn = recording.by_urn()
    collapsed = len(by_urn) > limit
    shown = {urn for urn, r in by_urn.items() if not collapsed or not r.custom or r.parent not in by_urn}

    def shown_as(urn: str) -> str | None:
        current: str | None = urn
        while current is not None and current not in shown:
            record = by_urn.get(current)
            current = record.parent if record else None
        return current

    depends: set[tuple[str, str]] = set()
    contains: set[tuple[str, str]] = set()
    for record in by_urn.values():
        source = shown_as(record.urn)
        for dependency in record.depends_on:
            target = shown_as(dependency)
            # Inside one folded component, or a dependency on one's own ancestor, says nothing about wiring.
            if source and target and source != target and not _is_ancestor(target, source, by_urn):
                depends.add((source, target))
        if record.urn in shown and record.parent in shown:
            contains.add((record.parent, record.urn))
    nodes = {urn: (_label(by_urn[urn]), layer_of(by_urn[urn], by_urn)) for urn in shown}
    return Graph(nodes=nodes, depends=frozenset(depends), contains=frozenset(contains), collapsed=collapsed)


def _is_ancestor(candidate: str, urn: str, by_urn: dict[str, ResourceRecord]) -> bool:
    parent = by_urn[urn].parent if urn in by_urn else None
    while parent is not None:
        if parent == candidate:
            return True
        parent = by_urn[parent].parent if parent in by_urn else None
    return False


def _label(record: ResourceRecord) -> str:
    kind = record.type.rsplit(":", 1)[-1]
    return f"{kind}\\n{record.name}"


def _ids(graph: Graph) -> dict[str, str]:
    return {urn: f"n{i}" for i, urn in enumerate(sorted(graph.nodes))}


def _by_layer(graph: Graph) -> dict[str, list[str]]:
    layers: dict[str, list[str]] = defaultdict(list)
    for urn in sorted(graph.nodes):
        layers[graph.nodes[urn][1]].append(urn)
    return layers


def _layer_order(layers: dict[str, list[str]]) -> list[str]:
    return [layer for layer in (*LAYERS, "other") if layer in layers]


def to_mermaid(graph: Graph) -> str:
    ids = _ids(graph)
    layers = _by_layer(graph)
    lines = ["flowchart LR"]
    for layer in _layer_order(layers):
        lines.append(f"  subgraph {layer}")
        lines += [f'    {ids[urn]}["{graph.nodes[urn][0].replace(chr(92) + "n", "<br/>")}"]' for urn in layers[layer]]
        lines.append("  end")
    lines += [f"  {ids[a]} --> {ids[b]}" for a, b in sorted(graph.depends)]
    lines += [f"  {ids[a]} -.- {ids[b]}" for a, b in sorted(graph.contains)]
    return "\n".join(lines) + "\n"


def to_dot(graph: Graph) -> str:
    ids = _ids(graph)
    layers = _by_layer(graph)
    lines = ["digraph trainyard {", "  rankdir=LR;", '  node [shape=box, fontname="Helvetica", fontsize=10];']
    for layer in _layer_order(layers):
        lines += [f"  subgraph cluster_{layer} {{", f'    label="{layer}";']
        lines += [f'    {ids[urn]} [label="{graph.nodes[urn][0]}"];' for urn in layers[layer]]
        lines.append("  }")
    lines += [f"  {ids[a]} -> {ids[b]};" for a, b in sorted(graph.depends)]
    lines += [f"  {ids[a]} -> {ids[b]} [style=dotted, arrowhead=none];" for a, b in sorted(graph.contains)]
    lines.append("}")
    return "\n".join(lines) + "\n"
