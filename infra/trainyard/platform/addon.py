"""The add-on interface: the code a special add-on brings to its declaration (platform/addons.yaml, read by
trainyard.catalogue.addons), and what the platform layer hands each add-on when it builds it.

An add-on is data first: its charts, the CRD groups they install, its metrics and what it waits for. Most need
no code beyond the generic one-release component (`chart_addon.py`); special ones (Cilium, Monitoring, the GPU
Operator, Rook, Karpenter, Alluxio) declare a `COMPONENT` in their module: how to build and when they apply
beyond their switch. Settings beyond `enabled` are config's (`AddonSettings`, config/model.py). Waiting for the
CNI and for monitoring, and turning chart ServiceMonitors on or off, is done here once for all of them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Protocol, TypeVar

import pulumi

from trainyard.catalogue.addons import AddonSpec
from trainyard.catalogue.charts import Catalogue, deep_merge
from trainyard.cloud.context import ClusterContext
from trainyard.config import Secrets, Settings
from trainyard.config.model import AddonSwitch
from trainyard.platform.context import TenantFacts
from trainyard.platform.ebs import EbsStorageClass
from trainyard.platform.kube import HelmChart

SettingsT = TypeVar("SettingsT", bound=AddonSwitch)


class Installed(Protocol):
    """A built add-on: its component, with the release dependants wait for."""

    @property
    def release(self) -> pulumi.Resource: ...


def _always(_: Settings) -> bool:
    return True


@dataclass(frozen=True)
class AddonCode:
    """What a special add-on's module declares as `COMPONENT`."""

    build: Callable[[AddonContext], Installed]
    # Conditions beyond the switch (GPU pools exist, the target is AWS): off when false, without a config error.
    applies: Callable[[Settings], bool] = _always


@dataclass(frozen=True, kw_only=True)
class Addon(AddonSpec):
    """One declaration of platform/addons.yaml with the code that builds it."""

    code: AddonCode

    @classmethod
    def of(cls, spec: AddonSpec, code: AddonCode) -> Addon:
        return cls(**{f.name: getattr(spec, f.name) for f in fields(spec)}, code=code)


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
