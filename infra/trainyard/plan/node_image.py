"""What is on the disk of an EKS node (Amazon Linux 2023, the only node image the stacks launch) before any pod.

The kubelet refuses a hostPath volume of type `File` or `Directory` (and Socket, CharDevice, BlockDevice) whose path
is not already there, and the pod stays in ContainerCreating (kubernetes.io/docs/concepts/storage/volumes,
"hostPath volume types"); the `...OrCreate` types and the empty type check nothing. So a chart pod that mounts a
path nodeadm never writes never starts, on every node.

As read on 2026-12-01; each entry names where it comes from. A path not listed is taken to be missing: add it
here with its source when a chart needs one.
"""

from __future__ import annotations

from collections.abc import Mapping

# hostPath types the kubelet checks before mounting (pkg/volume/hostpath, checkType).
CHECKED_TYPES = frozenset({"File", "Directory", "Socket", "CharDevice", "BlockDevice"})

# path -> (the type it has there, source).
AL2023_PATHS: Mapping[str, tuple[str, str]] = {
    # nodeadm writes the kubelet's kubeconfig here, not to kubeadm's /etc/kubernetes/kubelet.conf
    # (awslabs/amazon-eks-ami nodeadm/internal/kubelet/kubeconfig.go: kubeconfigRoot /var/lib/kubelet).
    "/var/lib/kubelet": ("Directory", "awslabs/amazon-eks-ami nodeadm/internal/kubelet/kubeconfig.go"),
    "/var/lib/kubelet/kubeconfig": ("File", "awslabs/amazon-eks-ami nodeadm/internal/kubelet/kubeconfig.go"),
    # Kernel pseudo-filesystems systemd mounts on every Linux boot (systemd mount-setup.c: /proc, /sys, /dev).
    "/proc": ("Directory", "systemd src/shared/mount-setup.c"),
    "/proc/sys/net": ("Directory", "Linux Documentation/admin-guide/sysctl/net.rst"),
    "/proc/sys/kernel": ("Directory", "Linux Documentation/admin-guide/sysctl/kernel.rst"),
    "/sys": ("Directory", "systemd src/shared/mount-setup.c"),
    "/dev": ("Directory", "systemd src/shared/mount-setup.c"),
    "/etc/os-release": ("File", "os-release(5); Amazon Linux 2023 user guide, 'Identifying AL2023'"),
    "/lib/modules": ("Directory", "Amazon Linux 2023 kernel package (modules under /lib/modules/<release>)"),
    "/boot": ("Directory", "Amazon Linux 2023 kernel package (vmlinuz under /boot)"),
}


def missing_path(path: str, host_type: str) -> str | None:
    """Why a hostPath of this type fails on an AL2023 EKS node, or None when it mounts."""
    if host_type not in CHECKED_TYPES:
        return None
    found = AL2023_PATHS.get(path.rstrip("/") or "/")
    if found is None:
        return f"{path} ({host_type}) does not exist on Amazon Linux 2023 EKS nodes"
    if found[0] != host_type:
        return f"{path} is a {found[0]} on Amazon Linux 2023 EKS nodes, the pod asks for a {host_type}"
    return None
