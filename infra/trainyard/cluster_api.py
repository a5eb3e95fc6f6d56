"""A member's own connection to the cluster, for `submit` and its `status`, `logs` and `cancel`: the kubeconfig's
credentials (exec plugins such as `aws eks get-token` included) through the Kubernetes Python client, and every way
a request can fail as one line naming what was asked (no traceback): no kubeconfig, an API server out of reach, an
object that is not there, a refusal by RBAC or admission."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainyard.config.yaml_input import InputError

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

# Seconds to connect, and to wait for an answer (a followed log waits for as long as the pod writes).
TIMEOUT = (10, 60)


class NotFoundError(InputError):
    """The API server has no such object (404 naming it)."""


def default_kubeconfig() -> list[Path]:
    """Where kubectl looks: each file of $KUBECONFIG, else ~/.kube/config."""
    listed = [Path(p) for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    return listed or [Path.home() / ".kube" / "config"]


def connect(kubeconfig: Path | None, context: str | None) -> ApiClient:
    """A client with the kubeconfig's cluster and credentials (``kubeconfig`` unset: $KUBECONFIG or ~/.kube/config)."""
    from kubernetes import config  # only the commands that talk to a cluster need the client
    from kubernetes.config.config_exception import ConfigException

    if kubeconfig is not None and not kubeconfig.is_file():
        raise InputError(f"--kubeconfig {kubeconfig}: no such file")
    if kubeconfig is None and not any(p.is_file() for p in default_kubeconfig()):
        raise InputError(f"no kubeconfig: none at {os.pathsep.join(map(str, default_kubeconfig()))}; pass "
                         "--kubeconfig (on AWS `aws eks update-kubeconfig --name <cluster>` writes one)")
    try:
        return config.new_client_from_config(config_file=str(kubeconfig) if kubeconfig else None, context=context)
    except (ConfigException, OSError, ValueError) as exc:
        where = kubeconfig or os.pathsep.join(map(str, default_kubeconfig()))
        raise InputError(f"--kubeconfig {where}{f' --context {context}' if context else ''}: {exc}") from None


@contextmanager
def answered(api: ApiClient, what: str) -> Iterator[None]:
    """Turn a failed request about ``what`` (e.g. "Volcano Job research/x") into one InputError line."""
    from kubernetes.client.exceptions import ApiException, OpenApiException
    from urllib3.exceptions import HTTPError

    try:
        yield
    except ApiException as exc:
        status = _status(exc.body)
        message = status.get("message") or exc.reason
        if exc.status == 404 and (status.get("details") or {}).get("name"):
            raise NotFoundError(f"{what}: not found ({message})") from None
        if exc.status == 401:
            raise InputError(f"{what}: the API server does not accept the kubeconfig's credentials (401: "
                             f"{message}); renew them (on AWS: aws eks update-kubeconfig)") from None
        raise InputError(f"{what}: the API server refused it ({exc.status}): {message}") from None
    except HTTPError as exc:  # urllib3's: refused, unresolvable, timed out, TLS (none of them an OSError)
        reason = getattr(exc, "reason", None) or exc
        raise InputError(f"{what}: cannot reach the API server at {api.configuration.host}: {reason}") from None
    except (OSError, OpenApiException) as exc:
        raise InputError(f"{what}: {exc}") from None


def _status(body: Any) -> dict[str, Any]:
    """The Status object the API server answers with, or nothing (a proxy's page, an empty body)."""
    try:
        status = json.loads(body or "{}")
    except (TypeError, ValueError):
        return {}
    return status if isinstance(status, dict) else {}
