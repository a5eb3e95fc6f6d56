"""Tenancy as the API server and Volcano would enforce it (issue 19 findings 7 and 12): a job may use only its
namespace's queue, every namespace has a quota (MIG slices included), and what each queue is handed fits it.

The admission policy's CEL is evaluated with a CEL interpreter (cel-python) against the rendered Namespace
objects, as the API server evaluates it with `object` and `namespaceObject` bound (Kubernetes docs,
"Validating Admission Policy": variables).
"""

from __future__ import annotations

from collections import defaultdict
from functools import cache
from typing import Any

import celpy
import pytest
from owned_stacks import recording
from trainyard.config.model import TenantQuota
from trainyard.config.quantity import parse_quantity
from trainyard.names import FABRIC_CHECK_NAMESPACE, FABRIC_CHECK_QUEUE, QUEUE_LABEL
from trainyard.plan.recording import Recording
from trainyard.plan.runtime import STACKS_DIR, available_stacks, read_stack, settings_of
from trainyard.plan.writers import is_kubernetes_object, manifest_of
from trainyard.platform.monitor_policy import POD_MONITOR_POLICY, SAMPLE_LIMIT
from trainyard.platform.tenants import QUEUE_POLICY, TENANT_LABEL

STACKS = available_stacks()
VOLCANO_STACKS = [s for s in STACKS if settings_of(read_stack(s)).addons.volcano.enabled]


def _recording(stack: str) -> Recording:
    return recording((stack, STACKS_DIR))


def _objects(stack: str, kind: str) -> list[dict[str, Any]]:
    return [manifest_of(r) for r in _recording(stack).resources
            if is_kubernetes_object(r) and r.type.rsplit(":", 1)[1] == kind]


def _jobs(stack: str) -> list[dict[str, Any]]:
    """Volcano Jobs (a batch/v1 Job, such as MLflow's schema migration, is no queue's)."""
    return [j for j in _objects(stack, "Job") if j["apiVersion"].startswith("batch.volcano.sh/")]


def _queues(stack: str) -> dict[str, dict[str, Any]]:
    return {q["metadata"]["name"]: q for q in [*_objects(stack, "Queue"), *_objects(stack, "QueuePatch")]}


def _namespaces(stack: str) -> dict[str, dict[str, Any]]:
    return {n["metadata"]["name"]: n for n in _objects(stack, "Namespace")}


class Policy:
    """The rendered ValidatingAdmissionPolicy's validations, compiled once."""

    def __init__(self, spec: dict[str, Any]) -> None:
        env = celpy.Environment()
        self.programs = [env.program(env.compile(v["expression"])) for v in spec["validations"]]
        self.rules = spec["matchConstraints"]["resourceRules"]

    def admits(self, obj: dict[str, Any], namespace: dict[str, Any]) -> bool:
        bound = {"object": celpy.json_to_cel(obj), "namespaceObject": celpy.json_to_cel(namespace)}
        return all(bool(program.evaluate(bound)) for program in self.programs)


def _named(stack: str, kind: str, name: str) -> dict[str, Any]:
    (obj,) = [o for o in _objects(stack, kind) if o["metadata"]["name"] == name]
    return obj


@cache
def _policy(stack: str) -> Policy:
    policy = _named(stack, "ValidatingAdmissionPolicy", QUEUE_POLICY)
    binding = _named(stack, "ValidatingAdmissionPolicyBinding", QUEUE_POLICY)
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    return Policy(policy["spec"])


def _job(queue: str | None) -> dict[str, Any]:
    return {"spec": {"queue": queue} if queue is not None else {}}


@pytest.mark.parametrize("stack", VOLCANO_STACKS)
def test_the_policy_covers_volcano_jobs_and_podgroups(stack: str) -> None:
    groups = {(g, r) for rule in _policy(stack).rules for g in rule["apiGroups"] for r in rule["resources"]}
    assert {("batch.volcano.sh", "jobs"), ("scheduling.volcano.sh", "podgroups")} <= groups
    assert all({"CREATE", "UPDATE"} <= set(rule["operations"]) for rule in _policy(stack).rules)


@pytest.mark.parametrize("stack", VOLCANO_STACKS)
def test_a_namespace_may_use_its_own_queue_only(stack: str) -> None:
    policy, namespaces = _policy(stack), _namespaces(stack)
    labelled = {name: ns for name, ns in namespaces.items() if QUEUE_LABEL in ns["metadata"].get("labels", {})}
    queues = set(_queues(stack)) | {"default"}
    assert {ns["metadata"]["labels"][QUEUE_LABEL] for ns in labelled.values()} <= queues
    for name, namespace in labelled.items():
        own = namespace["metadata"]["labels"][QUEUE_LABEL]
        assert policy.admits(_job(own), namespace), name
        for other in queues - {own}:
            assert not policy.admits(_job(other), namespace), f"{name} may use queue {other}"
        # Volcano's webhook turns an empty queue into `default` before validation; only its owner may use it.
        assert policy.admits(_job(None), namespace) is (own == "default"), name
    # Anywhere else no tenant's queue can be named, the cluster's `default` included.
    stranger = {"metadata": {"name": "elsewhere", "labels": {"team": "x"}}}
    assert not any(policy.admits(_job(q), stranger) for q in queues)
    assert not policy.admits(_job(None), {"metadata": {"name": "bare"}})


@pytest.mark.parametrize("stack", VOLCANO_STACKS)
def test_every_rendered_job_is_admitted_in_its_namespace(stack: str) -> None:
    policy, namespaces = _policy(stack), _namespaces(stack)
    for job in _jobs(stack):
        namespace = namespaces[job["metadata"]["namespace"]]
        assert policy.admits(job, namespace), job["metadata"]["name"]


@pytest.mark.parametrize("stack", STACKS)
def test_every_tenant_namespace_has_a_quota_with_mig_slices(stack: str) -> None:
    settings = settings_of(read_stack(stack))
    quotas = {q["metadata"]["namespace"]: q["spec"]["hard"] for q in _objects(stack, "ResourceQuota")
              if q["metadata"]["name"] == "tenant-quota"}
    mig_pools = [p for p in settings.pools("gpu") if p.mig_layout]
    # The classes the stack's checkpoint claims name (a stack without Rook names none).
    classes = {c["spec"]["storageClassName"] for c in _objects(stack, "PersistentVolumeClaim")
               if c["spec"].get("storageClassName")}
    for tenant in settings.tenants:
        hard = quotas[tenant.namespace_name]
        limit = tenant.quota or tenant.capability
        if limit.gpu:
            assert hard["requests.nvidia.com/gpu"] == str(limit.gpu)
            mig = {k for k in hard if k.startswith("requests.nvidia.com/mig-")}
            assert bool(mig) is bool(mig_pools), tenant.name
        assert "pods" in hard
        # Claims too, on the class checkpoint claims use; never namespace-wide, where the dataset claim Fluid makes
        # in the namespace (nominally 100Pi) would count and be refused.
        assert "requests.storage" not in hard and "persistentvolumeclaims" not in hard, tenant.name
        storage = tenant.quota or TenantQuota()
        bounded = {key.split(".storageclass.")[0] for key in hard if ".storageclass.storage.k8s.io/" in key}
        assert bounded == classes, tenant.name
        for per_class in (f"{c}.storageclass.storage.k8s.io" for c in classes):
            assert hard[f"{per_class}/requests.storage"] == storage.storage
            assert hard[f"{per_class}/persistentvolumeclaims"] == str(storage.claims)
            jobs = [j.checkpoint_size for j in settings.workloads if j.tenant == tenant.name]
            assert sum(parse_quantity(size) for size in jobs) <= parse_quantity(hard[f"{per_class}/requests.storage"])


def _scoped_to(quota: dict[str, Any], pod: dict[str, Any]) -> bool:
    """Whether a quota's PriorityClass scope selects the pod (Kubernetes docs, "Resource Quotas": quota scopes)."""
    (expression,) = quota["spec"]["scopeSelector"]["matchExpressions"]
    assert (expression["scopeName"], expression["operator"]) == ("PriorityClass", "In")
    return pod["spec"].get("priorityClassName", "") in expression["values"]


@pytest.mark.parametrize("stack", STACKS)
def test_no_tenant_pod_may_run_at_a_platform_priority(stack: str) -> None:
    settings = settings_of(read_stack(stack))
    scoped = {q["metadata"]["namespace"]: q for q in _objects(stack, "ResourceQuota")
              if "scopeSelector" in q["spec"]}
    assert sorted(scoped) == sorted(t.namespace_name for t in settings.tenants)
    classes = {c["metadata"]["name"] for c in _objects(stack, "PriorityClass")}
    training = {c for c in classes if c.endswith("-training")}
    for quota in scoped.values():
        assert quota["spec"]["hard"] == {"pods": "0"}
        for name in (classes - training) | {"system-cluster-critical", "system-node-critical"}:
            assert _scoped_to(quota, {"spec": {"priorityClassName": name}}), name
        for name in training:
            assert not _scoped_to(quota, {"spec": {"priorityClassName": name}}), name
        assert not _scoped_to(quota, {"spec": {}})
    # The stack's own training pods keep running there.
    for job in (j for j in _jobs(stack) if j["metadata"]["namespace"] in scoped):
        for task in job["spec"]["tasks"]:
            assert not _scoped_to(scoped[job["metadata"]["namespace"]], task["template"]), job["metadata"]["name"]


def _requests(pod: dict[str, Any]) -> dict[str, float]:
    total: dict[str, float] = defaultdict(float)
    for container in pod["containers"]:
        for name, value in container["resources"]["requests"].items():
            total[name] += float(parse_quantity(str(value)))
    return total


@pytest.mark.parametrize("stack", VOLCANO_STACKS)
def test_what_each_queue_is_handed_fits_its_capability(stack: str) -> None:
    """Volcano creates every pod of a job whatever its queue may hold, marks each Unschedulable, and Karpenter
    launches nodes for all of them (volcano-sh/volcano issue 4710): a queue's jobs, at their full replicas, must
    fit its capability, or GPU nodes are bought for pods the queue never admits."""
    demand: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for job in _jobs(stack):
        queue = job["spec"].get("queue", "default")
        for task in job["spec"]["tasks"]:
            for name, amount in _requests(task["template"]["spec"]).items():
                demand[queue][name] += task["replicas"] * amount
    queues = _queues(stack)
    for queue, wanted in demand.items():
        capability = queues[queue]["spec"].get("capability") or {}
        for name, limit in capability.items():
            assert wanted.get(name, 0) <= float(parse_quantity(str(limit))), (
                f"queue {queue}: its jobs ask {wanted.get(name)} {name}, capability {limit}")


@pytest.mark.parametrize("stack", VOLCANO_STACKS)
def test_fabric_checks_run_in_their_own_namespace_and_queue(stack: str) -> None:
    checks = [j for j in _jobs(stack) if j["metadata"]["labels"].get("trainyard.io/check") == "fabric"]
    if not settings_of(read_stack(stack)).fabric_checked_pools:
        assert not checks
        return
    assert checks
    assert {(j["metadata"]["namespace"], j["spec"]["queue"]) for j in checks} == {
        (FABRIC_CHECK_NAMESPACE, FABRIC_CHECK_QUEUE)}
    queue = _queues(stack)[FABRIC_CHECK_QUEUE]["spec"]
    # Lent to no one and taken back from no one.
    assert queue["reclaimable"] is False
    others = [j for j in _jobs(stack) if j not in checks]
    assert all(j["spec"]["queue"] != FABRIC_CHECK_QUEUE for j in others)


def _monitor(**spec: Any) -> dict[str, Any]:
    endpoint = spec.pop("endpoint", {})
    return {"spec": {"selector": {}, "sampleLimit": SAMPLE_LIMIT,
                     "podMetricsEndpoints": [{"port": "m", "followRedirects": False, **endpoint}], **spec}}


@pytest.mark.parametrize("stack", STACKS)
def test_a_tenants_pod_monitor_scrapes_its_namespace_keeps_its_label_and_bounds_its_samples(stack: str) -> None:
    policy = Policy(_named(stack, "ValidatingAdmissionPolicy", POD_MONITOR_POLICY)["spec"])
    binding = _named(stack, "ValidatingAdmissionPolicyBinding", POD_MONITOR_POLICY)["spec"]
    assert binding["validationActions"] == ["Deny"]
    assert binding["matchResources"]["namespaceSelector"] == {
        "matchExpressions": [{"key": TENANT_LABEL, "operator": "Exists"}]}
    assert {(g, r) for rule in policy.rules for g in rule["apiGroups"] for r in rule["resources"]} == {
        ("monitoring.coreos.com", "podmonitors")}
    namespaces = _namespaces(stack)
    tenants = [namespaces[t.namespace_name] for t in settings_of(read_stack(stack)).tenants]
    # Every namespace the binding selects is a tenant's, and the platform's own are not selected.
    assert all(TENANT_LABEL in n["metadata"]["labels"] for n in tenants)
    assert not [n for n in namespaces.values() if TENANT_LABEL in n["metadata"].get("labels", {})
                and n["metadata"]["name"] not in {t["metadata"]["name"] for t in tenants} | {FABRIC_CHECK_NAMESPACE}]
    # What the stack's own jobs render is admitted where it is created.
    for monitor in _objects(stack, "PodMonitor"):
        assert policy.admits(monitor, namespaces[monitor["metadata"]["namespace"]]), monitor["metadata"]["name"]
    for namespace in tenants:
        own = namespace["metadata"]["name"]
        assert policy.admits(_monitor(), namespace)
        assert policy.admits(_monitor(namespaceSelector={"matchNames": [own]}), namespace)
        # Renaming a series' metric (`__name__`, after the scrape) steers nothing.
        assert policy.admits(_monitor(endpoint={"metricRelabelings": [
            {"sourceLabels": ["__name__"], "regex": "x_(.*)", "targetLabel": "__name__", "replacement": "y_$1"}]}),
            namespace)
        refused = {
            "every namespace": _monitor(namespaceSelector={"any": True}),
            "another namespace": _monitor(namespaceSelector={"matchNames": [own, "monitoring"]}),
            "scraped labels win": _monitor(endpoint={"honorLabels": True}),
            "namespace rewritten": _monitor(endpoint={"relabelings": [
                {"targetLabel": "namespace", "replacement": "monitoring"}]}),
            "namespace from a regex group": _monitor(endpoint={"metricRelabelings": [
                {"sourceLabels": ["x"], "regex": "(.*)", "targetLabel": "$1", "replacement": "monitoring"}]}),
            "label names from data": _monitor(endpoint={"metricRelabelings": [
                {"action": "labelmap", "regex": "x_(.*)"}]}),
            "namespace dropped": _monitor(endpoint={"relabelings": [{"action": "labeldrop", "regex": "namespace"}]}),
            "namespace not kept": _monitor(endpoint={"metricRelabelings": [
                {"action": "LabelKeep", "regex": "__name__|job"}]}),
            "pod label as namespace": _monitor(podTargetLabels=["namespace"]),
            "scrape address rewritten": _monitor(endpoint={"relabelings": [
                {"targetLabel": "__address__", "replacement": "10.0.0.1:9090"}]}),
            "scrape parameter set": _monitor(endpoint={"relabelings": [
                {"targetLabel": "__param_target", "replacement": "http://169.254.169.254/"}]}),
            "through a proxy": _monitor(endpoint={"proxyUrl": "http://attacker.example:3128"}),
            "the proxy of Prometheus's environment": _monitor(endpoint={"proxyFromEnvironment": True}),
            "a token from a URL": _monitor(endpoint={"oauth2": {
                "clientId": {"secret": {"name": "x", "key": "id"}}, "clientSecret": {"name": "x", "key": "s"},
                "tokenUrl": "http://10.0.0.1/"}}),
            "redirects followed": _monitor(endpoint={"followRedirects": True}),
            "redirects followed by default": {"spec": {"selector": {}, "sampleLimit": SAMPLE_LIMIT,
                                                       "podMetricsEndpoints": [{"port": "m"}]}},
            "no sample limit": {"spec": {"selector": {}, "podMetricsEndpoints": [
                {"port": "m", "followRedirects": False}]}},
            "too many samples": _monitor(sampleLimit=SAMPLE_LIMIT + 1),
        }
        for what, monitor in refused.items():
            assert not policy.admits(monitor, namespace), f"{own}: {what}"
