"""The add-on interface: what an add-on declares (platform/addons.yaml), the code a special one brings, and what
the platform layer hands each add-on when it builds it.

An add-on is data first: its charts, the CRD groups they install, its metrics and what it waits for. Most need
no code beyond the generic one-release component (`chart_addon.py`); special ones (Cilium, Monitoring, the GPU
Operator, Rook, Karpenter, Alluxio) declare a `COMPONENT` in their module: how to build, their settings type and
when they apply beyond their switch. Waiting for the CNI and for monitoring, and turning chart ServiceMonitors
on or off, is done here once for all of them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import pulumi
from pydantic.alias_generators import to_pascal, to_snake

from trainyard.cloud.context import ClusterContext
from trainyard.config import Secrets, Settings
from trainyard.config.model import AddonSwitch
from trainyard.platform.catalogue import Catalogue, deep_merge
from trainyard.platform.context import TenantFacts
from trainyard.platform.ebs import EbsStorageClass
from trainyard.platform.kube import HelmChart

SettingsT = TypeVar("SettingsT", bound=AddonSwitch)


class Installed(Protocol):
    """A built add-on: its component, with the release dependants wait for."""

    @property
    def release(self) -> pulumi.Resource: ...


@dataclass(frozen=True)
class ScrapeTarget:
    """A Service serving Prometheus metrics that no chart ServiceMonitor covers."""

    name: str
    namespace: str
    selector: Mapping[str, str]
    port: str
    honor_labels: bool = False
    # Values paths of the add-on's first chart that must be on for the Service to exist and serve metrics.
    when: tuple[str, ...] = ()


@dataclass(frozen=True)
class ChartPod:
    """One Deployment/StatefulSet (or hook Job) of a chart that a waiting install needs running: where its
    placement keys live in the chart's values and the chart's defaults for them (the rehearsal's pod model)."""

    name: str
    at: str  # dotted values path holding nodeSelector / tolerations / affinity / replicas ("" = top level)
    enabled: str | None = None  # dotted path of the switch that deploys it; None: always deployed
    enabled_default: bool = True
    replicas: int = 1
    spread: bool = False  # the chart's default affinity keeps replicas on distinct nodes (required)
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    affinity: Mapping[str, Any] = field(default_factory=dict)
    selector_key: str = "nodeSelector"
    tolerations_key: str = "tolerations"
    replicas_key: str = "replicas"
    hook: bool = False  # a Helm hook Job: Helm runs it to completion even without --wait


def _always(_: Settings) -> bool:
    return True


@dataclass(frozen=True)
class AddonCode:
    """What a special add-on's module declares as `COMPONENT`."""

    build: Callable[[AddonContext], Installed]
    # Its `trainyard:addons.<key>` section; plain switches need no type of their own.
    settings: type[AddonSwitch] = AddonSwitch
    # Conditions beyond the switch (GPU pools exist, the target is AWS): off when false, without a config error.
    applies: Callable[[Settings], bool] = _always


@dataclass(frozen=True)
class Addon:
    """One entry of platform/addons.yaml with its code (see that file for what each field means)."""

    name: str
    charts: tuple[str, ...]
    code: AddonCode
    optional_charts: frozenset[str] = frozenset()
    crds: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    needs: tuple[str, ...] = ()
    cni: bool = False
    service_monitors: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    scrape: tuple[ScrapeTarget, ...] = ()
    pods: Mapping[str, tuple[ChartPod, ...]] = field(default_factory=dict)
    after_tenants: bool = False
    switch: bool = True

    @property
    def field(self) -> str:
        """The attribute of `Settings.addons` holding its section."""
        return to_snake(self.name)

    @property
    def resource_name(self) -> str:
        return to_snake(self.name).replace("_", "-")

    @property
    def type_name(self) -> str:
        return to_pascal(self.field)

    @property
    def exposes_metrics(self) -> bool:
        return bool(self.service_monitors or self.scrape)


@dataclass(frozen=True)
class AddonContext:
    """Everything an add-on's build gets; the platform layer makes one per add-on, in dependency order."""

    addon: Addon
    stack: Settings
    cluster: ClusterContext
    secrets: Secrets
    catalogue: Catalogue
    # The CNI release and the releases of the add-ons it needs: its first resources wait for these.
    after: tuple[pulumi.Resource, ...]
    # kube-prometheus-stack's release when monitoring is on: what ships ServiceMonitors waits for it.
    monitoring: pulumi.Resource | None
    # Add-ons on in this stack, in dependency order.
    enabled: tuple[Addon, ...]
    # snapshot.storage.k8s.io CRDs (the EKS snapshot-controller add-on) on AWS.
    snapshot_crds: tuple[pulumi.Resource, ...] = ()
    # The EBS gp3 default StorageClass on AWS (Prometheus' volume: never on Ceph).
    block_storage: EbsStorageClass | None = None
    # Tenant facts, for add-ons built after the tenants.
    tenants: Mapping[str, TenantFacts] = field(default_factory=dict)

    @property
    def monitored(self) -> tuple[pulumi.Resource, ...]:
        """`after`, plus kube-prometheus-stack when monitoring is on: for releases that ship ServiceMonitors."""
        return (*self.after, *([self.monitoring] if self.monitoring is not None else []))

    def settings(self, kind: type[SettingsT]) -> SettingsT:
        section = getattr(self.stack.addons, self.addon.field)
        if not isinstance(section, kind):
            raise TypeError(f"addons.{self.addon.name}: settings are {type(section).__name__}, not {kind.__name__}")
        return section

    def chart(self, release: str) -> HelmChart:
        """The catalogue chart with this add-on's ServiceMonitor switches set to whether monitoring is on."""
        switches: dict[str, Any] = {}
        for dotted in self.addon.service_monitors.get(release, ()):
            node = switches
            *parents, leaf = dotted.split(".")
            for key in parents:
                node = node.setdefault(key, {})
            node[leaf] = self.monitoring is not None
        return HelmChart(self.catalogue.chart(release), deep_merge(self.catalogue.values(release), switches))
