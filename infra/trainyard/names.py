"""Names shared across layers: the cloud layer grants IAM to service accounts the platform layer creates."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ServiceAccountRef:
    namespace: str
    name: str


# Label every node carries with its pool role; add-ons select system, storage or GPU nodes by it.
ROLE_LABEL = "trainyard.io/role"
POOL_LABEL = "trainyard.io/pool"
GPU_TAINT_KEY = "nvidia.com/gpu"
# Label and taint (NoSchedule) of pools whose GPUs serve several pods: `mig` (a partitioning MIG layout) or
# `time-sliced` (nodePools[].gpuSharing). Only pods that tolerate it land there; whole-GPU training never does.
GPU_SHARING_KEY = "trainyard.io/gpu-sharing"
# Where a node sits in the EC2 network, top layer first: set by EKS's cloud controller from DescribeInstanceTopology
# (kubernetes/cloud-provider-aws pkg/providers/v1/instances_v2.go); Volcano builds its HyperNodes from them.
NETWORK_LAYER_LABELS = tuple(f"topology.k8s.aws/network-node-layer-{layer}" for layer in (1, 2, 3))
# The GPU Operator's device plugin picks its config (devicePlugin.config.data key) by this node label.
DEVICE_PLUGIN_CONFIG_LABEL = "nvidia.com/device-plugin.config"
# That config's name for time-sliced pools (platform/gpu-operator/values.yaml devicePlugin.config.data).
TIME_SLICED_CONFIG = "time-sliced"
# GPU node admission (platform/gpu-health/gpu-health-check.sh spells the same keys): a Karpenter startup taint
# that only a passed check removes, the taint a failed check adds, and the node label with the result.
GPU_HEALTH_TAINT_KEY = "trainyard.io/gpu-health"
GPU_HEALTH_FAILED_TAINT_KEY = "trainyard.io/gpu-health-failed"
GPU_HEALTH_LABEL = "trainyard.io/gpu-health"
# The namespace the GPU admission check runs in (platform/gpu_health.py): reserved like the charts' namespaces.
GPU_HEALTH_NAMESPACE = "gpu-health"
# Cilium's startup taint on every node until its agent runs (docs.cilium.io, "Considerations on node pool taints
# and unmanaged pods").
CILIUM_AGENT_NOT_READY_TAINT_KEY = "node.cilium.io/agent-not-ready"
# mig-manager partitions a node's GPUs to the layout this label names (NVIDIA/mig-parted, k8s-mig-manager).
MIG_CONFIG_LABEL = "nvidia.com/mig.config"

KARPENTER = ServiceAccountRef("kube-system", "karpenter")
EBS_CSI = ServiceAccountRef("kube-system", "ebs-csi-controller-sa")
CILIUM_OPERATOR = ServiceAccountRef("kube-system", "cilium-operator")
# The first-bring-up Pod Identity check (platform/pod_identity_check.py): an association to a role with no rights.
POD_IDENTITY_CHECK = ServiceAccountRef("kube-system", "pod-identity-check")
# The trainer's service account exists in every tenant namespace; the role it gets writes checkpoints.
TRAINER_SERVICE_ACCOUNT = "trainer"
# Alluxio workers read the dataset bucket; Fluid runs them in the dataset namespace. The AlluxioRuntime has no
# field for a service account, so its pods run as the namespace's `default` one: the namespace holds nothing
# but the dataset runtime, so that account is what gets the read-only dataset role.
DATASET_NAMESPACE = "trainyard-data"
ALLUXIO = ServiceAccountRef(DATASET_NAMESPACE, "default")


# The fabric checks run in a namespace and queue of their own, not a tenant's (platform/tenants.py).
FABRIC_CHECK_NAMESPACE = "trainyard-fabric-check"
FABRIC_CHECK_QUEUE = "fabric-check"
# Experiment tracking (platform/mlflow.py): the MLflow server's namespace, Service, port and account (no AWS role).
# Tenants reach it at MLFLOW_TRACKING_URI.
MLFLOW_NAMESPACE = "mlflow"
MLFLOW_SERVICE = "mlflow"
MLFLOW_PORT = 5000
MLFLOW = ServiceAccountRef(MLFLOW_NAMESPACE, "mlflow")
# `local`'s CloudNativePG cluster for MLflow: a namespace of its own, where no tenant has a Role (members may
# port-forward to pods of the MLflow namespace, and a port-forward passes every network policy).
MLFLOW_DATABASE_NAMESPACE = "mlflow-db"
MLFLOW_TRACKING_URI = f"http://{MLFLOW_SERVICE}.{MLFLOW_NAMESPACE}.svc.cluster.local:{MLFLOW_PORT}"
# Where a tenant's MLflow artifacts go, below its namespace prefix of the checkpoint bucket (the trainer role's).
MLFLOW_ARTIFACT_DIR = "mlflow"
# The Secret every tenant namespace gets with the tracking URI, the tenant's MLflow user and password, and on AWS its
# artifact root (platform/mlflow_auth.py); pods take it whole as their environment.
MLFLOW_CLIENT_CONFIG = "mlflow-client"
# The auth app's admin user (platform/mlflow_auth.py); each tenant's MLflow user and workspace take the tenant's name.
MLFLOW_ADMIN_USERNAME = "admin"
# What a tenant may not be named while MLflow is on: the admin, and the workspace names MLflow keeps for itself
# (`default`: mlflow/utils/workspace_utils.py DEFAULT_WORKSPACE_NAME; the rest are path segments:
# mlflow/store/workspace/abstract_store.py WorkspaceNameValidator._RESERVED @ 3.17.2).
MLFLOW_RESERVED_NAMES = frozenset({MLFLOW_ADMIN_USERNAME, "default", "workspaces", "api", "ajax-api", "static-files"})
MLFLOW_MIN_NAME = 2  # WorkspaceNameValidator._MIN_LENGTH @ 3.17.2
# Each tenant's own Grafana (platform/tenant_grafana.py): the namespace holding nothing else, and its one pod per
# tenant, `grafana-<tenant>-0`, the StatefulSet's name being the prefix and the tenant's name.
TENANT_GRAFANA_NAMESPACE = "tenant-grafana"
TENANT_GRAFANA_PREFIX = "grafana-"
# The training pipeline (platform/argo_workflows.py): Argo's namespace, and the account every tenant's workflow
# pods run as (the WorkflowTemplates name it); it gets the trainer's pod identity (its namespace's S3 prefix).
WORKFLOWS_NAMESPACE = "argo"
WORKFLOW_SERVICE_ACCOUNT = "workflow"
# Where Argo keeps a workflow's artifacts, below the namespace prefix of the checkpoint bucket.
WORKFLOW_ARTIFACT_DIR = "argo"


def tenant_group(tenant: str) -> str:
    """The Kubernetes group a tenant's RoleBinding names when the stack names none (tenants[].access.group)."""
    return f"trainyard:tenant:{tenant}"


# Namespace label naming the one Volcano queue the namespace's jobs may use (an admission policy enforces it).
QUEUE_LABEL = "trainyard.io/queue"


def fabric_check_job(pool: str) -> str:
    """The Volcano job that checks one EFA pool's fabric (config rules and the workload layer both need it)."""
    return f"fabric-check-{pool}"
