"""EKS managed add-ons, pinned per Kubernetes version in `config/releases.py`.

The cluster is created without aws-node, kube-proxy or CoreDNS. Add-ons whose pods need the pod network
(CoreDNS, the EBS CSI controller, the snapshot controller) can only become healthy once Cilium runs on nodes, and
EKS waits for an add-on to be healthy, so they are a separate component the platform layer creates after the
Cilium release and the node groups (in `cluster.ready` by then)::

    from trainyard.cloud.addons import EksAddons, after_cni_addons

    EksAddons("eks-addons", after_cni_addons(settings, cluster.name),
              opts=pulumi.ResourceOptions(depends_on=[cilium_release, *cluster.ready]))

The pod identity agent runs on the host network, so the cloud layer installs it with the control plane, before
Cilium (whose operator gets its EC2 permissions through Pod Identity) and before any node: see `before_cni_addons`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_aws as aws

from trainyard.cloud.naming import base_tags
from trainyard.config.model import Settings
from trainyard.config.releases import KUBERNETES_RELEASES


@dataclass(frozen=True, slots=True)
class AddonPin:
    name: str
    version: str
    # The add-on's configuration values (its Helm chart values, checked by EKS against the add-on's schema).
    configuration: dict[str, Any] | None = None


# The node monitoring agent's own DCGM host engine (dcgmAgent, used for its GPU checks) tolerates nothing by
# default (chart values.yaml v1.7.0); GPU nodes are tainted, quarantined ones doubly so. The agent itself
# already tolerates everything.
NODE_MONITORING_AGENT_CONFIG: dict[str, Any] = {"dcgmAgent": {"tolerations": [{"operator": "Exists"}]}}


@dataclass(frozen=True)
class EksAddonsArgs:
    cluster_name: pulumi.Input[str]
    addons: tuple[AddonPin, ...]
    tags: dict[str, str] = field(default_factory=dict)


def before_cni_addons(settings: Settings, cluster_name: pulumi.Input[str]) -> EksAddonsArgs:
    release = KUBERNETES_RELEASES[settings.cluster.kubernetes_version]
    return EksAddonsArgs(cluster_name, (AddonPin("eks-pod-identity-agent", release.pod_identity_agent),),
                         base_tags(settings))


def after_cni_addons(settings: Settings, cluster_name: pulumi.Input[str]) -> EksAddonsArgs:
    release = KUBERNETES_RELEASES[settings.cluster.kubernetes_version]
    return EksAddonsArgs(cluster_name, (
        AddonPin("coredns", release.coredns),
        AddonPin("aws-ebs-csi-driver", release.ebs_csi_driver),
        # Ships the snapshot.storage.k8s.io CRDs Rook's VolumeSnapshotClasses need.
        AddonPin("snapshot-controller", release.snapshot_controller),
        # Node conditions (AcceleratedHardwareReady, KernelReady, NetworkingReady, StorageReady,
        # ContainerRuntimeReady) that Karpenter's node repair acts on; EKS user guide, node-health-nma.
        *((AddonPin("eks-node-monitoring-agent", release.node_monitoring_agent, NODE_MONITORING_AGENT_CONFIG),)
          if settings.addons.gpu_health.repair else ()),
    ), base_tags(settings))


class EksAddons(pulumi.ComponentResource):
    """One `aws.eks.Addon` per pin; Pulumi owns the fields it sets (conflicts are overwritten)."""

    addons: dict[str, aws.eks.Addon]

    def __init__(self, name: str, args: EksAddonsArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("trainyard:cloud:EksAddons", name, None, opts)
        self.addons = {
            pin.name: aws.eks.Addon(
                f"{name}-{pin.name}", cluster_name=args.cluster_name, addon_name=pin.name,
                addon_version=pin.version,
                configuration_values=json.dumps(pin.configuration) if pin.configuration is not None else None,
                resolve_conflicts_on_create="OVERWRITE",
                resolve_conflicts_on_update="OVERWRITE", tags=args.tags,
                opts=pulumi.ResourceOptions(parent=self))
            for pin in args.addons
        }
        self.register_outputs({"addons": list(self.addons)})
