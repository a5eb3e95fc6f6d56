"""README "Adding an add-on", done for real: a copy of the repository gets an example add-on by the README's steps,
each file edited by hand being one the README names and the lock written by `tools/upstream.py add`; its plan
renders it wired like every other add-on (monitoring, ordering, settings, conformance) and the checks the suite
makes of every chart (release data, the lock) pass for it.

The chart is fictional (`example-exporter`): its package, as `helm pull` would leave it, is a fixture here,
locked with `tools/upstream.py add` into a cache beside the copy; the plan renders the tree with Helm, and
conformance checks the values against its defaults, as for real charts.
"""

from __future__ import annotations

import fnmatch
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from owned_stacks import Stack, sample_stacks, stack_settings
from trainyard.config.release_check import chart_pins, unverified
from trainyard.plan.conformance import check_helm_values, upstream_dir

ROOT = Path(__file__).resolve().parents[2]
CHART, VERSION, KEY = "example-exporter", "1.0.0", "exampleExporter"


def _runs_what_it_waits_for(stack: Stack) -> bool:
    """The CNI, the add-on it needs (Volcano) and monitoring (its ServiceMonitor), which the checks below read."""
    addons = stack_settings(stack).addons
    return addons.cilium.enabled and addons.volcano.enabled and addons.monitoring.enabled


# The user's stacks the steps edit (whatever stacks/ holds): one that runs what the add-on waits for sets its
# interval, another turns it off.
ON = next(name for name, folder in sample_stacks() if _runs_what_it_waits_for((name, folder)))
OFF = next(name for name, _ in sample_stacks() if name != ON)

# 1. Catalogue data: the pin, base values, the add-on's declaration.
PIN = f"""  {CHART}:
    chart: {CHART}
    repository: https://charts.example.invalid
    version: {VERSION}
    namespace: example
"""
VALUES = """nodeSelector:
  trainyard.io/role: system
serviceMonitor:
  enabled: true
"""
DECLARATION = f"""  {KEY}:
    charts: [{CHART}]
    component: example_exporter
    needs: [volcano]
    crds: {{{CHART}: [example.invalid]}}
    serviceMonitors: {{{CHART}: [serviceMonitor.enabled]}}
"""
# 2. The component: one release with a value computed from its settings.
COMPONENT = '''"""Example add-on: one chart, one computed value."""

from __future__ import annotations

from trainyard.config.model import ExampleExporterSettings
from trainyard.platform.addon import AddonCode, AddonContext
from trainyard.platform.chart_addon import ChartAddon, ChartAddonArgs


def build(ctx: AddonContext) -> ChartAddon:
    return ChartAddon(ctx.addon.resource_name, ChartAddonArgs(
        type_name=ctx.addon.type_name, chart=ctx.chart("example-exporter"), cluster=ctx.cluster,
        values={"serviceMonitor": {"interval": ctx.settings(ExampleExporterSettings).interval}},
        depends_on=ctx.monitored))


COMPONENT = AddonCode(build=build)
'''
# 3. Its settings beyond `enabled`: config's, typed in config/model.py.
ANCHOR = "class AddonSettings(Model):"
SETTINGS = '''class ExampleExporterSettings(AddonSwitch):
    interval: str = "30s"


'''
SETTINGS_FIELD = "    example_exporter: ExampleExporterSettings = ExampleExporterSettings()\n"
UNVERIFIED = f"""- pin: chart/{CHART}={VERSION}
  reason: A fictional chart of tests/platform/test_adding_an_addon.py; no repository index lists it.
"""
PACKAGE = f"https://charts.example.invalid/{CHART}-{VERSION}.tgz"
# Upstream defaults of the fictional chart (the fixture conformance checks against).
UPSTREAM_VALUES = """nodeSelector: {}
tolerations: []
serviceMonitor:
  enabled: false
  interval: 60s
"""


# Its source tree: a Deployment placed by the values, and the ServiceMonitor where the cluster serves the CRD.
CHART_YAML = f"apiVersion: v2\nname: {CHART}\nversion: {VERSION}\nappVersion: {VERSION}\n"
TEMPLATE = """apiVersion: apps/v1
kind: Deployment
metadata: {name: example-exporter}
spec:
  replicas: 1
  selector: {matchLabels: {app: example-exporter}}
  template:
    metadata: {labels: {app: example-exporter}}
    spec:
      nodeSelector: {{- toYaml .Values.nodeSelector | nindent 8 }}
      tolerations: {{- toYaml .Values.tolerations | nindent 8 }}
      containers: [{name: exporter, image: "registry.example.invalid/example-exporter:{{ .Chart.AppVersion }}"}]
{{- if and .Values.serviceMonitor.enabled (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1") }}
---
apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata: {name: example-exporter}
spec:
  selector: {matchLabels: {app: example-exporter}}
  endpoints: [{port: metrics, interval: {{ .Values.serviceMonitor.interval }}}]
{{- end }}
"""


def _copy(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    for part in ("Pulumi.yaml", "infra", "platform", "stacks", "workloads/configs", "tools"):
        source, target = ROOT / part, repo / part
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return repo


def _files(repo: Path) -> dict[str, str]:
    return {p.relative_to(repo).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in repo.rglob("*") if p.is_file() and "__pycache__" not in p.parts}


def _add_example(repo: Path) -> None:
    platform = repo / "platform"
    (platform / "charts.yaml").write_text((platform / "charts.yaml").read_text() + PIN)
    (platform / CHART).mkdir()
    (platform / CHART / "values.yaml").write_text(VALUES)
    (platform / "addons.yaml").write_text((platform / "addons.yaml").read_text() + DECLARATION)
    (repo / "infra" / "trainyard" / "platform" / "example_exporter.py").write_text(COMPONENT)
    # 3. The settings type and its field of AddonSettings; the stack switch: one stack sets its interval (on by
    # default), another turns it off.
    model = repo / "infra" / "trainyard" / "config" / "model.py"
    model.write_text(_with_settings(model.read_text()))
    for stack, section in ((ON, {"interval": "15s"}), (OFF, {"enabled": False})):
        path = repo / "stacks" / f"Pulumi.{stack}.yaml"
        document = yaml.safe_load(path.read_text())
        document["config"].setdefault("trainyard:addons", {})[KEY] = section
        path.write_text(yaml.safe_dump(document, sort_keys=False))
    # Release data: no chart repository index confirms a fictional chart, so it is listed with the reason.
    unverified = repo / "infra" / "trainyard" / "config" / "release_data" / "unverified.yaml"
    unverified.write_text(unverified.read_text() + UNVERIFIED)


def _with_settings(model: str) -> str:
    """config/model.py with the settings class before AddonSettings and its field last in AddonSettings."""
    start = model.index(ANCHOR)
    end = model.index("\n\n\n", start) + 1
    return model[:start] + SETTINGS + model[start:end] + SETTINGS_FIELD + model[end:]


def _link(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:  # another file system
        shutil.copy2(source, target)


def _upstream(tmp_path: Path, repo: Path) -> Path:
    """A cache holding the real upstream data, and the fixture chart locked into it by `tools/upstream.py add`."""
    # A copy of the real cache (hard links: instant, and no symbolic link, which the tool never follows), without
    # its verification stamp, which the tool rewrites for the copy's lock.
    upstream = tmp_path / "upstream"
    shutil.copytree(upstream_dir(ROOT), upstream, copy_function=_link, ignore=shutil.ignore_patterns(".verified"))
    pulled = tmp_path / "pulled" / f"{CHART}-{VERSION}.tgz"  # what `helm pull <repository>/example-exporter` leaves
    pulled.parent.mkdir()
    with tarfile.open(pulled, "w:gz") as package:
        for name, text in (("Chart.yaml", CHART_YAML), ("values.yaml", UPSTREAM_VALUES),
                           ("templates/deployment.yaml", TEMPLATE)):
            member = tarfile.TarInfo(f"{CHART}/{name}")
            member.size = len(text.encode())
            package.addfile(member, io.BytesIO(text.encode()))
    added = subprocess.run([sys.executable, "tools/upstream.py", "add", CHART, VERSION, "--source", PACKAGE,
                            "--package", str(pulled), "--dest", str(upstream)], cwd=repo, capture_output=True,
                           text=True, timeout=120)
    assert added.returncode == 0, added.stderr
    return upstream


def _plan(repo: Path, stack: str, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    # The copy reads the fixture upstream data, and shares the checkout's render cache (keyed by all a render reads).
    env = {**os.environ, "PYTHONPATH": f"{repo / 'infra'}{os.pathsep}{repo / 'workloads'}",
           "TRAINYARD_UPSTREAM": str(repo.parent / "upstream"),
           "TRAINYARD_RENDER_CACHE": str(ROOT / "build" / "render-cache")}
    return subprocess.run([sys.executable, "-m", "trainyard", "plan", "--stack", stack, "--quiet", "--out", str(out),
                           *extra], capture_output=True, text=True, cwd=repo, env=env, timeout=300)


def _upstream_of(resources: dict[str, dict[str, Any]], urn: str) -> set[str]:
    seen: set[str] = set()
    todo = [urn]
    while todo:
        record = resources.get(todo.pop())
        for nxt in (*record["depends_on"], *([record["parent"]] if record["parent"] else [])) if record else ():
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp_path = tmp_path_factory.mktemp("addon")
    repo = _copy(tmp_path)
    before = _files(repo)
    _add_example(repo)
    by_hand = _files(repo)
    upstream = _upstream(tmp_path, repo)
    after = _files(repo)
    edited = {path for path in by_hand if by_hand[path] != before.get(path)}
    named = _readme_paths()
    assert sorted(p for p in edited if not any(fnmatch.fnmatch(p, pattern) for pattern in named)) == [], named
    assert {path for path in after if after[path] != by_hand.get(path)} == {"tools/upstream.lock.yaml"}
    return repo, upstream


def _readme_paths() -> list[str]:
    """The files README "Adding an add-on" names, placeholders (`<chart>`) as wildcards."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Adding an add-on"):readme.index("## Stack configuration")]
    return [re.sub(r"<[^>]+>", "*", span) for span in re.findall(r"`([\w./<>-]+/[\w./<>-]+)`", section)]


def test_the_suite_checks_of_every_chart_pass_for_it(example: tuple[Path, Path]) -> None:
    repo, _ = example
    data = repo / "infra" / "trainyard" / "config" / "release_data"
    listed = unverified(data)
    assert [p.name for p in chart_pins(repo, data) if not p.confirmed and p.name not in listed] == []
    assert f"chart/{CHART}={VERSION}" in listed
    lock = yaml.safe_load((repo / "tools" / "upstream.lock.yaml").read_text())
    assert f"chart-src/{CHART}/{VERSION}" in {tree["path"] for tree in lock["trees"]}
    assert {e["url"] for e in lock["files"] if e["path"].startswith(f"charts/{CHART}/")} == {PACKAGE}


def test_the_example_addon_renders_wired_like_every_other(example: tuple[Path, Path], tmp_path: Path) -> None:
    repo, upstream = example
    out = tmp_path / ON
    result = _plan(repo, ON, out)
    assert result.returncode == 0, result.stderr
    resources = {r["urn"]: r for r in json.loads((out / "resources.json").read_text())}
    (component,) = [r for r in resources.values() if r["type"] == "trainyard:platform:ExampleExporter"]
    assert component["name"] == "example-exporter"
    releases = {r["inputs"]["chart"]: r for r in resources.values() if r["type"] == "kubernetes:helm.sh/v3:Release"}
    release = releases[CHART]
    assert release["parent"] == component["urn"]
    # Monitoring: the chart's ServiceMonitor is on and waits for the monitoring CRDs; settings reach the values.
    assert release["inputs"]["values"]["serviceMonitor"] == {"enabled": True, "interval": "15s"}
    waits = _upstream_of(resources, release["urn"])
    # Ordering: after the CNI, the add-on it needs (Volcano) and kube-prometheus-stack.
    for chart in ("cilium", "volcano", "kube-prometheus-stack"):
        assert releases[chart]["urn"] in waits, chart
    # Conformance: the rendered values against the chart's upstream defaults.
    rendered = yaml.safe_load((out / "helm" / f"example.{CHART}.yaml").read_text())
    assert check_helm_values(rendered, upstream=upstream) == []
    assert check_helm_values({**rendered, "values": {**rendered["values"], "nodeSelctor": {}}}, upstream=upstream)
    # Helm rendered the chart with those values, the ServiceMonitor included (the stack installs its CRD).
    objects = out / "rendered" / CHART
    deployment = yaml.safe_load((objects / "deployment.example-exporter.yaml").read_text())
    assert deployment["spec"]["template"]["spec"]["nodeSelector"] == {"trainyard.io/role": "system"}
    assert (objects / "servicemonitor.example-exporter.yaml").is_file()
    # The rehearsal reads its pods from the rendered chart and finds a node for them.
    rehearsal = _plan(repo, ON, tmp_path / "rehearsed", "--rehearse")
    assert rehearsal.returncode == 0, rehearsal.stdout + rehearsal.stderr


def test_the_stack_switch_turns_it_off_and_typos_are_refused(example: tuple[Path, Path], tmp_path: Path) -> None:
    repo, _ = example
    result = _plan(repo, OFF, tmp_path / "off")
    assert result.returncode == 0, result.stderr
    assert CHART not in (tmp_path / "off" / "resources.json").read_text()
    path = repo / "stacks" / f"Pulumi.{OFF}.yaml"
    document = yaml.safe_load(path.read_text())
    document["config"]["trainyard:addons"][KEY] = {"enabled": False, "intervall": "1m"}
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    result = _plan(repo, OFF, tmp_path / "typo")
    assert result.returncode == 2
    assert f"trainyard:addons.{KEY}.intervall: unknown key" in result.stderr + result.stdout
