"""Argo Workflows: the training pipeline's engine, its workflows confined to tenant namespaces.

The controller and server run on the system nodes (platform/argo-workflows/values.yaml) and run only Workflows that
reference a WorkflowTemplate. Each tenant namespace gets what its pipeline's pods run as: the `workflow` account, with
the tenant's pod identity on AWS (cloud/aws.py: the same S3 grant as its trainer, its own namespace prefix) and a Role
holding what Argo's executor and the steps need in that namespace, nothing cluster-wide; and a network policy letting
those pods, and only those, reach the API server, which the executor reports to (the tenant's default-deny policy
allows no API traffic: platform/network_policy.py); without Cilium, whose policy selects them by their account, an
admission policy keeps the label that policy selects on to the pods Argo's controller makes. The argo namespace
itself takes no connection but Prometheus's scrapes of the controller.

Artifacts go to the checkpoint bucket under `<namespace>/argo/` with the pods' own AWS credentials (`useSDKCreds`:
the AWS SDK's default chain, which reads EKS Pod Identity; workflow/artifacts/s3/s3.go @ v4.0.10, GetCredentials), so
no access key exists anywhere. `local` has no S3 and no artifact repository: steps pass parameters there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import pulumi
import pulumi_kubernetes as k8s

from trainyard import names
from trainyard.cloud.context import ClusterContext
from trainyard.platform.addon import AddonCode, AddonContext
from trainyard.platform.context import TenantFacts
from trainyard.platform.kube import HelmChart, helm_release, k8s_options, labels
from trainyard.platform.network_policy import CILIUM_API_VERSION
from trainyard.platform.objects import custom_resource
from trainyard.platform.tenant_access import RBAC_GROUP, ui_access
from trainyard.platform.tenants import TENANT_LABEL

EXECUTOR_ROLE = "workflow-executor"
API_SERVER_POLICY = "allow-workflow-api"
NAMESPACE_POLICY = "argo-ingress"
WORKFLOW_LABEL_POLICY = "trainyard-workflow-pod-label"
# The controller's metrics port (chart 1.0.18 values.yaml controller.metricsConfig.port), which Prometheus scrapes.
CONTROLLER_METRICS_PORT = 9090
# Argo labels every pod of a Workflow with the Workflow's name (workflow/common/common.go LabelKeyWorkflow).
WORKFLOW_POD_LABEL = "workflows.argoproj.io/workflow"
# Cilium labels each endpoint with its pod's service account (Cilium docs, Policy Language: "Service Accounts").
_SERVICE_ACCOUNT_LABEL = "io.cilium.k8s.policy.serviceaccount"
# The key of an artifact: under the namespace's own prefix, which is all its role may write (cloud/iam.py).
KEY_FORMAT = f"{{{{workflow.namespace}}}}/{names.WORKFLOW_ARTIFACT_DIR}/{{{{workflow.name}}}}/{{{{pod.name}}}}"

NetworkPolicyKind = Literal["cilium", "kubernetes"]


def executor_rules() -> list[dict[str, Any]]:
    """The workflow account's Role: what Argo's executor needs (workflowtaskresults create and patch, the minimum
    for >= v3.4: docs/workflow-rbac.md @ v4.0.10) and what a pipeline's resource step does with a training job (the
    Volcano Job it creates, watches for its success and failure conditions and deletes with the Workflow, and its
    PodGroup)."""
    return [
        {"apiGroups": ["argoproj.io"], "resources": ["workflowtaskresults"], "verbs": ["create", "patch"]},
        {"apiGroups": ["batch.volcano.sh"], "resources": ["jobs"],
         "verbs": ["create", "get", "list", "watch", "patch", "delete"]},
        {"apiGroups": ["scheduling.volcano.sh"], "resources": ["podgroups"], "verbs": ["get", "list", "watch"]},
    ]


def artifact_repository(bucket: pulumi.Input[str] | None, region: str | None) -> dict[str, Any]:
    """The controller's default artifact repository (chart values `artifactRepository`), or none without S3."""
    if bucket is None or region is None:
        return {}
    return {"artifactRepository": {"s3": {
        "bucket": bucket,
        # The regional endpoint: the name tenant pods may reach (network_policy.s3_fqdns) through the S3 endpoint.
        "endpoint": f"s3.{region}.amazonaws.com",
        "region": region,
        "insecure": False,
        "useSDKCreds": True,
        "keyFormat": KEY_FORMAT,
    }}}


def api_server_policy(kind: NetworkPolicyKind, namespace: str, tenant_labels: Mapping[str, str]) -> dict[str, Any]:
    """The namespace's workflow pods may reach the API server (on top of the tenant's default-deny policy)."""
    meta = {"name": API_SERVER_POLICY, "namespace": namespace, "labels": dict(tenant_labels)}
    if kind == "cilium":
        return {"apiVersion": CILIUM_API_VERSION, "kind": "CiliumNetworkPolicy", "metadata": meta, "spec": {
            "endpointSelector": {"matchLabels": {_SERVICE_ACCOUNT_LABEL: names.WORKFLOW_SERVICE_ACCOUNT}},
            # The kube-apiserver entity (Cilium docs, Policy Language, "Entities Based").
            "egress": [{"toEntities": ["kube-apiserver"]}],
        }}
    # Without Cilium the API server has no selector of its own: workflow pods may open HTTPS anywhere, so only Argo's
    # controller may make pods with the label (workflow_label_policy).
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": meta, "spec": {
        "podSelector": {"matchExpressions": [{"key": WORKFLOW_POD_LABEL, "operator": "Exists"}]},
        "policyTypes": ["Egress"],
        "egress": [{"ports": [{"port": 443, "protocol": "TCP"}, {"port": 6443, "protocol": "TCP"}]}],
    }}


def controller_account(release: str) -> str:
    """The workflow controller's ServiceAccount, which creates every Workflow pod (chart templates/_helpers.tpl
    argo-workflows.controllerServiceAccountName: the release's fullname + `-workflow-controller`)."""
    return f"{release}-workflow-controller"


def workflow_label_policy(controller: str) -> dict[str, Any]:
    """Only Argo's controller makes pods that carry the Workflow label (a ValidatingAdmissionPolicy spec): where the
    API server policy selects workflow pods by that label (no Cilium), a member's own Volcano Job pods could carry it
    too and get HTTPS egress to anywhere. A pod keeps a label it already had (the controller relabels its own)."""
    has = f"has(object.metadata.labels) && '{WORKFLOW_POD_LABEL}' in object.metadata.labels"
    had = (f"request.operation == 'UPDATE' && has(oldObject.metadata.labels) && '{WORKFLOW_POD_LABEL}' in "
           f"oldObject.metadata.labels && oldObject.metadata.labels['{WORKFLOW_POD_LABEL}'] == "
           f"object.metadata.labels['{WORKFLOW_POD_LABEL}']")
    account = f"system:serviceaccount:{names.WORKFLOWS_NAMESPACE}:{controller}"
    return {
        "failurePolicy": "Fail",
        "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                                "operations": ["CREATE", "UPDATE"], "resources": ["pods"]}]},
        "validations": [{
            "expression": f"!({has}) || request.userInfo.username == '{account}' || ({had})",
            "message": f"only Argo's workflow controller ({account}) creates pods labelled {WORKFLOW_POD_LABEL}",
            "reason": "Forbidden",
        }],
    }


def namespace_policy(monitoring_namespace: str | None) -> dict[str, Any]:
    """The argo namespace's pods take no connection but Prometheus scraping the controller's metrics. Members reach
    the server with kubectl port-forward, which enters the pod's own network namespace, and the kubelet's probes
    come from the node, which a NetworkPolicy always lets in (Kubernetes docs, "Network Policies")."""
    sources = [{"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": monitoring_namespace}}}],
                "ports": [{"port": CONTROLLER_METRICS_PORT, "protocol": "TCP"}]}] if monitoring_namespace else []
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": NAMESPACE_POLICY, "namespace": names.WORKFLOWS_NAMESPACE,
                         "labels": labels("argo-workflows", "pipeline")},
            "spec": {"podSelector": {}, "policyTypes": ["Ingress"], "ingress": sources}}


@dataclass(frozen=True)
class ArgoWorkflowsArgs:
    chart: HelmChart
    cluster: ClusterContext
    # The checkpoint bucket (its `<namespace>/argo/` prefixes) and region; None on `local`.
    artifact_bucket: pulumi.Input[str] | None
    region: str | None
    tenants: Mapping[str, TenantFacts]
    network_policy: NetworkPolicyKind
    # Where Prometheus runs (it scrapes the controller), or None without monitoring.
    monitoring_namespace: str | None = None
    depends_on: Sequence[pulumi.Resource] = field(default_factory=tuple)


class ArgoWorkflows(pulumi.ComponentResource):
    """The argo-workflows release, and each tenant's workflow account, Role, binding and API server policy."""

    release: k8s.helm.v3.Release

    def __init__(self, name: str, args: ArgoWorkflowsArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("trainyard:platform:ArgoWorkflows", name, None, opts)
        cluster = args.cluster
        self.release = helm_release(f"{name}-release", args.chart, cluster, self,
                                    values=artifact_repository(args.artifact_bucket, args.region),
                                    depends_on=args.depends_on)
        for tenant in sorted(args.tenants.values(), key=lambda t: t.name):
            self._tenant(name, tenant, args)
        in_namespace = k8s_options(cluster, self, [self.release])
        policy: Any = namespace_policy(args.monitoring_namespace)
        k8s.networking.v1.NetworkPolicy(f"{name}-ingress-policy", metadata=policy["metadata"], spec=policy["spec"],
                                        opts=in_namespace)
        if args.network_policy == "kubernetes":
            self._workflow_label_policy(name, args)
        # Members reach the UI through `kubectl port-forward` and sign in with their own token (client auth).
        ui_access(name, names.WORKFLOWS_NAMESPACE, (t.group for t in args.tenants.values() if t.group is not None),
                  k8s_options(cluster, self, [self.release]))
        self.register_outputs({"release": self.release.id})

    def _workflow_label_policy(self, name: str, args: ArgoWorkflowsArgs) -> None:
        meta: Any = {"name": WORKFLOW_LABEL_POLICY, "labels": labels(WORKFLOW_LABEL_POLICY, "tenancy")}
        spec: Any = workflow_label_policy(controller_account(args.chart.pin.release))
        policy = k8s.admissionregistration.v1.ValidatingAdmissionPolicy(
            f"{name}-workflow-label-policy", metadata=meta, spec=spec, opts=k8s_options(args.cluster, self))
        # The tenants' namespaces: the platform's own pods elsewhere are not in question.
        binding: Any = {"policyName": WORKFLOW_LABEL_POLICY, "validationActions": ["Deny"],
                        "matchResources": {"namespaceSelector": {"matchExpressions": [
                            {"key": TENANT_LABEL, "operator": "Exists"}]}}}
        k8s.admissionregistration.v1.ValidatingAdmissionPolicyBinding(
            f"{name}-workflow-label-policy-binding", metadata=meta, spec=binding,
            opts=k8s_options(args.cluster, self, [policy]))

    def _tenant(self, name: str, tenant: TenantFacts, args: ArgoWorkflowsArgs) -> None:
        cluster, ns = args.cluster, tenant.namespace
        prefix = f"{name}-{tenant.name}"
        tenant_labels = labels("workflow", "pipeline", **{TENANT_LABEL: tenant.name})
        opts = k8s_options(cluster, self, list(tenant.ready))
        account = k8s.core.v1.ServiceAccount(
            f"{prefix}-account",
            metadata={"name": names.WORKFLOW_SERVICE_ACCOUNT, "namespace": ns, "labels": tenant_labels},
            # Argo's executor in every step reports results to the API server with this account's token.
            automount_service_account_token=True, opts=opts)
        meta: Any = {"name": EXECUTOR_ROLE, "namespace": ns, "labels": tenant_labels}
        rules: Any = executor_rules()
        role = k8s.rbac.v1.Role(f"{prefix}-role", metadata=meta, rules=rules, opts=opts)
        role_ref: Any = {"apiGroup": RBAC_GROUP, "kind": "Role", "name": EXECUTOR_ROLE}
        subjects: Any = [{"kind": "ServiceAccount", "name": names.WORKFLOW_SERVICE_ACCOUNT, "namespace": ns}]
        k8s.rbac.v1.RoleBinding(f"{prefix}-role-binding", metadata=meta, role_ref=role_ref, subjects=subjects,
                                opts=k8s_options(cluster, self, [*tenant.ready, role, account]))
        policy = api_server_policy(args.network_policy, ns, tenant_labels)
        if policy["kind"] == "CiliumNetworkPolicy":
            custom_resource(f"{prefix}-api-policy", policy, opts)
        else:
            spec: Any = policy["spec"]
            k8s.networking.v1.NetworkPolicy(f"{prefix}-api-policy", metadata=policy["metadata"], spec=spec, opts=opts)


def build(ctx: AddonContext) -> ArgoWorkflows:
    (release,) = ctx.addon.charts
    cluster = ctx.cluster
    return ArgoWorkflows(ctx.addon.resource_name, ArgoWorkflowsArgs(
        chart=ctx.chart(release), cluster=cluster, artifact_bucket=cluster.checkpoint_bucket, region=cluster.region,
        tenants=ctx.tenants, network_policy="cilium" if any(a.cni for a in ctx.enabled) else "kubernetes",
        monitoring_namespace=ctx.catalogue.chart("kube-prometheus-stack").namespace if ctx.monitoring else None,
        depends_on=ctx.monitored if ctx.addon.service_monitors else ctx.after))


COMPONENT = AddonCode(build=build)
