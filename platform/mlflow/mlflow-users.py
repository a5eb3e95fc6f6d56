"""Make the MLflow auth app's users what the platform says: one per tenant, each with the password of its Secret and
a member of its own workspace only.

Runs in the server's image as a Job after the server is up, and again as a CronJob (infra/trainyard/platform/
mlflow_auth.py), on the standard library only. It logs in as the admin (MLFLOW_TRACKING_USERNAME, its password in
the file ADMIN_PASSWORD_FILE) to MLFLOW_TRACKING_URI and reads the users from USERS_DIR, one file per user, named by
the user and holding its password. For each, all of it idempotent (REST paths: mlflow/server/auth/routes.py and
the workspace routes of mlflow/protos/service.proto @ 3.17.2; the admin passes every validator):
- the user: create it, or set its password to the file's (an admin's update needs no current password:
  mlflow/server/auth/__init__.py update_user_password), so a password a member changed or a rotated one is put back;
- its workspace, named as the user: create it when missing (only an admin may: validate_can_create_workspace),
  with the artifact root the file of the same name in ROOTS_DIR holds, if any (AWS: the tenant's S3 prefix), as its
  default_artifact_root, which is set again when it differs (PATCH workspaces/<name>);
- its membership: the workspace's `user` role (USE on ("workspace", "*"), which MLflow seeds into a new workspace:
  _DEFAULT_WORKSPACE_ROLES; made here when missing), assigned to the user, and every role the user holds in another
  user's workspace unassigned (a grant another tenant made it: users/permissions/grant writes a role in the
  granter's workspace). Roles in `default`, which only the admin can hand out now (what the user made there before
  workspaces, README "MLflow per tenant"), are kept.
Users it was not given are left alone.

Exit 0 when every user is in place; 1 with the reason otherwise. The server may still be starting: /health is tried
ATTEMPTS times, DELAY_SECONDS apart; a request that gets no answer within a minute (a busy server) is tried twice
more, DELAY_SECONDS apart.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

USERS = "/api/2.0/mlflow/users"
WORKSPACES = "/api/3.0/mlflow/workspaces"
ROLES = "/api/3.0/mlflow/roles"
USER_ROLES = "/api/3.0/mlflow/users/roles/list"
MEMBER_ROLE = "user"
EXISTS, MISSING = "RESOURCE_ALREADY_EXISTS", "RESOURCE_DOES_NOT_EXIST"  # mlflow/protos/databricks.proto
MEMBER_GRANT = {"resource_type": "workspace", "resource_pattern": "*", "permission": "USE"}


class RefusedError(Exception):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:300]}")
        self.status = status
        self.body = body

    @property
    def code(self) -> str:
        """MLflow's error_code, when the body is MLflow's JSON error."""
        try:
            return str(json.loads(self.body).get("error_code", ""))
        except (ValueError, AttributeError):
            return ""


class Admin:
    def __init__(self, base: str, username: str, password: str, timeout_s: float = 60.0, attempts: int = 3,
                 delay_s: float = 10.0) -> None:
        self.base = base.rstrip("/")
        token = base64.b64encode(f"{username}:{password}".encode()).decode()
        self.headers = {"Authorization": f"Basic {token}", "Content-Type": "application/json"}
        self.timeout_s, self.attempts, self.delay_s = timeout_s, attempts, delay_s

    def call(self, method: str, path: str, body: dict[str, Any] | None = None,
             query: dict[str, str] | None = None) -> dict[str, Any]:
        """One request, tried again when it gets no answer: every call here is idempotent (done_unless)."""
        url = self.base + path + ("?" + urllib.parse.urlencode(query) if query else "")
        data = json.dumps(body).encode() if body is not None else None
        for attempt in range(1, self.attempts + 1):
            request = urllib.request.Request(url, data=data, method=method, headers=self.headers)
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:  # noqa: S310 - its URI
                    raw = response.read()
                break
            except urllib.error.HTTPError as exc:
                raise RefusedError(exc.code, exc.read().decode(errors="replace")) from None
            except (urllib.error.URLError, OSError) as exc:  # refused, reset, timed out
                if attempt == self.attempts:
                    raise
                print(f"{method} {path}: {exc}; again ({attempt}/{self.attempts})", flush=True)
                time.sleep(self.delay_s)
        answer: dict[str, Any] = json.loads(raw) if raw else {}
        return answer

    def done_unless(self, code: str, method: str, path: str, body: dict[str, Any]) -> bool:
        """The call; False when the server answers `code` instead: the Job and the CronJob may run at once, and
        whichever is second finds the other's work done."""
        try:
            self.call(method, path, body)
        except RefusedError as exc:
            if exc.code == code:
                return False
            raise
        return True

    def exists(self, username: str) -> bool:
        try:
            self.call("GET", f"{USERS}/get", query={"username": username})
        except RefusedError as exc:
            if exc.status == 404 or exc.code == MISSING:
                return False
            raise
        return True

    def ensure(self, username: str, password: str, root: str | None, others: set[str]) -> str:
        """The user, its workspace (with `root`) and its membership (none in the workspaces of `others`); what was
        done, in words."""
        login = {"username": username, "password": password}
        if not self.exists(username) and self.done_unless(EXISTS, "POST", f"{USERS}/create", login):
            done = ["created"]
        else:
            self.call("PATCH", f"{USERS}/update-password", login)
            done = ["updated"]
        done.append(self.ensure_workspace(username, root))
        done.extend(self.ensure_member(username, self.member_role(username), others))
        return ", ".join(done)

    def ensure_workspace(self, name: str, root: str | None) -> str:
        wanted = {"default_artifact_root": root} if root else {}
        if self.done_unless(EXISTS, "POST", WORKSPACES, {"name": name, **wanted}):
            return f"workspace {name} created"
        found = self.call("GET", f"{WORKSPACES}/{name}").get("workspace", {})
        if root and found.get("default_artifact_root") != root:
            self.call("PATCH", f"{WORKSPACES}/{name}", wanted)
            return f"workspace {name} root set"
        return f"workspace {name} kept"

    def member_role(self, workspace: str) -> int:
        """The workspace's `user` role, with its grant (made here when the server did not seed it)."""
        role = self.role(workspace)
        if role is None:
            self.done_unless(EXISTS, "POST", f"{ROLES}/create", {"name": MEMBER_ROLE, "workspace": workspace})
            role = self.role(workspace)
        if role is None:
            raise RefusedError(404, f"role {MEMBER_ROLE!r} of workspace {workspace!r}: created, but not listed")
        grants = [{k: p[k] for k in MEMBER_GRANT} for p in role.get("permissions", [])]
        if MEMBER_GRANT not in grants:
            self.done_unless(EXISTS, "POST", f"{ROLES}/permissions/add", {"role_id": role["id"], **MEMBER_GRANT})
        return int(role["id"])

    def role(self, workspace: str) -> dict[str, Any] | None:
        roles = self.call("GET", f"{ROLES}/list", query={"workspace": workspace}).get("roles", [])
        return next((r for r in roles if r["name"] == MEMBER_ROLE and r["workspace"] == workspace), None)

    def ensure_member(self, username: str, role_id: int, others: set[str]) -> list[str]:
        """`username` holds `role_id` and no role in the workspaces of `others`."""
        held = self.call("GET", USER_ROLES, query={"username": username}).get("roles", [])
        done = []
        for role in held:
            if role["workspace"] in others:
                self.done_unless(MISSING, "DELETE", f"{ROLES}/unassign", {"username": username, "role_id": role["id"]})
                done.append(f"left {role['workspace']}")
        if all(int(role["id"]) != role_id for role in held):
            self.done_unless(EXISTS, "POST", f"{ROLES}/assign", {"username": username, "role_id": role_id})
            done.append("member")
        return done


def wait_for(base: str, attempts: int, delay_s: float) -> None:
    for attempt in range(1, attempts + 1):
        try:
            with urllib.request.urlopen(base.rstrip("/") + "/health", timeout=10) as response:  # noqa: S310
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError) as exc:
            print(f"server not up ({attempt}/{attempts}): {exc}", flush=True)
        time.sleep(delay_s)
    raise SystemExit(f"{base}: /health did not answer after {attempts} attempts")


def files(folder: Path) -> dict[str, str]:
    """Each regular file by name, its text stripped; a Secret or ConfigMap volume adds `..data` links and
    dot-folders, skipped."""
    return {p.name: p.read_text().strip() for p in sorted(folder.iterdir())
            if not p.name.startswith(".") and p.is_file()}


def users(folder: Path) -> dict[str, str]:
    found = files(folder)
    empty = sorted(name for name, password in found.items() if not password)
    if empty:
        raise SystemExit(f"{folder}: empty password for {', '.join(empty)}")
    return found


def main(env: dict[str, str]) -> int:
    try:
        base, folder = env["MLFLOW_TRACKING_URI"], Path(env["USERS_DIR"])
        admin_file = Path(env["ADMIN_PASSWORD_FILE"])
    except KeyError as exc:
        print(f"{exc.args[0]}: not set", file=sys.stderr)
        return 1
    attempts, delay_s = int(env.get("ATTEMPTS", "30")), float(env.get("DELAY_SECONDS", "10"))
    admin = Admin(base, env.get("MLFLOW_TRACKING_USERNAME", "admin"), admin_file.read_text().strip(),
                  delay_s=delay_s)
    wait_for(base, attempts, delay_s)
    try:
        given = users(folder)
        roots = files(Path(env["ROOTS_DIR"])) if env.get("ROOTS_DIR") else {}
        for username, password in given.items():
            done = admin.ensure(username, password, roots.get(username) or None, set(given) - {username})
            print(f"{username}: {done}", flush=True)
    except RefusedError as exc:
        print(f"the server refused: {exc}", file=sys.stderr)
        return 1
    except (urllib.error.URLError, OSError) as exc:
        print(f"the server did not answer: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(dict(os.environ)))
