"""What every in-cluster resource shares: provider, teardown rule, labels, and one way to install a chart."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from trainyard.catalogue.charts import ChartPin, deep_merge
from trainyard.cloud.context import ClusterContext

MANAGED_BY = "pulumi"
PART_OF = "trainyard"


@dataclass(frozen=True)
class HelmChart:
    """A pinned chart with its base values from the `platform/` catalogue."""

    pin: ChartPin
    base_values: Mapping[str, Any]


def checkov_skips(reasons: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Checkov's skip annotations, `checkov.io/skip<N>: <check>=<why>`, one per (check, why), numbered from 1."""
    return {f"checkov.io/skip{i}": f"{check}={reason}" for i, (check, reason) in enumerate(reasons, start=1)}


def labels(name: str, component: str, **extra: str) -> dict[str, str]:
    """The recommended app.kubernetes.io labels."""
    return {
        "app.kubernetes.io/name": name,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": PART_OF,
        "app.kubernetes.io/managed-by": MANAGED_BY,
        **extra,
    }


def k8s_options(
    cluster: ClusterContext,
    parent: pulumi.Resource,
    depends_on: Sequence[pulumi.Resource] = (),
    *,
    controller_deletes: bool = False,
) -> pulumi.ResourceOptions:
    """Options for an in-cluster resource.

    Everything is `deleted_with` the cluster, so `pulumi destroy` never waits on an API server that is gone.
    Objects whose deletion frees cloud capacity (Karpenter NodePools and node classes) set
    `controller_deletes`: they are really deleted, while their controller still runs, before the cluster goes.
    """
    return pulumi.ResourceOptions(
        parent=parent,
        provider=cluster.provider,
        depends_on=[*cluster.ready, *depends_on],
        deleted_with=None if controller_deletes else cluster.cluster,
    )


def helm_release(
    name: str,
    chart: HelmChart,
    cluster: ClusterContext,
    parent: pulumi.Resource,
    *,
    values: Mapping[str, Any] | None = None,
    depends_on: Sequence[pulumi.Resource] = (),
    namespace: str | None = None,
    wait: bool = True,
) -> k8s.helm.v3.Release:
    """Install a catalogue chart with its base values merged under `values` (later wins, lists replaced).

    helm.v3.Release installs the chart's CRDs with it, so custom resources that depend on the release only
    reach the API server once their kinds exist. `wait=False` creates the objects without waiting for pods (the
    CNI, whose pods can only run on nodes that join after it).
    """
    pin = chart.pin
    return k8s.helm.v3.Release(
        name,
        name=pin.release,
        chart=pin.chart if not pin.repository.startswith("oci://") else f"{pin.repository}/{pin.chart}",
        version=pin.version,
        repository_opts=None if pin.repository.startswith("oci://") else
        k8s.helm.v3.RepositoryOptsArgs(repo=pin.repository),
        namespace=namespace or pin.namespace,
        create_namespace=True,
        values=deep_merge(chart.base_values, values or {}),
        # Wait for workloads to be ready so dependants (CRs, webhooks) find a serving controller. Not waiting
        # needs atomic off too: "skipAwait will be disabled automatically if atomic is used" (pulumi-kubernetes
        # helm.v3.Release API docs); waitForJobs stays unset (false).
        atomic=wait,
        skip_await=not wait,
        cleanup_on_fail=True,
        timeout=900,
        opts=k8s_options(cluster, parent, depends_on),
    )
