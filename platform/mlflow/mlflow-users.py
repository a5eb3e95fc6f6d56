"""Make the MLflow auth app's users what the platform says: one per tenant, each with the password of its Secret.

Runs in the server's image as a Job after the server is up (infra/trainyard/platform/mlflow_auth.py), on the
standard library only. It logs in as the admin (MLFLOW_TRACKING_USERNAME, its password in the file
ADMIN_PASSWORD_FILE) to MLFLOW_TRACKING_URI and reads the users from USERS_DIR, one file per user, named by the user
and holding its password. For each: create it, or, when it exists, set its password to the file's (an admin's
password update needs no current password: mlflow/server/auth/__init__.py @ 3.17.2 update_user_password), so running
it again changes nothing and a rotated password takes effect. Users it was not given are left alone. REST paths:
mlflow/server/auth/routes.py @ 3.17.2.

Exit 0 when every user is in place; 1 with the reason otherwise. The server may still be starting: /health is tried
ATTEMPTS times, DELAY_SECONDS apart.
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


class RefusedError(Exception):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:300]}")
        self.status = status
        self.body = body


class Admin:
    def __init__(self, base: str, username: str, password: str, timeout_s: float = 10.0) -> None:
        self.base = base.rstrip("/")
        token = base64.b64encode(f"{username}:{password}".encode()).decode()
        self.headers = {"Authorization": f"Basic {token}", "Content-Type": "application/json"}
        self.timeout_s = timeout_s

    def call(self, method: str, path: str, body: dict[str, Any] | None = None,
             query: dict[str, str] | None = None) -> dict[str, Any]:
        url = self.base + path + ("?" + urllib.parse.urlencode(query) if query else "")
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(url, data=data, method=method, headers=self.headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:  # noqa: S310 - the server's URI
                raw = response.read()
        except urllib.error.HTTPError as exc:
            raise RefusedError(exc.code, exc.read().decode(errors="replace")) from None
        answer: dict[str, Any] = json.loads(raw) if raw else {}
        return answer

    def exists(self, username: str) -> bool:
        try:
            self.call("GET", f"{USERS}/get", query={"username": username})
        except RefusedError as exc:
            if exc.status == 404 or "RESOURCE_DOES_NOT_EXIST" in exc.body:
                return False
            raise
        return True

    def ensure(self, username: str, password: str) -> str:
        if self.exists(username):
            self.call("PATCH", f"{USERS}/update-password", {"username": username, "password": password})
            return "updated"
        self.call("POST", f"{USERS}/create", {"username": username, "password": password})
        return "created"


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


def users(folder: Path) -> dict[str, str]:
    """Each regular file a user; Kubernetes' Secret volume adds `..data` links and dot-folders, skipped."""
    found = {p.name: p.read_text().strip() for p in sorted(folder.iterdir())
             if not p.name.startswith(".") and p.is_file()}
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
    admin = Admin(base, env.get("MLFLOW_TRACKING_USERNAME", "admin"), admin_file.read_text().strip())
    wait_for(base, int(env.get("ATTEMPTS", "30")), float(env.get("DELAY_SECONDS", "10")))
    try:
        for username, password in users(folder).items():
            print(f"{username}: {admin.ensure(username, password)}", flush=True)
    except RefusedError as exc:
        print(f"the server refused: {exc}", file=sys.stderr)
        return 1
    except (urllib.error.URLError, OSError) as exc:
        print(f"the server did not answer: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(dict(os.environ)))
