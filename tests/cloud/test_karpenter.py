"""Karpenter: AWS side (roles, queue, rules, placement groups) and the CRs, validated against upstream schemas."""

from __future__ import annotations

import json
from typing import Any

import pytest
from aws_plan import by_urn, cloud_and_karpenter, of_type, one, plan
from owned_stacks import FLEET, Stack, recording, stack_file, stack_raw, stack_settings, stacks_where
from trainyard.cloud.karpenter import INTERRUPTION_EVENTS
from trainyard.cloud.userdata import NodeRole, render_user_data
from trainyard.config.instance_types import INSTANCE_TYPES
from trainyard.config.model import Settings
from trainyard.config.releases import KUBERNETES_RELEASES
from trainyard.plan.conformance import upstream_dir
from trainyard.plan.recording import Recording
from trainyard.plan.runtime import StackFile, render, settings_of

NODE_CLASS = "kubernetes:karpenter.k8s.aws/v1:EC2NodeClass"
NODE_POOL = "kubernetes:karpenter.sh/v1:NodePool"
NODE_OVERLAY = "kubernetes:karpenter.sh/v1alpha1:NodeOverlay"
RELEASE = "kubernetes:helm.sh/v3:Release"
CRDS = upstream_dir() / "crds"
# The tests' fleet, then every AWS stack of stacks/.
AWS = stacks_where(lambda s: s.is_aws)


def _schema(group: str, kind: str) -> dict[str, Any]:
    path = CRDS / group / f"{kind}_v1.json"
    return dict(json.loads(path.read_text()))


def _crs(rec: Recording, type_: str) -> dict[str, Any]:
    return {r.inputs["metadata"]["name"]: r for r in of_type(rec, type_)}


@pytest.mark.parametrize("stack", AWS)
def test_crs_validate_against_upstream_schemas(stack: Stack) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    for type_, group, kind in ((NODE_CLASS, "karpenter.k8s.aws", "ec2nodeclass"),
                               (NODE_POOL, "karpenter.sh", "nodepool")):
        validator = jsonschema.Draft202012Validator(_schema(group, kind))
        crs = of_type(plan(*stack), type_)
        assert crs, f"no {kind} in {stack[0]}"
        for cr in crs:
            body = {k: v for k, v in cr.inputs.items() if k in ("apiVersion", "kind", "metadata", "spec")}
            errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(body)]
            assert not errors, f"{cr.name}: {errors}"
    # The validator does bite: a spec Karpenter would reject is caught.
    pool = of_type(plan(*stack), NODE_POOL)[0].inputs
    broken = {**pool, "spec": {**pool["spec"], "disruption": {"consolidationPolicy": "Never"}}}
    validator = jsonschema.Draft202012Validator(_schema("karpenter.sh", "nodepool"))
    assert any("Never" in e.message for e in validator.iter_errors(
        {k: broken[k] for k in ("apiVersion", "kind", "metadata", "spec")}))


@pytest.mark.parametrize("stack", AWS)
def test_one_node_class_and_pool_per_gpu_pool(stack: Stack) -> None:
    gpu_pools = {pool.name for pool in stack_settings(stack).pools("gpu")}
    assert set(_crs(plan(*stack), NODE_POOL)) == gpu_pools
    assert set(_crs(plan(*stack), NODE_CLASS)) == gpu_pools


def _fleet_with_a_block() -> StackFile:
    """The tests' fleet with its first on-demand EFA pool launching into a Capacity Block (placeholder id and fee)."""
    pools = stack_raw(FLEET)["nodePools"]
    pool = next(p for p in pools if p["role"] == "gpu" and p.get("efa") and p.get("capacityTypes") == ["on-demand"])
    block = {"id": "cr-0123456789abcdef0", "type": "capacity-block", "instanceType": pool["instanceTypes"][0],
             "zone": pool["zones"][0], "instanceCount": pool["maxSize"], "upfrontFeeUsd": 1000.0, "durationHours": 24}
    pool.update(capacityTypes=["reserved"], placementGroup=False, capacityReservations=[block])
    file = stack_file(FLEET)
    return StackFile(file.stack, {**file.values, "trainyard:nodePools": json.dumps(pools)}, file.secret_keys)


def _assert_reservations_selected(rec: Recording, settings: Settings) -> None:
    """Karpenter launches `reserved` nodes only into reservations its node class selects (odcrs.md @v1.14.1)."""
    classes, pools = _crs(rec, NODE_CLASS), _crs(rec, NODE_POOL)
    for pool in settings.pools("gpu"):
        terms = classes[pool.name].inputs["spec"].get("capacityReservationSelectorTerms")
        template = pools[pool.name].inputs["spec"]["template"]
        requirements = {r["key"]: r["values"] for r in template["spec"]["requirements"]}
        if pool.capacity_reservations:
            assert terms == [{"id": r.id} for r in pool.capacity_reservations]
            assert "reserved" in requirements["karpenter.sh/capacity-type"]
        else:
            assert terms is None and "reserved" not in requirements["karpenter.sh/capacity-type"]


@pytest.mark.parametrize("stack", AWS)
def test_reserved_pools_select_their_reservations_by_id(stack: Stack) -> None:
    _assert_reservations_selected(plan(*stack), stack_settings(stack))


def test_a_capacity_block_pool_selects_its_block() -> None:
    file = _fleet_with_a_block()
    settings = settings_of(file)
    assert any(pool.capacity_reservations for pool in settings.pools("gpu"))
    _assert_reservations_selected(render(file, cloud_and_karpenter), settings)


@pytest.mark.parametrize("stack", AWS)
def test_node_pool_content(stack: Stack) -> None:
    settings = stack_settings(stack)
    crs = _crs(plan(*stack), NODE_POOL)
    for pool in settings.pools("gpu"):
        types = [INSTANCE_TYPES[name] for name in pool.instance_types]
        spec = crs[pool.name].inputs["spec"]
        # Every pool is bounded on nodes; one without a MIG layout on GPUs too (platform/karpenter.py pool_limits).
        gpus = {} if pool.mig_layout else {"nvidia.com/gpu": str(pool.max_size * min(t.gpu_count for t in types))}
        assert spec["limits"] == {"nodes": str(pool.max_size), **gpus}
        template = spec["template"]
        taints = template["spec"]["taints"]
        assert taints[0] == {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}
        assert all(t.model_dump(by_alias=True) in taints for t in pool.taints)
        # Cilium's, then GPU admission's: only a passed health check removes the second (platform/gpu_health.py).
        health = [{"key": "trainyard.io/gpu-health", "value": "pending", "effect": "NoSchedule"}] \
            if settings.addons.gpu_health.enabled else []
        assert template["spec"]["startupTaints"] == [
            {"key": "node.cilium.io/agent-not-ready", "value": "true", "effect": "NoExecute"}, *health]
        assert template["spec"]["expireAfter"] == "Never"
        labels = template["metadata"]["labels"]
        assert {"trainyard.io/role": "gpu", "trainyard.io/pool": pool.name}.items() <= labels.items()
        assert labels.get("nvidia.com/mig.config") == pool.mig_layout
        reqs = {r["key"]: r["values"] for r in template["spec"]["requirements"]}
        assert reqs["node.kubernetes.io/instance-type"] == pool.instance_types
        assert reqs["karpenter.sh/capacity-type"] == pool.capacity_types
        assert settings.aws is not None
        assert reqs["topology.kubernetes.io/zone"] == (pool.zones or settings.aws.availability_zones)


@pytest.mark.parametrize("stack", AWS)
def test_every_pool_is_bounded_by_what_its_initialized_nodes_still_report(stack: Stack) -> None:
    # Karpenter counts an initialized node at the node's own capacity (kubernetes-sigs/karpenter v1.14.1
    # statenode.go Capacity); a MIG-partitioned node reports nvidia.com/mig-*, not nvidia.com/gpu, so only a
    # `nodes` limit (one per state node) bounds a MIG pool.
    settings = stack_settings(stack)
    pools = _crs(plan(*stack), NODE_POOL)
    for pool in settings.pools("gpu"):
        limits = pools[pool.name].inputs["spec"]["limits"]
        assert limits["nodes"] == str(pool.max_size), pool.name
        if pool.mig_layout is not None:
            assert "nvidia.com/gpu" not in limits, pool.name


@pytest.mark.parametrize("stack", AWS)
def test_node_pools_never_consolidate_busy_nodes(stack: Stack) -> None:
    for cr in _crs(plan(*stack), NODE_POOL).values():
        disruption = cr.inputs["spec"]["disruption"]
        assert disruption["consolidationPolicy"] == "WhenEmpty"
        assert disruption["consolidateAfter"] == "10m"
        blocked = [b for b in disruption["budgets"] if b["nodes"] == "0"]
        assert blocked and {"Underutilized", "Drifted"} <= set(blocked[0]["reasons"])


@pytest.mark.parametrize("stack", AWS)
def test_node_class_content(stack: Stack) -> None:
    settings = stack_settings(stack)
    release = KUBERNETES_RELEASES[settings.cluster.kubernetes_version]
    classes = _crs(plan(*stack), NODE_CLASS)
    for pool in settings.pools("gpu"):
        spec = classes[pool.name].inputs["spec"]
        assert spec["amiSelectorTerms"] == [{"alias": release.karpenter_ami_alias}]
        assert spec["role"] == f"trainyard-{stack[0]}-karpenter-node"
        assert spec["subnetSelectorTerms"] == [{"tags": {"karpenter.sh/discovery": f"trainyard-{stack[0]}"}}]
        assert spec["securityGroupSelectorTerms"] == [{"tags": {"karpenter.sh/discovery": f"trainyard-{stack[0]}"}}]
        assert spec["userData"] == render_user_data(NodeRole.GPU)
        assert spec["metadataOptions"]["httpTokens"] == "required"
        assert spec["blockDeviceMappings"] == [{"deviceName": "/dev/xvda", "rootVolume": True, "ebs": {
            "volumeSize": f"{pool.root_volume_gib}Gi", "volumeType": "gp3", "encrypted": True,
            "deleteOnTermination": True}}]
        placement = {"name": f"trainyard-{stack[0]}-{pool.name}"} if pool.placement_group else None
        assert spec.get("placementGroupSelector") == placement


@pytest.mark.parametrize("stack", AWS)
def test_crs_outlive_nothing_but_depend_on_the_release(stack: Stack) -> None:
    rec = plan(*stack)
    cluster = one(rec, "aws:eks/cluster:Cluster")
    release = one(rec, RELEASE)
    assert release.deleted_with == cluster.urn
    assert release.inputs["values"]["settings"] == {"clusterName": f"trainyard-{stack[0]}",
                                                    "interruptionQueue": f"trainyard-{stack[0]}-karpenter",
                                                    "featureGates": {"nodeOverlay": True, "nodeRepair": True}}
    assert release.inputs["version"] == "1.14.1"
    for cr in of_type(rec, NODE_CLASS) + of_type(rec, NODE_POOL) + of_type(rec, NODE_OVERLAY):
        assert cr.deleted_with is None, f"{cr.name} would be skipped on destroy and orphan its instances"
        assert release.urn in cr.depends_on
    for pool in of_type(rec, NODE_POOL):
        node_class = _crs(plan(*stack), NODE_CLASS)[pool.inputs["metadata"]["name"]]
        assert node_class.urn in pool.depends_on


@pytest.mark.parametrize("stack", AWS)
def test_aws_side(stack: Stack) -> None:
    rec = plan(*stack)
    queue = one(rec, "aws:sqs/queue:Queue")
    assert queue.inputs["name"] == f"trainyard-{stack[0]}-karpenter"
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
        f"arn:aws:iam::000000000000:role/trainyard-{stack[0]}-karpenter-node"]
    groups = {g.inputs["name"]: g.inputs["strategy"] for g in of_type(rec, "aws:ec2/placementGroup:PlacementGroup")}
    assert groups == {f"trainyard-{stack[0]}-{pool.name}": "cluster" for pool in stack_settings(stack).pools("gpu")
                      if pool.placement_group}
    controller = [a for a in of_type(rec, "aws:eks/podIdentityAssociation:PodIdentityAssociation")
                  if a.inputs["serviceAccount"] == "karpenter"]
    assert [(a.inputs["namespace"], a.inputs["roleArn"]) for a in controller] == [
        ("kube-system", f"arn:aws:iam::000000000000:role/trainyard-{stack[0]}-karpenter-controller")]


def test_controller_policy_is_scoped_to_the_cluster() -> None:
    rec = plan(*FLEET)
    role_policy = next(p for p in of_type(rec, "aws:iam/rolePolicy:RolePolicy")
                       if by_urn(rec, p.parent or "").name == "karpenter-controller")
    statements = {s["Sid"]: s for s in json.loads(role_policy.inputs["policy"])["Statement"]}
    for sid in ("AllowScopedEC2LaunchTemplateAccessActions", "AllowScopedDeletion", "AllowScopedResourceTagging"):
        assert statements[sid]["Condition"]["StringEquals"]["aws:ResourceTag/kubernetes.io/cluster/trainyard-fleet"] \
            == "owned"
    assert statements["AllowPassingInstanceRole"]["Resource"] == \
        "arn:aws:iam::000000000000:role/trainyard-fleet-karpenter-node"
    assert statements["AllowAPIServerEndpointDiscovery"]["Resource"].endswith("eks-cluster")
    assert statements["AllowRegionalReadActions"]["Condition"] == {
        "StringEquals": {"aws:RequestedRegion": "us-west-2"}}


@pytest.mark.parametrize("stack", AWS)
def test_zonal_shift_stays_off_while_the_policy_lacks_its_statement(stack: Stack) -> None:
    # Karpenter 1.14.1's reference policy has a ZonalShiftPolicy (arc-zonal-shift:GetManagedResource) that only
    # ENABLE_ZONAL_SHIFT uses (chart settings.enableZonalShift, default false); the controller role leaves it out.
    rec = plan(*stack)
    values = one(rec, RELEASE).inputs["values"]
    policy = next(json.loads(r.inputs["policy"]) for r in of_type(rec, "aws:iam/rolePolicy:RolePolicy")
                  if r.name.startswith("karpenter-controller"))
    actions = {a for s in policy["Statement"] for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])}
    zonal_shift = bool(values.get("settings", {}).get("enableZonalShift", False))
    assert zonal_shift == any(a.startswith("arc-zonal-shift:") for a in actions)


@pytest.mark.parametrize("stack", AWS)
def test_efa_pools_give_pods_no_efa_interface_with_ips(stack: Stack) -> None:
    # Review finding 1 (issue 18 item 5 reversed): Cilium's ENI IPAM lists only ENIs with an IPv4 address (cilium
    # pkg/aws/ec2/ec2.go filter private-ip-address=*), so EFA goes on IP-less efa-only interfaces, one per network
    # card of every type of the pool, beside card 0's primary ENI; pools without EFA keep Karpenter's default.
    cilium = next(r for r in recording(stack).resources if r.type == RELEASE
                  and str(r.inputs["chart"]) == "cilium")
    assert cilium.inputs["values"]["ipam"]["mode"] == "eni"
    settings = stack_settings(stack)
    classes = _crs(plan(*stack), NODE_CLASS)
    for pool in settings.pools("gpu"):
        interfaces = classes[pool.name].inputs["spec"].get("networkInterfaces")
        if not pool.efa:
            assert interfaces is None, pool.name
            continue
        interfaces = interfaces or []
        cards = min(INSTANCE_TYPES[t].efa_interfaces for t in pool.instance_types)
        pairs = [(i["networkCardIndex"], i["deviceIndex"]) for i in interfaces]
        assert len(pairs) == len(set(pairs)), pool.name  # Karpenter's CEL: no card/device pair twice
        with_ips = [i for i in interfaces if i["interfaceType"] != "efa-only"]
        assert with_ips == [{"networkCardIndex": 0, "deviceIndex": 0, "interfaceType": "interface"}], pool.name
        efa_only = sorted(i["networkCardIndex"] for i in interfaces if i["interfaceType"] == "efa-only")
        assert efa_only == list(range(cards)), pool.name  # one per card (CEL: at most one), so the pods' count
