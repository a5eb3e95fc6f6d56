"""`make test` on a fresh machine: missing system tools are installed (apt-get, as root), not just named; where they
cannot be installed it stops with one message saying what to install."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOOL = "trainyard-missing-tool"
FAKE_APT = """#!/bin/sh
echo "$*" >> {log}
case "$1" in install) {install} ;; esac
"""


# An interpreter as Debian's is before python3.X-venv: no ensurepip, until the marker file exists.
NO_ENSUREPIP = """#!/bin/sh
case "$*" in *ensurepip*) [ -e {marker} ] || {{ echo "No module named 'ensurepip'" >&2; exit 1; }} ;; esac
exec {python} "$@"
"""


def _preflight(tmp_path: Path, apt_get: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(["make", "--no-print-directory", "preflight", f"SYSTEM_TOOLS={TOOL}", f"APT_GET={apt_get}",
                           *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


def _debian_python(tmp_path: Path) -> tuple[Path, Path]:
    python, marker = tmp_path / "python3", tmp_path / "venv-installed"
    python.write_text(NO_ENSUREPIP.format(marker=marker, python=sys.executable))
    python.chmod(0o755)
    return python, marker


def _fake_apt(tmp_path: Path, installs: bool) -> tuple[Path, Path]:
    bin_dir, log = tmp_path / "bin", tmp_path / "apt.log"
    bin_dir.mkdir(exist_ok=True)
    apt = tmp_path / "apt-get"
    tool = bin_dir / TOOL
    apt.write_text(FAKE_APT.format(log=log, install=f"printf '#!/bin/sh\\n' > {tool}; chmod +x {tool}"
                                   if installs else ":"))
    apt.chmod(0o755)
    return apt, log


def test_a_missing_tool_is_installed_with_the_packages_make_deps_names(tmp_path: Path) -> None:
    apt, log = _fake_apt(tmp_path, installs=True)
    result = _preflight(tmp_path, str(apt))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"installing missing system tools: {TOOL}" in result.stdout
    calls = log.read_text().splitlines()
    assert calls[0] == "update -qq"
    assert calls[1].startswith("install -y -qq --no-install-recommends ")
    assert {"mdadm", "xfsprogs", "qemu-system-x86", "busybox-static"} <= set(calls[1].split())


def test_an_install_that_does_not_bring_the_tool_stops(tmp_path: Path) -> None:
    apt, _ = _fake_apt(tmp_path, installs=False)
    result = _preflight(tmp_path, str(apt))
    assert result.returncode == 2
    assert f"still missing after make deps: {TOOL}" in result.stdout


def test_without_apt_get_it_stops_naming_the_packages(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    result = _preflight(tmp_path, str(tmp_path / "no-apt-get"))
    assert result.returncode == 2
    assert f"missing system tools: {TOOL}, and no apt-get to install them" in result.stdout
    assert "qemu-system-x86" in result.stdout


def test_ci_runs_the_readme_command() -> None:
    commands = [line.split("#")[0].strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert "make test" in commands and "make deps" not in commands


def test_an_interpreter_without_ensurepip_gets_python3_venv(tmp_path: Path) -> None:
    apt, log = _fake_apt(tmp_path, installs=True)
    python, marker = _debian_python(tmp_path)
    apt.write_text(apt.read_text().replace("install)", f"install) touch {marker};"))
    result = _preflight(tmp_path, str(apt), f"PYTHON={python}")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"installing missing system tools: {TOOL} python3-venv" in result.stdout
    assert "python3-venv" in log.read_text().splitlines()[1].split()


def test_make_plan_without_ensurepip_stops_before_making_a_venv(tmp_path: Path) -> None:
    python, _ = _debian_python(tmp_path)
    venv = tmp_path / "venv"
    result = subprocess.run(["make", "--no-print-directory", f"VENV={venv}", f"PYTHON={python}", f"{venv}/.installed"],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"make: {python} cannot create a virtual environment (no ensurepip): install python3-venv" in result.stdout
    assert not venv.exists()
