"""The MLflow Tracking Server (platform/mlflow.py) as each stack renders it.

What tenants rely on: every tenant namespace holds the server and its own MLflow user and workspace, whose artifact
root (AWS) is its prefix; the server runs the basic-auth app with one workspace per tenant and nothing open by
default, and a Job makes the users once it is up (a CronJob puts them back); only tenants (and those jobs) reach the
server; on AWS the server only reads artifacts and its default root is a prefix no tenant's role writes; the schema
is migrated before the server rolls; the database is RDS on AWS and a CloudNativePG cluster, after its operator, on
`local`. Expectations come from each stack's settings, never from the sample stacks.
"""

from __future__ import annotations

import configparser
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from jsonschema import Draft7Validator
from owned_stacks import OWNED_STACKS, planned, recording
from trainyard import names
from trainyard.config import Settings
from trainyard.config.load import platform_namespaces
from trainyard.paths import REPO_ROOT
from trainyard.plan.recording import Recording, ResourceRecord
from trainyard.plan.runtime import STACKS_DIR, available_stacks, read_stack, settings_of
from trainyard.plan.writers import is_kubernetes_object, manifest_of
from trainyard.platform import mlflow_auth
from trainyard.platform.mlflow import (
    ALLOWED_HOSTS,
    APP_LABELS,
    AUTH_DATABASE_ENV,
    CNPG_OWNER_SECRET,
    CONFIG_DIGEST,
    DATABASE_NAMESPACE,
    DATABASE_SECRET,
    DEFAULT_ARTIFACT_DIR,
    FLASK_SECRET_KEY,
    IMAGE,
    SERVER_SECRET,
    USERS_LABELS,
)

# The tests' own AWS and local stacks, and every sample stack that turns MLflow on: (name, stacks folder).
Stack = tuple[str, Path]
STACKS: list[Stack] = [("fleet", OWNED_STACKS), ("laptop", OWNED_STACKS),
                       *((s, STACKS_DIR) for s in available_stacks()
                         if settings_of(read_stack(s)).addons.mlflow.enabled)]


def _recording(stack: Stack) -> Recording:
    return recording(stack)


def _settings(stack: Stack) -> Settings:
    return settings_of(read_stack(*stack))


def _records(stack: Stack, kind: str, namespace: str | None = None) -> list[ResourceRecord]:
    return [r for r in _recording(stack).resources if is_kubernetes_object(r) and r.type.rsplit(":", 1)[1] == kind
            and (namespace is None or manifest_of(r)["metadata"].get("namespace") == namespace)]


def _one(stack: Stack, kind: str, name: str, namespace: str = names.MLFLOW_NAMESPACE) -> ResourceRecord:
    (found,) = [r for r in _records(stack, kind, namespace) if manifest_of(r)["metadata"]["name"] == name]
    return found


def _container(stack: Stack, kind: str, name: str) -> dict[str, Any]:
    (container,) = manifest_of(_one(stack, kind, name))["spec"]["template"]["spec"]["containers"]
    return container


def _server(stack: Stack) -> dict[str, Any]:
    return _container(stack, "Deployment", "mlflow")


def _option(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def _tenant_namespaces(stack: Stack) -> list[str]:
    return sorted(t.namespace_name for t in _settings(stack).tenants)


def _checkpoint_bucket(stack: Stack) -> str | None:
    buckets = [r.inputs["bucket"] for r in _recording(stack).resources if r.type == "aws:s3/bucket:Bucket"
               and "checkpoints" in r.inputs["bucket"]]
    return buckets[0] if buckets else None


@pytest.mark.parametrize("stack", STACKS, ids=[s[0] for s in STACKS])
def test_every_tenant_is_told_the_server_its_own_user_and_workspace(stack: Stack) -> None:
    secrets = {manifest_of(r)["metadata"]["namespace"]: r for r in _records(stack, "Secret")
               if manifest_of(r)["metadata"]["name"] == names.MLFLOW_CLIENT_CONFIG}
    assert sorted(secrets) == _tenant_namespaces(stack)
    assert not [r for r in _records(stack, "ConfigMap") if manifest_of(r)["metadata"]["name"]
                == names.MLFLOW_CLIENT_CONFIG]  # members may edit ConfigMaps, never this (tenant_access.py)
    by_urn = _recording(stack).by_urn()
    tenants = {t.namespace_name: t.name for t in _settings(stack).tenants}
    passwords = set()
    for namespace, record in secrets.items():
        # A Secret's data shows only as [secret] in the plan: what it holds is what client_data gives it.
        expected = mlflow_auth.client_data(tenants[namespace], "<password>")
        assert expected["MLFLOW_TRACKING_URI"] == names.MLFLOW_TRACKING_URI
        assert expected[mlflow_auth.USERNAME_ENV] == expected[mlflow_auth.WORKSPACE_ENV] == tenants[namespace]
        assert manifest_of(record)["stringData"] == dict.fromkeys(expected, "[secret]")
        # Each tenant's password is a generated one of its own.
        (password,) = [by_urn[u] for u in record.depends_on if by_urn[u].type == RANDOM_PASSWORD]
        assert password.inputs["length"] >= 32
        passwords.add(password.urn)
    assert len(passwords) == len(secrets)


RANDOM_PASSWORD = "random:index/randomPassword:RandomPassword"


STORE_URI = "postgresql://mlflow:p4ss@db.example:5432/mlflow?sslmode=require"


def _ini() -> configparser.ConfigParser:
    """The auth config as the server reads it (configparser: `%%` in the file is `%`)."""
    config = configparser.ConfigParser()
    config.read_string(mlflow_auth.auth_config(mlflow_auth.schema_uri(STORE_URI)))
    return config


@pytest.mark.parametrize("stack", STACKS, ids=[s[0] for s in STACKS])
def test_the_server_runs_the_auth_app_closed_by_default_on_its_own_schema(stack: Stack) -> None:
    server = _server(stack)
    assert _option(server["args"], "--app-name") == "basic-auth"
    assert "--enable-workspaces" in server["args"]  # names, runs and models kept apart per tenant
    env = {e["name"]: e for e in server["env"]}
    config_path = env[mlflow_auth.CONFIG_PATH_ENV]["value"]
    mounts = {m["mountPath"]: m["name"] for m in server["volumeMounts"]}
    pod = manifest_of(_one(stack, "Deployment", "mlflow"))["spec"]["template"]["spec"]
    (auth_volume,) = [v for v in pod["volumes"] if v["name"] == mounts[mlflow_auth.CONFIG_DIR]]
    assert config_path == f"{mlflow_auth.CONFIG_DIR}/{auth_volume['secret']['items'][0]['path']}"
    assert auth_volume["secret"]["secretName"] == mlflow_auth.AUTH_SECRET
    assert env[mlflow_auth.ADMIN_PASSWORD_ENV]["valueFrom"]["secretKeyRef"] == {
        "name": mlflow_auth.AUTH_SECRET, "key": mlflow_auth.ADMIN_PASSWORD_KEY}
    # What the config says (the Secret shows only [secret] in the plan: the function that writes it).
    section = _ini()["mlflow"]
    assert section["default_permission"] == "NO_PERMISSIONS"
    assert section.getboolean("grant_default_workspace_access") is False
    assert section["database_uri"] == f"{STORE_URI}&options=-csearch_path%3D{mlflow_auth.SCHEMA}"
    assert section["admin_username"] == mlflow_auth.ADMIN_USERNAME
    # The admin's password is generated, and kept wherever the stack keeps its state.
    auth_secret = _one(stack, "Secret", mlflow_auth.AUTH_SECRET)
    assert set(manifest_of(auth_secret)["stringData"]) == {
        mlflow_auth.CONFIG_KEY, mlflow_auth.DATABASE_URI_KEY, mlflow_auth.ADMIN_PASSWORD_KEY}
    by_urn = _recording(stack).by_urn()
    (admin,) = [by_urn[u] for u in auth_secret.depends_on if by_urn[u].type == RANDOM_PASSWORD
                and u.endswith("-auth-admin")]
    assert admin.inputs["length"] >= 32 and admin.protect is _settings(stack).protect
    # Nothing scrapes /metrics, which answers admins only.
    assert "--expose-prometheus" not in server["args"]
    assert not [r for r in _recording(stack).resources if r.type.endswith(":ServiceMonitor")
                and manifest_of(r)["metadata"]["name"] == "mlflow"]


@pytest.mark.parametrize("stack", STACKS, ids=[s[0] for s in STACKS])
def test_the_users_are_made_after_the_server_answers(stack: Stack) -> None:
    job = _one(stack, "Job", mlflow_auth.USERS_ACCOUNT)
    manifest = manifest_of(job)
    assert _one(stack, "Deployment", "mlflow").urn in job.depends_on
    assert job.replace_on_changes == ("spec",) and job.delete_before_replace
    pod = manifest["spec"]["template"]["spec"]
    assert manifest["spec"]["template"]["metadata"]["labels"] == USERS_LABELS
    assert pod["serviceAccountName"] == mlflow_auth.USERS_ACCOUNT and pod["automountServiceAccountToken"] is False
    (container,) = pod["containers"]
    assert container["command"] == ["python", f"{mlflow_auth.USERS_SCRIPT_DIR}/{mlflow_auth.USERS_SCRIPT}"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    script = manifest_of(_one(stack, "ConfigMap", volumes["script"]["configMap"]["name"]))
    assert script["data"] == {mlflow_auth.USERS_SCRIPT: (REPO_ROOT / "platform" / "mlflow" /
                                                         mlflow_auth.USERS_SCRIPT).read_text()}
    assert volumes["users"]["secret"]["secretName"] == mlflow_auth.USERS_SECRET
    users = manifest_of(_one(stack, "Secret", mlflow_auth.USERS_SECRET))["stringData"]
    assert sorted(users) == sorted(t.name for t in _settings(stack).tenants)
    # On AWS each tenant's workspace keeps its artifacts in the tenant's prefix, which its pod identity writes.
    assert volumes["roots"]["configMap"]["name"] == mlflow_auth.ROOTS_CONFIG
    roots = manifest_of(_one(stack, "ConfigMap", mlflow_auth.ROOTS_CONFIG)).get("data") or {}
    bucket = _checkpoint_bucket(stack)
    assert roots == ({t.name: f"s3://{bucket}/{t.namespace_name}/{names.MLFLOW_ARTIFACT_DIR}"
                      for t in _settings(stack).tenants} if bucket else {})
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["MLFLOW_TRACKING_URI"] == names.MLFLOW_TRACKING_URI and env["USERS_DIR"] == mlflow_auth.USERS_DIR
    assert env["ADMIN_PASSWORD_FILE"].startswith(mlflow_auth.ADMIN_DIR) and env["ROOTS_DIR"] == mlflow_auth.ROOTS_DIR
    assert manifest["spec"]["activeDeadlineSeconds"] < 600  # inside pulumi-kubernetes' default Job await


@pytest.mark.parametrize("stack", STACKS, ids=[s[0] for s in STACKS])
def test_the_users_are_put_back_every_few_minutes(stack: Stack) -> None:
    """A member may change its tenant's password (it knows the current one): the same pod, on a schedule, puts
    the platform's back (review-ml-2 m6)."""
    job = manifest_of(_one(stack, "Job", mlflow_auth.USERS_ACCOUNT))
    cron = _one(stack, "CronJob", mlflow_auth.USERS_ACCOUNT)
    spec = manifest_of(cron)["spec"]
    assert spec["schedule"] == mlflow_auth.RESTORE_SCHEDULE and spec["concurrencyPolicy"] == "Forbid"
    assert spec["jobTemplate"]["spec"]["template"]["spec"] == job["spec"]["template"]["spec"]
    # A failed run alerts (KubeJobFailed) and then goes, so the alert clears once the server is back.
    assert spec["failedJobsHistoryLimit"] == 1 and spec["jobTemplate"]["spec"]["ttlSecondsAfterFinished"] > 0
    assert "ttlSecondsAfterFinished" not in job["spec"]  # the one Pulumi keeps
    assert spec["jobTemplate"]["spec"]["template"]["metadata"]["labels"] == USERS_LABELS  # the server admits it
    assert _one(stack, "Deployment", "mlflow").urn in cron.depends_on


@pytest.mark.parametrize("stack", STACKS, ids=[s[0] for s in STACKS])
def test_the_tracking_uri_is_the_service_and_a_host_the_server_answers(stack: Stack) -> None:
    uri = urlsplit(names.MLFLOW_TRACKING_URI)
    service = manifest_of(_one(stack, "Service", names.MLFLOW_SERVICE))
    assert uri.hostname == f"{names.MLFLOW_SERVICE}.{names.MLFLOW_NAMESPACE}.svc.cluster.local"
    assert [p["port"] for p in service["spec"]["ports"]] == [uri.port]
    assert service["spec"]["selector"] == APP_LABELS
    # The server refuses a Host header it does not list (its DNS-rebinding check): the URI's must be there.
    assert _option(_server(stack)["args"], "--allowed-hosts") == ALLOWED_HOSTS
    assert uri.netloc in ALLOWED_HOSTS.split(",")


@pytest.mark.parametrize("stack", STACKS, ids=[s[0] for s in STACKS])
def test_server_artifacts_follow_the_target(stack: Stack) -> None:
    server, bucket = _server(stack), _checkpoint_bucket(stack)
    args = server["args"]
    if bucket is None:
        assert "--serve-artifacts" in args
        mounts = {m["mountPath"]: m["name"] for m in server["volumeMounts"]}
        assert _option(args, "--artifacts-destination") in mounts
        return
    # Clients upload with their own pod identity; the server's default root is outside every tenant's prefix.
    assert "--no-serve-artifacts" in args and "--serve-artifacts" not in args
    root = urlsplit(_option(args, "--default-artifact-root"))
    first = root.path.strip("/").split("/")[0]
    assert (root.scheme, root.netloc) == ("s3", bucket)
    assert root.path.endswith(f"/{DEFAULT_ARTIFACT_DIR}")
    assert first not in _tenant_namespaces(stack) and first in platform_namespaces()


@pytest.mark.parametrize("stack", STACKS, ids=[s[0] for s in STACKS])
def test_only_tenants_and_the_users_job_reach_the_server(stack: Stack) -> None:
    (ingress,) = [manifest_of(r) for r in _records(stack, "CiliumNetworkPolicy", names.MLFLOW_NAMESPACE)
                  + _records(stack, "NetworkPolicy", names.MLFLOW_NAMESPACE)]
    spec = ingress["spec"]
    (rule,) = spec["ingress"]
    if ingress["kind"] == "CiliumNetworkPolicy":
        assert spec["endpointSelector"] == {"matchLabels": APP_LABELS}
        peers = [e["matchLabels"] for e in rule["fromEndpoints"]]
        sources = [p["k8s:io.kubernetes.pod.namespace"] for p in peers if len(p) == 1]
        assert [p for p in peers if len(p) > 1] == [
            {"k8s:io.kubernetes.pod.namespace": names.MLFLOW_NAMESPACE, **USERS_LABELS}]
    else:
        assert spec["podSelector"] == {"matchLabels": APP_LABELS}
        sources = [e["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] for e in rule["from"]
                   if "namespaceSelector" in e]
        assert [e for e in rule["from"] if "namespaceSelector" not in e] == [
            {"podSelector": {"matchLabels": USERS_LABELS}}]
    assert sorted(sources) == _tenant_namespaces(stack)
    # And every tenant namespace lets its pods out to it, on the server's port only.
    for namespace in _tenant_namespaces(stack):
        (egress,) = [manifest_of(r) for r in [*_records(stack, "CiliumNetworkPolicy", namespace),
                                              *_records(stack, "NetworkPolicy", namespace)]
                     if manifest_of(r)["metadata"]["name"] == "allow-mlflow"]
        (out,) = egress["spec"]["egress"]
        ports = out["toPorts"][0]["ports"] if "toPorts" in out else out["ports"]
        assert [int(p["port"]) for p in ports] == [names.MLFLOW_PORT]


def _migration(stack: Stack) -> ResourceRecord:
    (job,) = [r for r in _records(stack, "Job", names.MLFLOW_NAMESPACE)
              if manifest_of(r)["metadata"]["name"].startswith("mlflow-db-upgrade-")]
    return job


def _migration_steps(stack: Stack) -> list[dict[str, Any]]:
    """Its init containers in order, then its container."""
    pod = manifest_of(_migration(stack))["spec"]["template"]["spec"]
    return [*pod["initContainers"], *pod["containers"]]


@pytest.mark.parametrize("stack", STACKS, ids=[s[0] for s in STACKS])
def test_schemas_are_migrated_by_this_version_before_the_server_rolls(stack: Stack) -> None:
    job = _migration(stack)
    deployment = _one(stack, "Deployment", "mlflow")
    assert job.urn in deployment.depends_on
    assert IMAGE.rpartition(":")[2].replace(".", "-").lower() in manifest_of(job)["metadata"]["name"]
    steps = _migration_steps(stack)
    assert {s["image"] for s in steps} == {_server(stack)["image"]} == {IMAGE}
    # The auth store's schema, then the tracking store, then the auth store's tables in it.
    schema, tracking, users = steps
    assert schema["command"] == ["python"] and f"CREATE SCHEMA IF NOT EXISTS {mlflow_auth.SCHEMA}" in schema["args"][1]
    assert "MLFLOW_BACKEND_STORE_URI" in schema["args"][1]
    assert tracking["args"] == ["db", "upgrade", "$(MLFLOW_BACKEND_STORE_URI)"]
    assert users["args"] == ["-m", "mlflow.server.auth", "db", "upgrade", "--url", f"$({AUTH_DATABASE_ENV})"]
    # A Job's template is immutable: a changed one is a new Job, the old one deleted first.
    assert job.replace_on_changes == ("spec",) and job.delete_before_replace


@pytest.mark.parametrize("stack", STACKS, ids=[s[0] for s in STACKS])
def test_a_new_store_password_rolls_the_server(stack: Stack) -> None:
    """The pods read the store's URI and the auth config when they start: their digest is on the template."""
    template = manifest_of(_one(stack, "Deployment", "mlflow"))["spec"]["template"]
    digest = template["metadata"]["annotations"][CONFIG_DIGEST]
    assert len(digest) == 64 and int(digest, 16) >= 0  # shown in the plan: a digest, never the secret


@pytest.mark.parametrize("stack", STACKS, ids=[s[0] for s in STACKS])
def test_secrets_come_from_secrets_and_the_flask_key_is_stable(stack: Stack) -> None:
    aws = _settings(stack).target == "aws"
    store = DATABASE_SECRET
    server = {"MLFLOW_BACKEND_STORE_URI": store, FLASK_SECRET_KEY: SERVER_SECRET,
              mlflow_auth.ADMIN_PASSWORD_ENV: mlflow_auth.AUTH_SECRET}
    migration = {"MLFLOW_BACKEND_STORE_URI": store, AUTH_DATABASE_ENV: mlflow_auth.AUTH_SECRET}
    for container, expected in ((_server(stack), server), *((step, migration) for step in _migration_steps(stack))):
        refs = {e["name"]: e["valueFrom"]["secretKeyRef"]["name"] for e in container["env"] if "valueFrom" in e}
        assert refs == expected
    # The Flask key is a generated password kept in state, not one a chart hook re-rolls on every upgrade.
    server_secret = _one(stack, "Secret", SERVER_SECRET)
    password = next(r for r in _recording(stack).resources if r.type == "random:index/randomPassword:RandomPassword"
                    and r.urn in server_secret.depends_on)
    assert password.inputs["length"] >= 32
    # The store URI (with the password) lives only in the MLflow namespace, shown only as a secret.
    assert manifest_of(_one(stack, "Secret", DATABASE_SECRET))["stringData"] == {"uri": "[secret]"}
    if not aws:
        # On `local` the owner's password is ours too, handed to CloudNativePG's initdb, and kept like the database.
        owner = _one(stack, "Secret", CNPG_OWNER_SECRET, DATABASE_NAMESPACE)
        assert manifest_of(owner)["type"] == "kubernetes.io/basic-auth"
        assert manifest_of(owner)["stringData"] == {"username": "[secret]", "password": "[secret]"}
        by_urn = _recording(stack).by_urn()
        (generated,) = [by_urn[u] for u in owner.depends_on if by_urn[u].type == RANDOM_PASSWORD]
        assert generated.protect is _settings(stack).protect


@pytest.mark.parametrize("stack", STACKS, ids=[s[0] for s in STACKS])
def test_local_database_is_a_cloudnative_pg_cluster_after_its_operator(stack: Stack) -> None:
    clusters = _records(stack, "Cluster")
    if _settings(stack).target == "aws":
        assert clusters == []
        return
    (cluster,) = clusters
    spec = manifest_of(cluster)["spec"]
    assert spec["bootstrap"]["initdb"] == {"database": "mlflow", "owner": "mlflow",
                                           "secret": {"name": CNPG_OWNER_SECRET}}
    assert spec["storage"]["size"] == f"{_settings(stack).addons.mlflow.database.storage_gib}Gi"
    # Its CRD and webhook come with the operator's release, which its namespace (and so the cluster) waits for.
    by_urn = _recording(stack).by_urn()
    (namespace,) = [r for r in _records(stack, "Namespace")
                    if manifest_of(r)["metadata"]["name"] == manifest_of(cluster)["metadata"]["namespace"]]
    releases = [by_urn[u] for u in namespace.depends_on if by_urn[u].type == "kubernetes:helm.sh/v3:Release"]
    assert "cloudnative-pg" in [r.inputs["chart"] for r in releases]
    assert namespace.urn in cluster.depends_on
    assert cluster.protect is cluster.retain_on_delete is _settings(stack).protect


LOCAL_DATABASE_STACKS = [s for s in STACKS if _settings(s).target == "local"]


@pytest.mark.parametrize("stack", LOCAL_DATABASE_STACKS, ids=[s[0] for s in LOCAL_DATABASE_STACKS])
def test_local_database_matches_the_operator_the_release_renders(stack: Stack) -> None:
    """The Cluster is valid against the CRD the cloudnative-pg release itself installs (the version that will admit
    it), and the operator that reconciles it runs on the system nodes, scraped when monitoring is on."""
    release = planned(stack).rendered.releases["cloudnative-pg"]
    (crd,) = [o for o in release.of_kind("CustomResourceDefinition") if o["spec"]["names"]["kind"] == "Cluster"]
    (cluster,) = [manifest_of(r) for r in _records(stack, "Cluster", DATABASE_NAMESPACE)]
    group, version = cluster["apiVersion"].split("/")
    assert crd["spec"]["group"] == group
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version and v["served"]]
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
              for e in Draft7Validator(served["schema"]["openAPIV3Schema"]).iter_errors(cluster)]
    assert errors == []
    (operator,) = release.of_kind("Deployment")
    assert operator["spec"]["template"]["spec"]["nodeSelector"][names.ROLE_LABEL] == "system"
    assert bool(list(release.of_kind("PodMonitor"))) is _settings(stack).addons.monitoring.enabled


@pytest.mark.parametrize("stack", STACKS, ids=[s[0] for s in STACKS])
def test_the_migration_runs_as_an_account_of_its_own(stack: Stack) -> None:
    job = manifest_of(_migration(stack))
    server = manifest_of(_one(stack, "Deployment", "mlflow"))
    account = job["spec"]["template"]["spec"]["serviceAccountName"]
    assert account != server["spec"]["template"]["spec"]["serviceAccountName"] == names.MLFLOW.name
    assert manifest_of(_one(stack, "ServiceAccount", account))["automountServiceAccountToken"] is False


@pytest.mark.parametrize("stack", STACKS, ids=[s[0] for s in STACKS])
def test_server_restarts_from_the_nodes_image_and_bounds_its_scratch(stack: Stack) -> None:
    for manifest in (manifest_of(_one(stack, "Deployment", "mlflow")),
                     *(manifest_of(r) for r in _records(stack, "Job", names.MLFLOW_NAMESPACE))):
        pod = manifest["spec"]["template"]["spec"]
        assert {c["imagePullPolicy"] for c in pod["containers"] + pod.get("initContainers", [])} == {"IfNotPresent"}
        assert all(v["emptyDir"].get("sizeLimit") for v in pod["volumes"] if "emptyDir" in v)
