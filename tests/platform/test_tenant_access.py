"""Tenant members act in their own namespace only (issue 21 §1): a Role and RoleBinding per tenant namespace, bound
to the group the stack names, and on AWS EKS access entries that put the named IAM principals in that group.

The Role is checked against what `pulumi up` itself creates for a training job (every object the workloads layer
puts in a tenant namespace), so a job kind added later without its verbs fails here. Expectations come from each
stack's settings, and the access entries from a stack edited to name principals.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from owned_stacks import OWNED_STACKS, planned, recording
from trainyard.config import ConfigError
from trainyard.config.load import decode_value, parse_settings
from trainyard.names import (
    FABRIC_CHECK_NAMESPACE,
    MLFLOW_CLIENT_CONFIG,
    TENANT_GRAFANA_NAMESPACE,
    TENANT_GRAFANA_PREFIX,
    tenant_group,
)
from trainyard.plan.recording import Recording, ResourceRecord
from trainyard.plan.runtime import (
    PROJECT,
    STACKS_DIR,
    StackFile,
    available_stacks,
    read_stack,
    render,
    settings_of,
)
from trainyard.plan.writers import is_kubernetes_object, manifest_of
from trainyard.platform.tenant_access import TENANT_ROLE, UI_ROLE

# The tests' own stacks and every sample stack: (name, stacks folder).
Stack = tuple[str, Path]
STACKS: list[Stack] = [("fleet", OWNED_STACKS), ("laptop", OWNED_STACKS),
                       *((s, STACKS_DIR) for s in available_stacks())]
ACCESS_ENTRY = "aws:eks/accessEntry:AccessEntry"
# What a member needs on an object they submit themselves: server-side apply (create, patch), watch it, cancel it.
SUBMIT = {"create", "patch", "get", "watch", "delete"}
MEMBER = "arn:aws:iam::111122223333:role/ml-engineer"


def _recording(stack: Stack) -> Recording:
    return recording(stack)


def _raw(stack: str) -> dict[str, Any]:
    """A stack the tests own, as the raw config its cases edit."""
    return {k.split(":", 1)[1]: decode_value(v) for k, v in read_stack(stack, OWNED_STACKS).values.items()}


def _stack_file(stack: str, raw: dict[str, Any]) -> StackFile:
    values = {f"{PROJECT}:{k}": v if isinstance(v, str) else json.dumps(v) for k, v in raw.items()}
    return StackFile(stack=stack, values=values, secret_keys=())


def _manifests(recording: Recording, kind: str) -> list[dict[str, Any]]:
    return [manifest_of(r) for r in recording.resources if is_kubernetes_object(r) and r.type.rsplit(":", 1)[1] == kind]


def _in_workloads(recording: Recording, record: ResourceRecord) -> bool:
    by_urn = recording.by_urn()
    while record.parent in by_urn:
        record = by_urn[record.parent]
        if record.type.startswith("trainyard:workloads:"):
            return True
    return False


def _granted(rules: list[dict[str, Any]], group: str, resource: str) -> set[str]:
    return {verb for rule in rules if group in rule["apiGroups"] and resource in rule["resources"]
            for verb in rule["verbs"]}


def _plural(kind: str) -> str:
    return kind.lower() + ("es" if kind.endswith("s") else "s")


@pytest.mark.parametrize("stack", STACKS, ids=[s[0] for s in STACKS])
def test_every_tenant_namespace_binds_its_group_to_its_role(stack: Stack) -> None:
    settings, recording = settings_of(read_stack(*stack)), _recording(stack)
    roles = {r["metadata"]["namespace"]: r for r in _manifests(recording, "Role")
             if r["metadata"]["name"] == TENANT_ROLE}
    bindings = {b["metadata"]["namespace"]: b for b in _manifests(recording, "RoleBinding")
                if b["metadata"]["name"] == TENANT_ROLE}
    tenants = {t.namespace_name: t for t in settings.tenants}
    assert sorted(roles) == sorted(bindings) == sorted(tenants)
    assert FABRIC_CHECK_NAMESPACE not in roles
    for namespace, binding in bindings.items():
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": TENANT_ROLE}
        assert binding["subjects"] == [{"kind": "Group", "name": tenants[namespace].group,
                                        "apiGroup": "rbac.authorization.k8s.io"}]
    # Nothing cluster-wide names a tenant group; in the tenants' Grafana namespace a group is bound only to its own
    # tenant's pod (tests/platform/test_tenant_grafana.py holds that binding's Role).
    groups = {t.group for t in settings.tenants}
    own_grafana = {f"{TENANT_GRAFANA_PREFIX}{t.name}": t.group for t in settings.tenants}
    for kind in ("ClusterRoleBinding", "RoleBinding"):
        for binding in _manifests(recording, kind):
            named = {s["name"] for s in binding.get("subjects", []) if s["kind"] == "Group"} & groups
            meta = binding["metadata"]
            grafana = meta.get("namespace") == TENANT_GRAFANA_NAMESPACE and named == {own_grafana.get(meta["name"])}
            allowed = kind == "RoleBinding" and (meta["name"] in {TENANT_ROLE, UI_ROLE} or grafana)
            assert not named or allowed, binding


# The UIs members reach with `kubectl port-forward svc/<service>` (README, "Reaching the UIs"): namespace -> service.
UIS = {"mlflow": ("mlflow", "mlflow"), "argoWorkflows": ("argo", "argo-workflows-server")}
# What that command asks of the API server: the Service, a pod behind it (listed, or watched until one is there),
# and the forward itself on the pods/portforward subresource: a WebSocket upgrade (GET: `get`), and SPDY (POST:
# `create`) when the upgrade is refused (client-go tools/portforward/tunneling_dialer.go, fallback_dialer.go).
PORT_FORWARD = {("", "services"): {"get"}, ("", "pods"): {"get", "list", "watch"},
                ("", "pods/portforward"): {"get", "create"}}


@pytest.mark.parametrize("stack", STACKS, ids=[s[0] for s in STACKS])
def test_members_may_port_forward_to_the_platforms_uis_and_nothing_else_there(stack: Stack) -> None:
    settings, recording = settings_of(read_stack(*stack)), _recording(stack)
    addons = settings.addons
    enabled = {"mlflow": addons.mlflow.enabled, "argoWorkflows": addons.argo_workflows.enabled}
    roles = {r["metadata"]["namespace"]: r for r in _manifests(recording, "Role") if r["metadata"]["name"] == UI_ROLE}
    bindings = {b["metadata"]["namespace"]: b for b in _manifests(recording, "RoleBinding")
                if b["metadata"]["name"] == UI_ROLE}
    expected = {UIS[a][0] for a, on in enabled.items() if on}
    assert sorted(roles) == sorted(bindings) == sorted(expected)
    services = {(s["metadata"].get("namespace"), s["metadata"]["name"]) for s in _manifests(recording, "Service")}
    rendered = {(o["metadata"].get("namespace"), o["metadata"]["name"])
                for _, o in planned(stack).rendered.objects() if o["kind"] == "Service"}
    for addon, on in enabled.items():
        if on:
            assert UIS[addon] in services | rendered, UIS[addon]
    groups = sorted(t.group for t in settings.tenants)
    for namespace, role in roles.items():
        granted = {(g, r): set(rule["verbs"]) for rule in role["rules"] for g in rule["apiGroups"]
                   for r in rule["resources"]}
        assert granted == PORT_FORWARD, namespace
        assert bindings[namespace]["roleRef"]["name"] == UI_ROLE
        assert sorted(s["name"] for s in bindings[namespace]["subjects"]) == groups


@pytest.mark.parametrize("stack", STACKS, ids=[s[0] for s in STACKS])
def test_members_may_submit_what_a_stack_job_is_made_of(stack: Stack) -> None:
    recording = _recording(stack)
    roles = {r["metadata"]["namespace"]: r["rules"] for r in _manifests(recording, "Role")
             if r["metadata"]["name"] == TENANT_ROLE}
    checked = 0
    for record in recording.resources:
        if not (is_kubernetes_object(record) and _in_workloads(recording, record)):
            continue
        obj = manifest_of(record)
        namespace = obj["metadata"].get("namespace")
        if namespace not in roles:
            continue  # the fabric checks' namespace: the platform's, not a tenant's
        group = obj["apiVersion"].rpartition("/")[0]
        assert _granted(roles[namespace], group, _plural(obj["kind"])) >= SUBMIT, (namespace, obj["kind"])
        checked += 1
    assert checked > 0


@pytest.mark.parametrize("stack", STACKS, ids=[s[0] for s in STACKS])
def test_members_read_logs_but_no_secrets_and_run_no_pods_of_their_own(stack: Stack) -> None:
    for role in _manifests(_recording(stack), "Role"):
        if role["metadata"]["name"] != TENANT_ROLE:
            continue
        rules = role["rules"]
        assert _granted(rules, "", "pods/log") == {"get"}
        # Pods are Volcano's and Argo's: a member reads them, and deletes a failed step's as `argo retry` does.
        assert _granted(rules, "", "pods") == {"get", "list", "watch", "delete"}
        assert all("*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"] for rule in rules)
        for resource in ("pods/exec", "pods/attach", "pods/portforward", "serviceaccounts", "roles",
                         "rolebindings", "resourcequotas", "queues"):
            assert not any(resource in rule["resources"] for rule in rules), resource
        # One Secret, by name and only read: the namespace's MLflow user, for the UI's sign-in.
        secrets = [rule for rule in rules if "secrets" in rule["resources"]]
        assert secrets == [{"apiGroups": [""], "resources": ["secrets"], "resourceNames": [MLFLOW_CLIENT_CONFIG],
                            "verbs": ["get"]}]
        # A job's pipeline: its WorkflowTemplate (server-side applied by `submit --pipeline`) and Workflows from it;
        # nothing cluster-wide of Argo's.
        assert _granted(rules, "argoproj.io", "workflows") >= SUBMIT
        assert _granted(rules, "argoproj.io", "workflowtemplates") >= SUBMIT
        assert not _granted(rules, "argoproj.io", "clusterworkflowtemplates")


def test_named_principals_get_one_access_entry_with_their_tenants_groups() -> None:
    raw = copy.deepcopy(_raw("fleet"))
    tenants = raw["tenants"]
    assert len(tenants) >= 2, "the case needs two tenants sharing a member"
    tenants[0]["access"] = {"principalArns": [MEMBER]}
    tenants[1]["access"] = {"group": "team-b", "principalArns": [MEMBER, f"{MEMBER}-b"]}
    recording = render(_stack_file("fleet", raw))
    entries = {r.inputs["principalArn"]: r for r in recording.resources if r.type == ACCESS_ENTRY}
    assert entries[MEMBER].inputs["kubernetesGroups"] == [tenant_group(tenants[0]["name"]), "team-b"]
    assert entries[f"{MEMBER}-b"].inputs["kubernetesGroups"] == ["team-b"]
    for arn in (MEMBER, f"{MEMBER}-b"):
        assert entries[arn].inputs["type"] == "STANDARD"
    # No EKS access policy: what the group may do is the namespace Role, nothing cluster-wide.
    associations = [r.inputs["principalArn"] for r in recording.resources
                    if r.type == "aws:eks/accessPolicyAssociation:AccessPolicyAssociation"]
    assert MEMBER not in associations and f"{MEMBER}-b" not in associations
    (binding,) = [b for b in _manifests(recording, "RoleBinding") if b["metadata"]["name"] == TENANT_ROLE
                  and b["metadata"]["namespace"] == tenants[1].get("namespace", tenants[1]["name"])]
    assert binding["subjects"][0]["name"] == "team-b"


DEPLOY_ROLE = _raw("fleet")["deploy"]["roleArn"]


@pytest.mark.parametrize(("stack", "mutate", "path", "fragment"), [
    ("fleet", lambda t: t[0].update(access={"group": "system:masters"}), "tenants[0].access.group", "reserves"),
    ("fleet", lambda t: [x.update(access={"group": "shared"}) for x in t[:2]], "tenants", "more than one tenant"),
    ("fleet", lambda t: t[0].update(access={"principalArns": [MEMBER, MEMBER]}), "tenants[0].access.principalArns",
     "more than once"),
    ("fleet", lambda t: t[0].update(access={"principalArns": [DEPLOY_ROLE]}),
     "tenants[0].access.principalArns", "deploy role"),
    ("laptop", lambda t: t[0].update(access={"principalArns": [MEMBER]}), "tenants[0].access.principalArns",
     "target 'aws' only"),
], ids=["system-group", "shared-group", "duplicate-principal", "deploy-role", "entries-on-local"])
def test_bad_access_is_named_by_key(stack: str, mutate: Any, path: str, fragment: str) -> None:
    raw = copy.deepcopy(_raw(stack))
    mutate(raw["tenants"])
    with pytest.raises(ConfigError) as caught:
        parse_settings(PROJECT, stack, raw)
    lines = [line for line in str(caught.value).splitlines() if line.startswith(f"  - trainyard:{path}:")]
    assert any(fragment in line for line in lines), str(caught.value)
