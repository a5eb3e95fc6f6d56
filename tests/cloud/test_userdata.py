"""The EC2 user data document: MIME structure, the NodeConfig part, the embedded script, determinism."""

from __future__ import annotations

import email
import email.policy
import re
import shutil
import subprocess
import sys
from email.message import EmailMessage

import pytest
import yaml
from trainyard.cloud import userdata
from trainyard.cloud.userdata import (
    CACHE_LABEL,
    CACHE_MOUNT,
    MIME_BOUNDARY,
    POD_NOFILE_SOFT,
    SCRIPT_INSTALL_PATH,
    SCRIPT_PATH,
    USER_DATA_BUDGET,
    KubeletSettings,
    NodeRole,
    render_user_data,
)

HEREDOC = re.compile(r"<<'(?P<end>\w+)'\n(?P<body>.*?\n)(?P=end)\n", re.DOTALL)


def parts(role: NodeRole, kubelet: KubeletSettings | None = None) -> list[EmailMessage]:
    document = email.message_from_string(render_user_data(role, kubelet), policy=email.policy.default)
    assert isinstance(document, EmailMessage)
    assert document.is_multipart()
    assert document.get_content_type() == "multipart/mixed"
    assert document["MIME-Version"] == "1.0"
    assert document.get_boundary() == MIME_BOUNDARY
    return [part for part in document.iter_parts() if isinstance(part, EmailMessage)]


def node_config(role: NodeRole, kubelet: KubeletSettings | None = None) -> dict[str, object]:
    loaded = yaml.safe_load(parts(role, kubelet)[0].get_content())
    assert isinstance(loaded, dict)
    return loaded


def shell_part(role: NodeRole) -> str:
    payload = parts(role)[1].get_content()
    assert isinstance(payload, str)
    return payload


@pytest.mark.parametrize("role", list(NodeRole))
def test_parts_and_content_types(role: NodeRole) -> None:
    nodeconfig, script = parts(role)
    assert nodeconfig.get_content_type() == "application/node.eks.aws"
    assert script.get_content_type() == "text/x-shellscript"
    assert script.get_content_charset() == "us-ascii"
    # Karpenter re-serializes the parts keeping only Content-Type: nothing may depend on other headers.
    assert [list(part.keys()) for part in (nodeconfig, script)] == [["Content-Type"], ["Content-Type"]]


@pytest.mark.parametrize("role", list(NodeRole))
def test_script_embedded_byte_for_byte_and_run_with_role(role: NodeRole) -> None:
    text = shell_part(role)
    match = HEREDOC.search(text)
    assert match is not None
    assert match["body"].encode("ascii") == SCRIPT_PATH.read_bytes()
    assert text.startswith("#!/bin/bash\n")
    assert f"cat >{SCRIPT_INSTALL_PATH} <<'{match['end']}'" in text
    assert text.endswith(f"exec {SCRIPT_INSTALL_PATH} --role {role.value}\n")


def test_shell_part_is_valid_bash() -> None:
    checked = subprocess.run(["bash", "-n"], input=shell_part(NodeRole.GPU), text=True, capture_output=True)
    assert checked.returncode == 0, checked.stderr


def test_shell_part_is_shellcheck_clean() -> None:
    if shutil.which("shellcheck") is None:
        pytest.fail("shellcheck not installed: make deps (apt-get install shellcheck)")
    checked = subprocess.run(["shellcheck", "-"], input=shell_part(NodeRole.STORAGE), text=True, capture_output=True)
    assert checked.returncode == 0, checked.stdout


def test_gpu_nodeconfig() -> None:
    config = node_config(NodeRole.GPU)
    assert config["apiVersion"] == "node.eks.aws/v1alpha1"
    assert config["kind"] == "NodeConfig"
    assert config["spec"] == {
        "containerd": {
            "baseRuntimeSpec": {"process": {"rlimits": [{"type": "RLIMIT_NOFILE", "soft": 500000, "hard": 1048576}]}}
        },
        "kubelet": {"config": {"cpuManagerPolicy": "static", "topologyManagerPolicy": "best-effort",
                               "topologyManagerScope": "pod"}},
    }


@pytest.mark.parametrize("role", [NodeRole.STORAGE, NodeRole.SYSTEM])
def test_other_roles_keep_platform_kubelet(role: NodeRole) -> None:
    spec = node_config(role)["spec"]
    assert isinstance(spec, dict)
    assert set(spec) == {"containerd"}


def test_explicit_kubelet_settings_replace_role_default() -> None:
    spec = node_config(NodeRole.GPU, KubeletSettings(max_pods=58, cpu_manager_policy="none"))["spec"]
    assert isinstance(spec, dict)
    assert spec["kubelet"] == {"config": {"maxPods": 58, "cpuManagerPolicy": "none"}}
    assert "cluster" not in spec


@pytest.mark.parametrize(
    "kwargs",
    [{"max_pods": 0}, {"cpu_manager_policy": "dynamic"}, {"topology_manager_policy": "numa"},
     {"topology_manager_scope": "node"}],
)
def test_kubelet_settings_reject_invalid_values(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        KubeletSettings(**kwargs)  # type: ignore[arg-type]


def test_deterministic_across_calls_and_interpreters() -> None:
    rendered = {role.value: render_user_data(role) for role in NodeRole}
    assert rendered == {role.value: render_user_data(role) for role in NodeRole}
    program = "import sys; from trainyard.cloud.userdata import NodeRole, render_user_data as r; "
    program += "sys.stdout.write(r(NodeRole(sys.argv[1])))"
    for seed in ("0", "4242"):
        for role, expected in rendered.items():
            out = subprocess.run(
                [sys.executable, "-c", program, role],
                env={"PYTHONHASHSEED": seed, "PYTHONPATH": ":".join(sys.path)},
                capture_output=True,
                check=True,
            ).stdout
            assert out == expected.encode("ascii")


@pytest.mark.parametrize("role", list(NodeRole))
def test_fits_user_data_budget(role: NodeRole) -> None:
    assert len(render_user_data(role).encode("ascii")) <= USER_DATA_BUDGET


def test_oversized_script_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(userdata, "prepare_node_script", lambda: "#!/bin/bash\n" + "#\n" * USER_DATA_BUDGET)
    with pytest.raises(ValueError, match="budget"):
        render_user_data(NodeRole.SYSTEM)


@pytest.mark.parametrize("bad", ["exit 0", "echo\nTRAINYARD_PREPARE_NODE_EOF\n", "echo\n--==trainyard-user-data==\n"])
def test_unembeddable_script_is_rejected(monkeypatch: pytest.MonkeyPatch, bad: str) -> None:
    monkeypatch.setattr(userdata, "prepare_node_script", lambda: bad)
    with pytest.raises(ValueError):
        render_user_data(NodeRole.SYSTEM)


def test_python_constants_match_the_script() -> None:
    script = SCRIPT_PATH.read_text(encoding="ascii")
    assert re.search(rf"\bCACHE_MOUNT={re.escape(CACHE_MOUNT)}\s", script)
    assert re.search(rf"\bCACHE_LABEL={CACHE_LABEL}\s", script)
    # pods (NodeConfig) and login sessions (limits.d) get the same soft open-file limit
    assert re.search(rf"^\*\s+soft\s+nofile\s+{POD_NOFILE_SOFT}$", script, re.MULTILINE)
