"""Pulumi type tokens (`provider:module:Type`, as the engine records them) of the resources the rehearsal reads."""

from __future__ import annotations

# AWS (pulumi-aws)
EKS_CLUSTER = "aws:eks/cluster:Cluster"
EKS_ADDON = "aws:eks/addon:Addon"
NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
POD_IDENTITY = "aws:eks/podIdentityAssociation:PodIdentityAssociation"

# Kubernetes (pulumi-kubernetes)
K8S_PROVIDER = "pulumi:providers:kubernetes"
RELEASE = "kubernetes:helm.sh/v3:Release"
CONFIG_MAP = "kubernetes:core/v1:ConfigMap"
PVC = "kubernetes:core/v1:PersistentVolumeClaim"
STORAGE_CLASS = "kubernetes:storage.k8s.io/v1:StorageClass"
JOB = "kubernetes:batch/v1:Job"
CRON_JOB = "kubernetes:batch/v1:CronJob"
CLUSTER_ROLE = "kubernetes:rbac.authorization.k8s.io/v1:ClusterRole"
CLUSTER_ROLE_BINDING = "kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding"

# Custom resources of the add-ons
NODE_POOL = "kubernetes:karpenter.sh/v1:NodePool"
NODE_CLASS = "kubernetes:karpenter.k8s.aws/v1:EC2NodeClass"
NODE_OVERLAY = "kubernetes:karpenter.sh/v1alpha1:NodeOverlay"
VOLCANO_JOB = "kubernetes:batch.volcano.sh/v1alpha1:Job"
QUEUES = ("kubernetes:scheduling.volcano.sh/v1beta1:Queue", "kubernetes:scheduling.volcano.sh/v1beta1:QueuePatch")
ALLUXIO_RUNTIME = "kubernetes:data.fluid.io/v1alpha1:AlluxioRuntime"
DATASET = "kubernetes:data.fluid.io/v1alpha1:Dataset"
CILIUM_POLICY = "kubernetes:cilium.io/v2:CiliumNetworkPolicy"
