"""A local stand-in for the Kubernetes API server, as much of it as `submit` and its actions reach, so the tests check
the requests the real Kubernetes Python client sends (URL, verb, query, body) and what each is allowed.

- Objects are kept by their REST path; GET reads one or lists a collection (equality label selectors), PATCH is a
  server-side apply (the object as sent), DELETE removes one; `pods/<name>/log` serves a pod's log text.
- Every request is authorized as the API server does it: its attributes (verb, API group, resource and subresource,
  namespace, name) come from the path and method as in k8s.io/apiserver pkg/endpoints/request/requestinfo.go
  (GET with a name is `get`, without one `list`, `watch=true` `watch`; PATCH `patch`, DELETE `delete`), and are
  matched against the RBAC rules the bearer token is bound to (k8s.io/kubernetes plugin/pkg/auth/authorizer/rbac
  RuleAllows: group, resource or `resource/subresource`, verb, resourceNames). A server-side apply of an object that
  is not there also needs `create` (Kubernetes docs, "Server-Side Apply": permissions). Refusals answer with the
  API server's Status (403 Forbidden, 404 NotFound naming the object, 401 for an unknown token).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml


@dataclass(frozen=True)
class Attributes:
    """What RBAC authorizes (k8s.io/apiserver pkg/authorization/authorizer.Attributes)."""

    verb: str
    group: str
    resource: str  # `pods/log` for a subresource
    namespace: str
    name: str


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: Any
    attributes: Attributes
    status: int = 0
    # Every authorization the request passed: its own attributes, and `create` for an apply that creates.
    authorized: list[Attributes] = field(default_factory=list)


@dataclass
class Cluster:
    """The stand-in's state: objects by path, pod logs by pod path, and the rules each token is bound to."""

    tokens: dict[str, list[dict[str, Any]]]
    objects: dict[str, dict[str, Any]] = field(default_factory=dict)
    logs: dict[str, bytes] = field(default_factory=dict)
    previous_logs: dict[str, bytes] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, manifest: dict[str, Any]) -> str:
        path = object_path(manifest)
        self.objects[path] = manifest
        return path


def collection_path(api_version: str, plural: str, namespace: str) -> str:
    prefix = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    return f"{prefix}/namespaces/{namespace}/{plural}"


def object_path(manifest: dict[str, Any]) -> str:
    meta = manifest["metadata"]
    plural = manifest["kind"].lower() + ("es" if manifest["kind"].endswith("s") else "s")
    return f"{collection_path(manifest['apiVersion'], plural, meta['namespace'])}/{meta['name']}"


def attributes_of(method: str, path: str, query: dict[str, list[str]]) -> Attributes:
    parts = path.strip("/").split("/")
    group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    assert rest[0] == "namespaces", f"{path}: the stand-in serves namespaced resources only"
    namespace, resource, name, subresource = rest[1], rest[2], *(rest[3:] + ["", ""])[:2]
    if method == "GET":
        verb = "get" if name else ("watch" if flag(query, "watch") else "list")
    else:
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}[method]
    if method == "DELETE" and not name:
        verb = "deletecollection"
    return Attributes(verb, group, f"{resource}/{subresource}" if subresource else resource, namespace, name)


def flag(query: dict[str, list[str]], key: str) -> bool:
    """A boolean query parameter as the API server reads one (k8s.io/apimachinery pkg/runtime/conversion.go
    Convert_Slice_string_To_bool: anything but 0, false or no, in any case, is true)."""
    return key in query and query[key][0].lower() not in ("0", "false", "no")


def rules_allow(rules: list[dict[str, Any]], wanted: Attributes) -> bool:
    def has(values: list[str], value: str) -> bool:
        return "*" in values or value in values

    return any(has(r.get("apiGroups", []), wanted.group) and has(r.get("resources", []), wanted.resource)
               and has(r.get("verbs", []), wanted.verb)
               and (not r.get("resourceNames") or wanted.name in r["resourceNames"]) for r in rules)


def _status(code: int, reason: str, message: str, **details: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "reason": reason,
            "details": details, "code": code}


class _Handler(BaseHTTPRequestHandler):
    cluster: Cluster

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's names
        self._serve()

    def do_PATCH(self) -> None:  # noqa: N802
        self._serve()

    def do_DELETE(self) -> None:  # noqa: N802
        self._serve()

    def _serve(self) -> None:
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        attrs = attributes_of(self.command, url.path, query)
        request = Request(self.command, url.path, query, {k.lower(): v for k, v in self.headers.items()}, body, attrs)
        with self.cluster.lock:
            self.cluster.requests.append(request)
            request.status, answer = self._answer(request)
        data = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
        self.send_response(request.status)
        self.send_header("Content-Type", "text/plain" if isinstance(answer, bytes) else "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _answer(self, request: Request) -> tuple[int, dict[str, Any] | bytes]:
        attrs, cluster = request.attributes, self.cluster
        token = request.headers.get("authorization", "").removeprefix("Bearer ")
        if token not in cluster.tokens:
            return 401, _status(401, "Unauthorized", "Unauthorized")
        resource, _, subresource = attrs.resource.partition("/")
        path = request.path.removesuffix(f"/{subresource}") if subresource else request.path
        exists = path in cluster.objects
        needed = [attrs]
        if request.method == "PATCH" and not exists:
            needed.append(Attributes("create", attrs.group, attrs.resource, attrs.namespace, attrs.name))
        for wanted in needed:
            if rules_allow(cluster.tokens[token], wanted):
                request.authorized.append(wanted)
            else:
                kind = f"{resource}.{attrs.group}" if attrs.group else resource
                return 403, _status(403, "Forbidden", f'{kind} "{attrs.name}" is forbidden: User "{token}" cannot '
                                    f'{wanted.verb} resource "{attrs.resource}" in API group "{attrs.group}" in the '
                                    f'namespace "{attrs.namespace}"', name=attrs.name, kind=resource)
        if attrs.name and not exists and request.method != "PATCH":
            kind = f"{resource}.{attrs.group}" if attrs.group else resource
            return 404, _status(404, "NotFound", f'{kind} "{attrs.name}" not found', name=attrs.name, kind=resource)
        if subresource == "log":
            previous = flag(request.query, "previous")
            logs = cluster.previous_logs if previous else cluster.logs
            if path not in logs and previous:
                return 400, _status(400, "BadRequest", f'previous terminated container in pod "{attrs.name}" not found')
            return 200, logs.get(path, b"")
        if request.method == "PATCH":
            cluster.objects[path] = request.body
            return (200 if exists else 201), request.body
        if request.method == "DELETE":
            return 200, cluster.objects.pop(path)
        if attrs.name:
            return 200, cluster.objects[path]
        return 200, {"kind": "List", "apiVersion": "v1", "metadata": {},
                     "items": [o for p, o in cluster.objects.items()
                               if p.rsplit("/", 1)[0] == request.path and _selected(o, request.query)]}


def _selected(manifest: dict[str, Any], query: dict[str, list[str]]) -> bool:
    labels = manifest.get("metadata", {}).get("labels") or {}
    terms = [t for selector in query.get("labelSelector", []) for t in selector.split(",") if t]
    return all(labels.get(key) == value for key, _, value in (t.partition("=") for t in terms))


@contextmanager
def serving(cluster: Cluster, kubeconfig: Path, token: str) -> Iterator[Cluster]:
    """Serve ``cluster`` on a local port and write a kubeconfig whose user presents ``token``."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), type("Handler", (_Handler,), {"cluster": cluster}))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    write_kubeconfig(kubeconfig, f"http://127.0.0.1:{server.server_address[1]}", token)
    try:
        yield cluster
    finally:
        server.shutdown()
        server.server_close()


def write_kubeconfig(path: Path, server: str, token: str) -> None:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "tenant",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": token}}],
        "contexts": [{"name": "tenant", "context": {"cluster": "c", "user": "u"}}]}))
