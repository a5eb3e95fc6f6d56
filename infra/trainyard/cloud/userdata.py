"""EC2 user data for trainyard nodes: one MIME multipart document that nodeadm and cloud-init both read.

Part 1, ``application/node.eks.aws``: a nodeadm ``NodeConfig`` with our kubelet and containerd settings and
no ``cluster`` section. EKS (managed node groups) and Karpenter (EC2NodeClass ``userData``) add their own
NodeConfig to the document; nodeadm merges them in document order and which comes first differs between
Karpenter versions, so we never set a key they set (cluster, labels, taints, ``maxPods`` on Karpenter nodes).

Part 2, ``text/x-shellscript``: installs ``node_bootstrap/prepare-node.sh`` and runs it with the node's role.
Karpenter re-serializes the document keeping only each part's ``Content-Type``, so parts are plain text
(no transfer encoding) and the script travels verbatim in a quoted heredoc, readable in plan diffs.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal, get_args

import yaml

CACHE_MOUNT: Final = "/mnt/trainyard-cache"
"""Where GPU nodes mount their NVMe instance store: the warm tier of the dataset cache (platform/alluxio.py)."""
CACHE_LABEL: Final = "TYCACHE"
"""XFS label of that cache filesystem."""

SCRIPT_PATH: Final = Path(__file__).resolve().parent / "node_bootstrap" / "prepare-node.sh"
SCRIPT_INSTALL_PATH: Final = "/usr/local/sbin/trainyard-prepare-node"

# Fixed so the offline plan is byte-identical run to run; render_user_data checks no part contains it.
MIME_BOUNDARY: Final = "==trainyard-user-data=="
NODECONFIG_CONTENT_TYPE: Final = "application/node.eks.aws"
SHELL_CONTENT_TYPE: Final = 'text/x-shellscript; charset="us-ascii"'
_HEREDOC_END: Final = "TRAINYARD_PREPARE_NODE_EOF"

# EC2 rejects user data over 16 KiB (raw, before base64), and EKS or Karpenter add a NodeConfig of ~2-3 KiB
# (cluster CA, endpoint, kubelet config, labels, taints) to ours: keep that much free.
EC2_USER_DATA_LIMIT: Final = 16 * 1024
PLATFORM_NODECONFIG_RESERVE: Final = 3584
USER_DATA_BUDGET: Final = EC2_USER_DATA_LIMIT - PLATFORM_NODECONFIG_RESERVE

# Pods get RLIMIT_NOFILE from containerd's base runtime spec (AMI default soft 65536), not from limits.d,
# so the project's 500000 open files must be set there too. nodeadm replaces the whole rlimits list, and
# the AMI's hard limit (= fs.nr_open) is kept so programs that raise soft to hard still can.
POD_NOFILE_SOFT: Final = 500000
POD_NOFILE_HARD: Final = 1048576

CpuManagerPolicy = Literal["none", "static"]
TopologyManagerPolicy = Literal["none", "best-effort", "restricted", "single-numa-node"]
TopologyManagerScope = Literal["container", "pod"]


class NodeRole(enum.StrEnum):
    GPU = "gpu"
    STORAGE = "storage"
    SYSTEM = "system"


@dataclass(frozen=True)
class KubeletSettings:
    """Kubelet settings added to the NodeConfig; ``None`` keeps the AMI / EKS / Karpenter value.

    On Karpenter nodes leave ``max_pods`` unset and use the EC2NodeClass ``kubelet`` block: Karpenter always
    writes maxPods, and which NodeConfig wins depends on its version. It never writes the two policies.
    """

    max_pods: int | None = None
    cpu_manager_policy: CpuManagerPolicy | None = None
    topology_manager_policy: TopologyManagerPolicy | None = None
    topology_manager_scope: TopologyManagerScope | None = None

    def __post_init__(self) -> None:
        # Values may come from stack YAML, where the Literal types are not enforced.
        if self.max_pods is not None and self.max_pods < 1:
            raise ValueError(f"max_pods must be positive, got {self.max_pods}")
        if self.cpu_manager_policy is not None and self.cpu_manager_policy not in get_args(CpuManagerPolicy):
            raise ValueError(f"unknown cpu_manager_policy {self.cpu_manager_policy!r}")
        if self.topology_manager_policy is not None and self.topology_manager_policy not in get_args(
            TopologyManagerPolicy
        ):
            raise ValueError(f"unknown topology_manager_policy {self.topology_manager_policy!r}")
        if self.topology_manager_scope is not None and self.topology_manager_scope not in get_args(
            TopologyManagerScope
        ):
            raise ValueError(f"unknown topology_manager_scope {self.topology_manager_scope!r}")

    def kubelet_config(self) -> dict[str, object]:
        """The set fields as KubeletConfiguration keys."""
        pairs = {
            "maxPods": self.max_pods,
            "cpuManagerPolicy": self.cpu_manager_policy,
            "topologyManagerPolicy": self.topology_manager_policy,
            "topologyManagerScope": self.topology_manager_scope,
        }
        return {key: value for key, value in pairs.items() if value is not None}


# GPU nodes: the static CPU manager gives Guaranteed training pods exclusive cores, so DataLoader workers are
# not time-sliced with neighbours (nodeadm always reserves kube CPU, which the static policy requires).
# The topology manager is best-effort, scope pod, on every GPU pool: it picks the narrowest NUMA alignment of the
# pod's CPUs, GPUs and EFA devices together and admits the pod either way. restricted admits only a *preferred*
# merged hint, and a merged hint is preferred only when every resource's preferred hint has the same NUMA mask
# (kubernetes pkg/kubelet/cm/topologymanager/policy.go mergePermutation, policy_restricted.go; the CPU and device
# managers prefer only masks of the request's minimal width: cpumanager/policy_static.go, devicemanager/
# topology_hints.go). On a two-socket HGX host (p4d: aws-ofi-nccl topology/p4d-24xl-topo.xml, 4 GPUs a socket) the
# fabric check (16 CPUs fit one socket, 8 GPUs need both) is rejected on an empty node, a
# 1-4 GPU pod whenever free GPUs and free cores sit on different sockets, and a failed pod restarts its whole
# Volcano job. No pool is kept on restricted: tenants submit their own pods to any pool, and a pod that takes the
# whole node gets the same all-socket alignment under best-effort (its only hints span every NUMA node).
# cpuManagerPolicyOptions full-pcpus-only is left off: it rejects an odd CPU count (SMTAlignmentError).
GPU_KUBELET: Final = KubeletSettings(cpu_manager_policy="static", topology_manager_policy="best-effort",
                                     topology_manager_scope="pod")


def default_kubelet(role: NodeRole) -> KubeletSettings:
    return GPU_KUBELET if role is NodeRole.GPU else KubeletSettings()


def node_config(kubelet: KubeletSettings) -> dict[str, object]:
    """The NodeConfig document (without ``cluster``: EKS or Karpenter supply it)."""
    spec: dict[str, object] = {
        "containerd": {
            "baseRuntimeSpec": {
                "process": {"rlimits": [{"type": "RLIMIT_NOFILE", "soft": POD_NOFILE_SOFT, "hard": POD_NOFILE_HARD}]}
            }
        }
    }
    if config := kubelet.kubelet_config():
        spec["kubelet"] = {"config": config}
    return {"apiVersion": "node.eks.aws/v1alpha1", "kind": "NodeConfig", "spec": spec}


def prepare_node_script() -> str:
    """The node bootstrap script, exactly as shipped (bytes decoded as ASCII, no newline translation)."""
    return SCRIPT_PATH.read_bytes().decode("ascii")


def _shell_part(role: NodeRole, script: str) -> str:
    if not script.endswith("\n") or _HEREDOC_END in script.splitlines():
        raise ValueError(f"{SCRIPT_PATH.name} cannot be embedded in a {_HEREDOC_END} heredoc")
    return (
        "#!/bin/bash\n"
        "# trainyard: install the node bootstrap script and run it for this node's role.\n"
        "set -euo pipefail\n"
        f"cat >{SCRIPT_INSTALL_PATH} <<'{_HEREDOC_END}'\n"
        f"{script}"
        f"{_HEREDOC_END}\n"
        f"chmod 0755 {SCRIPT_INSTALL_PATH}\n"
        f"exec {SCRIPT_INSTALL_PATH} --role {role.value}\n"
    )


def render_user_data(role: NodeRole, kubelet: KubeletSettings | None = None) -> str:
    """The MIME multipart user data for a node of ``role`` (plain text; base64 it for a launch template).

    ``kubelet`` defaults to ``default_kubelet(role)``. Pure and deterministic.
    """
    settings = default_kubelet(role) if kubelet is None else kubelet
    parts = [
        (NODECONFIG_CONTENT_TYPE, yaml.safe_dump(node_config(settings), sort_keys=False)),
        (SHELL_CONTENT_TYPE, _shell_part(role, prepare_node_script())),
    ]
    delimiter = f"--{MIME_BOUNDARY}"
    lines = ["MIME-Version: 1.0", f'Content-Type: multipart/mixed; boundary="{MIME_BOUNDARY}"', ""]
    for content_type, body in parts:
        if delimiter in body:
            raise ValueError(f"MIME boundary {MIME_BOUNDARY!r} occurs in the {content_type} part")
        # The line break before a delimiter belongs to the delimiter, so each body keeps its final newline.
        lines += [delimiter, f"Content-Type: {content_type}", "", body]
    lines.append(f"{delimiter}--")
    document = "\n".join(lines) + "\n"
    if (size := len(document.encode())) > USER_DATA_BUDGET:
        raise ValueError(f"user data is {size} bytes, over the {USER_DATA_BUDGET} byte budget")
    return document
