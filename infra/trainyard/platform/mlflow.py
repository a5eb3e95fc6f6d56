"""The MLflow Tracking Server: experiments and the model registry in PostgreSQL, artifacts in each tenant's S3 prefix.

Our own component rather than community-charts `mlflow` 1.11.5. Rendered with our values, that chart is one
Deployment, Service and ServiceAccount, and none of its defaults could stay: an in-memory SQLite store
(`sqlite:///:memory:`), `./mlruns` artifacts, a single maintainer's `burakince/mlflow` image, and a Flask secret that
is a pre-install/pre-upgrade hook with a random value (templates/flask_secret.yaml). Its migration step runs a
private MLflow function from a ConfigMap script (templates/configmap.yaml: `utils._initialize_tables`), where MLflow's
public `mlflow db upgrade` does the same for an empty or an old database (mlflow/db.py @ 3.17.2). And it lists
Bitnami `postgresql` 18.8.12 as a dependency that no public source holds, which Helm wants present even when disabled
(`helm template`: "found in Chart.yaml, but missing in charts/ directory"), so rendering it would take a placeholder
chart standing in for code nobody here can read; its other subcharts are Bitnami's discontinued mysql and minio
(AGPL-3.0), which must never be deployed. The server itself is `mlflow server` with flags, stated here in full.

On AWS the server never touches artifacts (`--no-serve-artifacts`) and holds no AWS role: clients read and write
`s3://<checkpoint bucket>/<namespace>/mlflow/...` with their own pod identity, so IAM keeps each tenant in its prefix
(an experiment's artifact location comes from the `mlflow-client` ConfigMap of its namespace). The default artifact
root is a prefix no tenant may write, so an experiment created without a location fails its first upload instead of
landing outside every tenant. On `local` (no S3) the server proxies artifacts onto a volume of its own.

What is not isolated: the server runs without MLflow's auth app, so any tenant pod that reaches it reads and changes
every tenant's experiments, runs and registered models (mlflow 3.17.2 serves them to any caller without
`--app-name basic-auth`: mlflow/server/handlers.py). A server role reading the tenants' prefixes would extend that to
their artifacts (handlers.py get_artifact_handler reads `run.info.artifact_uri` with the server's credentials, and
an experiment's artifact location may name any prefix: _validate_storage_location_uri checks only the scheme), so
the server has none and the UI shows no artifacts on AWS. On `local` the proxied artifacts are open the same way.

The database: RDS on AWS (cloud/database.py; its URI, with the password, in a Secret here), a one-instance
CloudNativePG cluster on `local` (its `-app` Secret's `uri`). The schema is migrated by a Job per MLflow version before
the server rolls (`pulumi up` waits for it), so replicas never race each other's migrations.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pulumi
import pulumi_kubernetes as k8s
import pulumi_random as random
import yaml

from trainyard import names
from trainyard.catalogue.addons import ScrapeTarget
from trainyard.cloud.context import ClusterContext, DatabaseFacts
from trainyard.cloud.database import connection_uri
from trainyard.config.model import MlflowSettings
from trainyard.paths import PLATFORM_DIR
from trainyard.platform.addon import AddonCode, AddonContext
from trainyard.platform.context import TenantFacts
from trainyard.platform.kube import k8s_options, labels
from trainyard.platform.monitoring import service_monitor
from trainyard.platform.network_policy import CILIUM_API_VERSION
from trainyard.platform.objects import custom_resource
from trainyard.platform.tenant_access import ui_access

IMAGE: str = yaml.safe_load((PLATFORM_DIR / "mlflow" / "images.yaml").read_text(encoding="utf-8"))["server"]
POSTGRES_IMAGE: str = yaml.safe_load(
    (PLATFORM_DIR / "cloudnative-pg" / "images.yaml").read_text(encoding="utf-8"))["postgres"]
NAMESPACE = names.MLFLOW_NAMESPACE
PORT = names.MLFLOW_PORT
PORT_NAME = "http"
APP_LABELS = {"app.kubernetes.io/name": "mlflow", "app.kubernetes.io/component": "tracking-server"}
DATABASE_SECRET = "mlflow-db"
DATABASE_URI_KEY = "uri"
SERVER_SECRET = "mlflow-server"
# MLflow reads the Flask secret from this variable and hands it to every worker (mlflow/server/__init__.py @ 3.17.2,
# _run_server: MLFLOW_FLASK_SERVER_SECRET_KEY); without it each process would sign sessions with its own.
FLASK_SECRET_KEY = "MLFLOW_FLASK_SERVER_SECRET_KEY"
# CloudNativePG names the application user's Secret `<cluster>-app`, with the connection URI under `uri`
# (cloudnative-pg v1.30.0 docs/src/applications.md).
CNPG_CLUSTER = "mlflow-db"
CNPG_API_VERSION = "postgresql.cnpg.io/v1"
# Under every tenant's artifact prefixes, and one no tenant may write (their role writes `<namespace>/*` only).
DEFAULT_ARTIFACT_DIR = "_unassigned"
LOCAL_ARTIFACTS = "/mlartifacts"
ARTIFACT_CLAIM = "mlflow-artifacts"
TMP = "/tmp"
TMP_SIZE = "256Mi"
MIGRATION_ACCOUNT = "mlflow-db-upgrade"
UNPRIVILEGED_USER = 10001
# Host names the server answers (its DNS-rebinding check, --allowed-hosts, fnmatch patterns over the Host header:
# mlflow/server/security_utils.py @ 3.17.2 is_allowed_host_header): the Service's in-cluster names with the port,
# localhost (kubectl port-forward) and the addresses pods and Prometheus reach it by (Prometheus scrapes with
# `Host: <pod IP>:5000`). A Host such as mlflow.mlflow.svc.cluster.local:5000 is refused by default.
_SERVICE_HOSTS = tuple(".".join((names.MLFLOW_SERVICE, NAMESPACE, "svc", "cluster.local")[:n]) for n in (1, 2, 3, 4))
_LOOPBACK_HOSTS = ("localhost", "localhost:*", "127.0.0.1", "127.0.0.1:*")
# Where the pod network is not known here (`local`: kind's pod CIDR), the server's own default private ranges
# (security_utils.get_private_ip_patterns), which the flag would otherwise drop.
_PRIVATE_HOSTS = ("10.*", "192.168.*", *(f"172.{i}.*" for i in range(16, 32)))
_POD_NAMESPACE = "k8s:io.kubernetes.pod.namespace"  # Cilium's label of an endpoint's namespace
_KUBE_NAMESPACE = "kubernetes.io/metadata.name"  # the label Kubernetes sets on every namespace
# Why the server's and the migration's pods do not pass these Checkov checks (checkov.io/skip<N>, tests/review).
_CHECKOV_REASONS = (
    ("CKV_K8S_43", "the tag is pinned from release data (config/release_data/unverified.yaml): no digest was readable"),
    ("CKV_K8S_15", "IfNotPresent: a release tag, and Always would make every server restart depend on ghcr.io "
                   "(Kubernetes docs, Images: image pull policy), as for CloudNativePG (platform/cloudnative-pg)"),
    ("CKV_K8S_35", "mlflow takes the store URI and the Flask secret only as options or their environment variables "
                   "(mlflow/cli/__init__.py, mlflow/server/__init__.py @ 3.17.2): a file would need a shell that puts "
                   "the URI on a command line"),
)
CHECKOV_SKIPS = {f"checkov.io/skip{i}": f"{check}={reason}" for i, (check, reason) in enumerate(_CHECKOV_REASONS, 1)}

NetworkPolicyKind = Literal["cilium", "kubernetes"]


@dataclass(frozen=True)
class MlflowArgs:
    cluster: ClusterContext
    settings: MlflowSettings
    # RDS on AWS; None: a CloudNativePG cluster of our own (`local`), after its operator (in `depends_on`).
    database: DatabaseFacts | None
    # The checkpoint bucket, whose `<namespace>/mlflow/` prefixes hold the artifacts; None on `local`.
    artifact_bucket: pulumi.Input[str] | None
    tenants: Mapping[str, TenantFacts]
    network_policy: NetworkPolicyKind
    # The addresses pods have (the VPC's CIDR on AWS); None where the program cannot know them (`local`).
    pod_cidr: str | None
    monitoring_namespace: str | None
    # kube-prometheus-stack's release when monitoring is on (the ServiceMonitor CRD).
    monitoring: pulumi.Resource | None
    protect: bool
    depends_on: Sequence[pulumi.Resource] = ()


def artifact_root(bucket: str | None, namespace: str) -> str:
    """Where a tenant's experiments keep their artifacts (the `mlflow-client` ConfigMap's
    TRAINYARD_MLFLOW_ARTIFACT_ROOT): its S3 prefix, or the server's proxy (`mlflow-artifacts:`) on `local`."""
    if bucket is None:
        return f"mlflow-artifacts:/{namespace}"
    return f"s3://{bucket}/{namespace}/{names.MLFLOW_ARTIFACT_DIR}"


def _artifact_root(bucket: pulumi.Input[str] | None, namespace: str) -> pulumi.Output[str]:
    def root(name: str | None) -> str:
        return artifact_root(name, namespace)

    return pulumi.Output.from_input(bucket).apply(root)


def address_patterns(cidr: str) -> tuple[str, ...]:
    """Host patterns that match every address of `cidr` and, for a prefix not on an octet boundary, no whole octet
    outside it: 100.64.0.0/10 -> 100.64.* .. 100.127.*."""
    network = ipaddress.IPv4Network(cidr)
    fixed, spare = divmod(network.prefixlen, 8)
    octets = str(network.network_address).split(".")
    if spare == 0:
        return (".".join([*octets[:fixed], "*"]),)
    first = int(octets[fixed])
    return tuple(".".join([*octets[:fixed], str(first + i), "*"]) for i in range(2 ** (8 - spare)))


def allowed_hosts(pod_cidr: str | None) -> str:
    """--allowed-hosts: the Service's names, loopback, and the pod network (AWS: the VPC's CIDR, where Cilium's ENI
    IPAM gives pods their addresses) or, where it is unknown, the private ranges."""
    pods = address_patterns(pod_cidr) if pod_cidr is not None else _PRIVATE_HOSTS
    return ",".join((*(f"{h}:{PORT}" for h in _SERVICE_HOSTS), *_LOOPBACK_HOSTS, *pods))


def server_args(*, artifact_bucket: str | None, pod_cidr: str | None, workers: int = 2) -> list[str]:
    """`mlflow server`'s command line (mlflow/cli/__init__.py @ 3.17.2); the store URI and the Flask secret come
    from the environment (MLFLOW_BACKEND_STORE_URI is the --backend-store-uri option's envvar)."""
    args = ["server", "--host", "0.0.0.0", "--port", str(PORT), "--workers", str(workers),
            "--allowed-hosts", allowed_hosts(pod_cidr),
            # Prometheus multiprocess files on the writable /tmp; /metrics then serves them (prometheus_exporter.py).
            "--expose-prometheus", f"{TMP}/prometheus"]
    if artifact_bucket is None:
        return [*args, "--serve-artifacts", "--artifacts-destination", LOCAL_ARTIFACTS]
    return [*args, "--no-serve-artifacts",
            "--default-artifact-root", f"s3://{artifact_bucket}/{names.MLFLOW_ARTIFACT_DIR}/{DEFAULT_ARTIFACT_DIR}"]


def _restricted() -> dict[str, Any]:
    return {"runAsNonRoot": True, "runAsUser": UNPRIVILEGED_USER, "runAsGroup": UNPRIVILEGED_USER,
            "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}}


def _env(uri_secret: str, *, migrate: bool) -> list[dict[str, Any]]:
    """The migration needs the store only; the Flask secret is the server's."""
    flask = [] if migrate else [
        {"name": FLASK_SECRET_KEY, "valueFrom": {"secretKeyRef": {"name": SERVER_SECRET, "key": FLASK_SECRET_KEY}}}]
    return [
        {"name": "MLFLOW_BACKEND_STORE_URI",
         "valueFrom": {"secretKeyRef": {"name": uri_secret, "key": DATABASE_URI_KEY}}},
        *flask,
        # MLflow reports usage to its maintainers unless told not to (mlflow/environment_variables.py @ 3.17.2).
        {"name": "MLFLOW_DISABLE_TELEMETRY", "value": "true"},
        # The image's user has no home under a random uid: caches go to the writable /tmp.
        {"name": "HOME", "value": TMP},
    ]


def pod_spec(args: MlflowArgs, uri_secret: str, *, migrate: bool) -> dict[str, Any]:
    """The server's pod, or with `migrate` the pod that runs `mlflow db upgrade` once."""
    container: dict[str, Any] = {
        "name": "migrate" if migrate else "server",
        "image": IMAGE,
        # A release tag: a node that holds it restarts the server without reaching ghcr.io (CHECKOV_SKIPS).
        "imagePullPolicy": "IfNotPresent",
        "env": _env(uri_secret, migrate=migrate),
        "securityContext": _restricted(),
        "volumeMounts": [{"name": "tmp", "mountPath": TMP}],
    }
    # Bounded: the Prometheus exporter writes a file per worker process there, and a restarted worker a new one.
    volumes: list[dict[str, Any]] = [{"name": "tmp", "emptyDir": {"sizeLimit": TMP_SIZE}}]
    if migrate:
        # Kubernetes expands $(VAR) in args from the container's env: no shell, and the URI never hits a command line
        # the API shows.
        container |= {"command": ["mlflow"], "args": ["db", "upgrade", "$(MLFLOW_BACKEND_STORE_URI)"],
                      "resources": {"requests": {"cpu": "100m", "memory": "256Mi"},
                                    "limits": {"cpu": "1", "memory": "1Gi"}}}
    else:
        probe = {"httpGet": {"path": "/health", "port": PORT_NAME}, "periodSeconds": 10}
        container |= {
            "command": ["mlflow"],
            "args": pulumi.Output.from_input(args.artifact_bucket).apply(
                lambda bucket: server_args(artifact_bucket=bucket, pod_cidr=args.pod_cidr)),
            "ports": [{"name": PORT_NAME, "containerPort": PORT, "protocol": "TCP"}],
            # /health is exempt from the host check (security_utils.HEALTH_ENDPOINTS), so probes by pod IP pass.
            "readinessProbe": {**probe, "failureThreshold": 3},
            "livenessProbe": {**probe, "failureThreshold": 6, "initialDelaySeconds": 30},
            "resources": {"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"cpu": "2", "memory": "2Gi"}},
        }
        if args.artifact_bucket is None:
            container["volumeMounts"].append({"name": "artifacts", "mountPath": LOCAL_ARTIFACTS})
            volumes.append({"name": "artifacts", "persistentVolumeClaim": {"claimName": ARTIFACT_CLAIM}})
    return {
        # The migration's own account: nothing the server's may ever be granted reaches it.
        "serviceAccountName": MIGRATION_ACCOUNT if migrate else names.MLFLOW.name,
        # PostgreSQL only: nothing here talks to the Kubernetes API.
        "automountServiceAccountToken": False,
        "nodeSelector": {names.ROLE_LABEL: "system"},
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}, "fsGroup": UNPRIVILEGED_USER},
        "containers": [container],
        "volumes": volumes,
        **({"restartPolicy": "OnFailure"} if migrate else {}),
    }


def cnpg_cluster(size_gib: int) -> dict[str, Any]:
    """The `local` stack's database: one PostgreSQL instance, its `mlflow` database owned by user `mlflow`
    (CloudNativePG Cluster, postgresql.cnpg.io/v1 @ 1.30.0). No backup: the Barman Cloud plugin needs cert-manager,
    which the platform does not run (platform/cloudnative-pg/values.yaml)."""
    return {
        "apiVersion": CNPG_API_VERSION,
        "kind": "Cluster",
        "metadata": {"name": CNPG_CLUSTER, "namespace": NAMESPACE, "labels": labels(CNPG_CLUSTER, "database")},
        "spec": {
            "instances": 1,
            "imageName": POSTGRES_IMAGE,
            "storage": {"size": f"{size_gib}Gi"},
            "bootstrap": {"initdb": {"database": "mlflow", "owner": "mlflow"}},
            "affinity": {"nodeSelector": {names.ROLE_LABEL: "system"}},
            "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
        },
    }


def server_ingress_policy(kind: NetworkPolicyKind, tenant_namespaces: Sequence[str],
                          monitoring_namespace: str | None) -> dict[str, Any]:
    """Only tenants' pods (and Prometheus) reach the server; selecting its pods turns every other ingress away."""
    sources = sorted(tenant_namespaces) + ([monitoring_namespace] if monitoring_namespace else [])
    meta = {"name": "mlflow-server-ingress", "namespace": NAMESPACE, "labels": labels("mlflow", "tenancy")}
    if kind == "cilium":
        return {"apiVersion": CILIUM_API_VERSION, "kind": "CiliumNetworkPolicy", "metadata": meta, "spec": {
            "endpointSelector": {"matchLabels": APP_LABELS},
            "ingress": [{"fromEndpoints": [{"matchLabels": {_POD_NAMESPACE: ns}} for ns in sources],
                         "toPorts": [{"ports": [{"port": str(PORT), "protocol": "TCP"}]}]}],
        }}
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": meta, "spec": {
        "podSelector": {"matchLabels": APP_LABELS},
        "policyTypes": ["Ingress"],
        "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {_KUBE_NAMESPACE: ns}}} for ns in sources],
                     "ports": [{"port": PORT, "protocol": "TCP"}]}],
    }}


def tenant_egress_policy(kind: NetworkPolicyKind, namespace: str, tenant_labels: Mapping[str, str]) -> dict[str, Any]:
    """A tenant's pods may open connections to the server (the tenant's default-deny policy allows no such egress;
    Cilium and Kubernetes policies both add up)."""
    meta = {"name": "allow-mlflow", "namespace": namespace, "labels": dict(tenant_labels)}
    if kind == "cilium":
        return {"apiVersion": CILIUM_API_VERSION, "kind": "CiliumNetworkPolicy", "metadata": meta, "spec": {
            "endpointSelector": {},
            "egress": [{"toEndpoints": [{"matchLabels": {_POD_NAMESPACE: NAMESPACE, **APP_LABELS}}],
                        "toPorts": [{"ports": [{"port": str(PORT), "protocol": "TCP"}]}]}],
        }}
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": meta, "spec": {
        "podSelector": {},
        "policyTypes": ["Egress"],
        "egress": [{"to": [{"namespaceSelector": {"matchLabels": {_KUBE_NAMESPACE: NAMESPACE}},
                            "podSelector": {"matchLabels": APP_LABELS}}],
                    "ports": [{"port": PORT, "protocol": "TCP"}]}],
    }}


def _version_suffix(image: str) -> str:
    """`ghcr.io/mlflow/mlflow:v3.17.2-full` -> `v3-17-2-full`: the migration Job's name carries the version it runs."""
    return image.rpartition(":")[2].replace(".", "-").lower()


class Mlflow(pulumi.ComponentResource):
    """Namespace, database (Secret or CloudNativePG cluster), migration Job, server, Service, ServiceMonitor,
    network policies, and each tenant's client ConfigMap and egress policy."""

    release: pulumi.Resource
    tracking_uri: str

    def __init__(self, name: str, args: MlflowArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("trainyard:platform:Mlflow", name, None, opts)
        cluster = args.cluster
        ns_labels: Any = {**labels("mlflow", "tracking"),
                          # Every pod here runs unprivileged; CloudNativePG's instance pods included.
                          "pod-security.kubernetes.io/enforce": "baseline",
                          "pod-security.kubernetes.io/warn": "restricted"}
        namespace = k8s.core.v1.Namespace(f"{name}-namespace", metadata={"name": NAMESPACE, "labels": ns_labels},
                                          opts=k8s_options(cluster, self, args.depends_on))
        in_ns = k8s_options(cluster, self, [namespace])
        # Members browse the UI through `kubectl port-forward svc/mlflow` (README, "Reaching the UIs"); on `local` that
        # reaches the database pods here too, which still want the password only the server's Secret holds.
        ui_access(name, NAMESPACE, (t.group for t in args.tenants.values() if t.group is not None), in_ns)
        stateful = pulumi.ResourceOptions(protect=args.protect, retain_on_delete=args.protect)
        uri_secret, database = self._database(name, args, namespace, in_ns, stateful)

        flask = random.RandomPassword(f"{name}-flask-secret", length=64, special=False,
                                      opts=pulumi.ResourceOptions(parent=self))
        flask_key: Any = {FLASK_SECRET_KEY: pulumi.Output.secret(flask.result)}
        server_secret = k8s.core.v1.Secret(
            f"{name}-server-secret", metadata={"name": SERVER_SECRET, "namespace": NAMESPACE,
                                               "labels": labels("mlflow", "tracking")},
            string_data=flask_key, opts=in_ns)
        account = k8s.core.v1.ServiceAccount(
            f"{name}-account", metadata={"name": names.MLFLOW.name, "namespace": NAMESPACE,
                                         "labels": labels("mlflow", "tracking")},
            automount_service_account_token=False, opts=in_ns)
        migration_account = k8s.core.v1.ServiceAccount(
            f"{name}-db-upgrade-account", metadata={"name": MIGRATION_ACCOUNT, "namespace": NAMESPACE,
                                                    "labels": labels("mlflow", "db-upgrade")},
            automount_service_account_token=False, opts=in_ns)
        volumes: list[pulumi.Resource] = []
        if args.artifact_bucket is None:
            claim: Any = {"accessModes": ["ReadWriteOnce"],
                          "resources": {"requests": {"storage": args.settings.artifact_volume}}}
            volumes.append(k8s.core.v1.PersistentVolumeClaim(
                f"{name}-artifacts", metadata={"name": ARTIFACT_CLAIM, "namespace": NAMESPACE,
                                               "labels": labels("mlflow", "tracking")},
                spec=claim, opts=pulumi.ResourceOptions.merge(in_ns, stateful)))
        prereqs = [namespace, account, migration_account, server_secret, *database, *volumes]

        job_labels = {**APP_LABELS, "app.kubernetes.io/component": "db-upgrade"}
        job_spec: Any = {"backoffLimit": 6, "template": {
            "metadata": {"labels": job_labels}, "spec": pod_spec(args, uri_secret, migrate=True)}}
        migration = k8s.batch.v1.Job(
            f"{name}-db-upgrade",
            metadata={"name": f"mlflow-db-upgrade-{_version_suffix(IMAGE)}", "namespace": NAMESPACE,
                      "labels": {**labels("mlflow", "db-upgrade")}, "annotations": CHECKOV_SKIPS},
            spec=job_spec,
            # A Job's template cannot change: a new MLflow version is a new Job (its name), run before the rollout.
            opts=pulumi.ResourceOptions.merge(k8s_options(cluster, self, prereqs),
                                              pulumi.ResourceOptions(replace_on_changes=["spec"],
                                                                     delete_before_replace=True)))

        replicas = args.settings.replicas
        deployment_spec: Any = {
            "replicas": replicas,
            "selector": {"matchLabels": APP_LABELS},
            # One more pod before one less; the local artifact volume mounts on one node, so there it is Recreate.
            "strategy": ({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
                         if args.artifact_bucket is not None else {"type": "Recreate"}),
            "template": {"metadata": {"labels": APP_LABELS},
                         "spec": {**pod_spec(args, uri_secret, migrate=False),
                                  "topologySpreadConstraints": [{
                                      "maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                                      "whenUnsatisfiable": "ScheduleAnyway",
                                      "labelSelector": {"matchLabels": APP_LABELS}}]}},
        }
        self.deployment = k8s.apps.v1.Deployment(
            f"{name}-server", metadata={"name": "mlflow", "namespace": NAMESPACE,
                                        "labels": {**labels("mlflow", "tracking-server")},
                                        "annotations": CHECKOV_SKIPS},
            spec=deployment_spec, opts=k8s_options(cluster, self, [*prereqs, migration]))
        if replicas > 1:
            pdb_spec: Any = {"minAvailable": 1, "selector": {"matchLabels": APP_LABELS}}
            k8s.policy.v1.PodDisruptionBudget(
                f"{name}-pdb", metadata={"name": "mlflow", "namespace": NAMESPACE,
                                         "labels": labels("mlflow", "tracking-server")},
                spec=pdb_spec, opts=in_ns)
        service_spec: Any = {"selector": APP_LABELS,
                             "ports": [{"name": PORT_NAME, "port": PORT, "targetPort": PORT_NAME, "protocol": "TCP"}]}
        service = k8s.core.v1.Service(
            f"{name}-service", metadata={"name": names.MLFLOW_SERVICE, "namespace": NAMESPACE,
                                         "labels": {**labels("mlflow", "tracking-server"), **APP_LABELS}},
            spec=service_spec, opts=in_ns)
        if args.monitoring is not None and args.monitoring_namespace is not None:
            target = ScrapeTarget(name="mlflow", namespace=NAMESPACE, selector=APP_LABELS, port=PORT_NAME)
            custom_resource(f"{name}-service-monitor", service_monitor(target, args.monitoring_namespace),
                            k8s_options(cluster, self, [args.monitoring, service]))
        self._policies(name, args, namespace)
        self.release = self.deployment
        self.tracking_uri = names.MLFLOW_TRACKING_URI
        self.register_outputs({"trackingUri": self.tracking_uri, "deployment": self.deployment.metadata["name"]})

    def _database(self, name: str, args: MlflowArgs, namespace: pulumi.Resource, in_ns: pulumi.ResourceOptions,
                  stateful: pulumi.ResourceOptions) -> tuple[str, list[pulumi.Resource]]:
        """The Secret holding the store's URI, and what must exist before a pod reads it."""
        if args.database is not None:
            secret = k8s.core.v1.Secret(
                f"{name}-db-secret", metadata={"name": DATABASE_SECRET, "namespace": NAMESPACE,
                                               "labels": labels("mlflow", "database")},
                string_data={DATABASE_URI_KEY: connection_uri(args.database)}, opts=in_ns)
            return DATABASE_SECRET, [secret]
        # After the namespace, which waits for the CloudNativePG release (`depends_on`): its CRDs and webhook.
        database = custom_resource(f"{name}-db", cnpg_cluster(args.settings.database.storage_gib),
                                   pulumi.ResourceOptions.merge(k8s_options(args.cluster, self, [namespace]), stateful))
        return f"{CNPG_CLUSTER}-app", [database]

    def _policies(self, name: str, args: MlflowArgs, namespace: pulumi.Resource) -> None:
        cluster, kind = args.cluster, args.network_policy
        tenants = sorted(args.tenants.values(), key=lambda t: t.name)
        policy = server_ingress_policy(kind, [t.namespace for t in tenants], args.monitoring_namespace)
        self._policy(f"{name}-ingress", policy, k8s_options(cluster, self, [namespace]))
        for tenant in tenants:
            tenant_labels = labels("mlflow-client", "tenancy", **{"trainyard.io/tenant": tenant.name})
            in_tenant = k8s_options(cluster, self, list(tenant.ready))
            root = _artifact_root(args.artifact_bucket, tenant.namespace)
            config_data: Any = {"MLFLOW_TRACKING_URI": names.MLFLOW_TRACKING_URI,
                                "TRAINYARD_MLFLOW_ARTIFACT_ROOT": root}
            k8s.core.v1.ConfigMap(
                f"{name}-client-{tenant.name}",
                metadata={"name": names.MLFLOW_CLIENT_CONFIG, "namespace": tenant.namespace, "labels": tenant_labels},
                data=config_data, opts=in_tenant)
            self._policy(f"{name}-egress-{tenant.name}",
                         tenant_egress_policy(kind, tenant.namespace, tenant_labels), in_tenant)

    def _policy(self, logical: str, manifest: dict[str, Any], opts: pulumi.ResourceOptions) -> None:
        if manifest["kind"] == "CiliumNetworkPolicy":
            custom_resource(logical, manifest, opts)
            return
        spec: Any = manifest["spec"]
        k8s.networking.v1.NetworkPolicy(logical, metadata=manifest["metadata"], spec=spec, opts=opts)


def build(ctx: AddonContext) -> Mlflow:
    cluster = ctx.cluster
    cilium = any(a.cni for a in ctx.enabled)
    return Mlflow(ctx.addon.resource_name, MlflowArgs(
        cluster=cluster, settings=ctx.settings(MlflowSettings), database=cluster.tracking_database,
        artifact_bucket=cluster.checkpoint_bucket, tenants=ctx.tenants,
        network_policy="cilium" if cilium else "kubernetes",
        pod_cidr=ctx.stack.network.vpc_cidr if ctx.stack.target == "aws" else None,
        monitoring_namespace=ctx.catalogue.chart("kube-prometheus-stack").namespace if ctx.monitoring else None,
        monitoring=ctx.monitoring, protect=ctx.stack.protect,
        depends_on=ctx.after))


COMPONENT = AddonCode(build=build)
