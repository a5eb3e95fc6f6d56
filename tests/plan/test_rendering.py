"""Every Helm release rendered with the real Helm: the objects, the refusals, the API versions, the cache."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from owned_stacks import FLEET, LAPTOP, OWNED_STACKS, stack_file
from trainyard.plan import helm, render_cache, rendering
from trainyard.plan.conformance import upstream_dir
from trainyard.plan.images import images, is_pinned, unpinned
from trainyard.plan.recording import Recording, ResourceRecord
from trainyard.plan.rendering import GENERATED, RenderError, render_releases
from trainyard.plan.runtime import available_stacks, plan_stack, read_stack
from trainyard.plan.writers import plan_files, rendered_files

ROOT = Path(__file__).resolve().parents[2]


def _release(name: str, chart: str, version: str, values: dict[str, Any], namespace: str = "demo") -> ResourceRecord:
    return ResourceRecord(urn=f"urn:pulumi:t::trainyard::kubernetes:helm.sh/v3:Release::{name}",
                          type=rendering.RELEASE, name=name, custom=True, parent=None, provider=None, depends_on=(),
                          protect=False, retain_on_delete=False, deleted_with=None,
                          inputs={"name": name, "namespace": namespace, "chart": chart, "version": version,
                                  "values": values})


def _demo_chart(upstream: Path) -> Path:
    """A chart of our own: a values schema, a `required` value, a `fail`, and a generated password."""
    tree = upstream / "chart-src" / "demo" / "1.0.0"
    (tree / "templates").mkdir(parents=True)
    (tree / "Chart.yaml").write_text("apiVersion: v2\nname: demo\nversion: 1.0.0\n")
    (tree / "values.yaml").write_text("replicas: 1\nimage: registry.example/demo:1.0.0\n")
    (tree / "values.schema.json").write_text('{"type": "object", "additionalProperties": false, "properties": '
                                             '{"replicas": {"type": "integer"}, "image": {"type": "string"}, '
                                             '"name": {"type": "string"}, "explode": {"type": "boolean"}}}')
    (tree / "templates" / "deployment.yaml").write_text(textwrap.dedent("""\
        {{- if .Values.explode }}{{ fail "explode is not supported" }}{{ end }}
        apiVersion: apps/v1
        kind: Deployment
        metadata: {name: {{ .Values.name | required "name is required" }}}
        spec:
          replicas: {{ .Values.replicas }}
          template:
            spec:
              containers: [{name: main, image: {{ .Values.image }}}]
        ---
        apiVersion: v1
        kind: Secret
        metadata: {name: generated}
        stringData: {password: {{ randAlphaNum 24 | quote }}}
        {{- if .Capabilities.APIVersions.Has "monitoring.coreos.com/v1" }}
        ---
        apiVersion: monitoring.coreos.com/v1
        kind: ServiceMonitor
        metadata: {name: demo}
        spec: {endpoints: []}
        {{- end }}
        """))
    return tree


def _render(tmp_path: Path, values: dict[str, Any], *extra: ResourceRecord, cache: str = "cache",
            plans: Path | None = None) -> rendering.RenderedStack:
    recording = Recording(resources=[_release("demo", "demo", "1.0.0", values), *extra])
    return render_releases(recording, "1.34", upstream=tmp_path / "up", cache_dir=tmp_path / cache, plans=plans)


@pytest.fixture()
def demo(tmp_path: Path) -> Path:
    return _demo_chart(tmp_path / "up")


def test_a_release_renders_with_its_values_and_generated_material_is_masked(tmp_path: Path, demo: Path) -> None:
    rendered = _render(tmp_path, {"name": "web", "replicas": 3})
    objects = {obj["kind"]: obj for obj in rendered.releases["demo"].objects}
    assert objects["Deployment"]["spec"]["replicas"] == 3
    assert objects["Deployment"]["metadata"]["name"] == "web"
    assert objects["Secret"]["stringData"]["password"] == GENERATED  # randAlphaNum: differs on every render
    assert "ServiceMonitor" not in objects  # nothing in this stack installs monitoring.coreos.com
    assert rendered.renders == 2  # rendered twice to find what the chart generates


def test_api_versions_of_crds_another_release_installs_reach_the_chart(tmp_path: Path, demo: Path) -> None:
    crd_chart = tmp_path / "up" / "chart-src" / "crds" / "1.0.0"
    (crd_chart / "crds").mkdir(parents=True)
    (crd_chart / "Chart.yaml").write_text("apiVersion: v2\nname: crds\nversion: 1.0.0\n")
    (crd_chart / "crds" / "sm.yaml").write_text(textwrap.dedent("""\
        apiVersion: apiextensions.k8s.io/v1
        kind: CustomResourceDefinition
        metadata: {name: servicemonitors.monitoring.coreos.com}
        spec:
          group: monitoring.coreos.com
          names: {kind: ServiceMonitor, plural: servicemonitors}
          scope: Namespaced
          versions: [{name: v1, served: true, storage: true, schema: {openAPIV3Schema: {type: object}}}]
        """))
    rendered = _render(tmp_path, {"name": "web"}, _release("crds", "crds", "1.0.0", {}))
    assert "ServiceMonitor" in {obj["kind"] for obj in rendered.releases["demo"].objects}
    assert {"monitoring.coreos.com/v1", "monitoring.coreos.com/v1/ServiceMonitor", "apps/v1/Deployment",
            "resource.k8s.io/v1/DeviceClass"} <= set(rendered.api_versions)


@pytest.mark.parametrize(("values", "named"), [
    ({"name": "web", "replicas": "three"}, "replicas"),  # the chart's values.schema.json
    ({"name": "web", "colour": "red"}, "colour"),  # a key the schema does not allow
    ({"replicas": 1}, "name is required"),  # a missing required value
    ({"name": "web", "explode": True}, "explode is not supported"),  # the chart's own fail
])
def test_a_refused_release_names_the_release_and_the_key(tmp_path: Path, demo: Path, values: dict[str, Any],
                                                          named: str) -> None:
    with pytest.raises(RenderError) as refused:
        _render(tmp_path, values)
    message = str(refused.value)
    assert message.startswith("Helm release demo (demo 1.0.0) does not render: ")
    assert named in message and "\n" not in message


def test_a_namespaced_object_the_chart_leaves_without_a_namespace_gets_the_releases(tmp_path: Path, demo: Path) -> None:
    """Helm's client puts it there (pkg/kube/client.go DefaultNamespace): the plan, the rules and the policy read it
    as installed."""
    rendered = _render(tmp_path, {"name": "web"}).releases["demo"]
    assert {(o["kind"], o["metadata"].get("namespace")) for o in rendered.objects} >= {("Deployment", "demo"),
                                                                                       ("Secret", "demo")}


def test_only_kinds_known_to_be_namespaced_are_placed() -> None:
    crds = [{"kind": "CustomResourceDefinition", "metadata": {"name": f"{plural}.example.io"},
             "spec": {"group": "example.io", "scope": scope, "names": {"kind": kind}, "versions": [{"name": "v1"}]}}
            for plural, kind, scope in (("queues", "Queue", "Cluster"), ("jobs", "Job", "Namespaced"))]
    namespaced = rendering.namespaced_kinds(["apps/v1/DaemonSet", "rbac.authorization.k8s.io/v1/Role",
                                             "rbac.authorization.k8s.io/v1/ClusterRole", "apps/v1"], crds)
    objects = ({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "a"}},
               {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "b",
                                                                                         "namespace": "other"}},
               {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "c"}},
               {"apiVersion": "example.io/v1", "kind": "Queue", "metadata": {"name": "d"}},
               {"apiVersion": "example.io/v1", "kind": "Job", "metadata": {"name": "e"}},
               {"apiVersion": "cilium.io/v2", "kind": "CiliumNodeConfig", "metadata": {"name": "f"}})  # scope unseen
    placed = {o["metadata"]["name"]: o["metadata"].get("namespace") for o in
              rendering.as_installed(objects, "system", namespaced)}
    assert placed == {"a": "system", "b": "other", "c": None, "d": None, "e": "system", "f": None}


def test_a_release_without_its_chart_tree_is_refused_naming_what_to_run(tmp_path: Path) -> None:
    with pytest.raises(RenderError, match=r"Helm release demo: no chart source tree for demo 1\.0\.0.*upstream\.py"):
        _render(tmp_path, {"name": "web"})


def test_the_cache_serves_an_unchanged_release_and_misses_a_changed_one(tmp_path: Path, demo: Path) -> None:
    first = _render(tmp_path, {"name": "web"})
    again = _render(tmp_path, {"name": "web"})
    changed = _render(tmp_path, {"name": "api"})
    assert (first.renders, again.renders, changed.renders) == (2, 0, 2)
    assert again.releases == first.releases
    (demo / "values.yaml").write_text("replicas: 4\nimage: registry.example/demo:1.0.0\n")
    rendering._tree_facts.cache_clear()
    edited = _render(tmp_path, {"name": "web"})
    assert edited.renders == 2
    assert next(edited.releases["demo"].of_kind("Deployment"))["spec"]["replicas"] == 4


def _monitoring_chart(upstream: Path) -> ResourceRecord:
    """A chart that installs the ServiceMonitor CRD and a ServiceMonitor once the cluster serves it: rendered
    first without its own CRD's API, then again with it."""
    tree = upstream / "chart-src" / "monitoring" / "1.0.0"
    (tree / "templates").mkdir(parents=True)
    (tree / "Chart.yaml").write_text("apiVersion: v2\nname: monitoring\nversion: 1.0.0\n")
    (tree / "templates" / "crd.yaml").write_text(textwrap.dedent("""\
        apiVersion: apiextensions.k8s.io/v1
        kind: CustomResourceDefinition
        metadata: {name: servicemonitors.monitoring.coreos.com}
        spec:
          group: monitoring.coreos.com
          names: {kind: ServiceMonitor, plural: servicemonitors}
          scope: Namespaced
          versions:
          - name: v1
            served: true
            storage: true
            schema: {openAPIV3Schema: {type: object, properties: {spec: {type: object}}}}
        {{- if .Capabilities.APIVersions.Has "monitoring.coreos.com/v1" }}
        ---
        apiVersion: monitoring.coreos.com/v1
        kind: ServiceMonitor
        metadata: {name: self}
        spec: {endpoints: []}
        {{- end }}
        """))
    return _release("monitoring", "monitoring", "1.0.0", {})


def _commit(rendered: rendering.RenderedStack, plans: Path) -> None:
    for release in rendered.releases.values():
        for rel, text in rendered_files(release).items():
            (plans / "s" / rel).parent.mkdir(parents=True, exist_ok=True)
            (plans / "s" / rel).write_text(text)


def test_a_committed_plan_serves_its_renders_without_helm(tmp_path: Path, demo: Path) -> None:
    monitoring = _monitoring_chart(tmp_path / "up")
    real = _render(tmp_path, {"name": "web"}, monitoring)
    assert real.renders == 4  # demo twice (generated material), monitoring before and after its own CRD is known
    assert len(real.releases["monitoring"].history) == 2
    plans = tmp_path / "plans"
    _commit(real, plans)
    clean = _render(tmp_path, {"name": "web"}, monitoring, cache="clean-clone", plans=plans)
    assert clean.renders == 0
    assert clean.releases == real.releases  # objects (the CRD with its schema), keys and every render's CRDs
    assert clean.api_versions == real.api_versions
    assert _render(tmp_path, {"name": "web"}, monitoring, cache="clean-clone", plans=plans).renders == 0
    assert _render(tmp_path, {"name": "api"}, monitoring, cache="other", plans=plans).renders == 2  # new values


def test_a_hand_edited_committed_plan_is_rendered_again(tmp_path: Path, demo: Path) -> None:
    real = _render(tmp_path, {"name": "web"})
    plans = tmp_path / "plans"
    _commit(real, plans)
    deployment = plans / "s" / "rendered" / "demo" / "deployment.web.yaml"
    deployment.write_text(deployment.read_text().replace("replicas: 1", "replicas: 9"))
    edited = _render(tmp_path, {"name": "web"}, cache="clean-clone", plans=plans)
    assert edited.renders == 2
    assert edited.releases == real.releases


def test_a_chart_tree_edit_misses_every_cache(tmp_path: Path, demo: Path) -> None:
    real = _render(tmp_path, {"name": "web"})
    _commit(real, tmp_path / "plans")
    (demo / "values.yaml").write_text("replicas: 4\nimage: registry.example/demo:1.0.0\n")
    os.utime(demo / "values.yaml", ns=(0, 0))  # the content decides, not the file's times
    rendering._tree_facts.cache_clear()
    edited = _render(tmp_path, {"name": "web"}, plans=tmp_path / "plans")
    assert edited.renders == 2
    assert next(edited.releases["demo"].of_kind("Deployment"))["spec"]["replicas"] == 4


def test_a_change_to_the_code_that_runs_helm_misses_every_cache(tmp_path: Path, demo: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    real = _render(tmp_path, {"name": "web"})
    _commit(real, tmp_path / "plans")
    template = helm.template

    def changed(*args: Any, **kwargs: Any) -> str:  # what an edit of helm.template's command line amounts to
        return template(*args, **kwargs).replace("replicas: 1", "replicas: 2")

    monkeypatch.setattr(helm, "template", changed)
    edited = _render(tmp_path, {"name": "web"}, plans=tmp_path / "plans")
    assert edited.renders == 2
    assert next(edited.releases["demo"].of_kind("Deployment"))["spec"]["replicas"] == 2


def test_the_cache_drops_the_least_recently_used_renders_beyond_its_size(tmp_path: Path, demo: Path) -> None:
    _render(tmp_path, {"name": "web"})
    cache = tmp_path / "cache"
    (current,) = cache.glob("*.json")
    size = current.stat().st_size
    old = [cache / f"{n:064x}.json" for n in range(3)]
    for age, path in enumerate(old, start=1):
        path.write_text("x" * size)
        os.utime(path, (time.time() - 100 * age, time.time() - 100 * age))
    stale, fresh = cache / "a.partial", cache / "b.partial"
    stale.write_text("")
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    fresh.write_text("")
    os.utime(current, (time.time() - 1000, time.time() - 1000))
    assert _render(tmp_path, {"name": "web"}).renders == 0  # a hit: now the most recently used
    render_cache.prune_cache(cache, limit=2 * size)
    assert sorted(p.name for p in cache.iterdir()) == sorted([current.name, old[0].name, fresh.name])
    assert _render(tmp_path, {"name": "api"}).renders == 2  # a miss writes, then prunes to CACHE_BYTES
    assert len(list(cache.glob("*.json"))) == 3


@pytest.mark.parametrize(("reference", "pinned"), [
    ("nvcr.io/nvidia/gpu-operator:main-latest", False), ("busybox", False), ("repo/app:latest", False),
    ("localhost:5000/app", False), ("repo/app:nightly", False), ("quay.io/cilium/cilium:v1.20.0", True),
    ("repo/app:latest@sha256:" + "0" * 64, True), ("localhost:5000/app:1.2", True),
    ("repo/app:latest\n", False), ("repo/app:main\n", False), ("repo/app:1.2 ", False),
    ("quay.io/prometheus/alertmanager:v0.34.0:v0.34.0", False),
])
def test_an_image_is_pinned_by_a_release_tag_or_a_digest(reference: str, pinned: bool) -> None:
    assert is_pinned(reference) is pinned


def test_every_stack_renders_every_release_with_pinned_images_only() -> None:
    for stack in available_stacks():
        planned = plan_stack(read_stack(stack))
        releases = {r.inputs["name"] for r in planned.recording.resources if r.type == rendering.RELEASE}
        assert set(planned.rendered.releases) == releases, stack
        assert all(r.objects for r in planned.rendered.releases.values()), stack
        assert unpinned(planned.rendered) == [], stack


def test_a_default_image_is_the_stamped_releases_not_the_trees() -> None:
    """The GPU Operator's tree defaults its operator and validator to .Chart.AppVersion, `main-latest` in the
    source; rendered from the archive stamped as NVIDIA packages v26.7.0, the default is the release's tag."""
    planned = plan_stack(stack_file(FLEET))
    records = []
    for record in planned.recording.resources:
        if record.type == rendering.RELEASE and record.inputs["chart"] == "gpu-operator":
            values = {k: v for k, v in record.inputs["values"].items() if k not in ("operator", "validator")}
            record = dataclasses.replace(record, inputs={**record.inputs, "values": values})
            records.append(record)
    rendered = render_releases(Recording(resources=records), planned.settings.cluster.kubernetes_version)
    operator = next(o for o in rendered.releases["gpu-operator"].of_kind("Deployment")
                    if o["metadata"]["name"] == "gpu-operator")
    version = rendered.releases["gpu-operator"].version
    assert operator["spec"]["template"]["spec"]["containers"][0]["image"].endswith(f":{version}")
    assert unpinned(rendered) == []


def _chart_labels(obj: Any) -> Any:
    """Every `helm.sh/chart` label of an object and of the pods it templates."""
    for metadata in (obj.get("metadata") or {}, ((obj.get("spec") or {}).get("template") or {}).get("metadata") or {}):
        label = (metadata.get("labels") or {}).get("helm.sh/chart")
        if label is not None:
            yield str(label)


def test_every_chart_label_reads_the_pinned_version() -> None:
    """Publishers stamp the release into Chart.yaml when they package it; the trees are unstamped sources, so the
    plan stamps them as `helm package --version --app-version` does (Karpenter's tree says 1.13.0, the GPU
    Operator's v1.0.0-devel, Rook's 0.0.1)."""
    for stack in available_stacks():
        for release in plan_stack(read_stack(stack)).rendered.releases.values():
            own = [label for obj in release.objects for label in _chart_labels(obj)
                   if label.startswith(f"{release.chart}-") and label[len(release.chart) + 1:][:1].isdigit()
                   or label.startswith(f"{release.chart}-v")]
            assert all(label == f"{release.chart}-{release.version}" for label in own), (stack, release.name, own)


def test_a_tree_that_needs_a_stamp_nobody_recorded_is_refused(tmp_path: Path, demo: Path) -> None:
    (demo / "Chart.yaml").write_text("apiVersion: v2\nname: demo\nversion: 0.9.0\n")
    rendering._tree_facts.cache_clear()
    with pytest.raises(RenderError, match=r"Helm release demo: the demo 1\.0\.0 source tree's Chart.yaml says "
                                          r"version 0\.9\.0: .*appVersion.*platform/charts\.yaml"):
        _render(tmp_path, {"name": "web"})


def test_rendered_files_are_one_per_object_and_crds_keep_only_schema_digests() -> None:
    planned = plan_stack(stack_file(FLEET))
    files = plan_files(planned.recording, planned.rendered)
    rendered = {path: text for path, text in files.items() if path.startswith("rendered/") and path.endswith(".yaml")}
    assert len(rendered) == sum(len(r.objects) for r in planned.rendered.releases.values())
    assert {path for path in files if path.startswith("rendered/") and not path.endswith(".yaml")} == {
        f"rendered/{r.name}/{name}" for r in planned.rendered.releases.values()
        for name in (render_cache.RECORD, *([render_cache.SCHEMAS] if any(r.of_kind("CustomResourceDefinition"))
                                            else []))}
    crds = [yaml.safe_load(text) for path, text in rendered.items() if "/customresourcedefinition." in path]
    assert crds and all("openAPIV3Schema" not in str(crd) for crd in crds)
    assert all(v["schema"]["sha256"] for crd in crds for v in crd["spec"]["versions"] if "schema" in v)


def test_the_helm_binary_is_the_pinned_release() -> None:
    binary = helm.helm_binary()
    version = subprocess.run([str(binary), "version", "--template", "{{.Version}}"], capture_output=True, text=True,
                             check=True).stdout
    assert version == helm.HELM.version
    assert helm.file_sha256(binary) == helm.HELM.sha256


def test_a_different_binary_is_refused(tmp_path: Path) -> None:
    fake = tmp_path / "helm"
    fake.write_text("#!/bin/sh\necho v3.19.0\n")
    with pytest.raises(helm.InputError, match="is not Helm v3.19.0"):
        helm.helm_binary.__wrapped__(fake)
    with pytest.raises(helm.InputError, match="no Helm binary"):
        helm.helm_binary.__wrapped__(tmp_path / "missing")


def test_a_helm_binary_this_machine_cannot_run_is_one_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The verified binary on a machine that cannot execute it (arm64, a noexec mount): InputError, no traceback."""
    fake = tmp_path / "helm"
    fake.write_bytes(b"\x7fELF not for this machine")
    fake.chmod(0o755)
    monkeypatch.setattr(helm, "HELM", dataclasses.replace(helm.HELM, sha256=helm.file_sha256(fake)))
    monkeypatch.setattr(helm, "helm_binary", lambda: fake)
    with pytest.raises(helm.InputError, match=r"^cannot run Helm .*/helm: Exec format error; install it"):
        helm.package(tmp_path, version="1.0.0", app_version="1.0.0", destination=tmp_path / "out")
    monkeypatch.undo()
    monkeypatch.setattr(helm, "HELM", dataclasses.replace(helm.HELM, sha256=helm.file_sha256(fake)))
    monkeypatch.setattr(helm.platform, "machine", lambda: "aarch64")
    with pytest.raises(helm.InputError, match=r"is a linux-amd64 binary and this machine is Linux aarch64"):
        helm.helm_binary.__wrapped__(fake)


def test_plan_cli_stops_on_a_release_that_does_not_render(tmp_path: Path) -> None:
    """One message naming the release, exit 2, no traceback, nothing written."""
    upstream = tmp_path / "up"
    tree = upstream_dir() / "chart-src"
    for path in tree.iterdir():
        if path.name != "volcano":
            (upstream / "chart-src").mkdir(parents=True, exist_ok=True)
            (upstream / "chart-src" / path.name).symlink_to(path)
    env = {"PATH": "/usr/bin:/bin", "TRAINYARD_UPSTREAM": str(upstream),
           "TRAINYARD_RENDER_CACHE": str(tmp_path / "cache")}
    result = subprocess.run([sys.executable, "-m", "trainyard", "plan", "--stack", LAPTOP[0], "--stacks-dir",
                             str(OWNED_STACKS), "--out", str(tmp_path / "out")], capture_output=True, text=True,
                            cwd=ROOT, env=env, timeout=300)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: Helm release volcano: no chart source tree for volcano")
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


def test_an_operator_resource_image_is_read_as_its_operator_pulls_it() -> None:
    """The Prometheus Operator pulls spec.image as written (its version only picks the config); the GPU Operator
    joins repository, image and version, with `@` for a digest."""
    alertmanager = {"apiVersion": "monitoring.coreos.com/v1", "kind": "Alertmanager",
                    "spec": {"image": "quay.io/prometheus/alertmanager:v0.34.0", "version": "v0.34.0"}}
    digest = "sha256:" + "a" * 64
    policy = {"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy",
              "spec": {"validator": {"repository": "nvcr.io/nvidia", "image": "gpu-operator-validator",
                                     "version": "v26.7.0"},
                       "driver": {"repository": "nvcr.io/nvidia", "image": "driver", "version": digest}}}
    assert [ref for _, ref in images(alertmanager)] == ["quay.io/prometheus/alertmanager:v0.34.0"]
    assert sorted(ref for _, ref in images(policy)) == [f"nvcr.io/nvidia/driver@{digest}",
                                                        "nvcr.io/nvidia/gpu-operator-validator:v26.7.0"]
