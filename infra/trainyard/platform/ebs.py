"""An encrypted EBS gp3 StorageClass from the EKS EBS CSI add-on: volumes that need no in-cluster storage."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

from trainyard.cloud.context import ClusterContext
from trainyard.platform.kube import k8s_options, labels

EBS_GP3_CLASS = "ebs-gp3"
# The EBS CSI driver's provisioner name (kubernetes-sigs/aws-ebs-csi-driver docs/parameters.md).
EBS_CSI_PROVISIONER = "ebs.csi.aws.com"
DEFAULT_CLASS_ANNOTATION = "storageclass.kubernetes.io/is-default-class"


@dataclass(frozen=True)
class EbsStorageClassArgs:
    cluster: ClusterContext
    # The aws-ebs-csi-driver add-on: the class is only useful once its controller provisions.
    depends_on: Sequence[pulumi.Resource] = ()


class EbsStorageClass(pulumi.ComponentResource):
    """The cluster's default class: Prometheus and any claim naming no class get EBS, never Ceph."""

    def __init__(self, name: str, args: EbsStorageClassArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("trainyard:platform:EbsStorageClass", name, None, opts)
        self.name = EBS_GP3_CLASS
        self.storage_class = k8s.storage.v1.StorageClass(
            f"{name}-class",
            metadata={"name": EBS_GP3_CLASS, "labels": labels(EBS_GP3_CLASS, "storage"),
                      "annotations": {DEFAULT_CLASS_ANNOTATION: "true"}},
            provisioner=EBS_CSI_PROVISIONER,
            # `type` and `encrypted` are the driver's StorageClass parameters (aws-ebs-csi-driver docs/parameters.md).
            parameters={"type": "gp3", "encrypted": "true"},
            reclaim_policy="Delete",
            allow_volume_expansion=True,
            # EBS volumes live in one zone: provision where the pod is scheduled (Kubernetes storage-classes docs).
            volume_binding_mode="WaitForFirstConsumer",
            opts=k8s_options(args.cluster, self, args.depends_on))
        self.register_outputs({"name": self.name})
