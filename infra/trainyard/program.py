"""The program `pulumi up` runs and the offline plan records: config → cloud → platform → workloads → exports.

The cloud layer hands over its control plane first: the platform's CNI is installed on it, then the node groups
join, then the other add-ons and the workloads follow.
"""

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
    control_plane = cloud.build(settings)
    # The CNI goes in before any node joins: a node without one never turns Ready.
    cni = platform.build_cni(settings, control_plane.context, secrets)
    cluster = control_plane.join_nodes([cni.release] if cni is not None else [])
    platform_context = platform.build(settings, cluster, secrets, cni)
    workloads.build(settings, platform_context)

    pulumi.export(outputs.CLUSTER_NAME, cluster.name)
    if cluster.kubeconfig is not None:
        pulumi.export(outputs.KUBECONFIG, pulumi.Output.secret(cluster.kubeconfig))
    if cluster.dataset_bucket is not None:
        pulumi.export(outputs.DATASET_BUCKET, cluster.dataset_bucket)
    if cluster.checkpoint_bucket is not None:
        pulumi.export(outputs.CHECKPOINT_BUCKET, cluster.checkpoint_bucket)
