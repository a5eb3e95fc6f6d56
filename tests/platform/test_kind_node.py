"""The kind cluster the README creates for the local stacks (stacks/kind-trainyard.yaml) can run every pod those
stacks make: each pod's node selector and required node affinity match its one node's labels (README, "The local
stack (kind)"). Expectations come from each local stack's plan, its Helm releases rendered by the real Helm."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from owned_stacks import planned
from trainyard.plan.cluster_model import satisfies
from trainyard.plan.pods import lookup, pod_makers, pod_needs
from trainyard.plan.runtime import STACKS_DIR, available_stacks, read_stack, settings_of
from trainyard.plan.writers import is_kubernetes_object, manifest_of

KIND_CONFIG = STACKS_DIR / "kind-trainyard.yaml"
LOCAL = [s for s in available_stacks() if settings_of(read_stack(s)).target == "local"]
# What the kubelet labels every node with (Kubernetes docs, "Well-Known Labels": kubernetes.io/os, .../hostname).
KUBELET_LABELS = {"kubernetes.io/os": "linux", "kubernetes.io/hostname": "trainyard-control-plane"}


def node_labels(config: Path) -> dict[str, str]:
    (node,) = yaml.safe_load(config.read_text())["nodes"]
    return {**KUBELET_LABELS, **{str(k): str(v) for k, v in (node.get("labels") or {}).items()}}


def _pod_specs(stack: str) -> list[tuple[str, dict[str, Any]]]:
    plan = planned((stack, STACKS_DIR))
    objects = [o for _, o in plan.rendered.objects()]
    objects += [manifest_of(r) for r in plan.recording.resources if is_kubernetes_object(r)]
    specs = [(w.label, dict(w.spec)) for w in pod_makers(objects)]
    specs += [(f"{o['kind']}/{o['metadata']['name']}", {"nodeSelector": lookup(o, "spec.affinity.nodeSelector")})
              for o in objects if o.get("kind") == "Cluster" and o["apiVersion"].startswith("postgresql.cnpg.io/")]
    specs += [(f"{o['kind']}/{o['metadata']['name']}", t["template"]["spec"]) for o in objects
              if o.get("kind") == "Job" and o["apiVersion"].startswith("batch.volcano.sh/")
              for t in o["spec"]["tasks"]]
    return specs


def test_there_is_a_local_stack_to_check() -> None:
    assert LOCAL, "no sample stack targets local"


@pytest.mark.parametrize("stack", LOCAL)
def test_the_kind_node_takes_every_pod_of_the_local_stack(stack: str) -> None:
    labels = node_labels(KIND_CONFIG)
    stranded = []
    for name, spec in _pod_specs(stack):
        needs = pod_needs(name, spec)
        selected = all(labels.get(k) == v for k, v in needs.node_selector.items())
        offered = {k: {v} for k, v in labels.items()}
        affine = not needs.affinity_terms or any(all(satisfies(r, offered) for r in term)
                                                 for term in needs.affinity_terms)
        if not (selected and affine):
            stranded.append(name)
    assert not stranded, f"pods no node of {KIND_CONFIG.name} can run: {stranded}"


def test_a_node_without_the_system_label_strands_the_controllers() -> None:
    """The check above can fail: kind's default node (no labels of ours) runs none of the platform's controllers."""
    labels = {**KUBELET_LABELS}
    stranded = [n for stack in LOCAL for n, s in _pod_specs(stack)
                if not all(labels.get(k) == v for k, v in pod_needs(n, s).node_selector.items())]
    assert any("volcano-scheduler" in n for n in stranded)
