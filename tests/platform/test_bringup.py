"""What a first `pulumi up` needs beyond the shape of the objects: where daemons can land, what storage and
scheduling can serve, read from each stack's plan records (issue 9)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import pytest
import yaml
from owned_stacks import Stack, recording, stack_settings, stacks_where
from trainyard.cloud.aws import pool_labels, pool_taints
from trainyard.config.instance_types import INSTANCE_TYPES
from trainyard.config.mig import load_mig_catalog
from trainyard.config.model import Settings
from trainyard.plan.engine_order import creation_order
from trainyard.plan.recording import Recording
from trainyard.plan.writers import HELM_RELEASE, release_of
from trainyard.platform.tenants import DEFAULT_DENY_POLICY


def _aws_with(has: Callable[[Settings], bool]) -> list[Any]:
    """The owned stacks, then every AWS stack of stacks/, that target AWS and have what the test reads."""
    return stacks_where(lambda s: s.is_aws and has(s))


def _recording(stack: Stack) -> Recording:
    return recording(stack)


def _values(stack: Stack, chart: str) -> dict[str, Any]:
    (values,) = [release_of(r)["values"] for r in _recording(stack).resources
                 if r.type == HELM_RELEASE and release_of(r)["chart"].rsplit("/", 1)[-1] == chart]
    return dict(values)


def _matches(expression: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key, operator, values = expression["key"], expression["operator"], expression.get("values", [])
    return {"In": lambda: labels.get(key) in values, "NotIn": lambda: labels.get(key) not in values,
            "Exists": lambda: key in labels, "DoesNotExist": lambda: key not in labels}[operator]()


def admits(placement: Mapping[str, Any], labels: Mapping[str, str], taints: Iterable[Mapping[str, str]]) -> bool:
    """Whether a pod with this placement (nodeAffinity + tolerations) can run on a node with these labels and
    taints: terms are ORed, expressions ANDed; every NoSchedule/NoExecute taint must be tolerated."""
    required = (placement.get("nodeAffinity", {}).get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = required.get("nodeSelectorTerms", [])
    if terms and not any(all(_matches(e, labels) for e in t.get("matchExpressions", [])) for t in terms):
        return False

    def tolerated(taint: Mapping[str, str]) -> bool:
        return any((t.get("key") in (None, taint["key"]))
                   and (t.get("operator") == "Exists" or t.get("value") == taint.get("value"))
                   and t.get("effect") in (None, "", taint["effect"]) for t in placement.get("tolerations", []))

    return all(tolerated(t) for t in taints if t["effect"] in ("NoSchedule", "NoExecute"))


def _pools(stack: Stack) -> dict[str, tuple[str, dict[str, str], list[dict[str, str]]]]:
    """Pool name -> (role, node labels, node taints), as the cloud layer sets them."""
    return {p.name: (p.role, pool_labels(p),
                     [{"key": t.key, "value": t.value, "effect": t.effect} for t in pool_taints(p)])
            for p in stack_settings(stack).node_pools}


@pytest.mark.parametrize("stack", _aws_with(lambda s: s.addons.rook_ceph.enabled))
def test_rook_creates_osds_on_the_storage_pool_and_only_there(stack: Stack) -> None:
    """`useAllNodes: false` with no `nodes:` list selects no node (Rook ceph-cluster-crd, Storage Selection
    Settings): all nodes are candidates, and the osd/prepareosd placement narrows them to the storage pool."""
    spec = _values(stack, "rook-ceph-cluster")["cephClusterSpec"]
    storage = spec["storage"]
    assert storage["useAllNodes"] is True or storage.get("nodes"), "no node selected for OSDs"
    for daemon in ("osd", "prepareosd"):
        placement = spec["placement"][daemon]
        eligible = {name for name, (_, labels, taints) in _pools(stack).items() if admits(placement, labels, taints)}
        storage_pools = {name for name, (role, _, _) in _pools(stack).items() if role == "storage"}
        assert storage_pools and eligible == storage_pools, (daemon, eligible)


def _upstream(recording: Recording, urn: str) -> frozenset[str]:
    """Everything the engine finishes before it starts `urn` (depends_on, parents, providers, transitively)."""
    return creation_order(recording.resources)[1][urn]


@pytest.mark.parametrize("stack", _aws_with(lambda s: s.addons.rook_ceph.enabled and bool(s.workloads)))
def test_checkpoint_claims_wait_for_the_ceph_storage(stack: Stack) -> None:
    """pulumi-kubernetes waits for a PVC to bind; a CephFS claim binds only once the release creating the Ceph
    cluster, the filesystem and the StorageClass exists (and Ceph serves)."""
    recording = _recording(stack)
    [ceph] = [r.urn for r in recording.resources
              if r.type == HELM_RELEASE and release_of(r)["chart"].rsplit("/", 1)[-1] == "rook-ceph-cluster"]
    classes = {c["storageClass"]["name"] for c in _values(stack, "rook-ceph-cluster")["cephFileSystems"]}
    claims = [r for r in recording.resources if r.type == "kubernetes:core/v1:PersistentVolumeClaim"
              and r.inputs["spec"].get("storageClassName") in classes]
    assert claims
    assert [r.urn for r in claims if ceph not in _upstream(recording, r.urn)] == []


@pytest.mark.parametrize("stack", _aws_with(lambda s: s.addons.monitoring.enabled))
def test_prometheus_is_on_its_own_ebs_gp3_class(stack: Stack) -> None:
    """Prometheus on Ceph waits for Ceph on first install and goes down with it: its volume comes from an
    EBS gp3 class served by the EBS CSI add-on, and kube-prometheus-stack waits for that class, not for Ceph."""
    recording = _recording(stack)
    spec = _values(stack, "kube-prometheus-stack")["prometheus"]["prometheusSpec"]
    class_name = spec["storageSpec"]["volumeClaimTemplate"]["spec"]["storageClassName"]
    [storage_class] = [r for r in recording.resources if r.type == "kubernetes:storage.k8s.io/v1:StorageClass"
                       and r.inputs["metadata"]["name"] == class_name]
    assert storage_class.inputs["provisioner"] == "ebs.csi.aws.com"
    assert storage_class.inputs["parameters"] == {"type": "gp3", "encrypted": "true"}
    releases = {release_of(r)["chart"].rsplit("/", 1)[-1]: r.urn for r in recording.resources if r.type == HELM_RELEASE}
    waits_for = _upstream(recording, releases["kube-prometheus-stack"])
    assert storage_class.urn in waits_for
    [ebs_csi] = [r.urn for r in recording.resources
                 if r.type == "aws:eks/addon:Addon" and r.inputs["addonName"] == "aws-ebs-csi-driver"]
    assert ebs_csi in _upstream(recording, storage_class.urn)
    assert not {releases["rook-ceph"], releases["rook-ceph-cluster"]} & waits_for


@pytest.mark.parametrize("stack", _aws_with(lambda s: s.addons.cilium.enabled))
def test_tenant_default_deny_lets_pods_reach_the_pod_identity_agent(stack: Stack) -> None:
    """Cilium classifies 169.254.170.23 (the agent, host network) as the `host` entity, never a CIDR
    (cilium/cilium issue 34387): the allow rule is `toEntities: [host]` on port 80, and nothing wider."""
    policies = [r.inputs for r in _recording(stack).resources
                if r.type == "kubernetes:cilium.io/v2:CiliumNetworkPolicy"]
    assert policies
    for policy in policies:
        egress = policy["spec"].get("egress", [])
        rules = [rule for rule in egress if "host" in rule.get("toEntities", [])]
        # The default-deny policy carries the one allow; the others select fewer pods or only admit ingress.
        expected = ([[{"ports": [{"port": "80", "protocol": "TCP"}]}]]
                    if policy["metadata"]["name"] == DEFAULT_DENY_POLICY else [])
        assert [rule["toPorts"] for rule in rules] == expected, policy["metadata"]
        assert not [rule for rule in egress if any(c.startswith("169.254.170.23") for c in rule.get("toCIDR", []))]


@pytest.mark.parametrize("stack", _aws_with(lambda s: True))
def test_every_mig_pool_has_overlays_equal_to_its_layout(stack: Stack) -> None:
    """Karpenter only launches a node for a pod requesting `nvidia.com/mig-*` if a NodeOverlay says the node will
    offer it (aws/karpenter-provider-aws PR 8710), with the `nodeOverlay` gate on (off in chart 1.14.1)."""
    catalog = load_mig_catalog()
    assert _values(stack, "karpenter")["settings"]["featureGates"]["nodeOverlay"] is True
    overlays = {(o["spec"]["requirements"][0]["values"][0], o["spec"]["requirements"][1]["values"][0]):
                o["spec"]["capacity"] for o in (r.inputs for r in _recording(stack).resources
                                                if r.type == "kubernetes:karpenter.sh/v1alpha1:NodeOverlay")}
    expected = {}
    for pool in stack_settings(stack).pools("gpu"):
        for name in pool.instance_types:
            itype = INSTANCE_TYPES[name]
            if pool.mig_layout is None or itype.gpu is None or not catalog.slices(pool.mig_layout, itype.gpu):
                continue
            expected[(pool.name, name)] = {f"nvidia.com/mig-{profile}": str(count * itype.gpu_count)
                                           for profile, count in catalog.slices(pool.mig_layout, itype.gpu).items()}
    assert overlays == expected
    # Every MIG pool's types have overlays (the fleet's h100-mig at least): the comparison is never of two nothings.
    assert {pool for pool, _ in expected} == {p.name for p in stack_settings(stack).pools("gpu") if p.mig_layout}


@pytest.mark.parametrize("stack", stacks_where(lambda s: s.addons.volcano.enabled))
def test_volcano_creates_pods_for_jobs_on_empty_pools_and_reclaims_for_reclaimable_queues(stack: Stack) -> None:
    """`enqueue` keeps a gang Pending with no pods until the cluster already has its resources, so Karpenter
    never scales a pool up from zero (volcano-sh/volcano issue 3910); a reclaimable queue needs `reclaim`."""
    config = yaml.safe_load(_values(stack, "volcano")["custom"]["scheduler_config_override"])
    actions = [a.strip() for a in config["actions"].split(",")]
    assert "enqueue" not in actions and actions[0] == "allocate"
    reclaimable = [r.inputs["spec"].get("reclaimable") for r in _recording(stack).resources
                   if r.type.startswith("kubernetes:scheduling.volcano.sh/v1beta1:Queue")]
    assert reclaimable
    if any(reclaimable):
        assert "reclaim" in actions


@pytest.mark.parametrize("stack", _aws_with(lambda s: s.addons.alluxio.enabled))
def test_cache_workers_cost_no_gpu_node(stack: Stack) -> None:
    """A cache worker that can only run on a GPU pool makes Karpenter launch a GPU node for it, and WhenEmpty
    consolidation never reclaims a node running a non-DaemonSet pod (Karpenter docs, Disruption): the workers
    land only on always-on non-GPU nodes, no more of them than those nodes."""
    inputs = [r.inputs for r in _recording(stack).resources
              if r.type.startswith("kubernetes:data.fluid.io/v1alpha1:")]
    [runtime] = [i for i in inputs if i["kind"] == "AlluxioRuntime"]
    [dataset] = [i for i in inputs if i["kind"] == "Dataset"
                 and i["metadata"]["name"] == runtime["metadata"]["name"]
                 and i["metadata"]["namespace"] == runtime["metadata"]["namespace"]]
    selector = runtime["spec"]["worker"]["nodeSelector"]
    placement = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                                  dataset["spec"]["nodeAffinity"]["required"]},
                 "tolerations": dataset["spec"]["tolerations"]}
    eligible = [name for name, (_, labels, taints) in _pools(stack).items()
                if all(labels.get(k) == v for k, v in selector.items()) and admits(placement, labels, taints)]
    pools = {p.name: p for p in stack_settings(stack).node_pools}
    assert eligible and all(pools[name].role != "gpu" for name in eligible), eligible
    assert runtime["spec"]["replicas"] <= sum(pools[name].min_size for name in eligible)


@pytest.mark.parametrize("stack", _aws_with(lambda s: s.addons.gpu_operator.enabled))
def test_mig_manager_may_reboot_cloud_gpu_nodes(stack: Stack) -> None:
    """On cloud VMs a MIG mode change may need a reboot (no exposed GPU reset): NVIDIA's GPU Operator MIG docs
    ask for the mig-manager's WITH_REBOOT=true there."""
    env = _values(stack, "gpu-operator")["migManager"].get("env", [])
    assert {"name": "WITH_REBOOT", "value": "true"} in env
