"""Every pinned version is one upstream published (issue 9, item 2), checked against release_data/.

Pins no data confirms must be listed, with a reason, in release_data/unverified.yaml; they are printed on
every run so the exceptions stay visible.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
import yaml
from owned_stacks import OWNED_STACKS
from tool_scripts import load_tool
from trainyard.config.release_check import DATA_DIR, Pin, all_pins, kubernetes_pins, release_problems, unverified
from trainyard.config.releases import KUBERNETES_RELEASES
from trainyard.paths import REPO_ROOT

FIXTURES = Path(__file__).parent / "fixtures" / "releases"


def test_every_pin_is_confirmed_or_listed_as_unverified(capsys: pytest.CaptureFixture[str]) -> None:
    pins = all_pins(REPO_ROOT)
    exceptions = unverified()
    with capsys.disabled():
        for pin in pins:
            if not pin.confirmed:
                print(f"\nUNVERIFIED {pin.name} ({pin.source}): {exceptions.get(pin.name, 'NOT LISTED')}")
    missing = [f"{p.name} ({p.source})" for p in pins if not p.confirmed and p.name not in exceptions]
    assert missing == [], "pins no release data lists; confirm them or add them to release_data/unverified.yaml"
    stale = sorted(set(exceptions) - {p.name for p in pins if not p.confirmed})
    assert stale == [], "unverified.yaml lists pins that are confirmed or no longer pinned"


def test_all_kinds_of_pin_are_checked() -> None:
    kinds = {p.name.split("/", 1)[0] for p in all_pins(REPO_ROOT)}
    assert kinds == {"eks-ami", "eks-addon", "chart", "image"}
    names = {p.name for p in all_pins(REPO_ROOT)}
    assert "image/public.ecr.aws/karpenter/controller:1.14.1" in names
    assert any(n.startswith("image/pytorch/pytorch:") for n in names)
    assert sum(n.startswith("chart/") for n in names) == len(yaml.safe_load(
        (REPO_ROOT / "platform" / "charts.yaml").read_text())["releases"])


@pytest.mark.parametrize("minor", sorted(KUBERNETES_RELEASES))
def test_node_ami_pins_are_released_and_consistent(minor: str) -> None:
    release = KUBERNETES_RELEASES[minor]
    assert release_problems(release) == []
    (ami,) = [p for p in kubernetes_pins({minor: release}) if p.name.startswith("eks-ami/")]
    assert ami.confirmed, f"{ami.name} is not in release_data/eks-ami.yaml"


def test_a_release_that_does_not_exist_is_caught() -> None:
    """The review's example: 1.34.2-20261103 while the CHANGELOG's newest 1.34 release is 1.34.9-20260714."""
    bad = dataclasses.replace(KUBERNETES_RELEASES["1.34"], ami_release="20261103", node_group_release="1.34.2-20261103")
    (ami,) = [p for p in kubernetes_pins({"1.34": bad}) if p.name.startswith("eks-ami/")]
    assert ami == Pin("eks-ami/1.34=1.34.2-20261103", "infra/trainyard/config/releases.py", False)
    assert ami.name not in unverified()


def test_mismatched_alias_and_release_are_caught() -> None:
    good = KUBERNETES_RELEASES["1.34"]
    assert release_problems(dataclasses.replace(good, ami_release="20260625"))
    assert release_problems(dataclasses.replace(good, node_group_release="1.33.13-20260714"))


def test_a_job_image_from_elsewhere_is_checked(tmp_path: Path) -> None:
    shutil.copytree(REPO_ROOT / "platform", tmp_path / "platform")
    (tmp_path / "stacks").mkdir()
    stack = yaml.safe_load((OWNED_STACKS / "Pulumi.fleet.yaml").read_text())
    stack["config"]["trainyard:workloads"][0]["image"] = "nvcr.io/nvidia/pytorch:26.07-py3"
    (tmp_path / "stacks" / "Pulumi.fleet.yaml").write_text(yaml.safe_dump(stack))
    pins = {p.name: p for p in all_pins(tmp_path)}
    assert pins["image/nvcr.io/nvidia/pytorch:26.07-py3"].confirmed is False
    assert not [n for n in pins if n.startswith("image/ghcr.io/trainyard/")], "the project's own image is exempt"


def test_a_chart_or_image_not_in_the_data_is_caught(tmp_path: Path) -> None:
    data = tmp_path / "release_data"
    shutil.copytree(DATA_DIR, data)
    charts = yaml.safe_load((data / "charts.yaml").read_text())
    charts["charts"]["cilium"]["versions"] = ["1.19.4"]
    (data / "charts.yaml").write_text(yaml.safe_dump(charts))
    images = yaml.safe_load((data / "images.yaml").read_text())
    images["images"]["public.ecr.aws/karpenter/controller"]["versions"] = ["1.14.0"]
    (data / "images.yaml").write_text(yaml.safe_dump(images))
    unconfirmed = {p.name for p in all_pins(REPO_ROOT, data) if not p.confirmed}
    assert {"chart/cilium=1.20.0", "image/public.ecr.aws/karpenter/controller:1.14.1"} <= unconfirmed


def test_changelog_parser_reads_al2023_releases_per_minor() -> None:
    parse = load_tool("refresh_releases").parse_eks_ami_changelog
    releases = parse((FIXTURES / "eks-ami-CHANGELOG.md").read_text(), ["1.33", "1.34", "1.35"])
    assert releases == {"1.33": ["1.33.13-20260714", "1.33.13-20260625"],
                        "1.34": ["1.34.9-20260714", "1.34.9-20260625"], "1.35": []}


def test_addon_parser_keeps_versions_of_the_asked_kubernetes_version() -> None:
    parse = load_tool("refresh_releases").parse_addon_versions
    text = (FIXTURES / "describe-addon-versions.json").read_text()
    assert parse(text, "1.34") == {"coredns": ["v1.12.4-eksbuild.10", "v1.12.4-eksbuild.2"]}
    assert parse(text, "1.33") == {"coredns": ["v1.12.4-eksbuild.2"]}


def test_helm_index_and_registry_tag_parsers() -> None:
    tool = load_tool("refresh_releases")
    assert tool.parse_helm_index((FIXTURES / "helm-index.yaml").read_text(), "cilium") == ["1.20.1", "1.20.0",
                                                                                           "1.19.4"]
    assert tool.parse_registry_tags((FIXTURES / "registry-tags.json").read_text()) == ["1.14.1", "1.14.0",
                                                                                       "1.13.2", "v1.2.0"]


def test_a_digest_is_confirmed_only_as_its_tags(tmp_path: Path) -> None:
    """Karpenter's image is `repository:tag@digest` and the digest is what is pulled: the pinned digest must be the
    one the release data records for the pinned tag, not another release's (the 1.14.1 source tree carries
    1.13.0's)."""
    pins = {p.name: p for p in all_pins(REPO_ROOT)}
    (digest,) = [p for p in pins.values() if p.name.startswith("image/public.ecr.aws/karpenter/controller:1.14.1@")]
    assert digest.confirmed
    data = tmp_path / "release_data"
    shutil.copytree(DATA_DIR, data)
    images = yaml.safe_load((data / "images.yaml").read_text())
    images["images"]["public.ecr.aws/karpenter/controller"]["digests"] = {
        "1.14.1": "sha256:ea731b0cd813add8b2947a76bfe861c38069d85922b01d0c1647d1466279b7fe"}
    (data / "images.yaml").write_text(yaml.safe_dump(images))
    assert digest.name in {p.name for p in all_pins(REPO_ROOT, data) if not p.confirmed}


def test_the_gpu_operators_own_images_are_pinned_to_its_release() -> None:
    """Operator, validator and node-status-exporter default to .Chart.AppVersion, "main-latest" in the source."""
    catalogue = yaml.safe_load((REPO_ROOT / "platform" / "charts.yaml").read_text())["releases"]["gpu-operator"]
    assert {path: tag for path, tag in catalogue["images"].items()} == {
        f"{part}.version": catalogue["version"] for part in ("operator", "validator", "nodeStatusExporter")}
