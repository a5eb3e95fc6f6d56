"""Each tenant's own Grafana: the training dashboards over its own namespace's series, and nothing else.

The admins' Grafana (kube-prometheus-stack's, namespace `monitoring`) sees every series and shares its namespace with
Prometheus and Alertmanager, whose HTTP APIs take no login; a port-forward grant reaches every pod of the namespace it
is given in (tenant_access.ui_rules), so members get none there. Instead every tenant with members gets one pod here,
in a namespace that holds nothing else, with two containers:

- prom-label-proxy, listening on the pod's loopback only, which injects `namespace="<tenant namespace>"` into every
  selector of every query, query_range, query_exemplars, series, label and /federate request it passes to Prometheus,
  filters the rules and alerts it returns by that label, and forwards its Alertmanager paths to Prometheus, which
  has no such API (404); nothing else is routed (injectproxy/routes.go @ v0.14.0; a static value, `-label-value`,
  not one the caller sends);
- Grafana, whose one data source is that proxy, with the tenant dashboards provisioned from files, anonymous Viewer
  access, no login form, no basic auth and no admin user at all (`disable_initial_admin_creation`): nobody, member or
  admin, can sign in and change a data source, and what a Viewer can still send (any PromQL through the data source:
  /api/ds/query, the data source proxy) goes through the proxy. Explore is off and Viewers may not edit.

Why not one Grafana with an organisation per tenant: Grafana OSS creates organisations and users only through its
API, and provisioned data sources and dashboards name an organisation that must already exist at startup
(pkg/services/provisioning), so it needs a stateful database and a Job re-applying orgs after every restart; the
chart's Grafana keeps its database in an emptyDir. Why not the API server's services/proxy: Grafana would have to
serve under the proxy's sub-path, and an RBAC grant on services/proxy names `<service>:<port>` as the object.

Members reach their own pod only: a StatefulSet per tenant gives it a fixed name (`grafana-<tenant>-0`), and a Role
bound to the tenant's group allows `get` on that pod and its `portforward` subresource, by resourceNames (the API
server's RequestInfo takes the name from the path, .../pods/<name>/portforward: k8s.io/apiserver
pkg/endpoints/request/requestinfo.go), which is what `kubectl port-forward pod/<name>` sends (kubectl
pkg/cmd/portforward/portforward.go: get the pod, then the forward). A forward enters the pod's network namespace
and so reaches the proxy on loopback too: the tenant's own series again. The namespace admits no connection and its
pods connect to DNS and Prometheus's web port only.

Nothing here is stateful: the dashboards and the data source come from files, Grafana's database is an emptyDir
that a restart rebuilds, and the admins' Grafana keeps its namespace and state.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pulumi
import pulumi_kubernetes as k8s
import yaml

from trainyard import names
from trainyard.cloud.context import ClusterContext
from trainyard.config import Settings
from trainyard.paths import PLATFORM_DIR
from trainyard.platform.addon import AddonCode, AddonContext
from trainyard.platform.context import TenantFacts
from trainyard.platform.kube import checkov_skips, k8s_options, labels
from trainyard.platform.monitoring import DASHBOARDS_DIR
from trainyard.platform.network_policy import CILIUM_API_VERSION
from trainyard.platform.objects import custom_resource
from trainyard.platform.tenant_access import RBAC_GROUP, forward_rules, role_binding_subjects

NetworkPolicyKind = Literal["cilium", "kubernetes"]

NAMESPACE = names.TENANT_GRAFANA_NAMESPACE
_IMAGES = yaml.safe_load((PLATFORM_DIR / "tenant-grafana" / "images.yaml").read_text(encoding="utf-8"))
GRAFANA_IMAGE: str = _IMAGES["grafana"]
PROXY_IMAGE: str = _IMAGES["labelProxy"]
# The dashboards whose series carry the tenant's own `namespace` label (the trainer's, kube-state-metrics' and the
# recorded GPU series of platform/monitoring/rules/gpu.rules.yaml). The per-node and per-MIG-instance ones read the
# exporter's series, whose `namespace` is the GPU Operator's: through the proxy they would stay empty.
DASHBOARDS = ("training", "gpu-jobs")
# The label every tenant series carries and the proxy enforces (PodMonitor defaults; kube-state-metrics' own).
TENANT_LABEL = "namespace"
GRAFANA_PORT = 3000
PROXY_PORT = 9091
PROXY_URL = f"http://127.0.0.1:{PROXY_PORT}"
DATASOURCE_UID = "prometheus"
# The grafana image's user and group (kube-prometheus-stack 88.5.3 charts/grafana/values.yaml securityContext), and
# prom-label-proxy's (its Dockerfile @ v0.14.0: USER nobody).
GRAFANA_USER = 472
PROXY_USER = 65534
CONFIG_MAP = "tenant-grafana"
DATA_DIR = "/var/lib/grafana"
PROVISIONING_DIR = "/etc/grafana/provisioning"
DASHBOARD_DIR = "/etc/grafana/dashboards"
CONFIG_DIGEST = "trainyard.io/config-sha256"
APP_LABELS = {"app.kubernetes.io/name": "grafana", "app.kubernetes.io/component": "tenant-dashboards"}
_POD_NAMESPACE = "k8s:io.kubernetes.pod.namespace"  # Cilium's label of an endpoint's namespace
_KUBE_NAMESPACE = "kubernetes.io/metadata.name"  # the label Kubernetes sets on every namespace
_DNS_PORTS = [{"port": "53", "protocol": "UDP"}, {"port": "53", "protocol": "TCP"}]
# Grafana's settings as GF_<SECTION>_<KEY> variables (grafana/grafana conf/defaults.ini names each key).
GRAFANA_SETTINGS = {
    "GF_AUTH_ANONYMOUS_ENABLED": "true",
    "GF_AUTH_ANONYMOUS_ORG_ROLE": "Viewer",
    "GF_AUTH_DISABLE_LOGIN_FORM": "true",
    "GF_AUTH_BASIC_ENABLED": "false",
    "GF_SECURITY_DISABLE_INITIAL_ADMIN_CREATION": "true",
    "GF_USERS_ALLOW_SIGN_UP": "false",
    "GF_USERS_ALLOW_ORG_CREATE": "false",
    "GF_USERS_VIEWERS_CAN_EDIT": "false",
    "GF_EXPLORE_ENABLED": "false",
    "GF_UNIFIED_ALERTING_ENABLED": "false",
    "GF_SNAPSHOTS_EXTERNAL_ENABLED": "false",
    "GF_ANALYTICS_REPORTING_ENABLED": "false",
    "GF_ANALYTICS_CHECK_FOR_UPDATES": "false",
    "GF_ANALYTICS_CHECK_FOR_PLUGIN_UPDATES": "false",
    # Run the plugins the image bundles (Prometheus' included) and fetch none: by default Grafana 13 installs newer
    # releases of its preinstall list over the bundled ones at start, which fails on a read-only root after the
    # bundled plugin is stopped (grafana/grafana pkg/setting/setting_plugins.go: preinstall_disabled).
    "GF_PLUGINS_PREINSTALL_DISABLED": "true",
    "GF_LOG_MODE": "console",
    # The image points its logs at /var/log/grafana; with a read-only root they go under the writable data path.
    "GF_PATHS_LOGS": f"{DATA_DIR}/log",
}
_CHECKOV_REASONS = (
    ("CKV_K8S_43", "tags taken from upstream release data (config/release_data/images.yaml): no digest was readable"),
    ("CKV_K8S_15", "IfNotPresent: release tags, and Always would make every restart depend on the registry "
                   "(Kubernetes docs, Images: image pull policy)"),
    ("CKV_K8S_40", "Grafana runs as its image's user 472, as the admins' Grafana does (kube-prometheus-stack 88.5.3 "
                   "charts/grafana/values.yaml securityContext); another UID has not been tried here"),
)
CHECKOV_SKIPS = checkov_skips(_CHECKOV_REASONS)


@dataclass(frozen=True)
class PrometheusEndpoint:
    """kube-prometheus-stack's Prometheus: its Service, web port and the labels of its pods."""

    namespace: str
    service: str
    port: int
    pod_labels: Mapping[str, str]

    @property
    def url(self) -> str:
        return f"http://{self.service}.{self.namespace}.svc:{self.port}"


@dataclass(frozen=True)
class TenantGrafanaArgs:
    cluster: ClusterContext
    tenants: Mapping[str, TenantFacts]
    prometheus: PrometheusEndpoint
    # Dashboard file stem -> its JSON text.
    dashboards: Mapping[str, str]
    network_policy: NetworkPolicyKind
    depends_on: Sequence[pulumi.Resource] = ()


def statefulset_name(tenant: str) -> str:
    return f"{names.TENANT_GRAFANA_PREFIX}{tenant}"


def pod_name(tenant: str) -> str:
    """The StatefulSet's one pod (Kubernetes docs, StatefulSets: ordinal index): what members forward to."""
    return f"{statefulset_name(tenant)}-0"


def prometheus_endpoint(monitoring_namespace: str, stack_values: Mapping[str, Any]) -> PrometheusEndpoint:
    """The Prometheus Service the chart renders: <fullname>-prometheus on 9090, selecting its pods by these labels
    (kube-prometheus-stack 88.5.3 templates/prometheus/service.yaml; fullnameOverride in our values)."""
    name = f"{stack_values['fullnameOverride']}-prometheus"
    return PrometheusEndpoint(namespace=monitoring_namespace, service=name, port=9090,
                              pod_labels={"app.kubernetes.io/name": "prometheus", "operator.prometheus.io/name": name})


def proxy_args(prometheus: PrometheusEndpoint, tenant_namespace: str) -> list[str]:
    """prom-label-proxy's flags (main.go @ v0.14.0). The label APIs serve the dashboards' namespace and pod
    variables (label_values); no -error-on-replace, so a dashboard's own `namespace=~"..."` is replaced, not refused."""
    return [f"-insecure-listen-address=127.0.0.1:{PROXY_PORT}", f"-upstream={prometheus.url}",
            f"-label={TENANT_LABEL}", f"-label-value={tenant_namespace}", "-enable-label-apis"]


def datasources() -> dict[str, Any]:
    """The one data source (Grafana docs, Provision Grafana: data sources), not editable from the UI."""
    return {"apiVersion": 1, "datasources": [{
        "name": "Prometheus", "type": "prometheus", "uid": DATASOURCE_UID, "access": "proxy", "url": PROXY_URL,
        "isDefault": True, "editable": False,
        # No alert rules of Prometheus to manage from here (the proxy filters /api/v1/rules anyway).
        "jsonData": {"manageAlerts": False}}]}


def dashboard_provider() -> dict[str, Any]:
    """Dashboards from files (Grafana docs, Provision Grafana: dashboards); nobody may change or delete them."""
    return {"apiVersion": 1, "providers": [{
        "name": "trainyard", "type": "file", "folder": "Trainyard", "disableDeletion": True, "allowUiUpdates": False,
        "options": {"path": DASHBOARD_DIR}}]}


def config_data(dashboards: Mapping[str, str]) -> dict[str, str]:
    """The ConfigMap every tenant's Grafana mounts: provisioning files and the tenant dashboards' JSON."""
    return {"datasources.yaml": yaml.safe_dump(datasources(), sort_keys=False),
            "dashboards.yaml": yaml.safe_dump(dashboard_provider(), sort_keys=False),
            **{f"{stem}.json": dashboards[stem] for stem in DASHBOARDS}}


def _restricted(user: int) -> dict[str, Any]:
    return {"runAsNonRoot": True, "runAsUser": user, "runAsGroup": user, "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}}


def pod_spec(prometheus: PrometheusEndpoint, tenant_namespace: str) -> dict[str, Any]:
    probe = {"httpGet": {"path": "/api/health", "port": "http"}, "periodSeconds": 10}
    # The proxy answers on loopback only; its image is busybox, whose wget checks the route it serves (/healthz).
    proxy_probe = {"exec": {"command": ["wget", "-q", "-O", "/dev/null", f"{PROXY_URL}/healthz"]},
                   "periodSeconds": 10}
    grafana = {
        "name": "grafana", "image": GRAFANA_IMAGE, "imagePullPolicy": "IfNotPresent",
        "env": [{"name": key, "value": value} for key, value in GRAFANA_SETTINGS.items()],
        "ports": [{"name": "http", "containerPort": GRAFANA_PORT, "protocol": "TCP"}],
        # The chart's probes for Grafana (kube-prometheus-stack 88.5.3 charts/grafana/values.yaml).
        "readinessProbe": probe,
        "livenessProbe": {**probe, "initialDelaySeconds": 60, "timeoutSeconds": 30, "failureThreshold": 10},
        "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"cpu": "500m", "memory": "512Mi"}},
        "securityContext": _restricted(GRAFANA_USER),
        "volumeMounts": [
            {"name": "data", "mountPath": DATA_DIR},
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "datasources", "mountPath": f"{PROVISIONING_DIR}/datasources", "readOnly": True},
            {"name": "providers", "mountPath": f"{PROVISIONING_DIR}/dashboards", "readOnly": True},
            {"name": "dashboards", "mountPath": DASHBOARD_DIR, "readOnly": True},
        ],
    }
    proxy = {
        "name": "label-proxy", "image": PROXY_IMAGE, "imagePullPolicy": "IfNotPresent",
        "args": proxy_args(prometheus, tenant_namespace),
        "readinessProbe": proxy_probe, "livenessProbe": {**proxy_probe, "failureThreshold": 6},
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"cpu": "200m", "memory": "128Mi"}},
        "securityContext": _restricted(PROXY_USER),
    }

    def items(*keys: str) -> dict[str, Any]:
        return {"configMap": {"name": CONFIG_MAP, "items": [{"key": key, "path": key} for key in keys]}}

    return {
        # Nothing here talks to the Kubernetes API.
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "nodeSelector": {names.ROLE_LABEL: "system"},
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}, "fsGroup": GRAFANA_USER},
        "containers": [grafana, proxy],
        "volumes": [
            {"name": "data", "emptyDir": {"sizeLimit": "1Gi"}},
            {"name": "tmp", "emptyDir": {"sizeLimit": "256Mi"}},
            {"name": "datasources", **items("datasources.yaml")},
            {"name": "providers", **items("dashboards.yaml")},
            {"name": "dashboards", **items(*(f"{stem}.json" for stem in DASHBOARDS))},
        ],
    }


def namespace_policy(kind: NetworkPolicyKind, prometheus: PrometheusEndpoint) -> dict[str, Any]:
    """No connection in (a port-forward enters the pod itself); out, DNS and Prometheus's web port only."""
    meta = {"name": "tenant-grafana", "namespace": NAMESPACE, "labels": labels("tenant-grafana", "tenancy")}
    if kind == "cilium":
        return {"apiVersion": CILIUM_API_VERSION, "kind": "CiliumNetworkPolicy", "metadata": meta, "spec": {
            "endpointSelector": {},
            # Default deny both ways although the policy lists no ingress rule: without rules a direction stays open
            # (CiliumNetworkPolicy spec.enableDefaultDeny, the cilium.io/v2 CRD's description).
            "enableDefaultDeny": {"ingress": True, "egress": True},
            "egress": [
                {"toEndpoints": [{"matchLabels": {_POD_NAMESPACE: "kube-system", "k8s:k8s-app": "kube-dns"}}],
                 "toPorts": [{"ports": _DNS_PORTS}]},
                {"toEndpoints": [{"matchLabels": {_POD_NAMESPACE: prometheus.namespace, **prometheus.pod_labels}}],
                 "toPorts": [{"ports": [{"port": str(prometheus.port), "protocol": "TCP"}]}]},
            ],
        }}
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": meta, "spec": {
        "podSelector": {},
        "policyTypes": ["Ingress", "Egress"],
        "ingress": [],
        "egress": [
            {"to": [{"namespaceSelector": {"matchLabels": {_KUBE_NAMESPACE: "kube-system"}},
                     "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
             "ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]},
            {"to": [{"namespaceSelector": {"matchLabels": {_KUBE_NAMESPACE: prometheus.namespace}},
                     "podSelector": {"matchLabels": dict(prometheus.pod_labels)}}],
             "ports": [{"port": prometheus.port, "protocol": "TCP"}]},
        ],
    }}


class TenantGrafana(pulumi.ComponentResource):
    """The namespace, its network policy, the shared provisioning ConfigMap, and per tenant with members a
    one-pod StatefulSet with a Role and RoleBinding that let the tenant's group forward to that pod only."""

    release: pulumi.Resource

    def __init__(self, name: str, args: TenantGrafanaArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("trainyard:platform:TenantGrafana", name, None, opts)
        cluster = args.cluster
        ns_labels: Any = {**labels("tenant-grafana", "tenancy"),
                          "pod-security.kubernetes.io/enforce": "restricted"}
        namespace = k8s.core.v1.Namespace(f"{name}-namespace", metadata={"name": NAMESPACE, "labels": ns_labels},
                                          opts=k8s_options(cluster, self, args.depends_on))
        in_ns = k8s_options(cluster, self, [namespace])
        policy = namespace_policy(args.network_policy, args.prometheus)
        if policy["kind"] == "CiliumNetworkPolicy":
            custom_resource(f"{name}-policy", policy, in_ns)
        else:
            spec: Any = policy["spec"]
            k8s.networking.v1.NetworkPolicy(f"{name}-policy", metadata=policy["metadata"], spec=spec, opts=in_ns)
        data = config_data(args.dashboards)
        self.release = k8s.core.v1.ConfigMap(
            f"{name}-config", metadata={"name": CONFIG_MAP, "namespace": NAMESPACE,
                                        "labels": labels("tenant-grafana", "tenancy")},
            data=data, opts=in_ns)
        # The pods read the files only when they start: a new file set rolls them.
        digest = hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()
        for tenant in sorted(args.tenants.values(), key=lambda t: t.name):
            if tenant.group is not None:
                self._tenant(name, tenant, tenant.group, args, digest, [namespace, self.release])
        self.register_outputs({"namespace": NAMESPACE})

    def _tenant(self, name: str, tenant: TenantFacts, group: str, args: TenantGrafanaArgs, digest: str,
                after: list[pulumi.Resource]) -> None:
        cluster, workload = args.cluster, statefulset_name(tenant.name)
        pod_labels = {**APP_LABELS, "trainyard.io/tenant": tenant.name}
        meta: Any = {"name": workload, "namespace": NAMESPACE,
                     "labels": labels("grafana", "tenant-dashboards", **{"trainyard.io/tenant": tenant.name})}
        spec: Any = {
            "replicas": 1,
            "selector": {"matchLabels": pod_labels},
            "template": {"metadata": {"labels": pod_labels, "annotations": {CONFIG_DIGEST: digest}},
                         "spec": pod_spec(args.prometheus, tenant.namespace)},
        }
        workload_meta: Any = {**meta, "annotations": CHECKOV_SKIPS}
        k8s.apps.v1.StatefulSet(f"{name}-{tenant.name}", metadata=workload_meta, spec=spec,
                                opts=k8s_options(cluster, self, after))
        rules: Any = forward_rules(pod_name(tenant.name))
        role = k8s.rbac.v1.Role(f"{name}-{tenant.name}-role", metadata=meta, rules=rules,
                                opts=k8s_options(cluster, self, after))
        role_ref: Any = {"apiGroup": RBAC_GROUP, "kind": "Role", "name": workload}
        subjects: Any = role_binding_subjects(group)
        k8s.rbac.v1.RoleBinding(f"{name}-{tenant.name}-role-binding", metadata=meta, role_ref=role_ref,
                                subjects=subjects, opts=k8s_options(cluster, self, [role]))


def _applies(stack: Settings) -> bool:
    """Its series come from the monitoring add-on's Prometheus."""
    return stack.addons.monitoring.enabled


def build(ctx: AddonContext) -> TenantGrafana:
    pin = ctx.catalogue.chart("kube-prometheus-stack")
    return TenantGrafana(ctx.addon.resource_name, TenantGrafanaArgs(
        cluster=ctx.cluster, tenants=ctx.tenants,
        prometheus=prometheus_endpoint(pin.namespace, ctx.catalogue.values("kube-prometheus-stack")),
        dashboards={stem: (DASHBOARDS_DIR / f"{stem}.json").read_text(encoding="utf-8") for stem in DASHBOARDS},
        network_policy="cilium" if any(a.cni for a in ctx.enabled) else "kubernetes",
        depends_on=ctx.after))


COMPONENT = AddonCode(build=build, applies=_applies)
