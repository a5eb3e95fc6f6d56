"""MLflow's database on AWS (cloud/database.py): an RDS instance outside the cluster, as protected as the buckets.

Every expectation comes from the stack's own settings, so an edited stack is checked against what it asks for.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

import pytest
from aws_plan import of_type, one, plan
from owned_stacks import Stack, recording, stack_settings, stacks_where
from trainyard import names
from trainyard.cloud.database import ENGINE_MAJOR, PORT, tls_query
from trainyard.config import rds_ca
from trainyard.plan.recording import Recording, ResourceRecord
from trainyard.plan.writers import manifest_of
from trainyard.platform.mlflow import (
    DATABASE_CA,
    DATABASE_CA_DIR,
    DATABASE_CA_KEY,
    DATABASE_ROOT_CERTIFICATE,
    DATABASE_SECRET,
    POSTGRES_IMAGE,
)

INSTANCE = "aws:rds/instance:Instance"
# The tests' fleet (so something is always checked), then every AWS stack of stacks/ that turns MLflow on.
TRACKING_STACKS = stacks_where(lambda s: s.is_aws and s.addons.mlflow.enabled)


def _in_database(rec: Recording, type_: str) -> list[ResourceRecord]:
    """The resources of that type inside the TrackingDatabase component, at any depth."""
    database, by_urn = one(rec, "trainyard:cloud:TrackingDatabase").urn, rec.by_urn()

    def inside(record: ResourceRecord) -> bool:
        while record.parent in by_urn and record.parent != database:
            record = by_urn[record.parent]
        return record.parent == database

    return [r for r in of_type(rec, type_) if inside(r)]


@pytest.mark.parametrize("stack", TRACKING_STACKS)
def test_instance_is_protected_encrypted_and_private(stack: Stack) -> None:
    settings, rec = stack_settings(stack), plan(*stack)
    db = settings.addons.mlflow.database
    instance = one(rec, INSTANCE)
    inputs = instance.inputs
    # Pulumi protect and retain, RDS deletion protection and a final snapshot wherever the stack protects state.
    assert (instance.protect, instance.retain_on_delete, inputs["deletionProtection"]) == (settings.protect,) * 3
    assert inputs["skipFinalSnapshot"] is not settings.protect
    assert inputs["deleteAutomatedBackups"] is False
    assert inputs["backupRetentionPeriod"] == db.backup_retention_days >= 1
    assert inputs["multiAz"] is (db.multi_az if db.multi_az is not None else settings.environment == "prod")
    assert inputs["publiclyAccessible"] is False
    assert inputs["storageEncrypted"] is True
    (key,) = _in_database(rec, "aws:kms/key:Key")
    assert inputs["kmsKeyId"].endswith(key.name)
    assert key.protect and key.retain_on_delete
    assert (inputs["allocatedStorage"], inputs["maxAllocatedStorage"]) == (db.storage_gib, db.max_storage_gib)
    # One major on both backends: `local`'s CloudNativePG image runs the same PostgreSQL major.
    assert inputs["engineVersion"] == ENGINE_MAJOR
    assert POSTGRES_IMAGE.rpartition(":")[2].split(".")[0] == ENGINE_MAJOR
    assert inputs["allowMajorVersionUpgrade"] is False


@pytest.mark.parametrize("stack", TRACKING_STACKS)
def test_only_the_cluster_nodes_reach_it_over_tls(stack: Stack) -> None:
    rec = plan(*stack)
    instance = one(rec, INSTANCE)
    (group,) = _in_database(rec, "aws:ec2/securityGroup:SecurityGroup")
    assert instance.inputs["vpcSecurityGroupIds"] == [f"{group.name}-id"]
    rules = _in_database(rec, "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule")
    node_group = one(rec, "aws:ec2/securityGroup:SecurityGroup", "eks-nodes")
    assert [(r.inputs["referencedSecurityGroupId"], r.inputs["fromPort"], r.inputs["toPort"]) for r in rules] == [
        (f"{node_group.name}-id", PORT, PORT)]
    assert not _in_database(rec, "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule")
    (parameters,) = _in_database(rec, "aws:rds/parameterGroup:ParameterGroup")
    assert {"name": "rds.force_ssl", "value": "1"} in [
        {k: p[k] for k in ("name", "value")} for p in parameters.inputs["parameters"]]
    private = {s.name for s in of_type(rec, "aws:ec2/subnet:Subnet") if "private" in s.name}
    (subnets,) = _in_database(rec, "aws:rds/subnetGroup:SubnetGroup")
    assert {i.removesuffix("-id") for i in subnets.inputs["subnetIds"]} <= private


@pytest.mark.parametrize("stack", TRACKING_STACKS)
def test_tracking_database_survives_a_cluster_rebuild(stack: Stack) -> None:
    """Nothing of the database hangs off the EKS cluster: a replaced cluster leaves the instance in place."""
    rec = plan(*stack)
    cluster = one(rec, "aws:eks/cluster:Cluster")
    for r in [one(rec, INSTANCE), *_in_database(rec, "aws:kms/key:Key")]:
        assert r.deleted_with is None
        assert cluster.urn not in r.depends_on


@pytest.mark.parametrize("stack", TRACKING_STACKS)
def test_tracking_server_holds_no_aws_role(stack: Stack) -> None:
    """Without MLflow's auth app any tenant may ask the server for any run's artifacts, which it reads with its own
    credentials (mlflow 3.17.2 handlers.py get_artifact_handler): it must have none; clients use their own."""
    rec = plan(*stack)
    accounts = {(a.inputs["namespace"], a.inputs["serviceAccount"])
                for a in of_type(rec, "aws:eks/podIdentityAssociation:PodIdentityAssociation")}
    assert (names.MLFLOW.namespace, names.MLFLOW.name) not in accounts
    assert not [r for r in of_type(rec, "aws:iam/role:Role") if r.name.startswith("mlflow")]


def _connecting_containers(rec: Recording) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(pod spec, container) of every container that reads the store's URI (the server, the migration's steps)."""
    found = []
    for record in rec.resources:
        if record.type not in ("kubernetes:apps/v1:Deployment", "kubernetes:batch/v1:Job"):
            continue
        pod = manifest_of(record)["spec"]["template"]["spec"]
        for container in [*pod.get("initContainers", []), *pod["containers"]]:
            if any(e.get("valueFrom", {}).get("secretKeyRef", {}).get("name") == DATABASE_SECRET
                   for e in container.get("env", [])):
                found.append((pod, container))
    return found


@pytest.mark.parametrize("stack", TRACKING_STACKS)
def test_clients_verify_the_server_against_the_instances_ca(stack: Stack) -> None:
    """verify-full against the root of the CA the instance names, for the stack's region, mounted wherever a pod
    connects, at the path the URI gives libpq."""
    settings, rec = stack_settings(stack), recording(stack)
    assert settings.aws is not None
    assert one(rec, INSTANCE).inputs["caCertIdentifier"] == rds_ca.CA_IDENTIFIER
    (ca,) = [manifest_of(r) for r in of_type(rec, "kubernetes:core/v1:ConfigMap")
             if manifest_of(r)["metadata"] == {**manifest_of(r)["metadata"], "name": DATABASE_CA,
                                               "namespace": names.MLFLOW_NAMESPACE}]
    assert ca["data"] == {DATABASE_CA_KEY: rds_ca.regional_roots()[settings.aws.region]}
    query = parse_qs(tls_query(DATABASE_ROOT_CERTIFICATE))
    assert query == {"sslmode": ["verify-full"], "sslrootcert": [f"{DATABASE_CA_DIR}/{DATABASE_CA_KEY}"]}
    containers = _connecting_containers(rec)
    assert len(containers) >= 4  # the server and the migration's three steps
    for pod, container in containers:
        (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == DATABASE_CA_DIR]
        (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
        assert volume["configMap"]["name"] == DATABASE_CA and mount["readOnly"] is True


@pytest.mark.parametrize("stack", stacks_where(lambda s: s.target == "local" and s.addons.mlflow.enabled))
def test_local_clients_require_tls_only(stack: Stack) -> None:
    """CloudNativePG's own CA is a Secret of the database's namespace: `local` requires TLS without a root, and
    mounts none."""
    assert parse_qs(tls_query(None)) == {"sslmode": ["require"]}
    rec = recording(stack)
    assert not [r for r in of_type(rec, "kubernetes:core/v1:ConfigMap") if manifest_of(r)["metadata"]["name"]
                == DATABASE_CA]
    containers = _connecting_containers(rec)
    assert containers and not [c for _, c in containers if any(m["mountPath"] == DATABASE_CA_DIR
                                                               for m in c["volumeMounts"])]
