"""The MLflow Tracking Server (platform/mlflow.py) as each stack renders it.

What tenants rely on: every tenant namespace names the server and its own artifact root; only tenants (and
Prometheus) reach the server; on AWS the server only reads artifacts and its default root is a prefix no tenant's
role writes; the schema is migrated before the server rolls; the database is RDS on AWS and a CloudNativePG cluster,
after its operator, on `local`. Expectations come from each stack's settings, never from the sample stacks.
"""

from __future__ import annotations

import ipaddress
from fnmatch import fnmatch
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from jsonschema import Draft7Validator
from owned_stacks import OWNED_STACKS
from trainyard import names
from trainyard.catalogue.charts import load_catalogue
from trainyard.config import Settings
from trainyard.config.load import platform_namespaces
from trainyard.paths import REPO_ROOT
from trainyard.plan.recording import Recording, ResourceRecord
from trainyard.plan.runtime import STACKS_DIR, available_stacks, plan_stack, read_stack, render, settings_of
from trainyard.plan.writers import is_kubernetes_object, manifest_of
from trainyard.platform.mlflow import (
    APP_LABELS,
    CNPG_CLUSTER,
    DATABASE_SECRET,
    DEFAULT_ARTIFACT_DIR,
    FLASK_SECRET_KEY,
    IMAGE,
    SERVER_SECRET,
    address_patterns,
)

# The tests' own AWS and local stacks, and every sample stack that turns MLflow on: (name, stacks folder).
Stack = tuple[str, Path]
STACKS: list[Stack] = [("fleet", OWNED_STACKS), ("laptop", OWNED_STACKS),
                       *((s, STACKS_DIR) for s in available_stacks()
                         if settings_of(read_stack(s)).addons.mlflow.enabled)]


@cache
def _recording(stack: Stack) -> Recording:
    return render(read_stack(*stack))


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
def test_every_tenant_is_told_the_server_and_its_own_artifact_root(stack: Stack) -> None:
    bucket = _checkpoint_bucket(stack)
    manifests = [manifest_of(r) for r in _records(stack, "ConfigMap")]
    configs = {m["metadata"]["namespace"]: m["data"] for m in manifests
               if m["metadata"]["name"] == names.MLFLOW_CLIENT_CONFIG}
    assert sorted(configs) == _tenant_namespaces(stack)
    for namespace, data in configs.items():
        root = (f"s3://{bucket}/{namespace}/{names.MLFLOW_ARTIFACT_DIR}" if bucket
                else f"mlflow-artifacts:/{namespace}")
        assert data == {"MLFLOW_TRACKING_URI": names.MLFLOW_TRACKING_URI, "TRAINYARD_MLFLOW_ARTIFACT_ROOT": root}


@pytest.mark.parametrize("stack", STACKS, ids=[s[0] for s in STACKS])
def test_the_tracking_uri_is_the_service_and_a_host_the_server_answers(stack: Stack) -> None:
    uri = urlsplit(names.MLFLOW_TRACKING_URI)
    service = manifest_of(_one(stack, "Service", names.MLFLOW_SERVICE))
    assert uri.hostname == f"{names.MLFLOW_SERVICE}.{names.MLFLOW_NAMESPACE}.svc.cluster.local"
    assert [p["port"] for p in service["spec"]["ports"]] == [uri.port]
    assert service["spec"]["selector"] == APP_LABELS
    # The server refuses a Host header it does not list (its DNS-rebinding check): the URI's must be there.
    allowed = _option(_server(stack)["args"], "--allowed-hosts").split(",")
    assert uri.netloc in allowed


def _answers(allowed: list[str], host: str) -> bool:
    """mlflow/server/security_utils.py @ 3.17.2 is_allowed_host_header: fnmatch of the Host header."""
    return any(fnmatch(host, pattern) for pattern in allowed)


@pytest.mark.parametrize("stack", STACKS, ids=[s[0] for s in STACKS])
def test_the_server_answers_prometheus_at_any_pod_address(stack: Stack) -> None:
    """Prometheus scrapes with `Host: <pod IP>:5000`: on AWS pods have VPC addresses (Cilium ENI IPAM), whatever
    CIDR the stack gives the VPC; on `local`, kind's pod network (10.244.0.0/16) is a private range."""
    settings = _settings(stack)
    allowed = _option(_server(stack)["args"], "--allowed-hosts").split(",")
    network = ipaddress.IPv4Network(settings.network.vpc_cidr if settings.target == "aws" else "10.244.0.0/16")
    for address in (network.network_address + 1, network.network_address + network.num_addresses // 2,
                    network.broadcast_address - 1):
        assert _answers(allowed, f"{address}:{names.MLFLOW_PORT}"), address
    if settings.target == "aws":
        assert not _answers(allowed, f"{network.broadcast_address + 256}:{names.MLFLOW_PORT}")


def test_host_patterns_cover_a_cidr_off_the_octet_boundary() -> None:
    """The range AWS suggests for pods (100.64.0.0/10), which no private-range default covers."""
    patterns = list(address_patterns("100.64.0.0/10"))
    for inside in ("100.64.0.1", "100.100.7.9", "100.127.255.254"):
        assert _answers(patterns, f"{inside}:5000"), inside
    for outside in ("100.63.255.1", "100.128.0.1", "10.0.0.1"):
        assert not _answers(patterns, f"{outside}:5000"), outside
    assert address_patterns("10.20.0.0/16") == ("10.20.*",)


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
def test_only_tenants_and_prometheus_reach_the_server(stack: Stack) -> None:
    settings = _settings(stack)
    monitoring = ([load_catalogue(REPO_ROOT).chart("kube-prometheus-stack").namespace]
                  if settings.addons.monitoring.enabled else [])
    (ingress,) = [manifest_of(r) for r in _records(stack, "CiliumNetworkPolicy", names.MLFLOW_NAMESPACE)
                  + _records(stack, "NetworkPolicy", names.MLFLOW_NAMESPACE)]
    spec = ingress["spec"]
    (rule,) = spec["ingress"]
    if ingress["kind"] == "CiliumNetworkPolicy":
        assert spec["endpointSelector"] == {"matchLabels": APP_LABELS}
        sources = [e["matchLabels"]["k8s:io.kubernetes.pod.namespace"] for e in rule["fromEndpoints"]]
    else:
        assert spec["podSelector"] == {"matchLabels": APP_LABELS}
        sources = [e["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] for e in rule["from"]]
    assert sorted(sources) == sorted(_tenant_namespaces(stack) + monitoring)
    # And every tenant namespace lets its pods out to it, on the server's port only.
    for namespace in _tenant_namespaces(stack):
        (egress,) = [manifest_of(r) for r in [*_records(stack, "CiliumNetworkPolicy", namespace),
                                              *_records(stack, "NetworkPolicy", namespace)]
                     if manifest_of(r)["metadata"]["name"] == "allow-mlflow"]
        (out,) = egress["spec"]["egress"]
        ports = out["toPorts"][0]["ports"] if "toPorts" in out else out["ports"]
        assert [int(p["port"]) for p in ports] == [names.MLFLOW_PORT]


@pytest.mark.parametrize("stack", STACKS, ids=[s[0] for s in STACKS])
def test_schema_is_migrated_by_this_version_before_the_server_rolls(stack: Stack) -> None:
    (job,) = _records(stack, "Job", names.MLFLOW_NAMESPACE)
    deployment = _one(stack, "Deployment", "mlflow")
    migrate = _container(stack, "Job", manifest_of(job)["metadata"]["name"])
    assert job.urn in deployment.depends_on
    assert migrate["image"] == _server(stack)["image"] == IMAGE
    assert IMAGE.rpartition(":")[2].replace(".", "-").lower() in manifest_of(job)["metadata"]["name"]
    assert migrate["args"] == ["db", "upgrade", "$(MLFLOW_BACKEND_STORE_URI)"]
    # A Job's template is immutable: a changed one is a new Job, the old one deleted first.
    assert job.replace_on_changes == ("spec",) and job.delete_before_replace


@pytest.mark.parametrize("stack", STACKS, ids=[s[0] for s in STACKS])
def test_secrets_come_from_secrets_and_the_flask_key_is_stable(stack: Stack) -> None:
    aws = _settings(stack).target == "aws"
    store = DATABASE_SECRET if aws else f"{CNPG_CLUSTER}-app"
    migration = _container(stack, "Job", manifest_of(_records(stack, "Job", names.MLFLOW_NAMESPACE)[0])["metadata"]
                           ["name"])
    for container, expected in ((_server(stack), {"MLFLOW_BACKEND_STORE_URI": store, FLASK_SECRET_KEY: SERVER_SECRET}),
                                (migration, {"MLFLOW_BACKEND_STORE_URI": store})):
        refs = {e["name"]: e["valueFrom"]["secretKeyRef"]["name"] for e in container["env"] if "valueFrom" in e}
        assert refs == expected
    # The Flask key is a generated password kept in state, not one a chart hook re-rolls on every upgrade.
    server_secret = _one(stack, "Secret", SERVER_SECRET)
    password = next(r for r in _recording(stack).resources if r.type == "random:index/randomPassword:RandomPassword"
                    and r.urn in server_secret.depends_on)
    assert password.inputs["length"] >= 32
    if aws:
        # The store URI (with the password) lives only in the MLflow namespace, shown only as a secret.
        assert manifest_of(_one(stack, "Secret", DATABASE_SECRET))["stringData"] == {"uri": "[secret]"}


@pytest.mark.parametrize("stack", STACKS, ids=[s[0] for s in STACKS])
def test_local_database_is_a_cloudnative_pg_cluster_after_its_operator(stack: Stack) -> None:
    clusters = _records(stack, "Cluster", names.MLFLOW_NAMESPACE)
    if _settings(stack).target == "aws":
        assert clusters == []
        return
    (cluster,) = clusters
    spec = manifest_of(cluster)["spec"]
    assert spec["bootstrap"]["initdb"] == {"database": "mlflow", "owner": "mlflow"}
    assert spec["storage"]["size"] == f"{_settings(stack).addons.mlflow.database.storage_gib}Gi"
    # Its CRD and webhook come with the operator's release, which the namespace (and so the cluster) waits for.
    by_urn = _recording(stack).by_urn()
    (namespace,) = [r for r in _records(stack, "Namespace") if manifest_of(r)["metadata"]["name"] == "mlflow"]
    releases = [by_urn[u] for u in namespace.depends_on if by_urn[u].type == "kubernetes:helm.sh/v3:Release"]
    assert "cloudnative-pg" in [r.inputs["chart"] for r in releases]
    assert namespace.urn in cluster.depends_on
    assert cluster.protect is cluster.retain_on_delete is _settings(stack).protect


LOCAL_DATABASE_STACKS = [s for s in STACKS if _settings(s).target == "local"]


@pytest.mark.parametrize("stack", LOCAL_DATABASE_STACKS, ids=[s[0] for s in LOCAL_DATABASE_STACKS])
def test_local_database_matches_the_operator_the_release_renders(stack: Stack) -> None:
    """The Cluster is valid against the CRD the cloudnative-pg release itself installs (the version that will admit
    it), and the operator that reconciles it runs on the system nodes, scraped when monitoring is on."""
    release = plan_stack(read_stack(*stack)).rendered.releases["cloudnative-pg"]
    (crd,) = [o for o in release.of_kind("CustomResourceDefinition") if o["spec"]["names"]["kind"] == "Cluster"]
    (cluster,) = [manifest_of(r) for r in _records(stack, "Cluster", names.MLFLOW_NAMESPACE)]
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
    (job,) = [manifest_of(r) for r in _records(stack, "Job", names.MLFLOW_NAMESPACE)]
    server = manifest_of(_one(stack, "Deployment", "mlflow"))
    account = job["spec"]["template"]["spec"]["serviceAccountName"]
    assert account != server["spec"]["template"]["spec"]["serviceAccountName"] == names.MLFLOW.name
    assert manifest_of(_one(stack, "ServiceAccount", account))["automountServiceAccountToken"] is False


@pytest.mark.parametrize("stack", STACKS, ids=[s[0] for s in STACKS])
def test_server_restarts_from_the_nodes_image_and_bounds_its_scratch(stack: Stack) -> None:
    for manifest in (manifest_of(_one(stack, "Deployment", "mlflow")),
                     *(manifest_of(r) for r in _records(stack, "Job", names.MLFLOW_NAMESPACE))):
        pod = manifest["spec"]["template"]["spec"]
        assert {c["imagePullPolicy"] for c in pod["containers"]} == {"IfNotPresent"}
        assert all(v["emptyDir"].get("sizeLimit") for v in pod["volumes"] if "emptyDir" in v)
