"""MLflow's basic-auth app and workspaces: each tenant reads and writes only its own experiments, runs and models.

The server runs `mlflow server --app-name basic-auth --enable-workspaces` (mlflow/server/auth/__init__.py,
mlflow/cli/__init__.py @ 3.17.2) with every resource closed by default (`default_permission = NO_PERMISSIONS`,
`grant_default_workspace_access = false`). Each tenant is one user and one workspace, both named as the tenant; the
user is a member of its own workspace only, through the workspace's `user` role (USE on the whole workspace: read
what is in it and create there; MLflow seeds it into every new workspace, _DEFAULT_WORKSPACE_ROLES). Names are
unique per workspace, not per server (experiments: uq_experiments_workspace_name, mlflow/store/tracking/dbmodels/
models.py; registered models: registered_model_pk on (workspace, name), mlflow/store/model_registry/dbmodels/
models.py), so another tenant can neither take nor share a name in this tenant's space: it may not create in a
workspace it is not a member of (_can_create_in_workspace), and what it makes in its own stays there.

A request names its workspace in the X-MLFLOW-WORKSPACE header (mlflow/server/workspace_helpers.py
workspace_before_request_handler; mlflow/utils/workspace_utils.py WORKSPACE_HEADER_NAME); without one it is in the
`default` workspace, where no tenant is a member. The tenant's `mlflow-client` Secret gives its pods the server's
URI, the user, its generated password and the workspace as MLFLOW_TRACKING_URI, MLFLOW_TRACKING_USERNAME,
MLFLOW_TRACKING_PASSWORD and MLFLOW_WORKSPACE, MLflow's own client variables (mlflow/environment_variables.py; its
client sends MLFLOW_WORKSPACE as the header: mlflow/utils/rest_utils.py), which the trainer and the pipeline's
steps send too (trainyard_train/mlflow_rest.py). The admin's password is generated and never leaves the MLflow
namespace; the app creates the admin when its user store is empty and ignores the password after that (its
basic_auth.ini), so the password is protected like the database.

The users Job, after the server is up, logs in as the admin and makes each tenant's user (or resets its password),
its workspace (on AWS with the tenant's S3 prefix as its default_artifact_root, so the server puts every experiment
of the workspace at `s3://<bucket>/<namespace>/mlflow/<experiment id>`, which the tenant's pod identity writes) and
its membership, and removes the user's roles in another tenant's workspace (platform/mlflow/mlflow-users.py,
idempotent). It runs again whenever a user, password or root changes, and every RESTORE_SCHEDULE as a
CronJob: a member knows the password (the Secret) and may change it (update_user_password needs only the current
one), which would lock the tenant's jobs out; the CronJob puts the platform's password back within minutes. The two
may run at once: whichever is second finds the other's work done; one that read the users Secret just before a
rotation may set the old password again, until the next run.

The stores are the tracking database's PostgreSQL: workspaces are tables of the tracking store (migration
1b5f0d9ad7c1_add_workspace_columns_and_catalog of `mlflow db upgrade`), users, roles and grants of the auth store,
in a schema of its own (`mlflow_auth`, the search path of its URI; migration 2ed73881770d_workspace_permissions), so
they live as long as the runs do (RDS outside the cluster, or the protected CloudNativePG cluster) and the two
stores' migrations (`alembic_version`, `alembic_version_auth`) never meet. The migration Job upgrades both before
the server rolls.

What stays open: the list of user names is readable by every user (validate_can_list_users). `/metrics` answers
admins only (a route without a validator fails closed: MLFLOW_BASIC_AUTH_FAIL_CLOSED), and the platform does not
give Prometheus the admin's password: nothing scrapes it. Experiments and models made before workspaces (in
`default`) stay the admin's (README, "MLflow per tenant").
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import pulumi

from trainyard import names

ADMIN_USERNAME = names.MLFLOW_ADMIN_USERNAME
SCHEMA = "mlflow_auth"
AUTH_SECRET = "mlflow-auth"
CONFIG_KEY = "basic_auth.ini"
ADMIN_PASSWORD_KEY = "admin-password"
DATABASE_URI_KEY = "database-uri"
CONFIG_DIR = "/etc/mlflow-auth"
# The users the Job makes: one file per user, named by it, holding its password (a Secret of the MLflow namespace).
USERS_SECRET = "mlflow-users"
USERS_DIR = "/etc/mlflow-users"
# Each tenant's workspace artifact root on AWS: one file per user, named by it (a ConfigMap; empty on `local`).
ROOTS_CONFIG = "mlflow-workspaces"
ROOTS_DIR = "/etc/mlflow-workspaces"
USERS_SCRIPT = "mlflow-users.py"
USERS_SCRIPT_DIR = "/opt/mlflow-users"
USERS_ACCOUNT = "mlflow-users"
USERS_COMPONENT = "users"
USERNAME_ENV = "MLFLOW_TRACKING_USERNAME"  # MLflow's client variables (mlflow/environment_variables.py @ 3.17.2)
PASSWORD_ENV = "MLFLOW_TRACKING_PASSWORD"
WORKSPACE_ENV = "MLFLOW_WORKSPACE"  # the client's workspace (mlflow/environment_variables.py @ 3.17.2)
# MLflow's own: the config file's path, and the admin's first password (mlflow/server/auth/config.py @ 3.17.2).
CONFIG_PATH_ENV = "MLFLOW_AUTH_CONFIG_PATH"
ADMIN_PASSWORD_ENV = "MLFLOW_AUTH_ADMIN_PASSWORD"
# Letters and digits only: passwords go into HTTP basic auth headers and files, never quoted.
PASSWORD_LENGTH = 40
# The Job tries the server's /health this often before giving up (it starts after the Deployment is ready, so
# this covers a rollout still settling).
ATTEMPTS, DELAY_SECONDS = 20, 10
# Within pulumi-kubernetes' default await of a Job (10 minutes: provider/pkg/await/job.go DefaultJobTimeoutMins).
DEADLINE_SECONDS = ATTEMPTS * (DELAY_SECONDS + 10) + 60
ADMIN_DIR = "/etc/mlflow-admin"
# How often the CronJob puts the users, passwords and memberships back (cron syntax: Kubernetes docs, CronJob).
RESTORE_SCHEDULE = "*/10 * * * *"
# Why the users Job does not pass these Checkov checks (checkov.io/skip<N>, tests/review).
CHECKOV_SKIPS = {
    "checkov.io/skip1": "CKV_K8S_43=the server's image, pinned by tag from release data (unverified.yaml): no digest "
                        "was readable",
    "checkov.io/skip2": "CKV_K8S_15=IfNotPresent, as the server's: a release tag, and no run should wait on ghcr.io",
}


def schema_uri(uri: str) -> str:
    """The tracking store's URI with the auth schema as its search path (libpq `options`: PostgreSQL docs,
    libpq connection parameters; `%3D` is the `=` inside the value)."""
    separator = "&" if "?" in uri else "?"
    return f"{uri}{separator}options=-csearch_path%3D{SCHEMA}"


def auth_config(database_uri: str) -> str:
    """basic_auth.ini (mlflow/server/auth/basic_auth.ini @ 3.17.2): nothing open by default, in any workspace."""
    return "\n".join([
        "[mlflow]",
        "default_permission = NO_PERMISSIONS",
        f"database_uri = {database_uri.replace('%', '%%')}",  # configparser interpolation takes %% as %
        f"admin_username = {ADMIN_USERNAME}",
        # No tenant is a member of the `default` workspace, where requests without a workspace land (config.py).
        "grant_default_workspace_access = false",
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth",
        "",
    ])


def client_data(tenant: str, password: pulumi.Input[str]) -> dict[str, pulumi.Input[str]]:
    """The `mlflow-client` Secret of a tenant's namespace: the server, the tenant's user and its workspace. Where
    artifacts go is the workspace's (its default_artifact_root, set by the users Job on AWS: MLflow refuses a
    client's artifact_location when workspaces are on, mlflow/store/tracking/sqlalchemy_workspace_store.py
    create_experiment @ 3.17.2; on `local` the server's proxy places them by workspace and experiment id)."""
    return {"MLFLOW_TRACKING_URI": names.MLFLOW_TRACKING_URI, USERNAME_ENV: tenant, PASSWORD_ENV: password,
            WORKSPACE_ENV: tenant}


def users_digest(passwords: Mapping[str, str], roots: Mapping[str, str]) -> str:
    """Names the users Job's run: a change of user, password or artifact root is a new Job, and so a new run."""
    text = "\n".join([*(f"{user}:{hashlib.sha256(password.encode()).hexdigest()}"
                        for user, password in sorted(passwords.items())),
                      *(f"{user}@{root}" for user, root in sorted(roots.items()))])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def users_job_spec(image: str, restricted: dict[str, Any]) -> dict[str, Any]:
    labels = {"app.kubernetes.io/name": "mlflow", "app.kubernetes.io/component": USERS_COMPONENT}
    return {
        "backoffLimit": 0,  # the script waits for the server itself; a refusal is final and in its log
        "activeDeadlineSeconds": DEADLINE_SECONDS,
        "template": {
            "metadata": {"labels": labels},
            "spec": {
                "serviceAccountName": USERS_ACCOUNT,
                "automountServiceAccountToken": False,
                "restartPolicy": "Never",
                "nodeSelector": {names.ROLE_LABEL: "system"},
                "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [{
                    "name": USERS_COMPONENT, "image": image, "imagePullPolicy": "IfNotPresent",
                    "command": ["python", f"{USERS_SCRIPT_DIR}/{USERS_SCRIPT}"],
                    "env": [
                        {"name": "MLFLOW_TRACKING_URI", "value": names.MLFLOW_TRACKING_URI},
                        {"name": USERNAME_ENV, "value": ADMIN_USERNAME},
                        {"name": "ADMIN_PASSWORD_FILE", "value": f"{ADMIN_DIR}/{ADMIN_PASSWORD_KEY}"},
                        {"name": "USERS_DIR", "value": USERS_DIR},
                        {"name": "ROOTS_DIR", "value": ROOTS_DIR},
                        {"name": "ATTEMPTS", "value": str(ATTEMPTS)},
                        {"name": "DELAY_SECONDS", "value": str(DELAY_SECONDS)},
                    ],
                    "resources": {"requests": {"cpu": "10m", "memory": "32Mi"},
                                  "limits": {"cpu": "200m", "memory": "128Mi"}},
                    "securityContext": restricted,
                    "volumeMounts": [{"name": "script", "mountPath": USERS_SCRIPT_DIR, "readOnly": True},
                                     {"name": "users", "mountPath": USERS_DIR, "readOnly": True},
                                     {"name": "roots", "mountPath": ROOTS_DIR, "readOnly": True},
                                     {"name": "admin", "mountPath": ADMIN_DIR, "readOnly": True}],
                }],
                "volumes": [{"name": "script", "configMap": {"name": USERS_ACCOUNT, "defaultMode": 0o444}},
                            {"name": "users", "secret": {"secretName": USERS_SECRET, "defaultMode": 0o444}},
                            {"name": "roots", "configMap": {"name": ROOTS_CONFIG, "defaultMode": 0o444}},
                            {"name": "admin", "secret": {"secretName": AUTH_SECRET, "defaultMode": 0o444, "items": [
                                {"key": ADMIN_PASSWORD_KEY, "path": ADMIN_PASSWORD_KEY}]}}],
            },
        },
    }


def users_restore_spec(image: str, restricted: dict[str, Any]) -> dict[str, Any]:
    """The CronJob that runs the users Job's pod every RESTORE_SCHEDULE; one at a time, and a run it missed is
    skipped (the next comes soon)."""
    return {
        "schedule": RESTORE_SCHEDULE,
        "concurrencyPolicy": "Forbid",
        "startingDeadlineSeconds": 300,
        "successfulJobsHistoryLimit": 1,
        # A failure stays (KubeJobFailed fires on it) until an hour after it ended, so the alert clears itself once
        # the server is back (Kubernetes docs, "Automatic Cleanup for Finished Jobs").
        "failedJobsHistoryLimit": 1,
        "jobTemplate": {"spec": {**users_job_spec(image, restricted), "ttlSecondsAfterFinished": 3600}},
    }
