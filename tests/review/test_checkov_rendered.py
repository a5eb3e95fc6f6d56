"""Checkov's Kubernetes checks over the objects every Helm release renders, as Helm installs them.

A chart's objects cannot carry our skip annotation, so why a release fails a check is written beside its values, in
platform/<release>/checkov.yaml (check id -> reason). A check a release fails without a reason is an error, and so
is a reason for a check that release no longer fails on any stack: the file says exactly what is accepted.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections import defaultdict
from collections.abc import Iterable, Mapping
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from review_support import REPO_ROOT, STACKS
from test_checkov import CHECKOV_VERSION, checkov_binary, describe, run_checkov, skip_reason
from trainyard.plan.rendering import RenderedRelease
from trainyard.plan.runtime import plan_stack, read_stack
from trainyard.plan.writers import rendered_files

REASONS_GLOB = "platform/*/checkov.yaml"

pytestmark = pytest.mark.checkov

# Built-in kinds without a namespace (`kubectl api-resources --namespaced=false`, Kubernetes v1.34); a custom
# resource's scope is its CRD's spec.scope.
CLUSTER_SCOPED = frozenset({
    "APIService", "CertificateSigningRequest", "ClusterRole", "ClusterRoleBinding", "ClusterTrustBundle",
    "CSIDriver", "CSINode", "CustomResourceDefinition", "DeviceClass", "FlowSchema", "IngressClass", "IPAddress",
    "MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding", "MutatingWebhookConfiguration", "Namespace", "Node",
    "PersistentVolume", "PriorityClass", "PriorityLevelConfiguration", "ResourceSlice", "RuntimeClass", "ServiceCIDR",
    "StorageClass", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "ValidatingWebhookConfiguration",
    "VolumeAttachment", "VolumeAttributesClass",
})


def cluster_scoped_kinds(releases: Iterable[RenderedRelease]) -> frozenset[str]:
    crds = {str(o["spec"]["names"]["kind"]) for r in releases for o in r.of_kind("CustomResourceDefinition")
            if o["spec"].get("scope") == "Cluster"}
    return CLUSTER_SCOPED | crds


def as_installed(release: RenderedRelease, cluster_kinds: frozenset[str]) -> RenderedRelease:
    """The objects as the cluster receives them: Helm's client puts a namespaced object that names no namespace
    into the release's (helm/helm v3.19.0 pkg/kube/client.go newBuilder: NamespaceParam(ns).DefaultNamespace())."""
    def placed(obj: Mapping[str, Any]) -> Mapping[str, Any]:
        meta = obj.get("metadata") or {}
        if obj.get("kind") in cluster_kinds or meta.get("namespace"):
            return obj
        return {**obj, "metadata": {**meta, "namespace": release.namespace}}
    return dataclasses.replace(release, objects=tuple(placed(o) for o in release.objects))


def load_reasons(root: Path = REPO_ROOT) -> dict[tuple[str, str], str]:
    """(release, check id) -> reason, from every platform/<release>/checkov.yaml."""
    found: dict[tuple[str, str], str] = {}
    for path in sorted(root.glob(REASONS_GLOB)):
        checks = yaml.safe_load(path.read_text(encoding="utf-8"))
        found |= {(path.parent.name, str(check)): str(reason or "").strip() for check, reason in checks.items()}
    return found


@dataclasses.dataclass(frozen=True)
class ChartReport:
    failed: Mapping[tuple[str, str], tuple[str, ...]]  # (release, check id) -> the failing objects
    unexplained_skips: tuple[str, ...]
    summary: Mapping[str, Any]


@cache
def chart_report(stack: str) -> ChartReport:
    binary = checkov_binary()
    if binary is None:
        pytest.fail(f"checkov not installed: `make test` installs checkov=={CHECKOV_VERSION} in .venv-checkov")
    releases = list(plan_stack(read_stack(stack)).rendered.releases.values())
    kinds = cluster_scoped_kinds(releases)
    with tempfile.TemporaryDirectory() as tmp:
        out, by_dir = Path(tmp), {}
        for release in releases:
            for relative, text in rendered_files(as_installed(release, kinds)).items():
                path = out / relative
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text, encoding="utf-8")
                by_dir[path.parent.name] = release.name
        report = run_checkov(binary, out / "rendered")
    failed: dict[tuple[str, str], list[str]] = defaultdict(list)
    for check in report["results"].get("failed_checks", []):
        failed[by_dir[Path(check["file_path"]).parent.name], check["check_id"]].append(describe(check))
    skips = tuple(describe(c) for c in report["results"].get("skipped_checks", []) if not skip_reason(c))
    return ChartReport({k: tuple(v) for k, v in failed.items()}, skips, report["summary"])


def unexplained(failed: Mapping[tuple[str, str], tuple[str, ...]], reasons: Mapping[tuple[str, str], str]) -> list[str]:
    return [f"{release}: {check} fails on {', '.join(objects)}" for (release, check), objects in sorted(failed.items())
            if not reasons.get((release, check))]


def stale(failed_anywhere: Iterable[tuple[str, str]], reasons: Mapping[tuple[str, str], str]) -> list[str]:
    return [f"{release}: {check}" for release, check in sorted(set(reasons) - set(failed_anywhere))]


@pytest.mark.parametrize("stack", STACKS)
def test_every_check_a_release_fails_has_a_written_reason(stack: str) -> None:
    report = chart_report(stack)
    print(f"{stack}: passed={report.summary['passed']} failed={report.summary['failed']} "
          f"objects={report.summary['resource_count']} reasons used={len(report.failed)}")
    assert report.summary["parsing_errors"] == 0
    assert report.unexplained_skips == (), "skips need a written reason"
    assert unexplained(report.failed, load_reasons()) == [], f"say why in {REASONS_GLOB} or fix it by values"


def test_every_reason_is_for_a_check_that_still_fails() -> None:
    failed_anywhere = {pair for stack in STACKS for pair in chart_report(stack).failed}
    assert stale(failed_anywhere, load_reasons()) == [], f"drop these from {REASONS_GLOB}: they pass now"


def test_a_missing_or_empty_reason_is_named_and_an_unused_one_is_stale() -> None:
    failed = {("volcano", "CKV_K8S_8"): ("CKV_K8S_8 (liveness) on Deployment.volcano-system.volcano-scheduler",),
              ("cilium", "CKV_K8S_16"): ("CKV_K8S_16 (privileged) on DaemonSet.kube-system.cilium",)}
    reasons = {("volcano", "CKV_K8S_8"): "", ("cilium", "CKV_K8S_16"): "why", ("fluid", "CKV_K8S_16"): "why"}
    assert unexplained(failed, reasons) == [
        "volcano: CKV_K8S_8 fails on CKV_K8S_8 (liveness) on Deployment.volcano-system.volcano-scheduler"]
    assert stale(failed, reasons) == ["fluid: CKV_K8S_16"]


def test_helm_places_a_namespaced_object_in_the_release_namespace_and_leaves_cluster_objects_alone() -> None:
    crd = {"kind": "CustomResourceDefinition", "metadata": {"name": "queues.scheduling.volcano.sh"},
           "spec": {"scope": "Cluster", "names": {"kind": "Queue"}}}
    objects = ({"kind": "DaemonSet", "metadata": {"name": "a"}}, {"kind": "Role", "metadata": {"name": "b",
                "namespace": "other"}}, {"kind": "ClusterRole", "metadata": {"name": "c"}},
               {"kind": "Queue", "metadata": {"name": "d"}}, crd)
    release = RenderedRelease("volcano", "volcano-system", "volcano", "1.0.0", objects)
    placed = as_installed(release, cluster_scoped_kinds([release])).objects
    assert [o["metadata"].get("namespace") for o in placed] == ["volcano-system", "other", None, None, None]
