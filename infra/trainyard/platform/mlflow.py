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
(an experiment's artifact location is its workspace's root: platform/mlflow_auth.py). The default artifact
root is a prefix no tenant may write, so an experiment created without a location fails its first upload instead of
landing outside every tenant. On `local` (no S3) the server proxies artifacts onto a volume of its own.

Who sees what: MLflow's basic-auth app, one user per tenant, nothing open by default (platform/mlflow_auth.py). The
server still holds no AWS role: with one, a tenant that owns an experiment could point its artifact location at
another tenant's prefix and read it through the server (handlers.py get_artifact_handler reads
`run.info.artifact_uri` with the server's credentials; _validate_storage_location_uri checks only the scheme), so the
UI shows no artifacts on AWS. On `local` the server's proxy keeps each experiment's artifacts under its id, which the
auth app checks per experiment.

The database: RDS on AWS (cloud/database.py), a one-instance CloudNativePG cluster on `local` whose owner's password
is generated here (bootstrap.initdb.secret); either way the URI, with the password, is in a Secret here, and the
server's pods carry its digest, so a changed password rolls them. The schemas are migrated by a Job per MLflow
version and store before the server rolls (`pulumi up` waits for it), so replicas never race each other's migrations.
Every pod that connects to RDS mounts its certificate authority's root (`mlflow-db-ca`) at the path the URI gives
libpq, which then verifies the server's certificate and host name (cloud/database.py).
The CloudNativePG cluster has a namespace of its own (`mlflow-db`): members may port-forward to the pods of this
namespace (the UI), and a port-forward enters the pod past every network policy, so the database is where no tenant
has a Role; that namespace takes connections from the server, the migration and the operator only, and is kept like
the database (deleting a namespace deletes what it holds). On `local` the MLflow namespace holds the artifacts' volume,
so it is kept too.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pulumi
import pulumi_kubernetes as k8s
import pulumi_random as random
import yaml

from trainyard import names
from trainyard.cloud.context import ClusterContext, DatabaseFacts
from trainyard.cloud.database import connection_uri
from trainyard.config.model import MlflowSettings
from trainyard.paths import PLATFORM_DIR
from trainyard.platform import mlflow_auth as auth
from trainyard.platform.addon import AddonCode, AddonContext
from trainyard.platform.context import TenantFacts
from trainyard.platform.kube import checkov_skips, k8s_options, labels
from trainyard.platform.network_policy import CILIUM_API_VERSION
from trainyard.platform.objects import custom_resource
from trainyard.platform.tenant_access import ui_access

IMAGE: str = yaml.safe_load((PLATFORM_DIR / "mlflow" / "images.yaml").read_text(encoding="utf-8"))["server"]
USERS_SCRIPT = PLATFORM_DIR / "mlflow" / auth.USERS_SCRIPT
POSTGRES_IMAGE: str = yaml.safe_load(
    (PLATFORM_DIR / "cloudnative-pg" / "images.yaml").read_text(encoding="utf-8"))["postgres"]
NAMESPACE = names.MLFLOW_NAMESPACE
PORT = names.MLFLOW_PORT
PORT_NAME = "http"
APP_LABELS = {"app.kubernetes.io/name": "mlflow", "app.kubernetes.io/component": "tracking-server"}
DATABASE_SECRET = "mlflow-db"
DATABASE_URI_KEY = "uri"
# RDS's root CA for the stack's region (cloud/database.py verifies the server against it): a ConfigMap every pod that
# connects to the database mounts, at the path its URI names (sslrootcert).
DATABASE_CA = "mlflow-db-ca"
DATABASE_CA_KEY = "root.crt"
DATABASE_CA_DIR = "/etc/mlflow-db-ca"
DATABASE_ROOT_CERTIFICATE = f"{DATABASE_CA_DIR}/{DATABASE_CA_KEY}"
SERVER_SECRET = "mlflow-server"
# MLflow reads the Flask secret from this variable and hands it to every worker (mlflow/server/__init__.py @ 3.17.2,
# _run_server: MLFLOW_FLASK_SERVER_SECRET_KEY); without it each process would sign sessions with its own.
FLASK_SECRET_KEY = "MLFLOW_FLASK_SERVER_SECRET_KEY"
# The owner's credentials CloudNativePG initialises the database with (a kubernetes.io/basic-auth Secret:
# Cluster spec.bootstrap.initdb.secret @ 1.30.0), and the Service of its primary, `<cluster>-rw` (cloudnative-pg
# v1.30.0 docs/src/applications.md).
CNPG_CLUSTER = "mlflow-db"
CNPG_OWNER_SECRET = "mlflow-db-owner"
CNPG_PORT = 5432
DATABASE_NAME = DATABASE_OWNER = "mlflow"
CNPG_API_VERSION = "postgresql.cnpg.io/v1"
DATABASE_NAMESPACE = names.MLFLOW_DATABASE_NAMESPACE
# The operator reaches every instance on PostgreSQL's port and its instance manager's status port, and the
# instances reach each other (cloudnative-pg v1.30.0 docs/src/networking.md, samples/networkpolicy-example.yaml: the
# operator's pods by app.kubernetes.io/name, an instance's by cnpg.io/cluster, docs/src/labels_annotations.md).
CNPG_STATUS_PORT = 8000
CNPG_OPERATOR_LABELS = {"app.kubernetes.io/name": "cloudnative-pg"}
CNPG_CLUSTER_LABEL = "cnpg.io/cluster"
LOCAL_DATABASE_HOST = f"{CNPG_CLUSTER}-rw.{DATABASE_NAMESPACE}.svc"
# Under every tenant's artifact prefixes, and one no tenant may write (their role writes `<namespace>/*` only).
DEFAULT_ARTIFACT_DIR = "_unassigned"
LOCAL_ARTIFACTS = "/mlartifacts"
ARTIFACT_CLAIM = "mlflow-artifacts"
TMP = "/tmp"
TMP_SIZE = "256Mi"
MIGRATION_ACCOUNT = "mlflow-db-upgrade"
MIGRATION_LABELS = {**APP_LABELS, "app.kubernetes.io/component": "db-upgrade"}
# On the server's pod template: a new store URI or auth config (a new password) rolls the pods, which read both
# only when they start.
CONFIG_DIGEST = "trainyard.io/config-sha256"
UNPRIVILEGED_USER = 10001
# Host names the server answers (its DNS-rebinding check, --allowed-hosts, fnmatch patterns over the Host header:
# mlflow/server/security_utils.py @ 3.17.2 is_allowed_host_header): the Service's in-cluster names with the port and
# localhost (kubectl port-forward). Nothing reaches it by a pod address: the probes' /health is exempt
# (security_utils.HEALTH_ENDPOINTS), and Prometheus does not scrape it (platform/mlflow_auth.py).
_SERVICE_HOSTS = tuple(".".join((names.MLFLOW_SERVICE, NAMESPACE, "svc", "cluster.local")[:n]) for n in (1, 2, 3, 4))
ALLOWED_HOSTS = ",".join((*(f"{h}:{PORT}" for h in _SERVICE_HOSTS), "localhost", "localhost:*", "127.0.0.1",
                          "127.0.0.1:*"))
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
CHECKOV_SKIPS = checkov_skips(_CHECKOV_REASONS)

NetworkPolicyKind = Literal["cilium", "kubernetes"]


@dataclass(frozen=True)
class LocalDatabase:
    """A CloudNativePG cluster of our own (`local`), after its operator (in `depends_on`)."""

    operator_namespace: str  # whose pods reach it


@dataclass(frozen=True)
class MlflowArgs:
    cluster: ClusterContext
    settings: MlflowSettings
    # RDS on AWS, or `local`'s own.
    database: DatabaseFacts | LocalDatabase
    # The checkpoint bucket, whose `<namespace>/mlflow/` prefixes hold the artifacts; None on `local`.
    artifact_bucket: pulumi.Input[str] | None
    tenants: Mapping[str, TenantFacts]
    network_policy: NetworkPolicyKind
    protect: bool
    depends_on: Sequence[pulumi.Resource] = ()


def artifact_root(bucket: pulumi.Input[str], namespace: str) -> pulumi.Output[str]:
    """Where a tenant's experiments keep their artifacts on AWS (its workspace's default_artifact_root): its S3
    prefix, which its pod identity may write."""
    return pulumi.Output.concat("s3://", bucket, f"/{namespace}/{names.MLFLOW_ARTIFACT_DIR}")


def server_args(*, artifact_bucket: str | None, workers: int = 2) -> list[str]:
    """`mlflow server`'s command line (mlflow/cli/__init__.py @ 3.17.2); the store URI and the Flask secret come
    from the environment (MLFLOW_BACKEND_STORE_URI is the --backend-store-uri option's envvar)."""
    args = ["server", "--host", "0.0.0.0", "--port", str(PORT), "--workers", str(workers),
            "--allowed-hosts", ALLOWED_HOSTS,
            # Users and permissions, one workspace per tenant (mlflow/cli/__init__.py --app-name,
            # --enable-workspaces; the workspace store is the tracking store: resolve_workspace_store_uri,
            # mlflow/utils/workspace_utils.py; platform/mlflow_auth.py).
            "--app-name", "basic-auth", "--enable-workspaces"]
    if artifact_bucket is None:
        return [*args, "--serve-artifacts", "--artifacts-destination", LOCAL_ARTIFACTS]
    return [*args, "--no-serve-artifacts",
            "--default-artifact-root", f"s3://{artifact_bucket}/{names.MLFLOW_ARTIFACT_DIR}/{DEFAULT_ARTIFACT_DIR}"]


def _restricted() -> dict[str, Any]:
    return {"runAsNonRoot": True, "runAsUser": UNPRIVILEGED_USER, "runAsGroup": UNPRIVILEGED_USER,
            "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}}


def _secret_env(name: str, secret: str, key: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}


AUTH_DATABASE_ENV = "MLFLOW_AUTH_DATABASE_URI"


def _env(*, migrate: bool) -> list[dict[str, Any]]:
    """The migration needs the two stores' URIs only; the Flask secret and the auth app's config are the server's."""
    own = [_secret_env(AUTH_DATABASE_ENV, auth.AUTH_SECRET, auth.DATABASE_URI_KEY)] if migrate else [
        _secret_env(FLASK_SECRET_KEY, SERVER_SECRET, FLASK_SECRET_KEY),
        {"name": auth.CONFIG_PATH_ENV, "value": f"{auth.CONFIG_DIR}/{auth.CONFIG_KEY}"},
        _secret_env(auth.ADMIN_PASSWORD_ENV, auth.AUTH_SECRET, auth.ADMIN_PASSWORD_KEY)]
    return [
        _secret_env("MLFLOW_BACKEND_STORE_URI", DATABASE_SECRET, DATABASE_URI_KEY),
        *own,
        # MLflow reports usage to its maintainers unless told not to (mlflow/environment_variables.py @ 3.17.2).
        {"name": "MLFLOW_DISABLE_TELEMETRY", "value": "true"},
        # The image's user has no home under a random uid: caches go to the writable /tmp.
        {"name": "HOME", "value": TMP},
    ]


# The auth store's schema, made by the migration before its tables (SQLAlchemy, which the image's server runs on).
CREATE_AUTH_SCHEMA = ("import os, sqlalchemy\n"
                      "with sqlalchemy.create_engine(os.environ['MLFLOW_BACKEND_STORE_URI']).begin() as db:\n"
                      f"    db.execute(sqlalchemy.text('CREATE SCHEMA IF NOT EXISTS {auth.SCHEMA}'))\n")
_MIGRATION_RESOURCES = {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}}


def _migration_steps(base: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The auth schema, then the tracking store (`mlflow db upgrade`), as init containers in that order; then the
    auth store (`python -m mlflow.server.auth db upgrade`: mlflow/server/auth/db/cli.py @ 3.17.2). Kubernetes expands
    $(VAR) in args from the container's env: no shell, and no URI on a command line the API shows."""
    step = {**base, "resources": _MIGRATION_RESOURCES}
    schema = {**step, "name": "auth-schema", "command": ["python"], "args": ["-c", CREATE_AUTH_SCHEMA]}
    tracking = {**step, "name": "migrate", "command": ["mlflow"], "args": ["db", "upgrade",
                                                                         "$(MLFLOW_BACKEND_STORE_URI)"]}
    users = {**step, "name": "migrate-auth", "command": ["python"],
             "args": ["-m", "mlflow.server.auth", "db", "upgrade", "--url", f"$({AUTH_DATABASE_ENV})"]}
    return [schema, tracking], users


def _root_certificate(args: MlflowArgs) -> str | None:
    database = args.database
    return database.root_certificate if isinstance(database, DatabaseFacts) else None


def pod_spec(args: MlflowArgs, *, migrate: bool) -> dict[str, Any]:
    """The server's pod, or with `migrate` the pod that migrates both stores once; both connect to the database."""
    container: dict[str, Any] = {
        "name": "server",
        "image": IMAGE,
        # A release tag: a node that holds it restarts the server without reaching ghcr.io (CHECKOV_SKIPS).
        "imagePullPolicy": "IfNotPresent",
        "env": _env(migrate=migrate),
        "securityContext": _restricted(),
        "volumeMounts": [{"name": "tmp", "mountPath": TMP}],
    }
    # Bounded: caches (HOME) go there.
    volumes: list[dict[str, Any]] = [{"name": "tmp", "emptyDir": {"sizeLimit": TMP_SIZE}}]
    if _root_certificate(args) is not None:
        container["volumeMounts"].append({"name": "db-ca", "mountPath": DATABASE_CA_DIR, "readOnly": True})
        volumes.append({"name": "db-ca", "configMap": {"name": DATABASE_CA, "defaultMode": 0o444}})
    init: list[dict[str, Any]] = []
    if migrate:
        init, container = _migration_steps(container)
    else:
        container["volumeMounts"].append({"name": "auth", "mountPath": auth.CONFIG_DIR, "readOnly": True})
        volumes.append({"name": "auth", "secret": {"secretName": auth.AUTH_SECRET, "defaultMode": 0o440,
                                                   "items": [{"key": auth.CONFIG_KEY, "path": auth.CONFIG_KEY}]}})
        probe = {"httpGet": {"path": "/health", "port": PORT_NAME}, "periodSeconds": 10}
        container |= {
            "command": ["mlflow"],
            "args": pulumi.Output.from_input(args.artifact_bucket).apply(
                lambda bucket: server_args(artifact_bucket=bucket)),
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
        **({"initContainers": init} if init else {}),
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
        "metadata": {"name": CNPG_CLUSTER, "namespace": DATABASE_NAMESPACE,
                     "labels": labels(CNPG_CLUSTER, "database")},
        "spec": {
            "instances": 1,
            "imageName": POSTGRES_IMAGE,
            "storage": {"size": f"{size_gib}Gi"},
            "bootstrap": {"initdb": {"database": DATABASE_NAME, "owner": DATABASE_OWNER,
                                     "secret": {"name": CNPG_OWNER_SECRET}}},
            "affinity": {"nodeSelector": {names.ROLE_LABEL: "system"}},
            "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
        },
    }


USERS_LABELS = {**APP_LABELS, "app.kubernetes.io/component": auth.USERS_COMPONENT}


def database_ingress_policy(operator_namespace: str) -> dict[str, Any]:
    """`local`'s database takes PostgreSQL connections from the server and the migration Job, the operator's on its
    two ports, and its own instances'; selecting every pod of its namespace turns every other connection away. A
    standard NetworkPolicy: `local` runs no Cilium (and Cilium enforces these too)."""
    postgres = {"port": CNPG_PORT, "protocol": "TCP"}
    both = [{"port": CNPG_STATUS_PORT, "protocol": "TCP"}, postgres]

    def pods(namespace: str, pod_labels: Mapping[str, str]) -> dict[str, Any]:
        return {"namespaceSelector": {"matchLabels": {_KUBE_NAMESPACE: namespace}},
                "podSelector": {"matchLabels": dict(pod_labels)}}

    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {
        "name": "mlflow-db-ingress", "namespace": DATABASE_NAMESPACE, "labels": labels(CNPG_CLUSTER, "database")},
        "spec": {
            "podSelector": {},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [pods(NAMESPACE, APP_LABELS), pods(NAMESPACE, MIGRATION_LABELS)], "ports": [postgres]},
                {"from": [pods(operator_namespace, CNPG_OPERATOR_LABELS)], "ports": both},
                {"from": [{"podSelector": {"matchLabels": {CNPG_CLUSTER_LABEL: CNPG_CLUSTER}}}], "ports": both},
            ],
        }}


def server_ingress_policy(kind: NetworkPolicyKind, tenant_namespaces: Sequence[str]) -> dict[str, Any]:
    """Only tenants' pods and the users Job reach the server; selecting its pods turns every other ingress away."""
    sources = sorted(tenant_namespaces)
    meta = {"name": "mlflow-server-ingress", "namespace": NAMESPACE, "labels": labels("mlflow", "tenancy")}
    if kind == "cilium":
        return {"apiVersion": CILIUM_API_VERSION, "kind": "CiliumNetworkPolicy", "metadata": meta, "spec": {
            "endpointSelector": {"matchLabels": APP_LABELS},
            "ingress": [{"fromEndpoints": [*({"matchLabels": {_POD_NAMESPACE: ns}} for ns in sources),
                                           {"matchLabels": {_POD_NAMESPACE: NAMESPACE, **USERS_LABELS}}],
                         "toPorts": [{"ports": [{"port": str(PORT), "protocol": "TCP"}]}]}],
        }}
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": meta, "spec": {
        "podSelector": {"matchLabels": APP_LABELS},
        "policyTypes": ["Ingress"],
        "ingress": [{"from": [*({"namespaceSelector": {"matchLabels": {_KUBE_NAMESPACE: ns}}} for ns in sources),
                              {"podSelector": {"matchLabels": USERS_LABELS}}],
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


def _digest(*values: str | None) -> str:
    """What pod templates carry of the secrets they read at start; a value not known yet (a preview, the offline
    plan) digests as empty."""
    return hashlib.sha256("\n".join(v or "" for v in values).encode()).hexdigest()


def _version_suffix(image: str) -> str:
    """`ghcr.io/mlflow/mlflow:v3.17.2-full` -> `v3-17-2-full`: the migration Job's name carries the version it runs."""
    return image.rpartition(":")[2].replace(".", "-").lower()


class Mlflow(pulumi.ComponentResource):
    """Namespace, database (Secret, and a CloudNativePG cluster on `local`), auth config, migration Job, server,
    Service, the users Job, network policies, and each tenant's client Secret and egress policy."""

    release: pulumi.Resource
    tracking_uri: str

    def __init__(self, name: str, args: MlflowArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("trainyard:platform:Mlflow", name, None, opts)
        cluster = args.cluster
        ns_labels: Any = {**labels("mlflow", "tracking"),
                          # Every pod here runs unprivileged; CloudNativePG's instance pods included.
                          "pod-security.kubernetes.io/enforce": "baseline",
                          "pod-security.kubernetes.io/warn": "restricted"}
        stateful = pulumi.ResourceOptions(protect=args.protect, retain_on_delete=args.protect)
        # On `local` it holds the artifacts' volume, which deleting the namespace would delete.
        namespace = k8s.core.v1.Namespace(
            f"{name}-namespace", metadata={"name": NAMESPACE, "labels": ns_labels},
            opts=pulumi.ResourceOptions.merge(k8s_options(cluster, self, args.depends_on),
                                              stateful if args.artifact_bucket is None else None))
        in_ns = k8s_options(cluster, self, [namespace])
        # Members browse the UI through `kubectl port-forward svc/mlflow` (README, "Reaching the UIs"), which reaches
        # every pod of this namespace: the database is never here.
        ui_access(name, NAMESPACE, (t.group for t in args.tenants.values() if t.group is not None), in_ns)
        store_uri, database = self._database(name, args, ns_labels, in_ns, stateful)
        auth_secret, admin = self._auth(name, args, store_uri, in_ns)

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
        prereqs = [namespace, account, migration_account, server_secret, auth_secret, *database, *volumes]

        # The store it migrates (its digest): a new database, a moved one included, is a new Job and so a new run.
        store_digest = pulumi.Output.unsecret(store_uri.apply(_digest))
        job_spec: Any = {"backoffLimit": 6, "template": {
            "metadata": {"labels": MIGRATION_LABELS, "annotations": {CONFIG_DIGEST: store_digest}},
            "spec": pod_spec(args, migrate=True)}}
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
        digest = pulumi.Output.unsecret(pulumi.Output.all(store_uri, admin).apply(lambda values: _digest(*values)))
        deployment_spec: Any = {
            "replicas": replicas,
            "selector": {"matchLabels": APP_LABELS},
            # One more pod before one less; the local artifact volume mounts on one node, so there it is Recreate.
            "strategy": ({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
                         if args.artifact_bucket is not None else {"type": "Recreate"}),
            "template": {"metadata": {"labels": APP_LABELS, "annotations": {CONFIG_DIGEST: digest}},
                         "spec": {**pod_spec(args, migrate=False),
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
        policy = self._policies(name, args, namespace)
        self._users(name, args, namespace, [self.deployment, service, policy], store_digest)
        self.release = self.deployment
        self.tracking_uri = names.MLFLOW_TRACKING_URI
        self.register_outputs({"trackingUri": self.tracking_uri, "deployment": self.deployment.metadata["name"]})

    def _database(self, name: str, args: MlflowArgs, ns_labels: Mapping[str, str], in_ns: pulumi.ResourceOptions,
                  stateful: pulumi.ResourceOptions) -> tuple[pulumi.Output[str], list[pulumi.Resource]]:
        """The store's URI and its Secret, and what must exist before a pod reads it."""
        facts, database = args.database, list[pulumi.Resource]()
        if isinstance(facts, LocalDatabase):
            cluster = args.cluster
            # Kept like the database: deleting it would delete the Cluster and its volume. It waits for the
            # CloudNativePG release (`depends_on`): its CRDs and webhook.
            meta: Any = {"name": DATABASE_NAMESPACE, "labels": {**ns_labels, **labels(CNPG_CLUSTER, "database")}}
            namespace = k8s.core.v1.Namespace(
                f"{name}-db-namespace", metadata=meta,
                opts=pulumi.ResourceOptions.merge(k8s_options(cluster, self, args.depends_on), stateful))
            in_db_ns = k8s_options(cluster, self, [namespace])
            policy: Any = database_ingress_policy(facts.operator_namespace)
            ingress = k8s.networking.v1.NetworkPolicy(f"{name}-db-ingress", metadata=policy["metadata"],
                                                      spec=policy["spec"], opts=in_db_ns)
            # The owner's password is ours, so the URI is known here as on AWS; CloudNativePG sets it at initdb only,
            # so it is kept like the database.
            password = random.RandomPassword(f"{name}-db-password", length=auth.PASSWORD_LENGTH, special=False,
                                             opts=pulumi.ResourceOptions(parent=self, protect=args.protect))
            owner: Any = {"username": DATABASE_OWNER, "password": pulumi.Output.secret(password.result)}
            owner_secret = k8s.core.v1.Secret(
                f"{name}-db-owner", metadata={"name": CNPG_OWNER_SECRET, "namespace": DATABASE_NAMESPACE,
                                              "labels": labels(CNPG_CLUSTER, "database")},
                type="kubernetes.io/basic-auth", string_data=owner, opts=in_db_ns)
            database.append(custom_resource(
                f"{name}-db", cnpg_cluster(args.settings.database.storage_gib),
                pulumi.ResourceOptions.merge(k8s_options(cluster, self, [namespace, owner_secret, ingress]),
                                             stateful)))
            facts = DatabaseFacts(host=LOCAL_DATABASE_HOST, port=CNPG_PORT,
                                  name=DATABASE_NAME, username=DATABASE_OWNER,
                                  password=pulumi.Output.secret(password.result))
        root_path = None
        if facts.root_certificate is not None:
            root_path = DATABASE_ROOT_CERTIFICATE
            database.append(k8s.core.v1.ConfigMap(
                f"{name}-db-ca", metadata={"name": DATABASE_CA, "namespace": NAMESPACE,
                                           "labels": labels("mlflow", "database")},
                data={DATABASE_CA_KEY: facts.root_certificate}, opts=in_ns))
        uri = connection_uri(facts, root_path)
        secret = k8s.core.v1.Secret(
            f"{name}-db-secret", metadata={"name": DATABASE_SECRET, "namespace": NAMESPACE,
                                           "labels": labels("mlflow", "database")},
            string_data={DATABASE_URI_KEY: uri}, opts=in_ns)
        return uri, [secret, *database]

    def _auth(self, name: str, args: MlflowArgs, store_uri: pulumi.Output[str],
              in_ns: pulumi.ResourceOptions) -> tuple[pulumi.Resource, pulumi.Output[str]]:
        """The auth app's config and the admin's password (kept: the app reads it only into an empty user store)."""
        admin = random.RandomPassword(f"{name}-auth-admin", length=auth.PASSWORD_LENGTH, special=False,
                                      opts=pulumi.ResourceOptions(parent=self, protect=args.protect))
        auth_uri = store_uri.apply(auth.schema_uri)
        data: Any = {auth.CONFIG_KEY: pulumi.Output.secret(auth_uri.apply(auth.auth_config)),
                     auth.DATABASE_URI_KEY: pulumi.Output.secret(auth_uri),
                     auth.ADMIN_PASSWORD_KEY: pulumi.Output.secret(admin.result)}
        secret = k8s.core.v1.Secret(
            f"{name}-auth-secret", metadata={"name": auth.AUTH_SECRET, "namespace": NAMESPACE,
                                             "labels": labels("mlflow", "auth")},
            string_data=data, opts=in_ns)
        return secret, admin.result

    def _users(self, name: str, args: MlflowArgs, namespace: pulumi.Resource,
               server: Sequence[pulumi.Resource], store_digest: pulumi.Output[str]) -> None:
        """Each tenant's user: its password in the tenant's `mlflow-client` Secret and in the users Secret here, and
        the Job that makes the users once the server answers."""
        cluster = args.cluster
        in_ns = k8s_options(cluster, self, [namespace])
        passwords: dict[str, pulumi.Output[str]] = {}
        roots: dict[str, pulumi.Output[str]] = {}
        for tenant in sorted(args.tenants.values(), key=lambda t: t.name):
            password = random.RandomPassword(f"{name}-user-{tenant.name}", length=auth.PASSWORD_LENGTH,
                                             special=False, opts=pulumi.ResourceOptions(parent=self))
            passwords[tenant.name] = password.result
            if args.artifact_bucket is not None:
                roots[tenant.name] = artifact_root(args.artifact_bucket, tenant.namespace)
            data: Any = auth.client_data(tenant.name, pulumi.Output.secret(password.result))
            k8s.core.v1.Secret(
                f"{name}-client-{tenant.name}",
                metadata={"name": names.MLFLOW_CLIENT_CONFIG, "namespace": tenant.namespace,
                          "labels": labels("mlflow-client", "tenancy", **{"trainyard.io/tenant": tenant.name})},
                string_data=data, opts=k8s_options(cluster, self, list(tenant.ready)))
        users: Any = {user: pulumi.Output.secret(password) for user, password in passwords.items()}
        users_secret = k8s.core.v1.Secret(
            f"{name}-users", metadata={"name": auth.USERS_SECRET, "namespace": NAMESPACE,
                                       "labels": labels("mlflow", auth.USERS_COMPONENT)},
            string_data=users, opts=in_ns)
        meta: Any = {"name": auth.USERS_ACCOUNT, "namespace": NAMESPACE,
                     "labels": labels("mlflow", auth.USERS_COMPONENT)}
        account = k8s.core.v1.ServiceAccount(f"{name}-users-account", metadata=meta,
                                             automount_service_account_token=False, opts=in_ns)
        script = k8s.core.v1.ConfigMap(f"{name}-users-script", metadata=meta,
                                       data={auth.USERS_SCRIPT: USERS_SCRIPT.read_text(encoding="utf-8")},
                                       opts=in_ns)
        roots_meta: Any = {**meta, "name": auth.ROOTS_CONFIG}
        roots_data: Any = roots
        roots_config = k8s.core.v1.ConfigMap(f"{name}-workspace-roots", metadata=roots_meta, data=roots_data,
                                             opts=in_ns)
        spec: Any = auth.users_job_spec(IMAGE, _restricted())
        # The users, passwords and roots it makes (their digest), and the store they go into: a change, a new
        # database included, is a new Job, and so a new run.
        spec["template"]["metadata"]["annotations"] = {
            "trainyard.io/users-sha256": pulumi.Output.unsecret(
                pulumi.Output.all(pulumi.Output.all(**passwords), pulumi.Output.all(**roots)).apply(
                    # Output.all of no values is an empty list, not a dict.
                    lambda known: auth.users_digest(
                        {user: password or "" for user, password in dict(known[0]).items()},
                        {user: root or "" for user, root in dict(known[1]).items()}))),
            CONFIG_DIGEST: store_digest}
        job_meta: Any = {**meta, "annotations": auth.CHECKOV_SKIPS}
        needs = [*server, users_secret, account, script, roots_config]
        k8s.batch.v1.Job(
            f"{name}-users-job", metadata=job_meta, spec=spec,
            opts=pulumi.ResourceOptions.merge(
                k8s_options(cluster, self, needs),
                pulumi.ResourceOptions(replace_on_changes=["spec"], delete_before_replace=True)))
        # And again every few minutes: what a member changed (its password) or another tenant granted goes back.
        restore: Any = auth.users_restore_spec(IMAGE, _restricted())
        k8s.batch.v1.CronJob(f"{name}-users-restore", metadata=job_meta, spec=restore,
                             opts=k8s_options(cluster, self, needs))

    def _policies(self, name: str, args: MlflowArgs, namespace: pulumi.Resource) -> pulumi.Resource:
        cluster, kind = args.cluster, args.network_policy
        tenants = sorted(args.tenants.values(), key=lambda t: t.name)
        policy = server_ingress_policy(kind, [t.namespace for t in tenants])
        ingress = self._policy(f"{name}-ingress", policy, k8s_options(cluster, self, [namespace]))
        for tenant in tenants:
            tenant_labels = labels("mlflow-client", "tenancy", **{"trainyard.io/tenant": tenant.name})
            self._policy(f"{name}-egress-{tenant.name}", tenant_egress_policy(kind, tenant.namespace, tenant_labels),
                         k8s_options(cluster, self, list(tenant.ready)))
        return ingress

    def _policy(self, logical: str, manifest: dict[str, Any], opts: pulumi.ResourceOptions) -> pulumi.Resource:
        if manifest["kind"] == "CiliumNetworkPolicy":
            return custom_resource(logical, manifest, opts)
        spec: Any = manifest["spec"]
        return k8s.networking.v1.NetworkPolicy(logical, metadata=manifest["metadata"], spec=spec, opts=opts)


def build(ctx: AddonContext) -> Mlflow:
    cluster = ctx.cluster
    cilium = any(a.cni for a in ctx.enabled)
    return Mlflow(ctx.addon.resource_name, MlflowArgs(
        cluster=cluster, settings=ctx.settings(MlflowSettings),
        database=cluster.tracking_database or LocalDatabase(ctx.catalogue.chart("cloudnative-pg").namespace),
        artifact_bucket=cluster.checkpoint_bucket, tenants=ctx.tenants,
        network_policy="cilium" if cilium else "kubernetes",
        protect=ctx.stack.protect,
        depends_on=ctx.after))


COMPONENT = AddonCode(build=build)
