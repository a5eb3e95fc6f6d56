"""What a tenant's members may do: a Role in the tenant's namespace, bound to the group the stack names for it.

The Role covers what a training job is made of (the Volcano Job, the trainer ConfigMap, the checkpoint claim and the
PodMonitor: workloads/jobs.py), so a member can submit, watch and cancel the same objects `pulumi up` creates, plus
reading pods, their logs and events and the PodGroup Volcano makes, and a job's Argo WorkflowTemplate and the
Workflows run from it, and reading the one Secret that holds the namespace's MLflow user and password (to sign in
to the UI: platform/mlflow_auth.py). Nothing else: no other Secret, no pods of their own (Volcano's and Argo's
controllers create them; a member may only delete one, as `argo retry` does), no exec, and no object outside the
namespace. Queues stay out of reach too; the queue-of-namespace admission policy (tenants.queue_policy) keeps their
jobs in their own queue. On AWS the members reach the API server through EKS access entries that put their IAM
principals in the group (cloud/access.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from trainyard.names import MLFLOW_CLIENT_CONFIG

TENANT_ROLE = "tenant-user"
UI_ROLE = "tenant-ui"
RBAC_GROUP = "rbac.authorization.k8s.io"
# Server-side apply needs `patch`, and `create` for an object that does not exist yet (Kubernetes docs, "Server-Side
# Apply": permissions); cancelling a job and removing what one submitted (a claim counts against the quota) need
# `delete`. `update` only where a member's tool replaces an object whole: Argo's Workflows below
# (tests/workloads_infra/test_submit_access.py holds every verb to a caller).
_MANAGE = ["create", "get", "list", "watch", "patch", "delete"]
_READ = ["get", "list", "watch"]


def tenant_rules() -> list[dict[str, Any]]:
    """The Role's rules (rbac.authorization.k8s.io/v1 PolicyRule)."""
    return [
        # A training job: the Volcano Job (workloads/volcano.py) and the PodGroup Volcano makes for it.
        {"apiGroups": ["batch.volcano.sh"], "resources": ["jobs"], "verbs": _MANAGE},
        {"apiGroups": ["scheduling.volcano.sh"], "resources": ["podgroups"], "verbs": _READ},
        # Its trainer config and checkpoint claim (workloads/jobs.py), and its metrics (PodMonitor).
        {"apiGroups": [""], "resources": ["configmaps", "persistentvolumeclaims"], "verbs": _MANAGE},
        {"apiGroups": ["monitoring.coreos.com"], "resources": ["podmonitors"], "verbs": _MANAGE},
        # Watching it run (`trainyard submit status`, `logs`: job_control.py). Deleting a pod is `argo retry`'s
        # (server/workflow/workflow_server.go RetryWorkflow @ v4.0.10 deletes the failed steps' pods with the
        # caller's token): no more than a member already does by deleting the Job or Workflow that owns it.
        {"apiGroups": [""], "resources": ["pods"], "verbs": [*_READ, "delete"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": _READ},
        {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
        {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": _READ},
        # The MLflow user of the namespace, by name: `get` alone, since list and watch ignore resourceNames' narrowing
        # of what they return (Kubernetes docs, "Using RBAC Authorization": referring to resources).
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [MLFLOW_CLIENT_CONFIG], "verbs": ["get"]},
        # Pipelines: a job's WorkflowTemplate (`trainyard submit --pipeline` applies one per job) and the Workflows
        # that reference it, the only ones the controller runs (platform/argo-workflows/values.yaml
        # workflowRestrictions); `argo stop` and `terminate` patch a Workflow (workflow/util/util.go
        # patchShutdownStrategy @ v4.0.10), `argo suspend`, `resume` and `retry` update it (util.go SuspendWorkflow,
        # ResumeWorkflow; server/workflow/workflow_server.go RetryWorkflow): `update` gives nothing `patch` does not,
        # the Workflow CRD having no status subresource. A template's pods run as an account of the namespace, under
        # its pod security level and the namespace's quotas, as a Volcano Job's do: nothing a member could not
        # already start.
        {"apiGroups": ["argoproj.io"], "resources": ["workflows"], "verbs": [*_MANAGE, "update"]},
        {"apiGroups": ["argoproj.io"], "resources": ["workflowtemplates"], "verbs": _MANAGE},
    ]


def role_binding_subjects(group: str) -> list[dict[str, str]]:
    return [{"kind": "Group", "name": group, "apiGroup": RBAC_GROUP}]


def ui_rules() -> list[dict[str, Any]]:
    """What `kubectl port-forward svc/<ui>` does with a member's credentials: read the Service, find a pod behind it
    (list, or watch until one is there), and open the forward on pods/portforward: first as a WebSocket upgrade, a
    GET (`get`; client-go tools/portforward/tunneling_dialer.go), then, when that upgrade is refused, over SPDY, a
    POST (`create`; kubectl pkg/cmd/portforward/portforward.go createDialer's fallback). Both verbs: the preferred
    path works without a refused round trip, and so does the create check on WebSocket upgrades of Kubernetes 1.35
    (AuthorizePodWebsocketUpgradeCreatePermission, KEP-4006). The forward enters the pod's own network namespace, so
    it takes no network policy's leave; RBAC cannot narrow it to one pod (their names are generated), so it reaches
    every pod of the namespace it is granted in."""
    return [
        {"apiGroups": [""], "resources": ["services"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["pods/portforward"], "verbs": ["get", "create"]},
    ]


def forward_rules(pod: str) -> list[dict[str, Any]]:
    """`kubectl port-forward pod/<pod>` to one pod of a fixed name: get the pod (kubectl checks it is running), then
    the forward, by either verb as in ui_rules. By resourceNames: the API server takes a request's object name from
    its path, subresources included (k8s.io/apiserver pkg/endpoints/request/requestinfo.go), so no other pod of the
    namespace is reached, and no list or watch (resourceNames do not narrow them)."""
    return [
        {"apiGroups": [""], "resources": ["pods"], "resourceNames": [pod], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["pods/portforward"], "resourceNames": [pod], "verbs": ["get", "create"]},
    ]


def ui_access(name: str, namespace: str, groups: Iterable[str], opts: pulumi.ResourceOptions) -> None:
    """Every tenant's members may port-forward to the web UI of a platform namespace (README, "Reaching the UIs")."""
    subjects: Any = [s for group in sorted(set(groups)) for s in role_binding_subjects(group)]
    if not subjects:
        return
    meta: Any = {"name": UI_ROLE, "namespace": namespace}
    rules: Any = ui_rules()
    role = k8s.rbac.v1.Role(f"{name}-ui-role", metadata=meta, rules=rules, opts=opts)
    role_ref: Any = {"apiGroup": RBAC_GROUP, "kind": "Role", "name": UI_ROLE}
    k8s.rbac.v1.RoleBinding(f"{name}-ui-role-binding", metadata=meta, role_ref=role_ref, subjects=subjects,
                            opts=pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(depends_on=[role])))
