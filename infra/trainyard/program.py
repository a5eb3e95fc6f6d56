"""The program `pulumi up` runs and the offline plan records: config → cloud → platform → workloads → exports."""

from __future__ import annotations

import pulumi

from trainyard import outputs
from trainyard.cloud import layer as cloud
from trainyard.config import Secrets, Settings, load_settings
from trainyard.platform import layer as platform
from trainyard.workloads import layer as workloads


def main() -> None:
    settings, secrets = load_settings()
    build(settings, secrets)


def build(settings: Settings, secrets: Secrets) -> None:
    cluster = cloud.build(settings)
    platform_context = platform.build(settings, cluster, secrets)
    workloads.build(settings, platform_context)

    pulumi.export(outputs.CLUSTER_NAME, cluster.name)
    if cluster.kubeconfig is not None:
        pulumi.export(outputs.KUBECONFIG, pulumi.Output.secret(cluster.kubeconfig))
    if cluster.dataset_bucket is not None:
        pulumi.export(outputs.DATASET_BUCKET, cluster.dataset_bucket)
    if cluster.checkpoint_bucket is not None:
        pulumi.export(outputs.CHECKPOINT_BUCKET, cluster.checkpoint_bucket)
