"""Shell scripts as root under User-Mode Linux, for kernel features the host lacks (here: the md RAID driver).

Debian's `user-mode-linux` kernel boots in about two seconds with the host's `/` as its root file system (hostfs),
so the guest runs the repository's scripts in place and leaves its results where the test reads them. Sparse files
become the guest's block devices `/dev/ubda`, `/dev/ubdb`, ...; `/run` is a guest tmpfs, so what the guest's tools
record there (mdadm's map) never reaches the host. The kernel ships md and raid0 as modules: they are loaded
from its own module tree before the script runs.
"""

from __future__ import annotations

import shlex
import shutil
import string
import subprocess
from collections.abc import Sequence
from pathlib import Path

KERNEL = "linux.uml"
MD_MODULES = ("md-mod.ko", "raid0.ko")
_INIT = string.Template("""#!/bin/sh
# PID 1 of the guest: mount the kernel file systems, load md, run the scenario, record its status, stop.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
mount -t proc proc /proc && mount -t sysfs sysfs /sys && mount -t devtmpfs devtmpfs /dev && mount -t tmpfs tmpfs /run
modules=/usr/lib/uml/modules/$$(uname -r)/kernel/drivers/md
for module in $modules; do insmod "$$modules/$$module"; done
/bin/sh $script > $out 2>&1
echo $$? > $status
sync
halt -f
""")


def available() -> bool:
    return shutil.which(KERNEL) is not None


def run(script: str, disks: Sequence[Path], workdir: Path, timeout_s: float = 180) -> tuple[int, str]:
    """Boot a guest with `disks` attached, run `script` in it as root; returns (exit status, its output)."""
    scenario, init = workdir / "uml-scenario.sh", workdir / "uml-init.sh"
    out, status = workdir / "uml-scenario.out", workdir / "uml-scenario.status"
    scenario.write_text(script)
    init.write_text(_INIT.substitute(modules=" ".join(MD_MODULES), script=shlex.quote(str(scenario)),
                                     out=shlex.quote(str(out)), status=shlex.quote(str(status))))
    init.chmod(0o755)
    command = [KERNEL, "mem=512M", "rootfstype=hostfs", "rootflags=/", "rw", f"init={init}", "con=null",
               *(f"ubd{index}={disk}" for index, disk in enumerate(disks))]
    booted = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)
    if not status.is_file():
        raise RuntimeError(f"the UML guest did not run the scenario (exit {booted.returncode}):\n"
                           f"{booted.stdout[-2000:]}{booted.stderr[-2000:]}")
    return int(status.read_text().strip()), out.read_text()
