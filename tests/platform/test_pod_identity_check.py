"""The first-bring-up Pod Identity check (issue 18 item 12): its script against a fake agent, and its place in the
plan: a Job on a system node, on the pod network, that the Karpenter release waits for."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
from owned_stacks import FLEET, recording
from trainyard.plan.engine_order import creation_order
from trainyard.plan.recording import Recording
from trainyard.plan.rules.awaits import duration_seconds

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "platform" / "karpenter" / "pod-identity-check.sh"
TOKEN = "eyJ-projected-token"
CREDENTIALS = {"AccessKeyId": "ASIAEXAMPLE", "SecretAccessKey": "very-secret", "Token": "session-token",
               "AccountId": "111122223333", "Expiration": "2026-12-01T12:00:00Z"}


class Agent(BaseHTTPRequestHandler):
    """The pod identity agent's credentials endpoint: 200 with credentials for the right token, else `status`."""

    status = 200
    seen: list[tuple[str, str | None]] = []

    def do_GET(self) -> None:  # noqa: N802 (BaseHTTPRequestHandler's name)
        Agent.seen.append((self.path, self.headers.get("Authorization")))
        ok = Agent.status == 200 and self.headers.get("Authorization") == TOKEN
        body = json.dumps(CREDENTIALS if ok else {"message": "association not found"}).encode()
        self.send_response(200 if ok else Agent.status or 500)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
        pass


@pytest.fixture
def agent() -> Iterator[int]:
    server = HTTPServer(("127.0.0.1", 0), Agent)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    Agent.status, Agent.seen = 200, []
    yield server.server_address[1]
    server.shutdown()


def _run(tmp_path: Path, uri: str | None, *, attempts: int = 2) -> subprocess.CompletedProcess[str]:
    bash = shutil.which("bash")
    assert bash is not None
    token = tmp_path / "token"
    token.write_text(TOKEN)
    env = {"PATH": os.environ["PATH"], "ATTEMPTS": str(attempts), "DELAY_SECONDS": "0"}
    if uri is not None:
        env |= {"AWS_CONTAINER_CREDENTIALS_FULL_URI": uri, "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE": str(token)}
    return subprocess.run([bash, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=120, check=False)


def test_credentials_from_the_agent_pass_and_are_never_printed(tmp_path: Path, agent: int) -> None:
    result = _run(tmp_path, f"http://127.0.0.1:{agent}/v1/credentials")
    assert result.returncode == 0, result.stderr
    assert "passed" in result.stderr and "111122223333" in result.stderr
    assert Agent.seen == [("/v1/credentials", TOKEN)]
    for secret in ("very-secret", "session-token", TOKEN):
        assert secret not in result.stdout + result.stderr


def test_an_agent_that_refuses_fails_with_its_answer(tmp_path: Path, agent: int) -> None:
    Agent.status = 500
    result = _run(tmp_path, f"http://127.0.0.1:{agent}/v1/credentials")
    assert result.returncode == 1 and "answered 500" in result.stderr and "association not found" in result.stderr
    assert len(Agent.seen) == 2 and "FAILED" in result.stderr


def test_no_path_to_the_agent_fails_naming_the_pod_network(tmp_path: Path) -> None:
    # What Cilium's "FIB lookup failed" drop (cilium/cilium 35989) looks like from the pod: no connection.
    with socket.socket() as bound:  # bound, never listening: its port refuses connections, and no other process
        bound.bind(("127.0.0.1", 0))  # can listen there while it is held
        result = _run(tmp_path, f"http://127.0.0.1:{bound.getsockname()[1]}/v1/credentials")
    assert result.returncode == 1 and "no connection" in result.stderr and "Traceback" not in result.stderr


def test_no_association_fails_before_any_request(tmp_path: Path) -> None:
    result = _run(tmp_path, None)
    assert result.returncode == 1 and "no pod identity association" in result.stderr


def test_shellcheck_is_clean() -> None:
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.fail("shellcheck not installed: make deps (Debian: apt-get install -y shellcheck)")
    result = subprocess.run([shellcheck, str(SCRIPT)], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout


# ------------------------------------------------------------------------------------------------ the plan


def _fleet() -> Recording:
    return recording(FLEET)


def test_pulumi_waits_for_the_check_longer_than_the_check_runs() -> None:
    # Review finding 9: pulumi-kubernetes awaits a Job 10 minutes by default (provider/pkg/await/job.go), and the
    # old check could run 30 x (10 s connect timeout + 10 s) = 600 s: the engine gave up as the reason came.
    job = next(r for r in _fleet().resources if r.name == "karpenter-pod-identity-check-job")
    spec = job.inputs["spec"]
    env = {e["name"]: int(e["value"]) for e in spec["template"]["spec"]["containers"][0]["env"]}
    retries = env["ATTEMPTS"] * (env["DELAY_SECONDS"] + 10)  # the script's `timeout 10` per connect
    assert "timeout 10 bash" in SCRIPT.read_text()
    await_seconds = duration_seconds(job.custom_timeouts["create"])
    assert await_seconds is not None and retries < spec["activeDeadlineSeconds"] < await_seconds


def test_karpenter_starts_only_after_pod_identity_works_through_cilium() -> None:
    recording = _fleet()
    by_name = {r.name: r for r in recording.resources}
    job = by_name["karpenter-pod-identity-check-job"]
    release = next(r for r in recording.resources if r.type == "kubernetes:helm.sh/v3:Release"
                   and str(r.inputs["chart"]).endswith("/karpenter"))
    _, closure = creation_order(recording.resources)
    assert job.urn in closure[release.urn], "the Karpenter release must wait for the check"
    cilium = next(r for r in recording.resources if r.type == "kubernetes:helm.sh/v3:Release"
                  and str(r.inputs["chart"]) == "cilium")
    groups = [r.urn for r in recording.resources if r.type == "aws:eks/nodeGroup:NodeGroup"]
    association = next(r for r in recording.resources
                       if r.type == "aws:eks/podIdentityAssociation:PodIdentityAssociation"
                       and r.inputs["serviceAccount"] == "pod-identity-check")
    assert {cilium.urn, association.urn, *groups} <= closure[job.urn]
    pod = job.inputs["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "pod-identity-check" == association.inputs["serviceAccount"]
    assert job.inputs["metadata"]["namespace"] == association.inputs["namespace"] == "kube-system"
    # On the pod network of a node Cilium runs on: not hostNetwork, Cilium's agent-not-ready taint not tolerated.
    assert not pod.get("hostNetwork") and pod["nodeSelector"] == {"trainyard.io/role": "system"}
    assert all(t.get("key") != "node.cilium.io/agent-not-ready" for t in pod["tolerations"])
    assert job.inputs["spec"]["template"]["metadata"]["annotations"]["trainyard.io/cilium-version"] == \
        str(cilium.inputs["version"])
    script = by_name["karpenter-pod-identity-check-script"].inputs["data"]["pod-identity-check.sh"]
    assert script == SCRIPT.read_text()
    # The role it gets may do nothing: fetching credentials is the whole check.
    role = by_name["pod-identity-check-role"]
    assert not [r for r in recording.resources if r.type in ("aws:iam/rolePolicy:RolePolicy",
                                                              "aws:iam/rolePolicyAttachment:RolePolicyAttachment")
                and r.inputs.get("role") == role.inputs["name"]]
