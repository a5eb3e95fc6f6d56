"""Monitoring: kube-prometheus-stack (owns the monitoring.coreos.com CRDs), rules and dashboards.

No prometheus-adapter: nothing in the platform scales on a custom metric (README, "Autoscaling")."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import pulumi_random as random
import yaml

from trainyard.catalogue.addons import ScrapeTarget
from trainyard.cloud.context import ClusterContext
from trainyard.config.model import MonitoringSettings
from trainyard.config.quantity import parse_quantity
from trainyard.paths import PLATFORM_DIR
from trainyard.platform.addon import AddonCode, AddonContext
from trainyard.platform.kube import HelmChart, helm_release, k8s_options, labels
from trainyard.platform.objects import custom_resource

MONITORING_API_VERSION = "monitoring.coreos.com/v1"
GRAFANA_SECRET = "grafana-admin"
GRAFANA_USER_KEY = "admin-user"
GRAFANA_PASSWORD_KEY = "admin-password"
DASHBOARD_LABEL = "grafana_dashboard"
# Prometheus trims old blocks at this share of the volume, before the disk fills and it stops ingesting.
RETENTION_SHARE = 0.85
_GIB = 2**30

RULES_DIR = PLATFORM_DIR / "monitoring" / "rules"
DASHBOARDS_DIR = PLATFORM_DIR / "monitoring" / "dashboards"


@dataclass(frozen=True)
class MonitoringArgs:
    stack_chart: HelmChart
    cluster: ClusterContext
    settings: MonitoringSettings
    grafana_admin_password: pulumi.Output[str] | None
    # Rule file stem -> its parsed `groups:` document; dashboard file stem -> JSON text.
    rules: Mapping[str, Mapping[str, Any]]
    dashboards: Mapping[str, str]
    # EBS gp3 StorageClass for Prometheus' volume on AWS, or None for the cluster default.
    storage_class: str | None = None
    # Services of other add-ons whose metrics no chart ServiceMonitor covers (platform/addons.yaml `scrape`).
    scrape: tuple[ScrapeTarget, ...] = ()
    depends_on: Sequence[pulumi.Resource] = ()


def retention_size(storage_size: str) -> str:
    """Prometheus' size-based retention for a volume (its GB are GiB)."""
    return f"{max(1, int(float(parse_quantity(storage_size)) / _GIB * RETENTION_SHARE))}GB"


def stack_values(args: MonitoringArgs) -> dict[str, Any]:
    settings = args.settings
    claim_spec: dict[str, Any] = {"accessModes": ["ReadWriteOnce"],
                                  "resources": {"requests": {"storage": settings.storage_size}}}
    if args.storage_class is not None:
        claim_spec["storageClassName"] = args.storage_class
    return {
        "prometheus": {"prometheusSpec": {
            "retention": settings.retention,
            "retentionSize": retention_size(settings.storage_size),
            "storageSpec": {"volumeClaimTemplate": {"spec": claim_spec}},
        }},
        # The password lives only in a Secret; Grafana is a ClusterIP service reached via kubectl port-forward.
        "grafana": {"admin": {"existingSecret": GRAFANA_SECRET, "userKey": GRAFANA_USER_KEY,
                              "passwordKey": GRAFANA_PASSWORD_KEY}},
    }


def prometheus_rule(name: str, namespace: str, groups: Mapping[str, Any]) -> dict[str, Any]:
    return {"apiVersion": MONITORING_API_VERSION, "kind": "PrometheusRule",
            "metadata": {"name": name, "namespace": namespace, "labels": labels(name, "monitoring")},
            "spec": {"groups": list(groups["groups"])}}


def service_monitor(target: ScrapeTarget, namespace: str) -> dict[str, Any]:
    """A ServiceMonitor in the monitoring namespace for a Service in the target's namespace."""
    return {"apiVersion": MONITORING_API_VERSION, "kind": "ServiceMonitor",
            "metadata": {"name": target.name, "namespace": namespace, "labels": labels(target.name, "monitoring")},
            "spec": {"selector": {"matchLabels": dict(target.selector)},
                     "namespaceSelector": {"matchNames": [target.namespace]},
                     "endpoints": [{"port": target.port, "interval": "30s", "honorLabels": target.honor_labels}]}}


class Monitoring(pulumi.ComponentResource):
    def __init__(self, name: str, args: MonitoringArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("trainyard:platform:Monitoring", name, None, opts)
        cluster, ns_name = args.cluster, args.stack_chart.pin.namespace
        namespace = k8s.core.v1.Namespace(f"{name}-namespace",
                                          metadata={"name": ns_name, "labels": labels("monitoring", "monitoring")},
                                          opts=k8s_options(cluster, self, args.depends_on))
        secret = k8s.core.v1.Secret(
            f"{name}-grafana-admin",
            metadata={"name": GRAFANA_SECRET, "namespace": ns_name, "labels": labels("grafana", "monitoring")},
            string_data={GRAFANA_USER_KEY: "admin",
                         GRAFANA_PASSWORD_KEY: pulumi.Output.secret(self._password(name, args))},
            opts=k8s_options(cluster, self, [namespace]))
        self.release = helm_release(f"{name}-stack", args.stack_chart, cluster, self, values=stack_values(args),
                                    depends_on=[*args.depends_on, namespace, secret])
        after_release = k8s_options(cluster, self, [self.release])
        for stem, text in sorted(args.dashboards.items()):
            k8s.core.v1.ConfigMap(
                f"{name}-dashboard-{stem}",
                metadata={"name": f"dashboard-{stem}", "namespace": ns_name,
                          "labels": {**labels(stem, "dashboard"), DASHBOARD_LABEL: "1"}},
                data={f"{stem}.json": text}, opts=k8s_options(cluster, self, [namespace]))
        for stem, groups in sorted(args.rules.items()):
            custom_resource(f"{name}-rules-{stem}", prometheus_rule(f"trainyard-{stem}", ns_name, groups),
                            after_release)
        for target in args.scrape:
            custom_resource(f"{name}-{target.name}", service_monitor(target, ns_name), after_release)
        self.register_outputs({"release": self.release.id})

    def _password(self, name: str, args: MonitoringArgs) -> pulumi.Input[str]:
        if args.grafana_admin_password is not None:
            return args.grafana_admin_password
        return random.RandomPassword(f"{name}-grafana-password", length=32, special=False,
                                     opts=pulumi.ResourceOptions(parent=self)).result


def build(ctx: AddonContext) -> Monitoring:
    return Monitoring(ctx.addon.resource_name, MonitoringArgs(
        stack_chart=ctx.chart("kube-prometheus-stack"),
        cluster=ctx.cluster, settings=ctx.settings(MonitoringSettings),
        grafana_admin_password=ctx.secrets.grafana_admin_password,
        rules={path.name.removesuffix(".rules.yaml"): _yaml(path) for path in sorted(RULES_DIR.glob("*.rules.yaml"))},
        dashboards={path.stem: path.read_text(encoding="utf-8") for path in sorted(DASHBOARDS_DIR.glob("*.json"))},
        # Prometheus on EBS, not Ceph: it must not wait for Ceph on first install nor go down with it.
        storage_class=ctx.block_storage.name if ctx.block_storage is not None else None,
        scrape=tuple(target for addon in ctx.enabled for target in addon.scrape),
        depends_on=(*ctx.after, *([ctx.block_storage.storage_class] if ctx.block_storage is not None else ()))))


def _yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


COMPONENT = AddonCode(build=build)
