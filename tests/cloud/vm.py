"""Shell scripts as root in a throwaway virtual machine, for kernel features the host lacks (here: the md RAID driver).

QEMU emulates the guest's CPU in software (TCG), so the guest never runs on the host's: the same run works on every
x86-64 host. User-Mode Linux, used here before, does not: Debian bookworm's 6.1 guest panics at init on CPUs with
AMX (Intel Sapphire Rapids) with "userspace - ptrace set fp regs failed, errno = 14". Its
arch/x86/um/os-Linux/registers.c passes PTRACE_SETREGSET(NT_X86_XSTATE) a buffer sized at build time (FP_SIZE), and
the host accepts only its own XSAVE size (arch/x86/kernel/fpu/regset.c, xstateregs_set: `count !=
fpu_user_cfg.max_size` is -EFAULT; 11008 bytes with AMX tiles). Upstream UML now asks the host for that size at
boot (host_fp_size, "um: switch to regset API and depend on XSTATE"); Debian trixie's 6.12.117 still has FP_SIZE,
and the UML of Debian unstable needs a newer C library than bookworm's.

The guest boots the host's Debian kernel with a small initramfs made here (busybox and the modules it needs). The
host's `/` is its root over 9p, so the scenario runs the host's real tools (mdadm, mkfs.xfs) in place and leaves its
results where the test reads them. Sparse files become the guest's `/dev/vda`, `/dev/vdb`, ...; `/dev`, `/proc`,
`/sys` and `/run` are the guest's own, so what the guest's tools record there (mdadm's map) never reaches the host.
"""

from __future__ import annotations

import gzip
import lzma
import re
import shlex
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

QEMU = "qemu-system-x86_64"
BUSYBOX = "/bin/busybox"
# The guest's drivers: virtio PCI, its disks, 9p over virtio for the host's root; md RAID0; XFS with the crc32c it
# asks the crypto API for (a guest without modprobe cannot load it on demand).
MODULES = ("kernel/drivers/virtio/virtio_pci.ko", "kernel/drivers/block/virtio_blk.ko",
           "kernel/net/9p/9pnet_virtio.ko", "kernel/fs/9p/9p.ko", "kernel/drivers/md/raid0.ko",
           "kernel/crypto/crc32c_generic.ko", "kernel/fs/xfs/xfs.ko")
_COMPRESSED = (".xz", ".gz", ".zst")
_INIT = """#!/bin/busybox sh
# PID 1 of the guest: load the drivers, take the host's / as root, run the scenario there, record its status, stop.
/bin/busybox --install -s /bin
mkdir -p /proc /sys /dev /host
mount -t proc proc /proc && mount -t sysfs sysfs /sys && mount -t devtmpfs devtmpfs /dev
for module in {modules}; do insmod "/modules/$module"; done
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 hostroot /host
mount -t proc proc /host/proc && mount -t sysfs sysfs /host/sys && mount -t devtmpfs devtmpfs /host/dev \\
    && mount -t tmpfs tmpfs /host/run
chroot /host /bin/sh -c '/bin/sh "$0" > "$1" 2>&1; echo $? > "$2"' {script} {out} {status}
sync
poweroff -f
"""


def problem() -> str | None:
    """Why no guest can boot here (a tool or the kernel missing), or None."""
    missing = [tool for tool in (QEMU, BUSYBOX) if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not installed: make deps (qemu-system-x86, busybox-static)"
    if guest_kernel() is None:
        return "no kernel in /boot with its 9p, virtio and md modules: make deps (linux-image-amd64)"
    return None


def guest_kernel() -> tuple[Path, Path] | None:
    """The newest kernel image in /boot whose module tree has every module the guest loads, with that tree."""
    found = []
    for image in Path("/boot").glob("vmlinuz-*"):
        modules = Path("/lib/modules") / image.name.removeprefix("vmlinuz-")
        if all(_module_file(modules, name) is not None for name in MODULES):
            found.append((image, modules))
    return max(found, key=lambda pair: _version_key(pair[0].name), default=None)


def run(script: str, disks: Sequence[Path], workdir: Path, timeout_s: float = 300) -> tuple[int, str]:
    """Boot a guest with `disks` attached, run `script` in it as root; returns (exit status, its output)."""
    kernel = guest_kernel()
    if kernel is None:
        raise RuntimeError(problem())
    image, modules = kernel
    scenario, out, status = workdir / "vm-scenario.sh", workdir / "vm-scenario.out", workdir / "vm-scenario.status"
    console, initrd = workdir / "vm-console.log", workdir / "vm-initrd.cpio"
    scenario.write_text(script)
    ordered = _with_dependencies(modules)
    init = _INIT.format(modules=" ".join(f"{Path(_stem(name)).name}.ko" for name in ordered),
                        script=shlex.quote(str(scenario)), out=shlex.quote(str(out)),
                        status=shlex.quote(str(status)))
    initrd.write_bytes(_cpio([("bin", None, 0o40755), ("modules", None, 0o40755),
                              ("bin/busybox", Path(BUSYBOX).read_bytes(), 0o100755),
                              ("init", init.encode(), 0o100755),
                              *((f"modules/{Path(_stem(name)).name}.ko", _module_bytes(modules, name), 0o100644)
                                for name in ordered)]))
    command = [QEMU, "-accel", "tcg", "-cpu", "qemu64", "-m", "512", "-smp", "1", "-nodefaults", "-display", "none",
               "-no-reboot", "-serial", f"file:{console}", "-kernel", str(image), "-initrd", str(initrd),
               "-append", "console=ttyS0 panic=-1 quiet",
               "-virtfs", "local,path=/,mount_tag=hostroot,security_model=passthrough,multidevs=remap",
               *(arg for disk in disks for arg in ("-drive", f"file={disk},format=raw,if=virtio"))]
    booted = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)
    if not status.is_file():
        log = console.read_text(errors="replace") if console.is_file() else ""
        raise RuntimeError(f"the guest did not run the scenario (qemu exit {booted.returncode}):\n"
                           f"{booted.stderr[-2000:]}{log[-3000:]}")
    return int(status.read_text().strip()), out.read_text()


def _with_dependencies(modules: Path) -> list[str]:
    """MODULES and what each needs (modules.dep), each after its dependencies, once."""
    lines = [line.partition(":") for line in (modules / "modules.dep").read_text().splitlines()]
    files = {_stem(name): name for name, _, _ in lines}
    needs = {_stem(name): [_stem(dep) for dep in rest.split()] for name, _, rest in lines}
    done: list[str] = []

    def visit(stem: str) -> None:
        if stem not in done:
            for dep in needs[stem]:
                visit(dep)
            done.append(stem)

    for name in MODULES:
        visit(_stem(name))
    return [files[stem] for stem in done]


def _stem(name: str) -> str:
    return name.split(".ko")[0]


def _module_file(modules: Path, name: str) -> Path | None:
    return next((path for path in (modules / f"{_stem(name)}.ko{suffix}" for suffix in ("", *_COMPRESSED))
                 if path.is_file()), None)


def _module_bytes(modules: Path, name: str) -> bytes:
    """The module as busybox's insmod reads it: uncompressed."""
    path = _module_file(modules, name)
    assert path is not None
    data = path.read_bytes()
    if path.suffix == ".xz":
        return lzma.decompress(data)
    if path.suffix == ".gz":
        return gzip.decompress(data)
    if path.suffix == ".zst":
        return subprocess.run(["zstd", "-dc", str(path)], capture_output=True, check=True).stdout
    return data


def _version_key(name: str) -> list[int]:
    return [int(part) for part in re.findall(r"\d+", name)]


def _cpio(entries: Sequence[tuple[str, bytes | None, int]]) -> bytes:
    """An initramfs: the kernel's "newc" cpio format (Documentation/driver-api/early-userspace/buffer-format.rst)."""
    blob = bytearray()
    for inode, (name, data, mode) in enumerate([*entries, ("TRAILER!!!", None, 0)], start=1):
        body, encoded = data or b"", name.encode() + b"\0"
        fields = (inode, mode, 0, 0, 1, 0, len(body), 0, 0, 0, 0, len(encoded), 0)
        blob += b"070701" + "".join(f"{value:08x}" for value in fields).encode() + encoded
        blob += b"\0" * (-len(blob) % 4) + body
        blob += b"\0" * (-len(blob) % 4)
    return bytes(blob)
