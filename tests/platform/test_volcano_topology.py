"""Volcano's network-topology-aware scheduling: the plugin is on and HyperNodes come from the EKS topology labels.

The label discoverer (volcano pkg/controllers/hypernode/discovery/label/label.go @v1.15.1) reads
`networkTopologyTypes.<type>` top tier first, drops the last entry (kubernetes.io/hostname) and makes the label just
above it tier 1. `_discover` below follows its generateHyperNodeInfo to show which HyperNodes EKS nodes end up in.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import yaml
from owned_stacks import FLEET, planned
from trainyard.config.instance_types import INSTANCE_TYPES
from trainyard.paths import PLATFORM_DIR

VALUES = PLATFORM_DIR / "volcano" / "values.yaml"
# What the AWS cloud controller sets from DescribeInstanceTopology (cloud-provider-aws instances_v2.go), top first.
EKS_LAYERS = [f"topology.k8s.aws/network-node-layer-{i}" for i in (1, 2, 3)]
HOSTNAME = "kubernetes.io/hostname"


def _custom() -> dict[str, Any]:
    custom: dict[str, Any] = yaml.safe_load(VALUES.read_text())["custom"]
    return custom


def _discovery() -> dict[str, Any]:
    override = _custom()["controller_config_override"]
    # templates/controllers.yaml renders it with toYaml: a string would become a YAML scalar, not this mapping.
    assert isinstance(override, dict)
    (label,) = [d for d in override["networkTopologyDiscovery"] if d["source"] == "label"]
    assert label["enabled"] is True
    discovery: dict[str, Any] = label["config"]["networkTopologyTypes"]
    return discovery


def test_the_scheduler_runs_the_network_topology_plugin() -> None:
    conf = yaml.safe_load(_custom()["scheduler_config_override"])
    plugins = {p["name"]: p for tier in conf["tiers"] for p in tier["plugins"]}
    assert "network-topology-aware" in plugins
    arguments = plugins["network-topology-aware"]["arguments"]
    assert arguments["hypernode.binpack.resources"] == "nvidia.com/gpu"
    assert arguments["weight"] > 0


def test_label_discovery_reads_the_eks_layers_top_first_hostname_last() -> None:
    for name, labels in _discovery().items():
        assert len(name) <= 20  # longer type names are skipped by parseCfg
        keys = [entry["nodeLabel"] for entry in labels]
        assert keys == [*EKS_LAYERS, HOSTNAME]


def _discover(nodes: dict[str, dict[str, str]]) -> dict[tuple[str, str], tuple[int, set[str]]]:
    """(label key, value) -> (tier, members): generateHyperNodeInfo's walk over every configured type."""
    found: dict[tuple[str, str], tuple[int, set[str]]] = {}
    members: dict[tuple[str, str], set[str]] = defaultdict(set)
    for labels in _discovery().values():
        bottom_up = [entry["nodeLabel"] for entry in labels][-2::-1]  # hostname dropped, tier 1 first
        for node, node_labels in nodes.items():
            member = node
            for tier, key in enumerate(bottom_up, start=1):
                if key not in node_labels:
                    break  # the walk stops at the first missing label
                hyper = (key, node_labels[key])
                members[hyper].add(member)
                found[hyper] = (tier, members[hyper])
                member = f"{key}={node_labels[key]}"
    return found


def test_eks_nodes_form_a_three_tier_tree_and_unlabelled_nodes_stay_out() -> None:
    def p5(l1: str, l2: str, l3: str) -> dict[str, str]:
        return dict(zip(EKS_LAYERS, (l1, l2, l3), strict=True)) | {HOSTNAME: "x"}

    nodes = {"a": p5("nn-1", "nn-2a", "nn-3a"), "b": p5("nn-1", "nn-2a", "nn-3a"), "c": p5("nn-1", "nn-2b", "nn-3c"),
             "g5": {HOSTNAME: "g5"}}
    tree = _discover(nodes)
    layer = dict(enumerate(EKS_LAYERS, start=1))
    assert tree[(layer[3], "nn-3a")] == (1, {"a", "b"})
    assert tree[(layer[3], "nn-3c")] == (1, {"c"})
    assert tree[(layer[2], "nn-2a")] == (2, {f"{layer[3]}=nn-3a"})
    assert tree[(layer[1], "nn-1")] == (3, {f"{layer[2]}=nn-2a", f"{layer[2]}=nn-2b"})
    # No topology labels (g5, system and storage nodes): in no HyperNode, only in Volcano's virtual cluster top.
    assert not any("g5" in m for _, m in tree.values())


def test_every_catalogued_type_has_the_layers_discovery_reads() -> None:
    """EKS also documents topology.k8s.aws/network-node-layer-4, "present only on instance types whose topology has
    four layers" (EKS user guide, ml-workload-topology). Listing it would not be harmless: the walk starts at tier 1
    (the bottom label) and stops at the first missing one, so every 3-layer node would fall out of all HyperNodes.
    No catalogued type has four layers (EC2 instance-topology prerequisites); one that does needs its own type."""
    layers = {len(entries) - 1 for entries in _discovery().values()}
    assert layers == {len(EKS_LAYERS)}
    assert max(t.network_layers for t in INSTANCE_TYPES.values()) <= len(EKS_LAYERS)


def test_the_rendered_configmaps_hold_the_plugin_and_a_parseable_discovery_config() -> None:
    """As Helm 3.19.0 renders chart 1.15.1 with our values: the controller reads `volcano-controller.conf` into
    NetworkTopologyConfig (pkg/controllers/hypernode/config/loader.go), so it must parse to that mapping."""
    release = next(r for r in planned(FLEET).rendered.releases.values() if r.chart == "volcano")
    maps = {obj["metadata"]["name"]: obj["data"] for obj in release.of_kind("ConfigMap")}
    controller = yaml.safe_load(maps[f"{release.name}-controller-configmap"]["volcano-controller.conf"])
    assert controller == _custom()["controller_config_override"]
    (scheduler,) = [data for name, data in maps.items() if name.endswith("scheduler-configmap")]
    conf = yaml.safe_load(next(iter(scheduler.values())))
    assert "network-topology-aware" in {p["name"] for tier in conf["tiers"] for p in tier["plugins"]}
