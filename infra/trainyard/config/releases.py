"""Pinned releases per supported Kubernetes version: node AMIs and EKS-managed add-ons.

Every pin must be listed in `release_data/` (dated upstream release data, refreshed by tools/refresh_releases.py)
or in `release_data/unverified.yaml` with the reason: tests/config/test_release_pins.py checks each one.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class KubernetesRelease:
    version: str
    # EKS-optimized AL2023 AMI release (the same date stamp for the standard and NVIDIA variants).
    ami_release: str
    # The managed node group `release_version` of that AMI (Kubernetes patch + date stamp).
    node_group_release: str
    coredns: str
    ebs_csi_driver: str
    pod_identity_agent: str
    snapshot_controller: str
    # EKS add-on eks-node-monitoring-agent: aws/eks-node-monitoring-agent tag v1.7.0 (2026-08-04),
    # charts/eks-node-monitoring-agent/values.yaml nodeAgent.image.tag; one agent build serves every EKS version.
    node_monitoring_agent: str = "v1.7.0-eksbuild.1"

    @property
    def karpenter_ami_alias(self) -> str:
        """Karpenter picks the NVIDIA variant of this AMI by itself for GPU instance types."""
        return f"al2023@v{self.ami_release}"


# Each EKS managed add-on a KubernetesRelease pins -> the field holding its version: config/release_check.py checks
# these pins, tools/refresh_releases.py eks-addons reads the versions of these add-ons.
ADDON_FIELDS: dict[str, str] = {
    "coredns": "coredns",
    "aws-ebs-csi-driver": "ebs_csi_driver",
    "eks-pod-identity-agent": "pod_identity_agent",
    "snapshot-controller": "snapshot_controller",
    "eks-node-monitoring-agent": "node_monitoring_agent",
}


KUBERNETES_RELEASES: dict[str, KubernetesRelease] = {
    r.version: r
    for r in (
        # AMI release v20260714, the newest in awslabs/amazon-eks-ami CHANGELOG.md (release_data/eks-ami.yaml);
        # add-on versions unverified (release_data/unverified.yaml).
        KubernetesRelease("1.33", "20260714", "1.33.13-20260714", coredns="v1.12.4-eksbuild.1",
                          ebs_csi_driver="v1.52.1-eksbuild.1", pod_identity_agent="v1.3.10-eksbuild.1",
                          snapshot_controller="v8.3.0-eksbuild.1"),
        KubernetesRelease("1.34", "20260714", "1.34.9-20260714", coredns="v1.12.4-eksbuild.1",
                          ebs_csi_driver="v1.52.1-eksbuild.1", pod_identity_agent="v1.3.10-eksbuild.1",
                          snapshot_controller="v8.3.0-eksbuild.1"),
    )
}
