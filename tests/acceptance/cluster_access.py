"""kubectl as the acceptance tests use it: JSON reads, raw API paths, exec in a pod (through testinfra)."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from typing import Any

import testinfra


class Cluster:
    def __init__(self, kubeconfig: str) -> None:
        self.kubeconfig = kubeconfig

    def kubectl(self, *args: str, timeout: float = 60) -> str:
        done = subprocess.run(["kubectl", "--kubeconfig", self.kubeconfig, *args], capture_output=True, text=True,
                              timeout=timeout, check=False)
        if done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {done.stderr.strip()}")
        return done.stdout

    def get(self, resource: str, namespace: str | None = None, selector: str | None = None) -> list[dict[str, Any]]:
        args = ["get", resource, "-o", "json"]
        args += ["-n", namespace] if namespace else ["--all-namespaces"]
        args += ["-l", selector] if selector else []
        return list(json.loads(self.kubectl(*args))["items"])

    def raw(self, path: str) -> Any:
        return json.loads(self.kubectl("get", "--raw", path))

    def exec_in(self, pod: str, namespace: str, container: str, command: str) -> str:
        host = testinfra.get_host(f"kubectl://{pod}?namespace={namespace}&container={container}"
                                  f"&kubeconfig={self.kubeconfig}")
        return str(host.check_output(command))

    def wait_for(self, what: str, check: Callable[[], bool], timeout: float, interval: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
            time.sleep(interval)


def condition(obj: dict[str, Any], kind: str) -> str | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return str(c.get("status"))
    return None
