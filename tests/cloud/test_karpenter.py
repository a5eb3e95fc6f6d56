"""Karpenter: AWS side (roles, queue, rules, placement groups) and the CRs, validated against upstream schemas."""

from __future__ import annotations

import json
from typing import Any

import pytest
from aws_plan import by_urn, of_type, one, plan
from trainyard.cloud.karpenter import INTERRUPTION_EVENTS
from trainyard.cloud.userdata import NodeRole, render_user_data
from trainyard.plan.conformance import upstream_dir
from trainyard.plan.runtime import read_stack, settings_of

NODE_CLASS = "kubernetes:karpenter.k8s.aws/v1:EC2NodeClass"
NODE_POOL = "kubernetes:karpenter.sh/v1:NodePool"
NODE_OVERLAY = "kubernetes:karpenter.sh/v1alpha1:NodeOverlay"
RELEASE = "kubernetes:helm.sh/v3:Release"
CRDS = upstream_dir() / "crds"


def _schema(group: str, kind: str) -> dict[str, Any]:
    path = CRDS / group / f"{kind}_v1.json"
    return dict(json.loads(path.read_text()))


def _crs(stack: str, type_: str) -> dict[str, Any]:
    return {r.inputs["metadata"]["name"]: r for r in of_type(plan(stack), type_)}


@pytest.mark.parametrize("stack", ["dev", "staging", "prod"])
def test_crs_validate_against_upstream_schemas(stack: str) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    for type_, group, kind in ((NODE_CLASS, "karpenter.k8s.aws", "ec2nodeclass"),
                               (NODE_POOL, "karpenter.sh", "nodepool")):
        validator = jsonschema.Draft202012Validator(_schema(group, kind))
        crs = of_type(plan(stack), type_)
        assert crs, f"no {kind} in {stack}"
        for cr in crs:
            body = {k: v for k, v in cr.inputs.items() if k in ("apiVersion", "kind", "metadata", "spec")}
            errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(body)]
            assert not errors, f"{cr.name}: {errors}"
    # The validator does bite: a spec Karpenter would reject is caught.
    pool = of_type(plan(stack), NODE_POOL)[0].inputs
    broken = {**pool, "spec": {**pool["spec"], "disruption": {"consolidationPolicy": "Never"}}}
    validator = jsonschema.Draft202012Validator(_schema("karpenter.sh", "nodepool"))
    assert any("Never" in e.message for e in validator.iter_errors(
        {k: broken[k] for k in ("apiVersion", "kind", "metadata", "spec")}))


@pytest.mark.parametrize("stack", ["staging", "prod"])
def test_one_node_class_and_pool_per_gpu_pool(stack: str) -> None:
    gpu_pools = {p.name for p in settings_of(read_stack(stack)).pools("gpu")}
    assert gpu_pools and set(_crs(stack, NODE_POOL)) == gpu_pools
    assert set(_crs(stack, NODE_CLASS)) == gpu_pools


@pytest.mark.parametrize("stack", ["dev", "staging", "prod"])
def test_reserved_pools_select_their_reservations_by_id(stack: str) -> None:
    """Karpenter launches `reserved` nodes only into reservations its node class selects (odcrs.md @v1.14.1)."""
    classes, pools = _crs(stack, NODE_CLASS), _crs(stack, NODE_POOL)
    for pool in settings_of(read_stack(stack)).pools("gpu"):
        terms = classes[pool.name].inputs["spec"].get("capacityReservationSelectorTerms")
        template = pools[pool.name].inputs["spec"]["template"]
        requirements = {r["key"]: r["values"] for r in template["spec"]["requirements"]}
        if pool.capacity_reservations:
            assert terms == [{"id": r.id} for r in pool.capacity_reservations]
            assert "reserved" in requirements["karpenter.sh/capacity-type"]
        else:
            assert terms is None and "reserved" not in requirements["karpenter.sh/capacity-type"]


def test_node_pool_content() -> None:
    pools = _crs("prod", NODE_POOL)
    h100 = pools["h100"].inputs["spec"]
    assert h100["limits"] == {"nodes": "8", "nvidia.com/gpu": "64"}  # maxSize 8 x 8 GPUs
    assert pools["h200"].inputs["spec"]["limits"] == {"nodes": "4", "nvidia.com/gpu": "32"}
    template = h100["template"]
    assert template["spec"]["taints"] == [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}]
    # Cilium's, then GPU admission's: only a passed health check removes the second (platform/gpu_health.py).
    assert template["spec"]["startupTaints"] == [
        {"key": "node.cilium.io/agent-not-ready", "value": "true", "effect": "NoExecute"},
        {"key": "trainyard.io/gpu-health", "value": "pending", "effect": "NoSchedule"}]
    assert template["spec"]["expireAfter"] == "Never"
    assert template["metadata"]["labels"] == {"trainyard.io/role": "gpu", "trainyard.io/pool": "h100"}
    reqs = {r["key"]: r["values"] for r in template["spec"]["requirements"]}
    assert reqs["node.kubernetes.io/instance-type"] == ["p5.48xlarge"]
    assert reqs["karpenter.sh/capacity-type"] == ["on-demand"]
    assert reqs["topology.kubernetes.io/zone"] == ["us-west-2a"]
    spot = {r["key"]: r["values"] for r in pools["h200"].inputs["spec"]["template"]["spec"]["requirements"]}
    assert spot["karpenter.sh/capacity-type"] == ["spot", "on-demand"]
    assert spot["node.kubernetes.io/instance-type"] == ["p5e.48xlarge", "p5en.48xlarge"]
    mig_labels = pools["h100-mig"].inputs["spec"]["template"]["metadata"]["labels"]
    assert mig_labels["nvidia.com/mig.config"] == "training-mixed"
    assert _crs("staging", NODE_POOL)["a100-mig"].inputs["spec"]["template"]["metadata"]["labels"][
        "nvidia.com/mig.config"] == "balanced"
    assert "nvidia.com/mig.config" not in template["metadata"]["labels"]


@pytest.mark.parametrize("stack", ["dev", "staging", "prod"])
def test_every_pool_is_bounded_by_what_its_initialized_nodes_still_report(stack: str) -> None:
    # Karpenter counts an initialized node at the node's own capacity (kubernetes-sigs/karpenter v1.14.1
    # statenode.go Capacity); a MIG-partitioned node reports nvidia.com/mig-*, not nvidia.com/gpu, so only a
    # `nodes` limit (one per state node) bounds a MIG pool.
    settings = settings_of(read_stack(stack))
    pools = _crs(stack, NODE_POOL)
    for pool in settings.pools("gpu"):
        limits = pools[pool.name].inputs["spec"]["limits"]
        assert limits["nodes"] == str(pool.max_size), pool.name
        if pool.mig_layout is not None:
            assert "nvidia.com/gpu" not in limits, pool.name


@pytest.mark.parametrize("stack", ["dev", "staging", "prod"])
def test_node_pools_never_consolidate_busy_nodes(stack: str) -> None:
    for cr in _crs(stack, NODE_POOL).values():
        disruption = cr.inputs["spec"]["disruption"]
        assert disruption["consolidationPolicy"] == "WhenEmpty"
        assert disruption["consolidateAfter"] == "10m"
        blocked = [b for b in disruption["budgets"] if b["nodes"] == "0"]
        assert blocked and {"Underutilized", "Drifted"} <= set(blocked[0]["reasons"])


def test_node_class_content() -> None:
    classes = _crs("prod", NODE_CLASS)
    h100 = classes["h100"].inputs["spec"]
    assert h100["amiSelectorTerms"] == [{"alias": "al2023@v20260714"}]
    assert h100["role"] == "trainyard-prod-karpenter-node"
    assert h100["subnetSelectorTerms"] == [{"tags": {"karpenter.sh/discovery": "trainyard-prod"}}]
    assert h100["securityGroupSelectorTerms"] == [{"tags": {"karpenter.sh/discovery": "trainyard-prod"}}]
    assert h100["userData"] == render_user_data(NodeRole.GPU)
    assert h100["metadataOptions"]["httpTokens"] == "required"
    assert h100["blockDeviceMappings"] == [{"deviceName": "/dev/xvda", "rootVolume": True, "ebs": {
        "volumeSize": "1000Gi", "volumeType": "gp3", "encrypted": True, "deleteOnTermination": True}}]
    assert h100["placementGroupSelector"] == {"name": "trainyard-prod-h100"}
    assert "placementGroupSelector" not in classes["h100-spot"].inputs["spec"]
    assert classes["h100-mig"].inputs["spec"]["blockDeviceMappings"][0]["ebs"]["volumeSize"] == "500Gi"


@pytest.mark.parametrize("stack", ["dev", "staging", "prod"])
def test_crs_outlive_nothing_but_depend_on_the_release(stack: str) -> None:
    rec = plan(stack)
    cluster = one(rec, "aws:eks/cluster:Cluster")
    release = one(rec, RELEASE)
    assert release.deleted_with == cluster.urn
    assert release.inputs["values"]["settings"] == {"clusterName": f"trainyard-{stack}",
                                                    "interruptionQueue": f"trainyard-{stack}-karpenter",
                                                    "featureGates": {"nodeOverlay": True, "nodeRepair": True}}
    assert release.inputs["version"] == "1.14.1"
    for cr in of_type(rec, NODE_CLASS) + of_type(rec, NODE_POOL) + of_type(rec, NODE_OVERLAY):
        assert cr.deleted_with is None, f"{cr.name} would be skipped on destroy and orphan its instances"
        assert release.urn in cr.depends_on
    for pool in of_type(rec, NODE_POOL):
        node_class = _crs(stack, NODE_CLASS)[pool.inputs["metadata"]["name"]]
        assert node_class.urn in pool.depends_on


def test_aws_side() -> None:
    rec = plan("prod")
    queue = one(rec, "aws:sqs/queue:Queue")
    assert queue.inputs["name"] == "trainyard-prod-karpenter"
    assert queue.inputs["sqsManagedSseEnabled"] is True
    rules = of_type(rec, "aws:cloudwatch/eventRule:EventRule")
    patterns = {(p["source"][0], p["detail-type"][0]) for p in (json.loads(r.inputs["eventPattern"]) for r in rules)}
    assert patterns == set(INTERRUPTION_EVENTS.values())
    targets = of_type(rec, "aws:cloudwatch/eventTarget:EventTarget")
    assert len(targets) == len(rules) and all(t.inputs["arn"].endswith("karpenter-interruption") for t in targets)
    policy = json.loads(one(rec, "aws:sqs/queuePolicy:QueuePolicy").inputs["policy"])
    assert {s["Effect"] for s in policy["Statement"]} == {"Allow", "Deny"}
    node_entries = [e for e in of_type(rec, "aws:eks/accessEntry:AccessEntry") if e.inputs["type"] == "EC2_LINUX"]
    assert [e.inputs["principalArn"] for e in node_entries] == [
        "arn:aws:iam::000000000000:role/trainyard-prod-karpenter-node"]
    groups = {g.inputs["name"]: g.inputs["strategy"] for g in of_type(rec, "aws:ec2/placementGroup:PlacementGroup")}
    assert groups == {"trainyard-prod-h100": "cluster", "trainyard-prod-h200": "cluster"}
    controller = [a for a in of_type(rec, "aws:eks/podIdentityAssociation:PodIdentityAssociation")
                  if a.inputs["serviceAccount"] == "karpenter"]
    assert [(a.inputs["namespace"], a.inputs["roleArn"]) for a in controller] == [
        ("kube-system", "arn:aws:iam::000000000000:role/trainyard-prod-karpenter-controller")]


def test_controller_policy_is_scoped_to_the_cluster() -> None:
    rec = plan("prod")
    role_policy = next(p for p in of_type(rec, "aws:iam/rolePolicy:RolePolicy")
                       if by_urn(rec, p.parent or "").name == "karpenter-controller")
    statements = {s["Sid"]: s for s in json.loads(role_policy.inputs["policy"])["Statement"]}
    for sid in ("AllowScopedEC2LaunchTemplateAccessActions", "AllowScopedDeletion", "AllowScopedResourceTagging"):
        assert statements[sid]["Condition"]["StringEquals"]["aws:ResourceTag/kubernetes.io/cluster/trainyard-prod"] \
            == "owned"
    assert statements["AllowPassingInstanceRole"]["Resource"] == \
        "arn:aws:iam::000000000000:role/trainyard-prod-karpenter-node"
    assert statements["AllowAPIServerEndpointDiscovery"]["Resource"].endswith("eks-cluster")
    assert statements["AllowRegionalReadActions"]["Condition"] == {
        "StringEquals": {"aws:RequestedRegion": "us-west-2"}}
