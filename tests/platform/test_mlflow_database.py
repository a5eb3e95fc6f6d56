"""`local`'s MLflow database (platform/mlflow.py): a CloudNativePG cluster in a namespace of its own.

Tenant members may port-forward to every pod of the MLflow namespace (its `tenant-ui` Role), and a port-forward
enters the pod past every network policy: the database is where no tenant has a Role, its namespace is kept like the
database (deleting a namespace deletes what it holds), and its network policy admits exactly the server, the
migration Job and CloudNativePG's operator. Expectations come from each stack's objects, never the sample stacks.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from owned_stacks import Stack, planned, stack_settings, stacks_where
from trainyard import names
from trainyard.config.load import platform_namespaces
from trainyard.plan.recording import ResourceRecord
from trainyard.plan.writers import is_kubernetes_object, manifest_of
from trainyard.platform import mlflow_auth
from trainyard.platform.mlflow import CONFIG_DIGEST, DATABASE_NAMESPACE, LOCAL_DATABASE_HOST

LOCAL_DATABASE = stacks_where(lambda s: s.target == "local" and s.addons.mlflow.enabled)
KUBE_NAMESPACE = "kubernetes.io/metadata.name"
# Where a workload keeps its pod template.
TEMPLATES = {"Deployment": ("spec", "template"), "StatefulSet": ("spec", "template"), "DaemonSet": ("spec", "template"),
             "Job": ("spec", "template"), "CronJob": ("spec", "jobTemplate", "spec", "template")}


def _objects(stack: Stack) -> Iterator[tuple[ResourceRecord | None, dict[str, Any]]]:
    """Every object the stack puts in the cluster: the program's, then every Helm release's."""
    plan = planned(stack)
    for record in plan.recording.resources:
        if is_kubernetes_object(record):
            yield record, manifest_of(record)
    for _, obj in plan.rendered.objects():
        yield None, dict(obj)


def _templates(obj: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    if obj["apiVersion"].startswith("batch.volcano.sh/"):  # a tenant's job: one template per task
        return [task["template"] for task in obj["spec"]["tasks"]]
    if (path := TEMPLATES.get(obj["kind"])) is None:
        return []
    template: Any = obj
    for key in path:
        template = template[key]
    return [template]


def _pods(stack: Stack) -> list[tuple[str, str, Mapping[str, str]]]:
    """(namespace, workload, pod labels) of every pod template of the stack, tenants' jobs included."""
    return [(obj["metadata"]["namespace"], f"{obj['kind']}/{obj['metadata']['name']}",
             template.get("metadata", {}).get("labels", {}))
            for _, obj in _objects(stack) if "kind" in obj for template in _templates(obj)]


def _of(stack: Stack, kind: str, namespace: str | None = None) -> list[tuple[ResourceRecord | None, dict[str, Any]]]:
    return [(r, o) for r, o in _objects(stack) if o.get("kind") == kind
            and (namespace is None or o["metadata"].get("namespace") == namespace)]


def _admits(peer: Mapping[str, Any], policy_namespace: str, namespace: str, pod_labels: Mapping[str, str]) -> bool:
    """Whether a NetworkPolicy peer (matchLabels only) selects a pod (Kubernetes docs, Network Policies)."""
    if "namespaceSelector" in peer:
        wanted = peer["namespaceSelector"].get("matchLabels", {})
        if set(wanted) - {KUBE_NAMESPACE} or wanted.get(KUBE_NAMESPACE, namespace) != namespace:
            return False
    elif namespace != policy_namespace:
        return False
    return all(pod_labels.get(k) == v for k, v in peer.get("podSelector", {}).get("matchLabels", {}).items())


@pytest.mark.parametrize("stack", LOCAL_DATABASE)
def test_the_database_is_in_a_kept_namespace_no_tenant_has_a_role_in(stack: Stack) -> None:
    settings = stack_settings(stack)
    (cluster,) = [o for _, o in _of(stack, "Cluster") if o["apiVersion"].startswith("postgresql.cnpg.io/")]
    namespace = cluster["metadata"]["namespace"]
    assert namespace == DATABASE_NAMESPACE != names.MLFLOW_NAMESPACE
    # No Role or binding at all there: members reach only the namespaces whose UI they may port-forward to.
    assert not _of(stack, "Role", namespace) and not _of(stack, "RoleBinding", namespace)
    ui_bindings = {o["metadata"]["namespace"] for _, o in _of(stack, "RoleBinding")
                   if any(s.get("kind") == "Group" for s in o.get("subjects", []))}
    assert names.MLFLOW_NAMESPACE in ui_bindings and namespace not in ui_bindings
    # What the Cluster's initdb reads is beside it, and nothing of the database is left in the MLflow namespace.
    owner = cluster["spec"]["bootstrap"]["initdb"]["secret"]["name"]
    assert [o["metadata"]["name"] for _, o in _of(stack, "Secret", namespace)] == [owner]
    assert not [o for _, o in _of(stack, "Cluster", names.MLFLOW_NAMESPACE)]
    # The server connects to the Cluster's read-write Service (cloudnative-pg docs/src/applications.md: <name>-rw).
    assert f"{cluster['metadata']['name']}-rw.{namespace}.svc" == LOCAL_DATABASE_HOST
    # Deleting a namespace deletes what it holds: the database's, and the MLflow one holding the artifacts' volume,
    # are kept like the database.
    kept = {o["metadata"]["name"]: (r.protect, r.retain_on_delete) for r, o in _of(stack, "Namespace")
            if r is not None}
    assert kept[namespace] == kept[names.MLFLOW_NAMESPACE] == (settings.protect, settings.protect)
    (claim,) = [r for r, o in _of(stack, "PersistentVolumeClaim", names.MLFLOW_NAMESPACE)]
    assert claim is not None and (claim.protect, claim.retain_on_delete) == (settings.protect, settings.protect)
    # No tenant may take its name.
    assert namespace in platform_namespaces()


@pytest.mark.parametrize("stack", LOCAL_DATABASE)
def test_only_the_server_the_migration_and_the_operator_reach_the_database(stack: Stack) -> None:
    (cluster,) = [o for _, o in _of(stack, "Cluster") if o["apiVersion"].startswith("postgresql.cnpg.io/")]
    namespace = cluster["metadata"]["namespace"]
    (policy,) = [o for _, o in _of(stack, "NetworkPolicy", namespace)]
    spec = policy["spec"]
    # Every pod of the namespace, ingress only (the instance manager talks to the API server).
    assert spec["podSelector"] == {} and spec["policyTypes"] == ["Ingress"]
    admitted: dict[str, set[int]] = {}
    for rule in spec["ingress"]:
        ports = {int(p["port"]) for p in rule["ports"]}
        for pod_namespace, workload, pod_labels in _pods(stack):
            if any(_admits(peer, namespace, pod_namespace, pod_labels) for peer in rule["from"]):
                admitted.setdefault(f"{pod_namespace}/{workload}", set()).update(ports)
    (migration,) = [o["metadata"]["name"] for _, o in _of(stack, "Job", names.MLFLOW_NAMESPACE)
                    if o["metadata"]["name"].startswith("mlflow-db-upgrade-")]
    operator = planned(stack).rendered.releases["cloudnative-pg"]
    (operator_deployment,) = operator.of_kind("Deployment")
    # PostgreSQL for the server and the migration; the operator also on the instance manager's status port
    # (cloudnative-pg v1.30.0 docs/src/networking.md: 8000 and 5432). Nothing else of the stack: no tenant pod, not
    # the users Job (it talks to the server), not Prometheus.
    assert admitted == {
        f"{names.MLFLOW_NAMESPACE}/Deployment/mlflow": {5432},
        f"{names.MLFLOW_NAMESPACE}/Job/{migration}": {5432},
        f"{operator.namespace}/Deployment/{operator_deployment['metadata']['name']}": {8000, 5432},
    }
    # And the instances of this Cluster reach each other (the operator labels them cnpg.io/cluster: <name>).
    own = [rule for rule in spec["ingress"] if rule["from"] == [
        {"podSelector": {"matchLabels": {"cnpg.io/cluster": cluster["metadata"]["name"]}}}]]
    assert len(own) == 1 and len(spec["ingress"]) == 3


@pytest.mark.parametrize("stack", stacks_where(lambda s: s.addons.mlflow.enabled))
def test_a_new_store_is_migrated_and_given_its_users(stack: Stack) -> None:
    """The migration and users Jobs' templates carry the store's digest: a new database (a moved one too) is a new
    Job of each (replaced on a spec change), so its schemas exist before the server rolls onto it, and its users."""
    by_urn = planned(stack).recording.by_urn()
    jobs = {o["metadata"]["name"].partition("-v")[0]: r for r, o in _of(stack, "Job", names.MLFLOW_NAMESPACE)}
    digests = set()
    for job in (jobs["mlflow-db-upgrade"], jobs[mlflow_auth.USERS_ACCOUNT]):
        assert job is not None and job.replace_on_changes == ("spec",)
        digests.add(manifest_of(job)["spec"]["template"]["metadata"]["annotations"][CONFIG_DIGEST])
        # Computed from the store: the database's own resources are what the digest waits for.
        store = {"aws:rds/instance:Instance"} if stack_settings(stack).is_aws else {
            "random:index/randomPassword:RandomPassword"}
        assert store <= {by_urn[u].type for u in job.depends_on}
    (digest,) = digests
    assert len(digest) == 64 and int(digest, 16) >= 0
