"""The trainer image carries EFA at exact, mutually consistent pins, and its environment agrees with the jobs'."""

from __future__ import annotations

import re
import shlex
from functools import cache
from pathlib import Path

from trainyard.workloads.pod import EFA_ENV

DOCKERFILE = Path(__file__).resolve().parents[2] / "workloads" / "Dockerfile"
# What each EFA installer bundles, from AWS's EFA release notes (efa-changelog.html): a bump of the installer
# must come with the libfabric and plugin versions it really installs (the build checks them too).
INSTALLER_BUNDLES = {"1.50.0": ("2.6.0amzn1.0", "1.21.1"), "1.51.0": ("2.7.0amzn2.0", "1.22.0")}
# aws-ofi-nccl doc/efa-env-var.md: not to be set with libfabric >= 1.18 and aws-ofi-nccl >= 1.7.
OBSOLETE = {"FI_EFA_USE_DEVICE_RDMA", "NCCL_PROTO", "FI_EFA_FORK_SAFE", "RDMAV_FORK_SAFE"}


@cache
def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comment lines dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("#") or not line.strip():
            continue
        pending += line.rstrip().removesuffix("\\") + " "
        if not line.rstrip().endswith("\\"):
            keyword, _, rest = pending.strip().partition(" ")
            out.append((keyword.upper(), rest.strip()))
            pending = ""
    return out


def _pairs(keyword: str) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for kw, rest in instructions():
        if kw == keyword:
            pairs.update(token.split("=", 1) for token in shlex.split(rest))
    return pairs


def test_efa_pins_are_exact_and_match_what_the_installer_bundles() -> None:
    args = _pairs("ARG")
    installer, libfabric = args["EFA_INSTALLER_VERSION"], args["LIBFABRIC_VERSION"]
    plugin = args["AWS_OFI_NCCL_VERSION"]
    assert re.fullmatch(r"\d+\.\d+\.\d+", installer) and re.fullmatch(r"\d+\.\d+\.\d+", plugin)
    assert re.fullmatch(r"\d+\.\d+\.\d+amzn\d+\.\d+", libfabric)
    assert INSTALLER_BUNDLES[installer] == (libfabric, plugin)
    assert re.fullmatch(r"[0-9A-F]{40}", args["EFA_KEY_FINGERPRINT"])


def test_the_build_verifies_the_installer_and_what_it_installed() -> None:
    run = next(rest for kw, rest in instructions() if kw == "RUN" and "efa_installer.sh" in rest)
    # Signed by the pinned key, then checked against the pins; no "latest" download.
    assert "gpg --batch --verify" in run and 'grep -qx "fpr:::::::::${EFA_KEY_FINGERPRINT}:"' in run
    assert "aws-efa-installer-${EFA_INSTALLER_VERSION}.tar.gz" in run and "latest" not in run
    assert 'grep -q "${LIBFABRIC_VERSION}"' in run and 'grep -q "^${AWS_OFI_NCCL_VERSION}"' in run
    # AWS's container flags: no kernel module, no ulimit files, no lspci probe.
    assert "--skip-kmod --skip-limit-conf --no-verify" in run


def test_image_environment_loads_the_plugin_and_leaves_efa_only_settings_to_the_jobs() -> None:
    env = _pairs("ENV")
    assert env["NCCL_NET_PLUGIN"] == "ofi"
    assert env["LD_LIBRARY_PATH"].startswith("/opt/amazon/ofi-nccl/lib:/opt/amazon/efa/lib")
    # NCCL_NET and FI_PROVIDER would break NCCL on nodes without EFA: only EFA pods get them, from the jobs.
    assert not env.keys() & EFA_ENV.keys()
    assert not env.keys() & OBSOLETE


def test_efa_pods_get_the_environment_the_plugin_documents() -> None:
    assert EFA_ENV == {"NCCL_NET": "Libfabric", "FI_PROVIDER": "efa", "FI_EFA_USE_HUGE_PAGE": "0"}
    assert not EFA_ENV.keys() & OBSOLETE


def test_base_image_is_pinned() -> None:
    base = next(rest for kw, rest in instructions() if kw == "FROM")
    assert ":" in base and not base.endswith(":latest")
