"""Rules on what a training job's pods need of GPU nodes: the device plugin that advertises GPUs, whole GPUs where
MIG does not split them, and a trainer config that fits the smallest device the job can get."""

from __future__ import annotations

from trainyard import names
from trainyard.plan.cluster_model import admits
from trainyard.plan.recording import ResourceRecord
from trainyard.plan.resource_types import VOLCANO_JOB
from trainyard.plan.rules.base import Moment, of_type, ready_pools, rule
from trainyard.plan.trainer_check import trainer_problem
from trainyard.plan.volcano_jobs import task_pods

GPU_OPERATOR_CHART = "gpu-operator"
WHOLE_GPU = "nvidia.com/gpu"


# nvidia.com/gpu and nvidia.com/mig-* are extended resources only the NVIDIA device plugin advertises on a node,
# and the GPU Operator is what deploys it here (kubernetes.io/docs/concepts/extend-kubernetes/compute-storage-net/
# device-plugins; NVIDIA/gpu-operator): without it Karpenter may launch the node, but the pod stays Pending.
@rule("gpu-device-plugin", of_type(VOLCANO_JOB),
      "Kubernetes device plugins; the NVIDIA device plugin is deployed by the GPU Operator")
def gpu_device_plugin(record: ResourceRecord, moment: Moment) -> str | None:
    if GPU_OPERATOR_CHART in moment.after.charts:
        return None
    for pod, _replicas in task_pods(record):
        if nvidia := [r for r in pod.extended_resources if r.startswith("nvidia.com/")]:
            return (f"{pod.name} would hang Pending: it requests {', '.join(nvidia)}, which only the device plugin "
                    f"of the GPU Operator advertises, and no {GPU_OPERATOR_CHART} release is installed")
    return None


# With the mixed MIG strategy (platform/gpu-operator/values.yaml) the device plugin advertises a MIG-enabled GPU
# only as its slices, nvidia.com/mig-<profile>, never as nvidia.com/gpu: a pod asking for whole GPUs never fits a
# node mig-manager partitioned (nvidia.com/mig.config).
@rule("whole-gpus-on-mig", of_type(VOLCANO_JOB), "NVIDIA/k8s-device-plugin README, MIG support (mixed strategy)")
def whole_gpus_on_mig(record: ResourceRecord, moment: Moment) -> str | None:
    pools = ready_pools(moment.after)
    for pod, _replicas in task_pods(record):
        if WHOLE_GPU not in pod.requests:
            continue
        landing = [p for p in pools if admits(pod, p)]
        if landing and all(names.MIG_CONFIG_LABEL in p.labels for p in landing):
            return (f"{pod.name} would hang Pending: it requests whole GPUs ({WHOLE_GPU}) and every pool it may "
                    f"land on ({', '.join(p.name for p in landing)}) partitions its GPUs with MIG "
                    f"({names.MIG_CONFIG_LABEL}), which advertises only MIG slices")
    return None


# The trainer accepts its config at every node count of the job's range, and fits the smallest device its pods
# can get (issue 19 finding 4: an elastic job that forms at a size its batch cannot split fails there).
@rule("trainer-config-valid", of_type(VOLCANO_JOB),
      "trainyard_train validate.check_node_range and planner.check_fits (the trainer's own checks)")
def trainer_config_valid(record: ResourceRecord, moment: Moment) -> str | None:
    return trainer_problem(record, moment.records, {pool.name: pool for pool in moment.after.pools})
