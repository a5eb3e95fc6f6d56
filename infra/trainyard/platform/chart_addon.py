"""The generic add-on: one chart release with its catalogue values, for add-ons that need no code of their own.

Volcano is one: its scheduler policy is catalogue data (platform/volcano/values.yaml), and its metrics are
scraped through the ServiceMonitors the monitoring add-on creates from platform/addons.yaml.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi

from trainyard.cloud.context import ClusterContext
from trainyard.platform.addon import AddonCode, AddonContext
from trainyard.platform.kube import HelmChart, helm_release


@dataclass(frozen=True)
class ChartAddonArgs:
    # Component type under trainyard:platform, e.g. "Volcano".
    type_name: str
    chart: HelmChart
    cluster: ClusterContext
    # Computed values merged over the chart's catalogue values.
    values: Mapping[str, Any] = field(default_factory=dict)
    depends_on: Sequence[pulumi.Resource] = ()


class ChartAddon(pulumi.ComponentResource):
    def __init__(self, name: str, args: ChartAddonArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(f"trainyard:platform:{args.type_name}", name, None, opts)
        self.release = helm_release(f"{name}-release", args.chart, args.cluster, self, values=args.values,
                                    depends_on=args.depends_on)
        self.register_outputs({"release": self.release.id})


def build(ctx: AddonContext) -> ChartAddon:
    addon = ctx.addon
    (release,) = addon.charts  # the registry allows exactly one chart without a component
    return ChartAddon(addon.resource_name, ChartAddonArgs(
        type_name=addon.type_name, chart=ctx.chart(release), cluster=ctx.cluster,
        depends_on=ctx.monitored if addon.service_monitors else ctx.after))


COMPONENT = AddonCode(build=build)
