"""Argo Workflows (platform/argo_workflows.py) as each stack renders it, the chart's objects by the real Helm.

What the pipeline relies on: the CRDs come with the release from the locked chart (no install-time download), the
controller runs only the platform's templates as each tenant's `workflow` account, its artifacts go under the
tenant's own prefix with pod credentials (no access key), and each tenant namespace has exactly what that account
needs. Expectations come from each stack's settings and the release's rendered objects.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml
from owned_stacks import OWNED_STACKS, planned
from trainyard import names
from trainyard.plan.recording import Recording
from trainyard.plan.rendering import RenderedRelease
from trainyard.plan.runtime import STACKS_DIR, StackPlan, available_stacks, read_stack, settings_of
from trainyard.plan.writers import is_kubernetes_object, manifest_of
from trainyard.platform.argo_workflows import (
    API_SERVER_POLICY,
    EXECUTOR_ROLE,
    KEY_FORMAT,
    NAMESPACE_POLICY,
    WORKFLOW_LABEL_POLICY,
    WORKFLOW_POD_LABEL,
)

# The tests' own AWS and local stacks, and every sample stack that turns Argo Workflows on: (name, stacks folder).
Stack = tuple[str, Path]
STACKS: list[Stack] = [("fleet", OWNED_STACKS), ("laptop", OWNED_STACKS),
                       *((s, STACKS_DIR) for s in available_stacks()
                         if settings_of(read_stack(s)).addons.argo_workflows.enabled)]
RELEASE = "argo-workflows"
IMAGE_TAGS = {"workflow-controller", "argocli", "argoexec"}
_WRITES = {"create", "update", "patch", "delete", "deletecollection", "*"}


def _plan(stack: Stack) -> StackPlan:
    return planned(stack)


def _recording(stack: Stack) -> Recording:
    return _plan(stack).recording


def _release(stack: Stack) -> RenderedRelease:
    return _plan(stack).rendered.releases[RELEASE]


def _controller_config(stack: Stack) -> dict[str, Any]:
    (config_map,) = [o for o in _release(stack).of_kind("ConfigMap")
                     if o["metadata"]["name"].endswith("workflow-controller-configmap")]
    config: dict[str, Any] = yaml.safe_load(config_map["data"]["config"])
    return config


def _objects(stack: Stack, kind: str, name: str) -> dict[str, dict[str, Any]]:
    """namespace (None: cluster-wide) -> the object of that kind and name the program creates there."""
    return {m["metadata"].get("namespace"): m for m in (manifest_of(r) for r in _recording(stack).resources
                                                    if is_kubernetes_object(r) and r.type.rsplit(":", 1)[1] == kind)
            if m["metadata"]["name"] == name}


def _checkpoint_bucket(stack: Stack) -> str | None:
    buckets = [r.inputs["bucket"] for r in _recording(stack).resources if r.type == "aws:s3/bucket:Bucket"
               and "checkpoints" in r.inputs["bucket"]]
    return buckets[0] if buckets else None


@pytest.mark.parametrize("stack", STACKS, ids=[s[0] for s in STACKS])
def test_crds_come_with_the_release_and_nothing_downloads_them(stack: Stack) -> None:
    release = _release(stack)
    crds = {o["spec"]["group"] for o in release.of_kind("CustomResourceDefinition")}
    assert crds == {"argoproj.io"}
    kinds = {o["spec"]["names"]["kind"] for o in release.of_kind("CustomResourceDefinition")}
    assert {"Workflow", "WorkflowTemplate", "WorkflowTaskResult"} <= kinds
    # The chart's default installs them from a hook Job that fetches them from GitHub at install time.
    assert list(release.of_kind("Job")) == []
    assert not [o for o in release.objects if "helm.sh/hook" in (o["metadata"].get("annotations") or {})]


@pytest.mark.parametrize("stack", STACKS, ids=[s[0] for s in STACKS])
def test_controller_and_server_run_pinned_images_on_system_nodes(stack: Stack) -> None:
    deployments = list(_release(stack).of_kind("Deployment"))
    assert len(deployments) == 2
    images = {c["image"] for d in deployments for c in d["spec"]["template"]["spec"]["containers"]}
    for d in deployments:
        pod = d["spec"]["template"]["spec"]
        assert pod["nodeSelector"][names.ROLE_LABEL] == "system"
        assert pod["securityContext"] == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
        (container,) = pod["containers"]
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert "livenessProbe" in container
    (controller,) = [d for d in deployments if "controller" in d["metadata"]["name"]]
    args = controller["spec"]["template"]["spec"]["containers"][0]["args"]
    images.add(args[args.index("--executor-image") + 1])
    assert {i.rpartition(":")[0].rpartition("/")[2] for i in images} == IMAGE_TAGS
    assert len({i.rpartition(":")[2] for i in images}) == 1  # one Argo version
    (server,) = [d for d in deployments if d is not controller]
    assert "--auth-mode=client" in server["spec"]["template"]["spec"]["containers"][0]["args"]


@pytest.mark.parametrize("stack", STACKS, ids=[s[0] for s in STACKS])
def test_workflows_run_their_templates_spec_as_the_tenants_workflow_account(stack: Stack) -> None:
    config = _controller_config(stack)
    # Secure, not Strict: Strict runs a status.storedWorkflowTemplateSpec the Workflow's creator wrote itself
    # (argo-workflows v4.0.10 workflow/controller/operator.go setStoredWfSpec).
    assert config["workflowRestrictions"] == {"templateReferencing": "Secure"}
    assert config["workflowDefaults"]["spec"]["serviceAccountName"] == names.WORKFLOW_SERVICE_ACCOUNT


@pytest.mark.parametrize("stack", STACKS, ids=[s[0] for s in STACKS])
def test_artifacts_go_under_the_namespace_prefix_with_pod_credentials(stack: Stack) -> None:
    config, bucket = _controller_config(stack), _checkpoint_bucket(stack)
    if bucket is None:
        assert "artifactRepository" not in config
        return
    s3 = config["artifactRepository"]["s3"]
    aws = settings_of(read_stack(*stack)).aws
    assert aws is not None
    region = aws.region
    assert s3 == {"bucket": bucket, "endpoint": f"s3.{region}.amazonaws.com", "region": region, "insecure": False,
                  "useSDKCreds": True, "keyFormat": KEY_FORMAT}
    # The first key segment is the namespace: the only prefix the tenant's role may write (cloud/iam.py).
    assert KEY_FORMAT.startswith("{{workflow.namespace}}/")
    assert "accessKeySecret" not in str(config) and "secretKeySecret" not in str(config)
    # And the tenant's workflow account holds that role.
    pairs = {(r.inputs["namespace"], r.inputs["serviceAccount"]) for r in _recording(stack).resources
             if r.type == "aws:eks/podIdentityAssociation:PodIdentityAssociation"}
    for tenant in settings_of(read_stack(*stack)).tenants:
        assert (tenant.namespace_name, names.WORKFLOW_SERVICE_ACCOUNT) in pairs


@pytest.mark.parametrize("stack", STACKS, ids=[s[0] for s in STACKS])
def test_each_tenant_gets_the_workflow_account_and_only_what_it_needs(stack: Stack) -> None:
    tenants = sorted(t.namespace_name for t in settings_of(read_stack(*stack)).tenants)
    accounts = _objects(stack, "ServiceAccount", names.WORKFLOW_SERVICE_ACCOUNT)
    roles = _objects(stack, "Role", EXECUTOR_ROLE)
    bindings = _objects(stack, "RoleBinding", EXECUTOR_ROLE)
    assert sorted(accounts) == sorted(roles) == sorted(bindings) == tenants
    for namespace in tenants:
        # The executor reports each step's outputs to the API server with the account's token.
        assert accounts[namespace]["automountServiceAccountToken"] is True
        assert bindings[namespace]["subjects"] == [
            {"kind": "ServiceAccount", "name": names.WORKFLOW_SERVICE_ACCOUNT, "namespace": namespace}]
        rules = {(g, r): set(rule["verbs"]) for rule in roles[namespace]["rules"]
                 for g in rule["apiGroups"] for r in rule["resources"]}
        assert rules[("argoproj.io", "workflowtaskresults")] == {"create", "patch"}
        assert {"create", "get", "watch", "delete"} <= rules[("batch.volcano.sh", "jobs")]
        assert not any(r in {"secrets", "pods/exec", "roles", "rolebindings"} for _, r in rules)


@pytest.mark.parametrize("stack", STACKS, ids=[s[0] for s in STACKS])
def test_workflow_pods_and_only_they_reach_the_api_server(stack: Stack) -> None:
    cilium = settings_of(read_stack(*stack)).addons.cilium.enabled
    policies = _objects(stack, "CiliumNetworkPolicy" if cilium else "NetworkPolicy", API_SERVER_POLICY)
    assert sorted(policies) == sorted(t.namespace_name for t in settings_of(read_stack(*stack)).tenants)
    for policy in policies.values():
        spec = policy["spec"]
        if cilium:
            assert spec["endpointSelector"] == {
                "matchLabels": {"io.cilium.k8s.policy.serviceaccount": names.WORKFLOW_SERVICE_ACCOUNT}}
            assert spec["egress"] == [{"toEntities": ["kube-apiserver"]}]
        else:
            assert spec["podSelector"]["matchExpressions"][0]["key"] == "workflows.argoproj.io/workflow"
            assert spec["policyTypes"] == ["Egress"]
            assert {p["port"] for rule in spec["egress"] for p in rule["ports"]} == {443, 6443}


def _server_rules(release: RenderedRelease) -> tuple[dict[tuple[str, str], set[str]], dict[tuple[str, str], set[str]]]:
    """What the server's own account may do: (cluster-wide rules, rules in its namespace), as
    {(apiGroup, resource[/name]): verbs}, from every binding of the release that names that account."""
    (server,) = [d for d in release.of_kind("Deployment") if "controller" not in d["metadata"]["name"]]
    account = (server["spec"]["template"]["spec"]["serviceAccountName"], server["metadata"]["namespace"])
    roles = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o
             for o in release.of_kind("ClusterRole", "Role")}
    scopes: tuple[dict[tuple[str, str], set[str]], dict[tuple[str, str], set[str]]] = ({}, {})
    for binding in release.of_kind("ClusterRoleBinding", "RoleBinding"):
        if not any((s.get("name"), s.get("namespace")) == account for s in binding["subjects"]):
            continue
        ref = binding["roleRef"]
        namespace = binding["metadata"].get("namespace") if ref["kind"] == "Role" else None
        scope = scopes[0] if binding["kind"] == "ClusterRoleBinding" else scopes[1]
        for rule in roles[(ref["kind"], namespace, ref["name"])]["rules"]:
            for group in rule.get("apiGroups", []):
                for resource in rule.get("resources", []):
                    for name in rule.get("resourceNames") or [""]:
                        key = (group, f"{resource}/{name}" if name else resource)
                        scope.setdefault(key, set()).update(rule["verbs"])
    return scopes


@pytest.mark.parametrize("stack", STACKS, ids=[s[0] for s in STACKS])
def test_the_server_account_reads_only_what_client_auth_leaves_to_it(stack: Stack) -> None:
    release = _release(stack)
    cluster_wide, own_namespace = _server_rules(release)
    # Its caches of every namespace's Workflows and WorkflowTemplates (argo-workflows v4.0.10 NewWorkflowServer's
    # reflector, server/workflowtemplate/informer.go): read, never write.
    assert cluster_wide == {("argoproj.io", "workflows"): {"list", "watch"},
                            ("argoproj.io", "workflowtemplates"): {"list", "watch"}}
    # Its own config map (config/controller.go Get), by name, and nothing else of its namespace.
    (server,) = [d for d in release.of_kind("Deployment") if "controller" not in d["metadata"]["name"]]
    (config_arg,) = [a for a in server["spec"]["template"]["spec"]["containers"][0]["args"]
                     if a.startswith("--configmap=")]
    assert own_namespace == {("", f"configmaps/{config_arg.removeprefix('--configmap=')}"): {"get"}}
    assert not [k for k in (*cluster_wide, *own_namespace) if k[1].startswith(("secrets", "pods"))]
    assert not [v for v in (*cluster_wide.values(), *own_namespace.values()) if v & _WRITES]


def _deployment(stack: Stack, part: str) -> dict[str, Any]:
    (deployment,) = [d for d in _release(stack).of_kind("Deployment") if d["metadata"]["name"].endswith(part)]
    return deployment


@pytest.mark.parametrize("stack", STACKS, ids=[s[0] for s in STACKS])
def test_executor_containers_run_as_the_restricted_profile_asks(stack: Stack) -> None:
    """Every step's init and wait containers run argoexec with the controller's executor context, which the chart
    leaves empty (and argoexec's default image runs as root)."""
    context = _controller_config(stack)["executor"]["securityContext"]
    # Kubernetes Pod Security Standards, "Restricted": non-root, no escalation, ALL dropped, RuntimeDefault seccomp.
    assert context["runAsNonRoot"] is True and context["runAsUser"] > 0
    assert context["allowPrivilegeEscalation"] is False and context["capabilities"]["drop"] == ["ALL"]
    assert context["seccompProfile"]["type"] in ("RuntimeDefault", "Localhost")
    assert context.get("privileged") is not True


@pytest.mark.parametrize("stack", STACKS, ids=[s[0] for s in STACKS])
def test_the_server_takes_tokens_over_tls_only(stack: Stack) -> None:
    server = _deployment(stack, "-server")["spec"]["template"]["spec"]["containers"][0]
    assert "--secure=true" in server["args"] and not [a for a in server["args"] if a == "--secure=false"]
    for probe in ("readinessProbe", "livenessProbe"):
        assert server[probe]["httpGet"]["scheme"] == "HTTPS", probe


@pytest.mark.parametrize("stack", STACKS, ids=[s[0] for s in STACKS])
def test_the_argo_namespace_takes_only_prometheus_scrapes_of_the_controller(stack: Stack) -> None:
    settings = settings_of(read_stack(*stack))
    (policy,) = _objects(stack, "NetworkPolicy", NAMESPACE_POLICY).values()
    assert policy["metadata"]["namespace"] == _release(stack).namespace
    assert policy["spec"]["podSelector"] == {} and policy["spec"]["policyTypes"] == ["Ingress"]
    controller = _deployment(stack, "-workflow-controller")["spec"]["template"]["spec"]["containers"][0]
    (metrics,) = [p["containerPort"] for p in controller["ports"] if p.get("name") == "metrics"]
    monitors = list(_release(stack).of_kind("ServiceMonitor"))
    if settings.addons.monitoring.enabled:
        assert monitors, "the controller's metrics are scraped"
        monitoring = _plan(stack).rendered.releases["kube-prometheus-stack"].namespace
        assert policy["spec"]["ingress"] == [{
            "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": monitoring}}}],
            "ports": [{"port": metrics, "protocol": "TCP"}]}]
    else:
        assert not monitors and policy["spec"]["ingress"] == []


@pytest.mark.parametrize("stack", STACKS, ids=[s[0] for s in STACKS])
def test_the_two_controllers_spread_over_nodes(stack: Stack) -> None:
    deployment = _deployment(stack, "-workflow-controller")
    template = deployment["spec"]["template"]
    assert deployment["spec"]["replicas"] > 1
    spread = {c["topologyKey"]: c for c in template["spec"].get("topologySpreadConstraints") or []}
    for key in ("kubernetes.io/hostname", "topology.kubernetes.io/zone"):
        selector = spread[key]["labelSelector"]["matchLabels"]
        assert selector.items() <= template["metadata"]["labels"].items(), key  # it counts these very pods
        assert spread[key]["maxSkew"] == 1


def _admits(spec: dict[str, Any], pod: dict[str, Any], user: str, old: dict[str, Any] | None = None) -> bool:
    env = celpy.Environment()
    bound = {"object": celpy.json_to_cel(pod), "oldObject": celpy.json_to_cel(old),
             "request": celpy.json_to_cel({"userInfo": {"username": user},
                                           "operation": "CREATE" if old is None else "UPDATE"})}
    return all(bool(env.program(env.compile(v["expression"])).evaluate(bound)) for v in spec["validations"])


@pytest.mark.parametrize("stack", STACKS, ids=[s[0] for s in STACKS])
def test_without_cilium_only_the_controller_labels_a_pod_as_a_workflows(stack: Stack) -> None:
    """Where the API server policy selects workflow pods by their Workflow label, nobody else may set it: a
    member's Volcano Job pods with it would get HTTPS egress to anywhere."""
    cilium = settings_of(read_stack(*stack)).addons.cilium.enabled
    policies = list(_objects(stack, "ValidatingAdmissionPolicy", WORKFLOW_LABEL_POLICY).values())
    if cilium:  # selected by their service account there, and only towards the API server
        assert policies == []
        return
    (policy,) = policies
    (binding,) = _objects(stack, "ValidatingAdmissionPolicyBinding", WORKFLOW_LABEL_POLICY).values()
    assert binding["spec"]["policyName"] == WORKFLOW_LABEL_POLICY and binding["spec"]["validationActions"] == ["Deny"]
    tenant_namespaces = [n for n in _plan(stack).recording.resources if n.type == "kubernetes:core/v1:Namespace"
                         and "trainyard.io/tenant" in (n.inputs["metadata"].get("labels") or {})]
    assert tenant_namespaces and binding["spec"]["matchResources"]["namespaceSelector"] == {
        "matchExpressions": [{"key": "trainyard.io/tenant", "operator": "Exists"}]}
    controller = _deployment(stack, "-workflow-controller")
    account = (f"system:serviceaccount:{controller['metadata']['namespace']}:"
               f"{controller['spec']['template']['spec']['serviceAccountName']}")
    spec = policy["spec"]
    assert spec["matchConstraints"]["resourceRules"][0]["resources"] == ["pods"]
    labelled = {"metadata": {"labels": {WORKFLOW_POD_LABEL: "pipeline-x"}}}
    assert _admits(spec, labelled, account)
    assert not _admits(spec, labelled, "system:serviceaccount:volcano-system:volcano-controllers")
    assert _admits(spec, {"metadata": {"labels": {"volcano.sh/job-name": "x"}}}, "volcano-controllers")
    assert _admits(spec, {"metadata": {}}, "anyone")
    assert _admits(spec, labelled, "kubelet-or-gc", old=labelled)  # a pod keeps the label it was made with
    assert not _admits(spec, labelled, "someone", old={"metadata": {"labels": {}}})
