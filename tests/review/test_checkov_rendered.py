"""Checkov's Kubernetes checks over the objects every Helm release renders, as Helm installs them.

A chart's objects cannot carry our skip annotation, so why a release fails a check is written beside its values, in
platform/<release>/checkov.yaml: check id -> `why` and the `objects` it is accepted for (each by its rendered file's
name, `<kind>.<name>`). An object failing a check without its reason is an error, so a chart bump or a values change
that makes another object fail is named; so is a reason for an object that no longer fails it on any stack: the
file says exactly what is accepted.
"""

from __future__ import annotations

import copy
import dataclasses
import tempfile
from collections import defaultdict
from collections.abc import Iterable, Mapping
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from owned_stacks import planned
from review_support import REPO_ROOT, STACKS
from test_checkov import CHECKOV_VERSION, checkov_binary, describe, run_checkov, skip_reason
from trainyard.plan.recording import Recording
from trainyard.plan.rendering import RELEASE, RenderedRelease, render_releases
from trainyard.plan.runtime import STACKS_DIR
from trainyard.plan.writers import rendered_files

REASONS_GLOB = "platform/*/checkov.yaml"

pytestmark = pytest.mark.checkov

@dataclasses.dataclass(frozen=True)
class Reason:
    why: str
    objects: frozenset[str]  # rendered file names without .yaml: `<kind>.<name>`


Key = tuple[str, str]  # (release, check id)


def load_reasons(root: Path = REPO_ROOT) -> dict[Key, Reason]:
    """(release, check id) -> why and the objects it is accepted for, from every platform/<release>/checkov.yaml."""
    found: dict[Key, Reason] = {}
    for path in sorted(root.glob(REASONS_GLOB)):
        for check, entry in (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).items():
            entry = entry if isinstance(entry, dict) else {}
            found[(path.parent.name, str(check))] = Reason(
                str(entry.get("why") or "").strip(), frozenset(map(str, entry.get("objects") or ())))
    return found


@dataclasses.dataclass(frozen=True)
class ChartReport:
    failed: Mapping[Key, Mapping[str, str]]  # (release, check id) -> failing object -> how Checkov names it
    unexplained_skips: tuple[str, ...]
    summary: Mapping[str, Any]


@cache
def chart_report(stack: str) -> ChartReport:
    return report_of(tuple(planned((stack, STACKS_DIR)).rendered.releases.values()))


def report_of(releases: tuple[RenderedRelease, ...]) -> ChartReport:
    binary = checkov_binary()
    if binary is None:
        pytest.fail(f"checkov not installed: `make test` installs checkov=={CHECKOV_VERSION} in .venv-checkov")
    with tempfile.TemporaryDirectory() as tmp:
        out, by_dir = Path(tmp), {}
        for release in releases:
            for relative, text in rendered_files(release).items():
                path = out / relative
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text, encoding="utf-8")
                by_dir[path.parent.name] = release.name
        report = run_checkov(binary, out / "rendered")
    failed: dict[Key, dict[str, str]] = defaultdict(dict)
    for check in report["results"].get("failed_checks", []):
        path = Path(check["file_path"])
        failed[by_dir[path.parent.name], check["check_id"]][path.stem] = describe(check)
    skips = tuple(describe(c) for c in report["results"].get("skipped_checks", []) if not skip_reason(c))
    return ChartReport({k: dict(v) for k, v in failed.items()}, skips, report["summary"])


def unexplained(failed: Mapping[Key, Mapping[str, str]], reasons: Mapping[Key, Reason]) -> list[str]:
    """A failing object its (release, check) reason does not name, or whose reason says nothing."""
    found = []
    for (release, check), objects in sorted(failed.items()):
        reason = reasons.get((release, check), Reason("", frozenset()))
        missing = sorted(o for o in objects if not reason.why or o not in reason.objects)
        found += [f"{release}: {check} fails on {o} ({objects[o]})" for o in missing]
    return found


def stale(failed_anywhere: Iterable[tuple[str, str, str]], reasons: Mapping[Key, Reason]) -> list[str]:
    """An object a reason is written for that fails its check on no stack (fixed, renamed or no longer rendered)."""
    failing = set(failed_anywhere)
    return [f"{release}: {check} on {o}" for (release, check), reason in sorted(reasons.items())
            for o in sorted(reason.objects) if (release, check, o) not in failing] + \
        [f"{release}: {check} lists no objects" for (release, check), reason in sorted(reasons.items())
         if not reason.objects]


@pytest.mark.parametrize("stack", STACKS)
def test_every_check_a_release_fails_has_a_written_reason(stack: str) -> None:
    report = chart_report(stack)
    print(f"{stack}: passed={report.summary['passed']} failed={report.summary['failed']} "
          f"objects={report.summary['resource_count']} reasons used={len(report.failed)}")
    assert report.summary["parsing_errors"] == 0
    assert report.unexplained_skips == (), "skips need a written reason"
    assert unexplained(report.failed, load_reasons()) == [], f"say why in {REASONS_GLOB} or fix it by values"


def test_every_reason_is_for_an_object_that_still_fails() -> None:
    failed_anywhere = {(release, check, o) for stack in STACKS
                       for (release, check), objects in chart_report(stack).failed.items() for o in objects}
    assert stale(failed_anywhere, load_reasons()) == [], f"drop these from {REASONS_GLOB}: they pass now"


def test_a_reason_covers_only_the_objects_it_names() -> None:
    """A reason written for the agent does not cover a second object of the release failing the same check (a
    chart bump's new privileged pod); an empty reason covers nothing; a listed object that passes is stale."""
    failed = {("volcano", "CKV_K8S_8"): {"deployment.volcano-scheduler": "CKV_K8S_8 (liveness) on Deployment..."},
              ("cilium", "CKV_K8S_16"): {"daemonset.cilium": "CKV_K8S_16 (privileged) on DaemonSet.cilium",
                                         "daemonset.cilium-envoy": "CKV_K8S_16 (privileged) on DaemonSet.envoy"}}
    reasons = {("volcano", "CKV_K8S_8"): Reason("", frozenset({"deployment.volcano-scheduler"})),
               ("cilium", "CKV_K8S_16"): Reason("why", frozenset({"daemonset.cilium", "daemonset.hubble"})),
               ("fluid", "CKV_K8S_16"): Reason("why", frozenset({"daemonset.csi-nodeplugin-fluid"}))}
    assert unexplained(failed, reasons) == [
        "cilium: CKV_K8S_16 fails on daemonset.cilium-envoy (CKV_K8S_16 (privileged) on DaemonSet.envoy)",
        "volcano: CKV_K8S_8 fails on deployment.volcano-scheduler (CKV_K8S_8 (liveness) on Deployment...)"]
    failing = {(r, c, o) for (r, c), objects in failed.items() for o in objects}
    assert stale(failing, reasons) == ["cilium: CKV_K8S_16 on daemonset.hubble",
                                       "fluid: CKV_K8S_16 on daemonset.csi-nodeplugin-fluid"]


def test_a_second_object_failing_a_check_its_release_has_a_reason_for_is_named() -> None:
    """The reason for Cilium's privileged check is the agent's mount-bpf-fs init container: an Envoy made
    privileged by a values change fails the same check and must not pass on the agent's reason."""
    stack = next(s for s in STACKS if "cilium" in planned((s, STACKS_DIR)).rendered.releases)
    plan = planned((stack, STACKS_DIR))
    resources = []
    for record in plan.recording.resources:
        if record.type == RELEASE and record.inputs.get("name") == "cilium":
            inputs = copy.deepcopy(record.inputs)
            inputs["values"].setdefault("envoy", {}).setdefault("securityContext", {})["privileged"] = True
            record = dataclasses.replace(record, inputs=inputs)
        resources.append(record)
    rendered = render_releases(Recording(resources=resources), plan.settings.cluster.kubernetes_version)
    reasons = load_reasons()
    # Checkov over Cilium's objects alone: the other releases render as on the stack, which
    # test_every_check_a_release_fails_has_a_written_reason checks (a fifth of the objects, a fifth of the time).
    found = [line.split(" (")[0] for line in unexplained(report_of((rendered.releases["cilium"],)).failed, reasons)]
    checks = {line.split(": ")[1].split(" fails")[0] for line in found}
    assert "CKV_K8S_16" in checks and all(("cilium", check) in reasons for check in checks)  # each has a reason
    assert found == [f"cilium: {check} fails on daemonset.cilium-envoy" for check in sorted(checks)]
