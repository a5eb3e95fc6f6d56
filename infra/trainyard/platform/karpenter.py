"""Karpenter in the cluster: the controller chart, then one EC2NodeClass and one NodePool per GPU pool.

The platform layer installs it, on AWS, after the CNI (the controller's pods need pod networking) and, when
monitoring is on, after kube-prometheus-stack (its chart ships a ServiceMonitor): see platform/addons.yaml.

Teardown: node classes and pools are *not* deleted with the cluster (`controller_deletes`) and depend on the
release, so `pulumi destroy` deletes them first, while the controller still runs and can terminate the EC2
instances behind them; only then is the release removed (that one is `deleted_with` the cluster).

GPU pools disrupt no node voluntarily while it runs pods (consolidation only when empty, no budget for drift or
underutilization, no expiry), so training pods carry no `karpenter.sh/do-not-disrupt`: Karpenter's drain on an
interruption skips pods that do, and they must get SIGTERM to checkpoint (workloads/pod.py). An EFA pool's node
class lists its interfaces: the primary ENI on card 0 and one IP-less `efa-only` interface per network card
(`efa_network_interfaces`), so every node offers `PoolFacts.efa_interfaces` EFA devices, which EFA jobs request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from trainyard import names
from trainyard.cloud.context import ClusterContext, KarpenterFacts, PoolFacts
from trainyard.config.instance_types import INSTANCE_TYPES
from trainyard.config.mig import MigCatalog, load_mig_catalog
from trainyard.config.model import Settings
from trainyard.platform.addon import AddonCode, AddonContext
from trainyard.platform.kube import HelmChart, helm_release, k8s_options, labels
from trainyard.platform.objects import custom_resource
from trainyard.platform.pod_identity_check import SCRIPT as POD_IDENTITY_SCRIPT
from trainyard.platform.pod_identity_check import PodIdentityCheck, PodIdentityCheckArgs

NODE_CLASS_API = "karpenter.k8s.aws/v1"
NODE_POOL_API = "karpenter.sh/v1"
NODE_OVERLAY_API = "karpenter.sh/v1alpha1"
ROOT_DEVICE = "/dev/xvda"
# Cilium removes this taint once its agent runs on the node; until then no pod may start there.
# The device plugin's name for time-sliced replicas (renameByDefault: platform/gpu-operator/values.yaml).
SHARED_GPU_RESOURCE = "nvidia.com/gpu.shared"
CILIUM_STARTUP_TAINT = {"key": names.CILIUM_AGENT_NOT_READY_TAINT_KEY, "value": "true", "effect": "NoExecute"}
# Empty nodes go after a short wait (GPU hours are expensive); non-empty ones are never consolidated.
CONSOLIDATE_AFTER = "10m"
# How long a deleted node waits for its pods (a checkpoint) before they are removed anyway.
TERMINATION_GRACE = "4h"


def efa_network_interfaces(cards: int) -> list[dict[str, Any]]:
    """The primary ENI on card 0 and one `efa-only` interface at device index 1 of each of `cards` network cards.

    Without this list Karpenter gives a node launched for EFA pods one `efa` interface *with IPs* per card
    (aws/karpenter-provider-aws v1.14.1 pkg/providers/launchtemplate/launchtemplate.go generateNetworkInterfaces),
    which Cilium's ENI IPAM lists and hands to pods: the layout cilium/cilium issue 42600 breaks past two EFA
    devices. An `efa-only` interface has no IPv4 address, and Cilium lists ENIs with the EC2 filter
    `private-ip-address=*` (cilium pkg/aws/ec2/ec2.go describeNetworkInterfaces), so it never sees one: its pods
    stay on card 0's ENIs. Every EFA type here has one EFA per network card (p4d 4, p5/p5e 32, p5en 16, g5.48xlarge
    1: karpenter-provider-aws v1.14.1 pkg/providers/instancetype/zz_generated.vpclimits.go), so a pool's
    `efa_interfaces` (the least of its types) is the number of cards every type has."""
    # CEL rules of v1.14.1 pkg/apis/v1/ec2nodeclass.go: an `interface` at card 0 / device 0, at most one efa-only
    # per card; device index 1 beside the primary and on the other cards as AWS advises (EC2 User Guide,
    # efa-acc-inst-types.html; Karpenter's own default, launchtemplate.go).
    return [{"networkCardIndex": 0, "deviceIndex": 0, "interfaceType": "interface"},
            *({"networkCardIndex": card, "deviceIndex": 1, "interfaceType": "efa-only"} for card in range(cards))]


def node_class_spec(pool: PoolFacts, facts: KarpenterFacts) -> dict[str, Any]:
    discovery = [{"tags": {"karpenter.sh/discovery": facts.discovery_tag}}]
    spec: dict[str, Any] = {
        # One pinned alias: Karpenter picks the NVIDIA variant of that AMI release for GPU instance types.
        "amiSelectorTerms": [{"alias": facts.ami_alias}],
        "role": facts.node_role,
        "subnetSelectorTerms": discovery,
        "securityGroupSelectorTerms": discovery,
        "userData": pool.user_data,
        "blockDeviceMappings": [{
            "deviceName": ROOT_DEVICE, "rootVolume": True,
            "ebs": {"volumeSize": f"{pool.root_volume_gib}Gi", "volumeType": "gp3", "encrypted": True,
                    "deleteOnTermination": True},
        }],
        # IMDSv2 only and one hop, as on the managed groups: pods use Pod Identity, never node credentials.
        "metadataOptions": {"httpEndpoint": "enabled", "httpProtocolIPv6": "disabled",
                            "httpPutResponseHopLimit": 1, "httpTokens": "required"},
    }
    if pool.efa_interfaces:
        spec["networkInterfaces"] = efa_network_interfaces(pool.efa_interfaces)
    if pool.placement_group is not None:
        spec["placementGroupSelector"] = {"name": pool.placement_group}
    if pool.capacity_reservations:
        # By id: Karpenter launches `reserved` nodes only into reservations these terms select, never into an
        # `open` ODCR it was not told about (website/content/en/docs/tasks/odcrs.md @v1.14.1).
        spec["capacityReservationSelectorTerms"] = [{"id": rid} for rid in pool.capacity_reservations]
    return spec


def pool_limits(pool: PoolFacts) -> dict[str, str]:
    """What bounds a pool at maxSize nodes. Karpenter counts an initialized node at the capacity the node itself
    reports (kubernetes-sigs/karpenter v1.14.1 pkg/controllers/state/statenode.go Capacity), and a node whose GPUs
    mig-manager partitioned reports nvidia.com/mig-*, not nvidia.com/gpu, so a GPU limit stops bounding a MIG pool.
    Every state node counts as one `nodes` (same file; scheduling/scheduler.go enforces node limits before
    launch), whatever its GPUs show, so that is the limit of every pool; pools without a MIG layout keep their GPU
    limit too."""
    limits = {"nodes": str(pool.max_nodes)}
    if pool.mig_layout is None:
        limits[names.GPU_TAINT_KEY] = str(pool.max_nodes * pool.gpus_per_node)
    return limits


def node_pool_spec(pool: PoolFacts, node_class: str) -> dict[str, Any]:
    requirements = [
        {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": list(pool.instance_types)},
        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": list(pool.capacity_types)},
        {"key": "topology.kubernetes.io/zone", "operator": "In", "values": list(pool.zones)},
        {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
        {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]},
    ]
    if pool.capacity_blocks_only:
        # Says so in the object: a Capacity Block pool's nodes sit together in the EC2 network, which a hard
        # networkTopology job relies on (the rehearsal's hard-topology-co-located rule reads it). Karpenter takes
        # the label as a requirement (website/content/en/docs/tasks/odcrs.md @v1.14.1).
        requirements.append({"key": "karpenter.k8s.aws/capacity-reservation-type", "operator": "In",
                             "values": ["capacity-block"]})
    return {
        "template": {
            # Includes nvidia.com/mig.config: nodes launched from zero come up partitioned by mig-manager.
            "metadata": {"labels": dict(pool.node_labels)},
            "spec": {
                "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": node_class},
                "requirements": requirements,
                "taints": [{"key": t.key, "value": t.value, "effect": t.effect} for t in pool.taints],
                # Karpenter counts a node with only these left as capacity to come (kubernetes-sigs/karpenter
                # pkg/controllers/state/statenode.go Taints); DaemonSets that tolerate them remove them.
                "startupTaints": [CILIUM_STARTUP_TAINT, *({"key": t.key, "value": t.value, "effect": t.effect}
                                                         for t in pool.startup_taints)],
                # Expiry is forceful (ignores do-not-disrupt): never expire a node under a training job.
                "expireAfter": "Never",
                "terminationGracePeriod": TERMINATION_GRACE,
            },
        },
        "limits": pool_limits(pool),
        "disruption": {
            "consolidationPolicy": "WhenEmpty",
            "consolidateAfter": CONSOLIDATE_AFTER,
            "budgets": [
                {"nodes": "0", "reasons": ["Underutilized", "Drifted"]},
                {"nodes": "1", "reasons": ["Empty"]},
            ],
        },
    }


def overlay_capacity(pool: PoolFacts, instance_type: str, mig: MigCatalog, replicas: int = 0) -> dict[str, str]:
    """The device-plugin resources a node of this pool and type offers that its instance type does not say: MIG
    slices once mig-manager applied the layout (`mixed` strategy: one extended resource per profile), or a
    time-sliced pool's `replicas` per GPU as nvidia.com/gpu.shared; nothing otherwise."""
    gpus = INSTANCE_TYPES[instance_type].gpu_count
    if pool.gpu_sharing == "time-sliced" and replicas:
        return {SHARED_GPU_RESOURCE: str(gpus * replicas)}
    if pool.mig_layout is None or pool.gpu is None or not mig.slices(pool.mig_layout, pool.gpu):
        return {}
    return {resource: str(per_gpu * gpus)
            for resource, per_gpu in sorted(mig.resource_names(pool.mig_layout, pool.gpu).items())}


def node_overlay(pool: PoolFacts, instance_type: str, capacity: dict[str, str]) -> dict[str, Any]:
    """Tells Karpenter's scheduling simulation that this pool's nodes of this type offer `capacity`: without it
    a pod requesting `nvidia.com/mig-*` matches no instance type and a MIG pool never launches from zero
    (aws/karpenter-provider-aws PR 8710; NodeOverlay CRD karpenter.sh/v1alpha1 `capacity`)."""
    return {
        "apiVersion": NODE_OVERLAY_API,
        "kind": "NodeOverlay",
        "metadata": {"name": f"{pool.name}-{instance_type}", "labels": _labels(pool)},
        "spec": {
            "requirements": [
                {"key": "karpenter.sh/nodepool", "operator": "In", "values": [pool.name]},
                {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": [instance_type]},
            ],
            "capacity": capacity,
        },
    }


@dataclass(frozen=True)
class KarpenterArgs:
    cluster: ClusterContext
    chart: HelmChart
    # What must run before the controller: the CNI release, kube-prometheus-stack when monitoring is on.
    after: tuple[pulumi.Resource, ...] = ()
    # Replace nodes whose node-monitoring-agent conditions stay bad (settings.featureGates.nodeRepair).
    node_repair: bool = False
    # The CNI chart's version: the Pod Identity check before the controller re-runs when it changes.
    cilium_version: str = ""
    # Replicas per GPU on time-sliced pools (addons.gpuOperator.timeSlicing.replicas).
    time_slicing_replicas: int = 0


class Karpenter(pulumi.ComponentResource):
    """The Karpenter release and, per GPU pool, an EC2NodeClass and a NodePool named after the pool."""

    release: k8s.helm.v3.Release
    node_classes: dict[str, k8s.apiextensions.CustomResource]
    node_pools: dict[str, k8s.apiextensions.CustomResource]
    node_overlays: list[pulumi.Resource]

    def __init__(self, name: str, args: KarpenterArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("trainyard:platform:Karpenter", name, None, opts)
        cluster = args.cluster
        facts = cluster.karpenter
        if facts is None:
            raise ValueError("Karpenter needs the AWS target's KarpenterFacts (ClusterContext.karpenter)")
        # The controller's AWS credentials come through Pod Identity across Cilium's datapath: proven first.
        self.pod_identity_check = PodIdentityCheck(f"{name}-pod-identity-check", PodIdentityCheckArgs(
            cluster=cluster, cilium_version=args.cilium_version,
            script=POD_IDENTITY_SCRIPT.read_text(encoding="utf-8"), depends_on=args.after),
            opts=pulumi.ResourceOptions(parent=self))
        self.release = helm_release(
            name, args.chart, cluster, self, depends_on=[*args.after, self.pod_identity_check.job],
            values={
                "settings": {"clusterName": cluster.name, "interruptionQueue": facts.interruption_queue,
                             # Alpha in 1.14 (chart values.yaml); repairs ignore disruption budgets: README,
                             # "GPU node health".
                             "featureGates": {"nodeRepair": args.node_repair}},
                # The node's resolver (VPC DNS): the controller must not wait for CoreDNS to reach AWS APIs.
                "dnsPolicy": "Default",
            })
        self.node_classes = {}
        self.node_pools = {}
        self.node_overlays = []
        mig = load_mig_catalog()
        for pool in cluster.pools_with("gpu"):
            node_class = k8s.apiextensions.CustomResource(
                f"{name}-{pool.name}-nodeclass", api_version=NODE_CLASS_API, kind="EC2NodeClass",
                metadata={"name": pool.name, "labels": _labels(pool)}, spec=node_class_spec(pool, facts),
                opts=k8s_options(cluster, self, [self.release], controller_deletes=True))
            self.node_classes[pool.name] = node_class
            self.node_pools[pool.name] = k8s.apiextensions.CustomResource(
                f"{name}-{pool.name}-nodepool", api_version=NODE_POOL_API, kind="NodePool",
                metadata={"name": pool.name, "labels": _labels(pool)}, spec=node_pool_spec(pool, pool.name),
                opts=k8s_options(cluster, self, [self.release, node_class], controller_deletes=True))
            for instance_type in pool.instance_types:
                capacity = overlay_capacity(pool, instance_type, mig, args.time_slicing_replicas)
                if capacity:
                    # Capacity, like the NodePool: deleted by the API while Karpenter runs, not with the cluster.
                    self.node_overlays.append(custom_resource(
                        f"{name}-{pool.name}-{instance_type}-overlay", node_overlay(pool, instance_type, capacity),
                        k8s_options(cluster, self, [self.release], controller_deletes=True)))
        self.register_outputs({"nodePools": list(self.node_pools)})


def _labels(pool: PoolFacts) -> dict[str, str]:
    return labels("karpenter", "node-pool", **{names.POOL_LABEL: pool.name})


def build(ctx: AddonContext) -> Karpenter:
    return Karpenter(ctx.addon.resource_name, KarpenterArgs(
        cluster=ctx.cluster, chart=ctx.chart("karpenter"), after=ctx.monitored,
        node_repair=ctx.stack.addons.gpu_health.repair,
        time_slicing_replicas=ctx.stack.addons.gpu_operator.time_slicing.replicas,
        cilium_version=ctx.catalogue.chart("cilium").version))


def _on_aws(stack: Settings) -> bool:
    # The cloud layer provisions Karpenter's AWS side (queue, node role) on every AWS stack.
    return stack.is_aws


COMPONENT = AddonCode(build=build, applies=_on_aws)
