"""Every entry point (plan, diff, graph, the config loader) meets bad input with one message and exit 2, and
never deletes or overwrites a file it did not write."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from owned_stacks import OWNED_STACKS
from trainyard.__main__ import main
from trainyard.plan import writers
from trainyard.plan.recording import Recording
from trainyard.plan.runtime import available_stacks
from trainyard.plan.writers import MARKER, write_plan

ROOT = Path(__file__).resolve().parents[2]
# The tests' own fleet stack (tests/fixtures/stacks): the bad stacks below are edits of its text.
FLEET_TEXT = (OWNED_STACKS / "Pulumi.fleet.yaml").read_text()


def _edited(old: str, new: str) -> bytes:
    """The fleet's text with `old` replaced: an edit that no longer matches fails here, not as a stack that passes."""
    assert old in FLEET_TEXT, f"Pulumi.fleet.yaml has no {old!r}"
    return FLEET_TEXT.replace(old, new).encode()


# Stack files that must each be refused: name -> text.
BAD_STACKS: dict[str, bytes] = {
    "syntax": b"config:\n  trainyard:tenants: [a,\n",
    "tab": b"config:\n\ttrainyard:target: aws\n",
    "python-tag": b"config:\n  trainyard:target: !!python/object/apply:os.system [touch /tmp/pwned]\n",
    "top-list": b"- config: {}\n",
    "config-list": b"config: [1, 2]\n",
    "int-key": b"config:\n  1: x\n",
    "non-utf8": b"config:\n  trainyard:target: \xff\n",
    "duplicate": _edited("  trainyard:target: aws\n", "  trainyard:target: aws\n  trainyard:target: local\n"),
    "plaintext-secret": (FLEET_TEXT + "  trainyard:grafanaAdminPassword: hunter2\n").encode(),
    "bomb": b"a: &a [x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a]\nconfig: {c: *b}\n",
    "trainer-config-path": _edited("trainerConfig: tiny.yaml", "trainerConfig: /etc/os-release"),
    "tenant-in-monitoring": _edited("    - name: research\n", "    - name: research\n      namespace: monitoring\n"),
    "region-mismatch": (FLEET_TEXT + "  aws:region: us-east-1\n").encode(),
    # Values that passed validation and then crashed `plan --out` (issue 24): each is now named by its key.
    "tenant-in-gpu-health": _edited("    - name: research\n", "    - name: research\n      namespace: gpu-health\n"),
    "tenant-named-default": _edited("  trainyard:fabricCheck:", "    - name: default\n      namespace: team-d\n"
                                    "  trainyard:fabricCheck:"),
    "tenant-named-root": _edited("  trainyard:fabricCheck:", "    - name: root\n  trainyard:fabricCheck:"),
    # Three Ceph replicas, one per zone (failureDomain: zone), in two zones.
    "ceph-zones-too-few": _edited("availabilityZones: [us-west-2a, us-west-2b, us-west-2c]",
                                  "availabilityZones: [us-west-2a, us-west-2b]"),
    "dataset-prefix-wildcard": _edited("    alluxio:\n", "    alluxio:\n      datasetPrefix: 'data*/'\n"),
    "dataset-prefix-no-slash": _edited("    alluxio:\n", "    alluxio:\n      datasetPrefix: datasets\n"),
    "zone-not-a-letter": _edited("us-west-2b, us-west-2c]", "us-west-2b, us-west-2-]"),
    "checkpoint-of-zero": _edited("checkpointSize: 10Gi", "checkpointSize: '0'"),
    "lookalike-key": _edited("  trainyard:fabricCheck:", "  trainyard:f\u0430bricCheck:"),
    "zero-width-key": _edited("      weight: 1\n", "      we\u200bight: 1\n"),
}


@pytest.fixture
def stacks_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "stacks"
    folder.mkdir()
    for name, text in BAD_STACKS.items():
        (folder / f"Pulumi.{name}.yaml").write_bytes(text)
    (folder / "Pulumi.good.yaml").write_text(FLEET_TEXT)
    return folder


def _file(tmp_path: Path) -> str:
    path = tmp_path / "notes.txt"
    path.write_text("mine\n")
    return str(path)


def _folder_with_notes(tmp_path: Path) -> str:
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine\n")
    return str(folder)


def _read_only(tmp_path: Path) -> str:
    # sysfs refuses new entries to every user, root included (a chmod 500 folder does not stop root).
    return "/sys/trainyard-plan"


def _no_folder(tmp_path: Path) -> str:
    return str(tmp_path / "missing" / "graph.dot")


def _earlier_plan(tmp_path: Path, marker_lines: str = "") -> Path:
    out = tmp_path / "plan"
    write_plan(_recording("a"), out)
    with (out / MARKER).open("a") as marker:
        marker.write(marker_lines)
    return out


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim"
    victim.mkdir(exist_ok=True)
    (victim / "ns.configmap.a.yaml").write_text("mine\n")
    return victim


def _marker_with(line: str) -> Callable[[Path], str]:
    return lambda t: str(_earlier_plan(t, f"{line}\n"))


def _linked(folder: str) -> Callable[[Path], str]:
    """An earlier plan whose `folder` was replaced by a link (as a pull request can commit one)."""
    def build(tmp_path: Path) -> str:
        out = _earlier_plan(tmp_path)
        victim = _victim(tmp_path)
        shutil.rmtree(out / folder)
        (out / folder).symlink_to(victim)
        return str(out)
    return build


def _linked_file(tmp_path: Path) -> str:
    out = _earlier_plan(tmp_path)
    victim = _victim(tmp_path)
    (out / "manifests" / "ns.configmap.a.yaml").unlink()
    (out / "manifests" / "ns.configmap.a.yaml").symlink_to(victim / "ns.configmap.a.yaml")
    return str(out)


def _out_is_a_link(tmp_path: Path) -> str:
    (tmp_path / "plan").symlink_to(_victim(tmp_path))
    return str(tmp_path / "plan")


def _graph_link(tmp_path: Path) -> str:
    target = tmp_path / "theirs.dot"
    target.write_text("digraph trainyard {}\n")
    (tmp_path / "graph.dot").symlink_to(target)
    return str(tmp_path / "graph.dot")


def _graph_over_notes(tmp_path: Path) -> str:
    path = tmp_path / "notes.dot"
    path.write_text("my own notes\n")
    return str(path)


# (id, argv built from the stacks folder and tmp_path)
Argv = Callable[[Path, Path], list[str]]
CASES: list[tuple[str, Argv]] = [
    *((f"plan-{name}", lambda s, t, name=name: ["plan", "--stack", name, "--stacks-dir", str(s), "--out",
                                                str(t / "out")])
      for name in BAD_STACKS),
    ("plan-unknown-stack", lambda s, t: ["plan", "--stack", "nope", "--stacks-dir", str(s)]),
    ("plan-path-stack", lambda s, t: ["plan", "--stack", "../stacks/Pulumi.good", "--stacks-dir", str(s)]),
    ("plan-absolute-stack", lambda s, t: ["plan", "--stack", "/etc/passwd", "--stacks-dir", str(s)]),
    ("plan-out-is-a-file", lambda s, t: ["plan", "--stack", "good", "--stacks-dir", str(s), "--out", _file(t)]),
    ("plan-out-has-user-files", lambda s, t: ["plan", "--stack", "good", "--stacks-dir", str(s), "--out",
                                              _folder_with_notes(t)]),
    ("plan-out-unwritable", lambda s, t: ["plan", "--stack", "good", "--stacks-dir", str(s), "--out",
                                          _read_only(t)]),
    ("plan-out-marker-nul", lambda s, t: ["plan", "--stack", "good", "--stacks-dir", str(s), "--out",
                                          _marker_with("manifests/a\x00.yaml")(t)]),
    ("plan-out-marker-dotdot", lambda s, t: ["plan", "--stack", "good", "--stacks-dir", str(s), "--out",
                                             _marker_with("manifests/../../victim/ns.configmap.a.yaml")(t)]),
    ("plan-out-marker-absolute", lambda s, t: ["plan", "--stack", "good", "--stacks-dir", str(s), "--out",
                                               _marker_with(f"{t}/victim/ns.configmap.a.yaml")(t)]),
    ("plan-out-marker-folder", lambda s, t: ["plan", "--stack", "good", "--stacks-dir", str(s), "--out",
                                             _marker_with("manifests")(t)]),
    ("plan-out-manifests-link", lambda s, t: ["plan", "--stack", "good", "--stacks-dir", str(s), "--out",
                                              _linked("manifests")(t)]),
    ("plan-out-helm-link", lambda s, t: ["plan", "--stack", "good", "--stacks-dir", str(s), "--out",
                                         _linked("helm")(t)]),
    ("plan-out-file-link", lambda s, t: ["plan", "--stack", "good", "--stacks-dir", str(s), "--out",
                                         _linked_file(t)]),
    ("plan-out-is-a-link", lambda s, t: ["plan", "--stack", "good", "--stacks-dir", str(s), "--out",
                                         _out_is_a_link(t)]),
    ("plan-out-under-a-file", lambda s, t: ["plan", "--stack", "good", "--stacks-dir", str(s), "--out",
                                            f"{_file(t)}/plan"]),
    ("graph-is-a-link", lambda s, t: ["plan", "--stack", "good", "--stacks-dir", str(s), "--graph", _graph_link(t)]),
    ("graph-is-a-folder", lambda s, t: ["plan", "--stack", "good", "--stacks-dir", str(s), "--graph", str(t)]),
    ("graph-no-folder", lambda s, t: ["plan", "--stack", "good", "--stacks-dir", str(s), "--graph", _no_folder(t)]),
    ("graph-over-user-file", lambda s, t: ["plan", "--stack", "good", "--stacks-dir", str(s), "--graph",
                                           _graph_over_notes(t)]),
    ("graph-wrong-suffix", lambda s, t: ["plan", "--stack", "good", "--stacks-dir", str(s), "--graph", _file(t)]),
    # diff renders stacks/ (every stack unless named): a bad ref is refused before any render.
    ("diff-unknown-ref", lambda s, t: ["diff", "--base", "no-such-ref-anywhere"]),
    ("diff-option-as-ref", lambda s, t: ["diff", "--base=--output=/tmp/x"]),
    ("diff-unknown-stack", lambda s, t: ["diff", "--base", "HEAD", "--stack", "nope"]),
    ("diff-path-stack", lambda s, t: ["diff", "--base", "HEAD", "--stack", "../../etc/passwd"]),
    ("diff-one-unknown-of-two", lambda s, t: ["diff", "--base", "HEAD", *(f"--stack={name}" for name in
                                                                         available_stacks()[:1]), "--stack", "prdo"]),
    ("region-local-stack", lambda s, t: ["region", "--stack", "laptop", "--stacks-dir", str(OWNED_STACKS)]),
    ("region-unknown-stack", lambda s, t: ["region", "--stack", "../Pulumi"]),
]


@pytest.mark.parametrize(("case", "argv"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_message_and_exit_2(stacks_dir: Path, tmp_path: Path, case: str, argv: Argv,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    args = argv(stacks_dir, tmp_path)
    before = _snapshot(tmp_path)
    links = _links(tmp_path)
    code = main(args)
    out, err = capsys.readouterr()
    assert code == 2, out + err
    assert "Traceback" not in out + err
    assert err.startswith("error: ") and err.count("error: ") == 1, err
    assert _snapshot(tmp_path) == before, "a refused command changed files"
    assert _links(tmp_path) == links


@pytest.mark.parametrize(("name", "shown"), [("lookalike-key", "f\\u0430bricCheck"),
                                             ("zero-width-key", "we\\u200bight")])
def test_a_key_with_hidden_characters_is_shown_escaped(stacks_dir: Path, name: str, shown: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--stack", name, "--stacks-dir", str(stacks_dir)]) == 2
    err = capsys.readouterr().err
    assert shown in err and err.isascii(), err


def test_two_resources_for_one_object_are_one_message_not_a_traceback(tmp_path: Path) -> None:
    from trainyard.plan.writers import check_unique_objects
    twice = _recording("a")
    again = twice.resources[0]
    twice.resources.append(dataclasses.replace(again, urn=again.urn + "-again", name="a-again"))
    with pytest.raises(ValueError, match="creates the ConfigMap 'a' in namespace ns twice"):
        check_unique_objects(twice)
    with pytest.raises(ValueError, match="twice"):
        write_plan(twice, tmp_path / "plan")
    assert not (tmp_path / "plan").exists()


def _snapshot(folder: Path) -> dict[str, bytes]:
    """Every regular file below `folder` (links are listed by `_links`, not followed)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and not p.is_symlink()}


def _links(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): os.readlink(p) for p in sorted(folder.rglob("*")) if p.is_symlink()}


def test_the_cli_process_prints_no_traceback(stacks_dir: Path) -> None:
    for name in ("python-tag", "bomb", "non-utf8"):
        result = subprocess.run([sys.executable, "-m", "trainyard", "plan", "--stack", name, "--stacks-dir",
                                 str(stacks_dir)], capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        assert result.stderr.startswith(f"error: {stacks_dir}/Pulumi.{name}.yaml:"), result.stderr
    assert not Path("/tmp/pwned").exists()


# ---- plan --out: only the plan's own files are ever replaced ----------------------------------------------------

def _recording(*names: str) -> Recording:
    from trainyard.plan.recording import ResourceRecord
    recording = Recording()
    for name in names:
        recording.resources.append(ResourceRecord(
            urn=f"urn:pulumi:dev::trainyard::kubernetes:core/v1:ConfigMap::{name}", type="kubernetes:core/v1:ConfigMap",
            name=name, custom=True, parent=None, provider=None, depends_on=(), protect=False, retain_on_delete=False,
            deleted_with=None, inputs={"apiVersion": "v1", "kind": "ConfigMap",
                                       "metadata": {"name": name, "namespace": "ns"}}))
    return recording


def test_a_new_folder_gets_the_plan_and_its_marker(tmp_path: Path) -> None:
    write_plan(_recording("a"), tmp_path / "plan")
    listed = (tmp_path / "plan" / MARKER).read_text().splitlines()
    assert "manifests/ns.configmap.a.yaml" in listed and "resources.json" in listed


def test_a_second_plan_replaces_its_own_files_and_keeps_the_users(tmp_path: Path) -> None:
    out = tmp_path / "plan"
    write_plan(_recording("a", "b"), out)
    (out / "notes.txt").write_text("mine\n")
    (out / "manifests" / "mine.yaml").write_text("mine\n")
    write_plan(_recording("a"), out)
    assert (out / "notes.txt").read_text() == "mine\n"
    assert (out / "manifests" / "mine.yaml").read_text() == "mine\n"
    assert not (out / "manifests" / "ns.configmap.b.yaml").exists()  # the plan's own stale file went
    assert (out / "manifests" / "ns.configmap.a.yaml").exists()


def test_a_plan_file_over_a_user_file_is_refused_before_writing(tmp_path: Path) -> None:
    out = tmp_path / "plan"
    write_plan(_recording("a"), out)
    (out / "manifests" / "ns.configmap.b.yaml").write_text("mine\n")
    before = _snapshot(out)
    with pytest.raises(ValueError, match=r"ns\.configmap\.b\.yaml exists and was not written by an earlier plan"):
        write_plan(_recording("a", "b"), out)
    assert _snapshot(out) == before


@pytest.mark.parametrize("line", ["../victim.txt", "{victim}", "manifests/../../victim.txt", "manifests\\..\\x",
                                  "manifests/a\x00.yaml", "manifests//ns.configmap.a.yaml", "./resources.json"])
def test_an_edited_marker_never_deletes_outside_the_folder(tmp_path: Path, line: str) -> None:
    out = tmp_path / "plan"
    write_plan(_recording("a", "b"), out)
    victim = tmp_path / "victim.txt"
    victim.write_text("mine\n")
    with (out / MARKER).open("a") as marker:
        marker.write(line.format(victim=victim) + "\n")
    before = _snapshot(tmp_path)
    with pytest.raises(ValueError, match=rf"{MARKER} line \d+: .* nothing was written"):
        write_plan(_recording("a"), out)
    assert _snapshot(tmp_path) == before


@pytest.mark.parametrize("folder", ["manifests", "helm"])
def test_a_linked_folder_of_an_earlier_plan_is_never_followed(tmp_path: Path, folder: str) -> None:
    out = tmp_path / "plan"
    write_plan(_recording("a", "b"), out)
    victim = _victim(tmp_path)
    (victim / "ns.configmap.b.yaml").write_text("mine\n")  # listed in the marker: the plan would delete it
    shutil.rmtree(out / folder)
    (out / folder).symlink_to(victim)
    with pytest.raises(ValueError, match=f"{folder} is a symbolic link"):
        write_plan(_recording("a"), out)
    assert sorted(p.name for p in victim.iterdir()) == ["ns.configmap.a.yaml", "ns.configmap.b.yaml"]
    assert {p.read_text() for p in victim.iterdir()} == {"mine\n"}


def test_a_marker_far_larger_than_a_plan_is_refused(tmp_path: Path) -> None:
    out = _earlier_plan(tmp_path, "manifests/x.yaml\n" * (5 * 1024 * 1024 // 17))
    with pytest.raises(ValueError, match="more than 4194304 bytes"):
        write_plan(_recording("a"), out)


def test_a_plan_inside_the_repository_never_goes_through_a_linked_folder(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    victim = _victim(tmp_path)
    (repo / "plans").symlink_to(victim)  # a committed link: `make plans` writes plans/dev
    monkeypatch.setattr(writers, "REPO_ROOT", repo)
    monkeypatch.chdir(repo)
    for out in (Path("plans/dev"), repo / "plans" / "dev"):
        with pytest.raises(ValueError, match="plans is a symbolic link"):
            write_plan(_recording("a"), out)
    assert [p.name for p in victim.iterdir()] == ["ns.configmap.a.yaml"]


def test_an_empty_existing_folder_is_used(tmp_path: Path) -> None:
    (tmp_path / "plan").mkdir()
    write_plan(_recording("a"), tmp_path / "plan")
    assert (tmp_path / "plan" / MARKER).is_file()


def test_the_committed_plans_carry_the_marker() -> None:
    stacks = available_stacks()
    assert stacks
    for stack in stacks:
        assert (ROOT / "plans" / stack / MARKER).is_file(), f"plans/{stack} was not written by `make plans`"


def test_region_prints_the_stacks_validated_region(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["region", "--stack", "fleet", "--stacks-dir", str(OWNED_STACKS)]) == 0
    assert capsys.readouterr().out == "us-west-2\n"


def test_a_plan_written_before_the_marker_is_replaced_but_not_with_a_stranger_in_it(tmp_path: Path) -> None:
    out = tmp_path / "plan"
    write_plan(_recording("a", "b"), out)
    (out / MARKER).unlink()  # as every plan looked before the marker existed
    write_plan(_recording("a"), out)
    assert not (out / "manifests" / "ns.configmap.b.yaml").exists() and (out / MARKER).is_file()
    (out / MARKER).unlink()
    (out / "manifests" / "notes.txt").write_text("mine\n")
    with pytest.raises(ValueError, match="not written by `trainyard plan`"):
        write_plan(_recording("a"), out)
    assert (out / "manifests" / "notes.txt").read_text() == "mine\n"


def test_graph_replaces_a_graph_it_wrote(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "laptop.mmd"
    for _ in range(2):
        assert main(["plan", "--stack", "laptop", "--stacks-dir", str(OWNED_STACKS), "--quiet", "--graph",
                     str(target)]) == 0
    assert target.read_text().startswith("flowchart LR")
    assert "error" not in capsys.readouterr().err


@pytest.mark.parametrize("name", ["../../escaped", "/etc/escaped", "a/../../../escaped"])
def test_an_object_name_never_places_a_plan_file_outside_the_folder(tmp_path: Path, name: str) -> None:
    recording = _recording("a")
    record = recording.resources[0]
    recording.resources.append(dataclasses.replace(
        record, urn=record.urn + "-evil", name="evil",
        inputs={**record.inputs, "metadata": {"name": name, "namespace": "ns"}}))
    try:
        write_plan(recording, tmp_path / "plan")  # a '/' in a name is a folder inside the plan, at most
    except ValueError as error:
        assert "nothing was written" in str(error)  # a '..' is refused
        assert list(tmp_path.iterdir()) == []
    assert [p.name for p in tmp_path.iterdir()] in ([], ["plan"])
    assert not Path("/etc/escaped.yaml").exists() and not list(tmp_path.parent.glob("escaped*"))
