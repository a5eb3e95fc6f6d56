"""Training pods carry what the trainer's tracker reads (trainyard_train/tracking.py): their namespace's MLflow
client settings and user from the optional Secret, and their namespace and job as the experiment."""

from __future__ import annotations

import pytest
from owned_stacks import recording
from trainyard.names import MLFLOW_CLIENT_CONFIG
from trainyard.plan.runtime import STACKS_DIR, available_stacks
from trainyard.workloads.pod import JOB_LABEL
from trainyard_train.tracking import TrackingTarget

VOLCANO_JOB = "kubernetes:batch.volcano.sh/v1alpha1:Job"


@pytest.mark.parametrize("stack_name", available_stacks())
def test_every_training_pod_reads_its_namespaces_tracking_settings(stack_name: str) -> None:
    jobs = [r.inputs for r in recording((stack_name, STACKS_DIR)).resources if r.type == VOLCANO_JOB
            and r.inputs["metadata"]["labels"].get("app.kubernetes.io/component") == "training"]
    assert jobs, f"stack {stack_name} renders no training job"
    for job in jobs:
        (container,) = job["spec"]["tasks"][0]["template"]["spec"]["containers"]
        # Optional: on a stack without MLflow the Secret is absent and the pod starts all the same.
        assert container["envFrom"] == [{"secretRef": {"name": MLFLOW_CLIENT_CONFIG, "optional": True}}]
        env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
        assert TrackingTarget.from_env(env) is None  # no URI in the pod spec itself: only the Secret turns it on
        target = TrackingTarget.from_env({**env, "MLFLOW_TRACKING_URI": "http://mlflow.mlflow.svc.cluster.local:5000"})
        # Experiment names are one namespace for the whole server: the tenant's namespace keeps them apart.
        assert target is not None
        assert target.experiment == f"{job['metadata']['namespace']}/{job['metadata']['labels'][JOB_LABEL]}"
