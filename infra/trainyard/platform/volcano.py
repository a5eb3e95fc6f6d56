"""Volcano: gang scheduling for elastic torchrun jobs. Queues and priority classes come with the Tenants."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi

from trainyard.cloud.context import ClusterContext
from trainyard.platform.kube import HelmChart, helm_release


@dataclass(frozen=True)
class VolcanoArgs:
    chart: HelmChart
    cluster: ClusterContext
    depends_on: Sequence[pulumi.Resource] = ()


class Volcano(pulumi.ComponentResource):
    def __init__(self, name: str, args: VolcanoArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("trainyard:platform:Volcano", name, None, opts)
        # The scheduler policy (gang, priority, drf/proportion, binpack on nvidia.com/gpu) is catalogue data.
        self.release = helm_release(f"{name}-release", args.chart, args.cluster, self, depends_on=args.depends_on)
        self.register_outputs({"release": self.release.id})
