"""Review R1: Helm installs a chart's crds/ on first install only (pkg/action/upgrade.go has no CRD step), so the
diff names a change to one of them as not applied by `pulumi up`, with the chart file to apply."""

from __future__ import annotations

import textwrap
from pathlib import Path

from trainyard.plan.crd_upgrades import install_only_crds, not_applied
from trainyard.plan.diff import StackDiff, format_diff


def _crd(name: str, version: str = "v1") -> str:
    return textwrap.dedent(f"""\
        apiVersion: apiextensions.k8s.io/v1
        kind: CustomResourceDefinition
        metadata: {{name: {name}}}
        spec:
          group: example.io
          names: {{kind: {name.split('.')[0].title()}, plural: {name.split('.')[0]}}}
          scope: Namespaced
          versions: [{{name: {version}, served: true, storage: true}}]
        """)


def _chart(root: Path) -> Path:
    """crds/ of the chart (one) and of a subchart named crds (one), a CRD in templates/, and a crds/ folder that is
    not a chart's."""
    tree = root / "chart"
    files = {"crds/foos.yaml": _crd("foos.example.io"), "charts/crds/crds/all/bars.yaml": _crd("bars.example.io"),
             "templates/bazs.yaml": _crd("bazs.example.io"), "files/crds/quxs.yaml": _crd("quxs.example.io"),
             "Chart.yaml": "apiVersion: v2\nname: chart\nversion: 1.0.0\n"}
    for rel, text in files.items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(text)
    return tree


def _plan(root: Path, crds: dict[str, str], hook: bool = False) -> Path:
    folder = root / "rendered" / "demo"
    folder.mkdir(parents=True)
    for name, text in crds.items():
        (folder / f"customresourcedefinition.{name}.yaml").write_text(text)
    if hook:
        (folder / "job.demo-upgrade-crd.yaml").write_text(
            "kind: Job\nmetadata: {name: demo-upgrade-crd, annotations: {helm.sh/hook: 'pre-install,pre-upgrade'}}\n")
    return root


def test_the_crds_helm_installs_only_on_first_install_are_those_of_crds_directories(tmp_path: Path) -> None:
    tree = _chart(tmp_path)
    assert {name: path.relative_to(tree).as_posix() for name, path in install_only_crds(tree).items()} == {
        "foos.example.io": "crds/foos.yaml", "bars.example.io": "charts/crds/crds/all/bars.yaml"}


def test_a_changed_or_added_crds_directory_crd_is_named_with_the_file_to_apply(tmp_path: Path) -> None:
    tree = _chart(tmp_path)
    base = _plan(tmp_path / "base", {n: _crd(n) for n in ("foos.example.io", "bazs.example.io")})
    head = _plan(tmp_path / "head", {n: _crd(n, "v2") for n in ("foos.example.io", "bars.example.io",
                                                                 "bazs.example.io")}, hook=True)
    found = not_applied(base, head, {"demo": tree})
    assert [(c.name, c.change) for c in found] == [("bars.example.io", "added"), ("foos.example.io", "changed")]
    assert str(found[1]) == (f"demo: CRD foos.example.io changed, which Helm's upgrade does not apply (unless its "
                             f"pre-upgrade hook Job/demo-upgrade-crd applies it): kubectl apply --server-side -f "
                             f"{tree / 'crds/foos.yaml'}")
    text = format_diff([StackDiff("fleet", crds=tuple(found))], "text")
    assert "CRDs `pulumi up` will not apply" in text and f"  {found[0]}" in text
    assert not_applied(base, base, {"demo": tree}) == []  # unchanged: nothing to apply


def test_a_release_the_base_does_not_install_gets_its_crds_on_first_install(tmp_path: Path) -> None:
    tree = _chart(tmp_path)
    (tmp_path / "base").mkdir()
    head = _plan(tmp_path / "head", {"foos.example.io": _crd("foos.example.io")})
    assert not_applied(tmp_path / "base", head, {"demo": tree}) == []
