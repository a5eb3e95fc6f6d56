"""Every multi-node Volcano job declares `networkTopology`; the mode is the stack's, soft unless it says hard.

Without the field Volcano places a gang anywhere; with it the network-topology-aware plugin packs the gang into the
lowest HyperNode tier that holds it (soft) or waits for one (hard). Expectations come from each stack's settings.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from jobs_render import fabric_checks, rendered, training_jobs, volcano_jobs, volcano_schema_errors
from owned_stacks import OWNED_STACKS
from trainyard.names import NETWORK_LAYER_LABELS
from trainyard.plan.runtime import available_stacks, read_stack, settings_of


@pytest.mark.parametrize("stack", available_stacks())
def test_multi_node_jobs_declare_their_topology(stack: str) -> None:
    recording = rendered(stack)
    settings = settings_of(read_stack(stack))
    jobs = training_jobs(recording)
    for job in settings.workloads:
        spec = jobs[job.name].inputs["spec"]
        declared = job.network_topology
        if job.max_nodes == 1:
            assert "networkTopology" not in spec, job.name
        elif declared is None or declared.mode == "soft":
            assert spec["networkTopology"] == {"mode": "soft"}, job.name
        else:
            assert spec["networkTopology"] == {"mode": "hard", "highestTierAllowed": declared.highest_tier}
        assert not volcano_schema_errors(jobs[job.name]), job.name


@pytest.mark.parametrize("stack", available_stacks())
def test_fabric_checks_are_soft(stack: str) -> None:
    for name, record in fabric_checks(rendered(stack)).items():
        assert record.inputs["spec"]["networkTopology"] == {"mode": "soft"}, name


@pytest.mark.parametrize("stack", available_stacks())
def test_hard_topology_jobs_run_on_co_located_capacity(stack: str) -> None:
    """A hard job (prod's example: a fixed-size job on a Capacity Block pool) sits on a reserved or placement-group
    pool and never autoscales."""
    settings = settings_of(read_stack(stack))
    for job in settings.workloads:
        if job.network_topology and job.network_topology.mode == "hard":
            pool = settings.pool(job.node_pool or "")
            assert pool.capacity_types == ["reserved"] or pool.placement_group, (job.name, pool.name)
            assert not job.autoscaling.enabled, job.name


def test_a_hard_job_of_the_fleet_renders_its_tier(tmp_path: Path) -> None:
    """The hard case on the tests' own fleet, whatever stacks/ holds: its elastic job on the on-demand placement-group
    pool, fixed in size, asks for hard placement at the pool's top tier."""
    document = yaml.safe_load((OWNED_STACKS / "Pulumi.fleet.yaml").read_text())
    config = document["config"]
    pool = next(p for p in config["trainyard:nodePools"]
                if p.get("placementGroup") and p.get("capacityTypes") == ["on-demand"])
    job = next(j for j in config["trainyard:workloads"] if j.get("nodePool") == pool["name"] and j["kind"] == "elastic")
    job.pop("autoscaling", None)
    job["networkTopology"] = {"mode": "hard", "highestTier": 3}
    (tmp_path / "Pulumi.fleet.yaml").write_text(yaml.safe_dump(document))
    record = training_jobs(rendered("fleet", tmp_path))[job["name"]]
    assert record.inputs["spec"]["networkTopology"] == {"mode": "hard", "highestTierAllowed": 3}
    assert not volcano_schema_errors(record)


@pytest.mark.parametrize("stack", available_stacks())
def test_a_changed_job_spec_replaces_the_job(stack: str) -> None:
    """Volcano's webhook refuses spec updates beyond minAvailable, replicas and priorityClassName (validateJobUpdate
    @v1.15.1), so adding networkTopology to a running stack's job must replace it, deleting the old one first."""
    for name, record in volcano_jobs(rendered(stack)).items():
        assert record.replace_on_changes == ("spec",), name
        assert record.delete_before_replace, name


@pytest.mark.parametrize("stack", available_stacks())
def test_fabric_checks_can_read_their_nodes_topology_and_nothing_else(stack: str) -> None:
    recording = rendered(stack)
    for name, record in fabric_checks(recording).items():
        pod = record.inputs["spec"]["tasks"][0]["template"]["spec"]
        (container,) = pod["containers"]
        assert f"--node-labels={','.join(NETWORK_LAYER_LABELS)}" in container["args"]
        assert {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in container["env"]
        assert pod["serviceAccountName"] == name and pod["automountServiceAccountToken"] is True
        namespace = record.inputs["metadata"]["namespace"]
        children = [r for r in recording.resources if r.parent == record.parent]
        (role,) = [r.inputs for r in children if r.type == "kubernetes:rbac.authorization.k8s.io/v1:ClusterRole"]
        assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]
        (binding,) = [r.inputs for r in children
                      if r.type == "kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding"]
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]
        assert binding["roleRef"]["name"] == role["metadata"]["name"]
        (policy,) = [r.inputs for r in children if r.type == "kubernetes:cilium.io/v2:CiliumNetworkPolicy"]
        assert policy["spec"]["endpointSelector"] == {"matchLabels": {"trainyard.io/job": name}}
        assert policy["spec"]["egress"] == [{"toEntities": ["kube-apiserver"],
                                             "toPorts": [{"ports": [{"port": "443", "protocol": "TCP"}]}]}]
