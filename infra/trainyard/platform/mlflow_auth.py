"""MLflow's basic-auth app: who may read and change which experiments, runs and registered models.

The server runs `mlflow server --app-name basic-auth` (mlflow/server/auth/__init__.py @ 3.17.2) with every resource
closed by default (`default_permission = NO_PERMISSIONS`): a user reads and changes only what it created (the app
grants the creator MANAGE on an experiment or registered model: set_can_manage_experiment_permission,
set_can_manage_registered_model_permission) or what an admin granted it, and the searches return only those
(filter_search_experiments, filter_search_registered_models, filter_experiment_ids for runs). Each tenant is one
user, named as the tenant, whose generated password is in the `mlflow-client` Secret of its namespace with the
server's URI: its pods (the trainer, the pipeline's gate and register steps) take them as MLFLOW_TRACKING_USERNAME
and MLFLOW_TRACKING_PASSWORD, MLflow's own names. The admin's password is generated too and never leaves the MLflow
namespace; the app creates the admin when its user store is empty, and ignores the password after that (its
basic_auth.ini), so the password is protected like the database.

The users are made by a Job after the server is up, which logs in as the admin and creates each user or resets its
password (platform/mlflow/mlflow-users.py, idempotent; a new set of users or passwords is a new Job).

The user store is the tracking database's PostgreSQL, in a schema of its own (`mlflow_auth`, the search path of its
URI), so it lives as long as the runs do (RDS outside the cluster, or the protected CloudNativePG cluster) and its
migrations (table `alembic_version_auth`) never meet the tracking store's. The migration Job creates the schema and
upgrades both stores before the server rolls.

What stays open: experiment and registered-model names are one namespace for the whole server, so a name another
tenant took is refused (the trainer's experiments are `<namespace>/<job>`, the pipeline's models
`<namespace>.<job>`, so only names a tenant picks itself can clash), and the list of user names is readable by every
user (validate_can_list_users). `/metrics` answers admins only (a route without a validator fails closed:
MLFLOW_BASIC_AUTH_FAIL_CLOSED), and the platform does not give Prometheus the admin's password: nothing scrapes it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import pulumi

from trainyard import names

ADMIN_USERNAME = "admin"
SCHEMA = "mlflow_auth"
AUTH_SECRET = "mlflow-auth"
CONFIG_KEY = "basic_auth.ini"
ADMIN_PASSWORD_KEY = "admin-password"
DATABASE_URI_KEY = "database-uri"
CONFIG_DIR = "/etc/mlflow-auth"
# The users the Job makes: one file per user, named by it, holding its password (a Secret of the MLflow namespace).
USERS_SECRET = "mlflow-users"
USERS_DIR = "/etc/mlflow-users"
USERS_SCRIPT = "mlflow-users.py"
USERS_SCRIPT_DIR = "/opt/mlflow-users"
USERS_ACCOUNT = "mlflow-users"
USERS_COMPONENT = "users"
USERNAME_ENV = "MLFLOW_TRACKING_USERNAME"  # MLflow's client variables (mlflow/environment_variables.py @ 3.17.2)
PASSWORD_ENV = "MLFLOW_TRACKING_PASSWORD"
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
    """basic_auth.ini (mlflow/server/auth/basic_auth.ini @ 3.17.2): nothing open by default."""
    return "\n".join([
        "[mlflow]",
        "default_permission = NO_PERMISSIONS",
        f"database_uri = {database_uri.replace('%', '%%')}",  # configparser interpolation takes %% as %
        f"admin_username = {ADMIN_USERNAME}",
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth",
        "",
    ])


def client_data(tenant: str, password: pulumi.Input[str],
                artifact_root: pulumi.Input[str] | None) -> dict[str, pulumi.Input[str]]:
    """The `mlflow-client` Secret of a tenant's namespace: the server, the tenant's user, and on AWS the S3 prefix its
    experiments keep their artifacts under (on `local` the server's proxy places them by experiment id, which the
    auth app checks per experiment)."""
    data: dict[str, pulumi.Input[str]] = {"MLFLOW_TRACKING_URI": names.MLFLOW_TRACKING_URI, USERNAME_ENV: tenant,
                                          PASSWORD_ENV: password}
    if artifact_root is not None:
        data["TRAINYARD_MLFLOW_ARTIFACT_ROOT"] = artifact_root
    return data


def users_digest(passwords: Mapping[str, str]) -> str:
    """Names the users Job's run: a change of user or password is a new Job, and so a new run."""
    text = "\n".join(f"{user}:{hashlib.sha256(password.encode()).hexdigest()}"
                     for user, password in sorted(passwords.items()))
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
                        {"name": "ATTEMPTS", "value": str(ATTEMPTS)},
                        {"name": "DELAY_SECONDS", "value": str(DELAY_SECONDS)},
                    ],
                    "resources": {"requests": {"cpu": "10m", "memory": "32Mi"},
                                  "limits": {"cpu": "200m", "memory": "128Mi"}},
                    "securityContext": restricted,
                    "volumeMounts": [{"name": "script", "mountPath": USERS_SCRIPT_DIR, "readOnly": True},
                                     {"name": "users", "mountPath": USERS_DIR, "readOnly": True},
                                     {"name": "admin", "mountPath": ADMIN_DIR, "readOnly": True}],
                }],
                "volumes": [{"name": "script", "configMap": {"name": USERS_ACCOUNT, "defaultMode": 0o444}},
                            {"name": "users", "secret": {"secretName": USERS_SECRET, "defaultMode": 0o444}},
                            {"name": "admin", "secret": {"secretName": AUTH_SECRET, "defaultMode": 0o444, "items": [
                                {"key": ADMIN_PASSWORD_KEY, "path": ADMIN_PASSWORD_KEY}]}}],
            },
        },
    }
