"""prepare-node.sh for real: as root, on loop devices, inside a private mount namespace.

Each node scenario holds a mount namespace open with a sleeping ``unshare`` process and runs the script in it
through ``nsenter``, so mounts it makes stay inspectable (through a testinfra host whose commands run in that
namespace) and vanish with the holder. ``--root`` points at a tmp dir. Tool shims on PATH record every call of
mkfs.xfs, mdadm and mount (then run the real tool) and of sysctl and systemctl (not run: tests never change
the host kernel). Scenarios that need no devices run the script directly, without root.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import struct
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import testinfra
import vm
from testinfra.backend.base import CommandResult
from testinfra.backend.local import LocalBackend
from testinfra.host import Host
from trainyard.cloud.userdata import CACHE_LABEL, CACHE_MOUNT, SCRIPT_PATH

HOST = testinfra.get_host("local://")
DISK_BYTES = 320 * 1024**2  # sparse; mkfs.xfs wants at least 300 MB
REFUSED = 3
USAGE = 2
RECORDED_TOOLS = ("mkfs.xfs", "mdadm", "mount")
FAKED_TOOLS = ("sysctl", "systemctl")
NODE_TOOLS = ("unshare", "nsenter", "losetup", "mdadm", "mkfs.xfs", "mkfs.ext4", "wipefs", "findmnt", "blkid")
CEILINGS = {
    "fs.file-max": 1000000,
    "vm.max_map_count": 1048576,
    "fs.inotify.max_user_instances": 8192,
    "fs.inotify.max_user_watches": 524288,
    "net.core.somaxconn": 32768,
    "net.core.rmem_max": 16777216,
    "net.core.wmem_max": 16777216,
    "net.ipv4.neigh.default.gc_thresh1": 8192,
    "net.ipv4.neigh.default.gc_thresh2": 32768,
    "net.ipv4.neigh.default.gc_thresh3": 65536,
}


def _node_problem() -> str | None:
    if os.geteuid() != 0:
        return "needs root: loop devices, mkfs and mount namespaces"
    missing = [tool for tool in NODE_TOOLS if shutil.which(tool) is None]
    if missing:
        return f"missing {', '.join(missing)}: make deps (apt-get install util-linux mdadm xfsprogs e2fsprogs)"
    return None


_NODE_PROBLEM = _node_problem()


@pytest.fixture
def node_tools() -> None:
    if _NODE_PROBLEM is not None:
        pytest.fail(_NODE_PROBLEM)


needs_node = pytest.mark.usefixtures("node_tools")


class NamespacedBackend(LocalBackend):
    """testinfra's local backend, but every command runs in the mount namespace of process ``pid``."""

    def __init__(self, pid: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pid = pid

    def get_command(self, command: str, *args: str) -> str:
        inner = super().get_command(command, *args)
        return shlex.join(["nsenter", "-t", str(self.pid), "-m", "--", "/bin/sh", "-c", inner])


class Node:
    """A --root dir, tool shims and the host (plain or namespaced) the script runs on."""

    def __init__(self, base: Path, host: Host) -> None:
        self.root = base / "root"
        self.root.mkdir()
        self.host = host
        self.calls_log = base / "calls.log"
        self.calls_log.touch()
        shims = base / "shims"
        shims.mkdir()
        for tool in RECORDED_TOOLS + FAKED_TOOLS:
            record = f'echo "{tool} $*" >>{shlex.quote(str(self.calls_log))}'
            real = shutil.which(tool)
            run = f'exec {shlex.quote(real)} "$@"' if tool in RECORDED_TOOLS and real else "exit 0"
            (shims / tool).write_text(f"#!/bin/sh\n{record}\n{run}\n")
            (shims / tool).chmod(0o755)
        self.path = f"{shims}:{os.environ['PATH']}"

    @property
    def cache(self) -> Path:
        return self.root / CACHE_MOUNT.lstrip("/")

    def argv(self, *args: str, apply: bool = False) -> list[str]:
        argv = ["env", f"PATH={self.path}", "bash", str(SCRIPT_PATH), "--root", str(self.root), *args]
        return argv if apply else [*argv, "--no-apply"]

    def prepare(self, *args: str, apply: bool = False) -> CommandResult:
        return self.host.run(shlex.join(self.argv(*args, apply=apply)))

    def calls(self, tool: str | None = None) -> list[str]:
        lines = self.calls_log.read_text().splitlines()
        return [line for line in lines if tool is None or line.split()[0] == tool]

    def reset_calls(self) -> None:
        self.calls_log.write_text("")

    def config(self, relative: str) -> str:
        return str(HOST.file(str(self.root / relative)).content_string)

    def files(self) -> dict[str, tuple[str, int, int]]:
        """Every file under --root (as the host sees it) with its digest, mtime and mode."""
        found = {}
        for path in sorted(self.root.rglob("*")):
            if path.is_file():
                stat = path.stat()
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
                found[str(path.relative_to(self.root))] = (digest, stat.st_mtime_ns, stat.st_mode)
        return found


def probe(dev: str) -> dict[str, str]:
    """What blkid finds on dev by low-level probing (no cache); empty when blank."""
    result = HOST.run("blkid -p -o export %s", dev)
    assert result.rc in (0, 2), result.stderr
    pairs = (line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
    return {key: value for key, value in pairs if key != "DEVNAME"}


def write_mbr(dev: str) -> None:
    """A DOS partition table with one Linux partition, without needing fdisk."""
    entry = struct.pack("<B3sB3sII", 0, b"\0\0\0", 0x83, b"\0\0\0", 2048, 4096)
    with open(dev, "r+b") as disk:
        disk.seek(446)
        disk.write(entry)
        disk.seek(510)
        disk.write(b"\x55\xaa")


@pytest.fixture
def loops(tmp_path: Path) -> Iterator[Callable[[int], list[str]]]:
    """Makes loop devices on sparse files; stops md arrays on them and detaches them afterwards."""
    created: list[str] = []

    def make(count: int) -> list[str]:
        for _ in range(count):
            image = tmp_path / f"disk{len(created)}.img"
            with open(image, "wb") as disk:
                disk.truncate(DISK_BYTES)
            result = HOST.run("losetup --find --show %s", str(image))
            if result.rc != 0:
                pytest.fail(f"cannot create a loop device: {result.stderr.strip()}")
            created.append(result.stdout.strip())
        return created[-count:]

    yield make
    for dev in created:
        holders = Path("/sys/class/block", Path(dev).name, "holders")
        for holder in holders.glob("md*"):
            for _ in range(10):  # the namespace holding its mount may take a moment to go away
                if HOST.run("mdadm --stop %s", f"/dev/{holder.name}").rc == 0:
                    break
                time.sleep(0.2)
        HOST.run("losetup -d %s", dev)  # a still-busy device is detached when released


@pytest.fixture
def node(tmp_path: Path, loops: Callable[[int], list[str]]) -> Iterator[Node]:
    """A Node inside a private mount namespace; torn down before `loops` so devices are free again."""
    holder = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sleep", "infinity"])
    try:
        own = os.readlink("/proc/self/ns/mnt")
        deadline = time.monotonic() + 60  # unshare starts in milliseconds, a loaded machine may take seconds
        while os.readlink(f"/proc/{holder.pid}/ns/mnt") == own:
            if holder.poll() is not None or time.monotonic() > deadline:
                pytest.fail("unshare --mount could not create a mount namespace")
            time.sleep(0.01)
        yield Node(tmp_path, Host(NamespacedBackend(holder.pid)))
    finally:
        holder.kill()
        holder.wait()


@pytest.fixture
def plain(tmp_path: Path) -> Node:
    """A Node running the script directly: for scenarios that touch no device."""
    return Node(tmp_path, HOST)


def fake_sysfs(base: Path, models: dict[str, str]) -> Path:
    for name, model in models.items():
        device = base / "block" / name / "device"
        device.mkdir(parents=True)
        (device / "model").write_text(f"{model:<40}\n")  # sysfs pads the model with spaces
    return base


def sysctls(text: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in text.splitlines() if line.strip() and not line.startswith("#"))
    return {key.strip(): value.strip() for key, value in pairs}


def live_sysctl(key: str) -> int:
    return int(Path("/proc/sys", *key.split(".")).read_text())


def limits(text: str) -> set[tuple[str, ...]]:
    return {tuple(line.split()) for line in text.splitlines() if line.strip() and not line.startswith("#")}


# --- GPU role: the instance-store cache -------------------------------------------------------------------


@needs_node
def test_gpu_single_device_becomes_the_mounted_cache(node: Node, loops: Callable[[int], list[str]]) -> None:
    (dev,) = loops(1)
    result = node.prepare("--role", "gpu", "--devices", dev)
    assert result.rc == 0, result.stderr

    mount = node.host.mount_point(str(node.cache))
    assert mount.exists
    assert (mount.device, mount.filesystem) == (dev, "xfs")
    assert "noatime" in mount.options
    assert not HOST.mount_point(str(node.cache)).exists  # private namespace: the host never sees it
    assert probe(dev)["TYPE"] == "xfs"
    assert probe(dev)["LABEL"] == CACHE_LABEL
    assert node.calls("mkfs.xfs") == [f"mkfs.xfs -q -L {CACHE_LABEL} {dev}"]
    assert f"LABEL={CACHE_LABEL} {CACHE_MOUNT} xfs defaults,noatime,nofail," in node.config("etc/fstab")
    dropin = node.config("etc/systemd/system/containerd.service.d/90-trainyard.conf")
    assert "[Service]\nLimitMEMLOCK=infinity\n" in dropin


@needs_node
def test_gpu_second_run_changes_nothing(node: Node, loops: Callable[[int], list[str]]) -> None:
    (dev,) = loops(1)
    assert node.prepare("--role", "gpu", "--devices", dev).rc == 0
    marker = node.cache / "marker"
    assert node.host.run(f"echo kept-across-runs > {shlex.quote(str(marker))}").rc == 0
    files, signature = node.files(), probe(dev)
    node.reset_calls()

    result = node.prepare("--role", "gpu", "--devices", dev)
    assert result.rc == 0, result.stderr
    assert node.files() == files  # same bytes, same mtimes: nothing rewritten
    assert probe(dev) == signature  # same filesystem UUID
    assert node.calls() == []  # no mkfs, no mdadm, no mount
    assert node.host.file(str(marker)).content_string == "kept-across-runs\n"
    mounts = node.host.check_output("cat /proc/self/mounts").splitlines()
    assert sum(line.split()[1] == str(node.cache) for line in mounts) == 1  # not stacked


@needs_node
@pytest.mark.parametrize(
    ("make_foreign", "signature"),
    [
        (lambda dev: HOST.run_expect([0], "mkfs.ext4 -q -L data %s", dev), "ext4:data"),
        (write_mbr, "dos"),
    ],
    ids=["ext4", "partition-table"],
)
def test_gpu_refuses_a_device_with_foreign_data(
    node: Node, loops: Callable[[int], list[str]], make_foreign: Callable[[str], object], signature: str
) -> None:
    (dev,) = loops(1)
    make_foreign(dev)
    before = probe(dev)

    result = node.prepare("--role", "gpu", "--devices", dev)
    assert result.rc == REFUSED
    assert f"REFUSED: {dev} holds foreign:{signature}; left untouched" in result.stderr
    assert probe(dev) == before
    assert node.calls() == []
    assert not node.host.mount_point(str(node.cache)).exists
    assert not (node.root / "etc/fstab").exists()
    assert "fs.file-max" in node.config("etc/sysctl.d/90-trainyard.conf")  # settings still written


@needs_node
def test_gpu_refuses_a_mixed_device_set_as_a_whole(node: Node, loops: Callable[[int], list[str]]) -> None:
    blank, foreign = loops(2)
    HOST.run_expect([0], "mkfs.ext4 -q %s", foreign)
    before = {dev: probe(dev) for dev in (blank, foreign)}

    result = node.prepare("--role", "gpu", "--devices", f"{blank} {foreign}")
    assert result.rc == REFUSED
    assert "neither all blank nor one trainyard array" in result.stderr
    assert {dev: probe(dev) for dev in (blank, foreign)} == before
    assert before[blank] == {}
    assert node.calls() == []


@pytest.mark.slow
def test_gpu_stripes_several_devices_into_one_cache(tmp_path: Path) -> None:
    # RAID0 needs the md driver, which a container host's kernel may lack: the scenario runs in a QEMU guest
    # (tests/cloud/vm.py) on the host's real tools, with the same shims, --root and assertions as the others.
    problem = _NODE_PROBLEM or vm.problem()
    if problem is not None:
        pytest.fail(problem)
    node = Node(tmp_path, HOST)
    disks = [tmp_path / f"disk{index}.img" for index in range(2)]
    for disk in disks:
        with open(disk, "wb") as image:
            image.truncate(DISK_BYTES)
    prepare = shlex.join(node.argv("--role", "gpu", "--devices", "/dev/vda /dev/vdb"))
    first_run = tmp_path / "first-run-calls.log"
    cache, calls = shlex.quote(str(node.cache)), shlex.quote(str(node.calls_log))
    script = f"""
{prepare} || exit 10
array=$(ls /sys/block | grep '^md')
fact() {{ echo "FACT $1=$2"; }}
fact array "$array"
fact level "$(cat /sys/block/$array/md/level)"
fact members "$(ls /sys/block/$array/slaves | sort | tr '\\n' ' ')"
fact fs "$(blkid -p -o value -s TYPE /dev/$array)"
fact label "$(blkid -p -o value -s LABEL /dev/$array)"
fact mount "$(readlink -f "$(findmnt -n -o SOURCE --mountpoint {cache})") $(findmnt -n -o FSTYPE --mountpoint {cache})"
for dev in vda vdb; do fact "member_$dev" "$(blkid -p -o value -s TYPE /dev/$dev)"; done
touch {cache}/marker
cp {calls} {shlex.quote(str(first_run))} && : > {calls}
{prepare} || exit 11
test -e {cache}/marker && fact marker kept
"""
    status, output = vm.run(script, disks, tmp_path)
    assert status == 0, output
    facts = dict(line.removeprefix("FACT ").split("=", 1) for line in output.splitlines() if line.startswith("FACT "))
    array = facts["array"]
    assert array.startswith("md") and facts["level"] == "raid0"
    assert facts["members"].split() == ["vda", "vdb"]
    assert (facts["fs"], facts["label"]) == ("xfs", CACHE_LABEL)
    assert facts["mount"] == f"/dev/{array} xfs"
    assert facts["member_vda"] == facts["member_vdb"] == "linux_raid_member"
    assert facts.get("marker") == "kept"
    # The second run only probed (mdadm -E): no new array, no mkfs, the cache and its data kept.
    first_calls = first_run.read_text().splitlines()
    assert len([call for call in first_calls if call.startswith("mdadm --create")]) == 1
    assert len([call for call in first_calls if call.startswith("mkfs.xfs")]) == 1
    assert not [call for call in node.calls() if not call.startswith("mdadm -E")]


# --- storage and system roles ------------------------------------------------------------------------------


@needs_node
def test_storage_leaves_devices_raw(node: Node, loops: Callable[[int], list[str]]) -> None:
    blank, old_cache = loops(2)
    HOST.run_expect([0], "mkfs.xfs -q -L %s %s", CACHE_LABEL, old_cache)
    before = {dev: probe(dev) for dev in (blank, old_cache)}

    result = node.prepare("--role", "storage", "--devices", f"{blank} {old_cache}")
    assert result.rc == 0, result.stderr
    assert f"{blank}: raw, left for a Ceph OSD" in result.stderr
    assert f"{old_cache}: carries the trainyard cache (cache-fs) from an earlier life; left untouched" in (
        result.stderr
    )
    assert {dev: probe(dev) for dev in (blank, old_cache)} == before
    assert node.calls() == []
    assert not node.host.mount_point(str(node.cache)).exists
    assert not (node.root / "etc/fstab").exists()
    assert not (node.root / "etc/systemd").exists()  # the EFA memlock drop-in is for GPU nodes


@needs_node
def test_system_role_does_not_look_at_devices(node: Node, loops: Callable[[int], list[str]]) -> None:
    (dev,) = loops(1)
    result = node.prepare("--role", "system", "--devices", dev)
    assert result.rc == 0, result.stderr
    assert "role system: instance-store devices are not used" in result.stderr
    assert probe(dev) == {}
    assert node.calls() == []
    assert "kernel.numa_balancing" not in sysctls(node.config("etc/sysctl.d/90-trainyard.conf"))


# --- discovery, settings, arguments (no device touched: no root needed) ------------------------------------


def test_gpu_without_instance_store_does_nothing_with_devices(plain: Node, tmp_path: Path) -> None:
    sysfs = fake_sysfs(tmp_path / "sys", {"nvme0n1": "Amazon Elastic Block Store"})
    result = plain.prepare("--role", "gpu", "--sysfs", str(sysfs))
    assert result.rc == 0, result.stderr
    assert "no NVMe instance-store devices: nothing to do with devices" in result.stderr
    assert plain.calls() == []
    assert not plain.cache.exists()
    assert not (plain.root / "etc/fstab").exists()
    assert (plain.root / "etc/sysctl.d/90-trainyard.conf").is_file()


def test_discovery_picks_instance_store_namespaces_only(plain: Node, tmp_path: Path) -> None:
    models = {
        "nvme0n1": "Amazon Elastic Block Store",
        "nvme1n1": "Amazon EC2 NVMe Instance Storage",
        "nvme2n1": "Amazon EC2 NVMe Instance Storage",
    }
    result = plain.prepare("--role", "storage", "--sysfs", str(fake_sysfs(tmp_path / "sys", models)))
    assert result.rc == 0, result.stderr
    reported = re.findall(r"^trainyard-prepare-node: (/dev/\S+):", result.stderr, re.MULTILINE)
    assert reported == ["/dev/nvme1n1", "/dev/nvme2n1"]


@pytest.mark.parametrize("role", ["gpu", "storage"])
def test_sysctl_file(plain: Node, role: str) -> None:
    assert plain.prepare("--role", role, "--devices", "").rc == 0
    text = plain.config("etc/sysctl.d/90-trainyard.conf")
    values = sysctls(text)
    for key, floor in CEILINGS.items():
        assert int(values[key]) == max(floor, live_sysctl(key)), key  # raised, never lowered
    assert values["net.ipv4.tcp_rmem"] == "4096 131072 16777216"
    assert values["net.ipv4.tcp_wmem"] == "4096 16384 16777216"
    assert ("kernel.numa_balancing" in values) == (role == "gpu")
    assert values.get("kernel.numa_balancing", "0") == "0"
    # each setting sits in a small group under a comment saying why
    lines = [line for line in text.splitlines() if line.strip()]
    for index, line in enumerate(lines):
        if not line.startswith("#"):
            assert any(above.startswith("#") for above in lines[max(0, index - 4) : index]), line


def test_limits_file(plain: Node) -> None:
    assert plain.prepare("--role", "storage", "--devices", "").rc == 0
    entries = limits(plain.config("etc/security/limits.d/90-trainyard.conf"))
    expected = {
        (domain, kind, item, value)
        for domain in ("*", "root")
        for kind in ("soft", "hard")
        for item, value in (("nofile", "500000"), ("memlock", "unlimited"))
    }
    assert entries == expected


@pytest.mark.parametrize("role", ["gpu", "storage", "system"])
def test_gpu_nodes_refuse_gpus_named_by_env_in_unprivileged_containers(plain: Node, tmp_path: Path,
                                                                      role: str) -> None:
    """nvidia-container-toolkit's accept-nvidia-visible-devices-envvar-when-unprivileged (default true) lets any
    unprivileged container see the GPUs its NVIDIA_VISIBLE_DEVICES names; GPU nodes turn it off with nvidia-ctk."""
    shims, log = tmp_path / "ctk", tmp_path / "nvidia-ctk.log"
    shims.mkdir()
    (shims / "nvidia-ctk").write_text(f'#!/bin/sh\necho "$*" >>{shlex.quote(str(log))}\n')
    (shims / "nvidia-ctk").chmod(0o755)
    argv = plain.argv("--role", role, "--devices", "")
    argv[1] = f"PATH={shims}:{plain.path}"
    result = plain.host.run(shlex.join(argv))
    assert result.rc == 0, result.stderr
    calls = log.read_text().splitlines() if log.exists() else []
    config = plain.root / "etc/nvidia-container-runtime/config.toml"
    expected = [f"config -i -c {config} --set accept-nvidia-visible-devices-envvar-when-unprivileged=false"]
    assert calls == (expected if role == "gpu" else [])


def test_apply_loads_only_our_file_under_a_foreign_root(plain: Node) -> None:
    assert plain.prepare("--role", "system", apply=True).rc == 0
    assert plain.calls() == [f"sysctl -p {plain.root}/etc/sysctl.d/90-trainyard.conf"]


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--role", "gpu-ish"],
        ["--role"],
        ["--role", "gpu", "--bogus"],
        ["--role", "gpu", "--root", "/nonexistent"],
    ],
    ids=["no-role", "bad-role", "missing-value", "unknown-flag", "missing-root"],
)
def test_usage_errors_write_nothing(plain: Node, args: list[str]) -> None:
    # apply=True appends nothing, so a flag missing its value really is last; the sysctl shim is a fake anyway
    result = plain.prepare(*args, apply=True)
    assert result.rc == USAGE
    assert "usage: prepare-node.sh" in result.stderr
    assert list(plain.root.iterdir()) == []


def test_script_is_shellcheck_clean() -> None:
    if shutil.which("shellcheck") is None:
        pytest.fail("shellcheck not installed: make deps (apt-get install shellcheck)")
    result = HOST.run("shellcheck %s", str(SCRIPT_PATH))
    assert result.rc == 0, result.stdout
