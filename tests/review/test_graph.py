"""The dependency graph: every shown edge is a real dependency, and big stacks fold into components."""

from __future__ import annotations

import pytest
from owned_stacks import FLEET, planned
from review_support import STACKS, rendered
from trainyard.plan import graph
from trainyard.plan.recording import Recording


def _fleet() -> Recording:
    return planned(FLEET).recording


@pytest.mark.parametrize("stack", STACKS)
def test_graph_edges_come_from_the_recording(stack: str) -> None:
    recording = rendered(stack)
    g = graph.build(recording)
    by_urn = recording.by_urn()
    assert g.collapsed == (len(by_urn) > graph.FULL_GRAPH_LIMIT)
    assert set(g.nodes) <= set(by_urn)
    for parent, child in g.contains:
        assert by_urn[child].parent == parent
    # Each dependency edge stands for at least one depends_on between resources folded into its two ends.
    for source, target in g.depends:
        assert source in g.nodes and target in g.nodes
    if not g.collapsed:
        for source, target in g.depends:
            assert target in by_urn[source].depends_on


def test_full_graph_keeps_every_resource_and_dependency() -> None:
    recording = _fleet()
    g = graph.build(recording, limit=10_000)
    by_urn = recording.by_urn()
    assert set(g.nodes) == set(by_urn)
    expected = {(r.urn, d) for r in by_urn.values() for d in r.depends_on if d in by_urn and d != r.parent}
    assert expected - g.depends <= {(r.urn, d) for r in by_urn.values() for d in r.depends_on
                                    if graph._is_ancestor(d, r.urn, by_urn)}


def test_mermaid_and_dot_have_one_cluster_per_layer_and_every_edge() -> None:
    g = graph.build(_fleet())
    layers = {layer for _, layer in g.nodes.values()}
    mermaid, dot = graph.to_mermaid(g), graph.to_dot(g)
    assert mermaid.startswith("flowchart LR")
    assert {f"subgraph {layer}" for layer in layers} <= set(line.strip() for line in mermaid.splitlines())
    assert dot.count("subgraph cluster_") == len(layers)
    assert mermaid.count(" --> ") == len(g.depends) and dot.count(" -> ") == len(g.depends) + len(g.contains)
    assert len(g.nodes) <= graph.FULL_GRAPH_LIMIT
