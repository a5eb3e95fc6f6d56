"""A stack file is read bounded and strictly: each malformed or hostile file gets one message with file and line."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from trainyard.config.yaml_input import MAX_BYTES, InputError, load_yaml
from trainyard.plan.runtime import available_stacks, read_stack

GOOD = "config:\n  trainyard:environment: dev\n"
BILLION_LAUGHS = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi", strict=True))

# (id, file bytes, line named in the message or None, fragment of the message)
CASES: list[tuple[str, bytes, int | None, str]] = [
    ("unclosed-bracket", b"config:\n  trainyard:tenants: [a,\n", 3, "invalid YAML"),
    ("tab-indent", b"config:\n\ttrainyard:target: aws\n", 2, "invalid YAML"),
    ("python-tag", b"config:\n  trainyard:target: !!python/object/apply:os.system [id]\n", 2, "python/object"),
    ("python-name-tag", b"config:\n  x: !!python/name:os.system\n", 2, "python/name"),
    ("duplicate-key", b"config:\n  trainyard:target: aws\n  trainyard:target: local\n", 3, "appears twice"),
    ("duplicate-nested-key", b"config:\n  trainyard:aws:\n    region: a\n    region: b\n", 4, "appears twice"),
    ("int-key", b"config:\n  1: x\n", 2, "not a string"),
    ("bool-key", b"config:\n  trainyard:addons:\n    yes: 1\n", 3, "not a string"),
    ("null-key", b"config:\n  ~: x\n", 2, "not a string"),
    ("non-utf8", b"config:\n  trainyard:target: \xff\xfe\n", 2, "not UTF-8"),
    ("latin1", b"# caf\xe9\n" + GOOD.encode(), 1, "not UTF-8"),
    ("alias", b"x: &x {a: 1}\nconfig:\n  trainyard:aws: *x\n", None, "alias"),
    ("merge-key", b"x: &x {a: 1}\nconfig:\n  trainyard:aws: {<<: *x}\n", None, "alias"),
    ("billion-laughs", BILLION_LAUGHS.encode(), None, "alias"),
    ("deep-nesting", b"config: " + b"[" * 5000 + b"\n", None, "invalid YAML"),
    ("nesting-beyond-64", b"config: " + b"[" * 100 + b"]" * 100 + b"\n", 1, "nested more than 64 levels"),
    ("two-documents", GOOD.encode() + b"---\n" + GOOD.encode(), 3, "invalid YAML"),
]


@pytest.mark.parametrize(("text", "line", "fragment"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_malformed_file_is_one_message_with_its_line(tmp_path: Path, text: bytes, line: int | None,
                                                       fragment: str) -> None:
    path = tmp_path / "Pulumi.bad.yaml"
    path.write_bytes(text)
    with pytest.raises(InputError) as caught:
        load_yaml(path, "stacks/Pulumi.bad.yaml")
    message = str(caught.value)
    assert message.startswith("stacks/Pulumi.bad.yaml" + (f":{line}:" if line else "")), message
    assert fragment in message and "\n" not in message


def test_the_same_file_checked_by_read_stack_names_the_stacks_folder(tmp_path: Path) -> None:
    (tmp_path / "Pulumi.bad.yaml").write_bytes(b"config:\n  trainyard:target: aws\n  trainyard:target: local\n")
    with pytest.raises(InputError, match=r"Pulumi\.bad\.yaml:3: key 'trainyard:target' appears twice"):
        read_stack("bad", tmp_path)


@pytest.mark.parametrize(("text", "fragment"), [
    ("- config: {}\n", "got a list"),
    ("just text\n", "got a string"),
    ("config: [a, b]\n", "'config:' must be a map"),
    ("config: 3\n", "got a int"),
    ("config:\n  trainyard:grafanaAdminPassword: hunter2\n", "must be encrypted"),
    ("config:\n  grafanaAdminPassword: hunter2\n", "pulumi config set --secret grafanaAdminPassword"),
    ("config:\n  trainyard:addons: {alluxio: {datasetPrefix: 2024-01-01}}\n", "quote it"),
])
def test_a_file_of_the_wrong_shape_is_refused(tmp_path: Path, text: str, fragment: str) -> None:
    (tmp_path / "Pulumi.bad.yaml").write_text(text)
    with pytest.raises(InputError, match="Pulumi.bad.yaml") as caught:
        read_stack("bad", tmp_path)
    assert fragment in str(caught.value)


def test_an_encrypted_secret_is_accepted(tmp_path: Path) -> None:
    (tmp_path / "Pulumi.ok.yaml").write_text(GOOD + "  trainyard:grafanaAdminPassword:\n    secure: v1:abc\n")
    assert read_stack("ok", tmp_path).secret_keys == ("trainyard:grafanaAdminPassword",)


@pytest.mark.parametrize("name", ["../stacks/Pulumi.dev", "/etc/passwd", "dev/../prod", "", "nope", "dev\n",
                                  "-rf", "Pulumi.dev.yaml"])
def test_an_unknown_or_path_like_stack_is_refused(name: str) -> None:
    listed = re.escape(", ".join(available_stacks()))  # the message lists the stacks stacks/ holds
    with pytest.raises(InputError, match=f"unknown stack .*; stacks in .*: {listed}$"):
        read_stack(name)


def _timed(path: Path) -> tuple[float, str]:
    start = time.perf_counter()
    with pytest.raises(InputError) as caught:
        load_yaml(path)
    return time.perf_counter() - start, str(caught.value)


def test_hostile_files_are_refused_quickly(tmp_path: Path) -> None:
    """Printed, not asserted (timing belongs to benches): the bounds make both refusals cheap."""
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(BILLION_LAUGHS)
    big = tmp_path / "big.yaml"
    big.write_text("config:\n  trainyard:tenants:\n" + "    - {name: t, weight: 1}\n" * 200_000)
    assert big.stat().st_size > 5_000_000
    for path in (bomb, big):
        seconds, message = _timed(path)
        print(f"{path.name}: {path.stat().st_size} bytes refused in {seconds * 1000:.1f} ms: {message}")
        assert ("alias" in message) if path is bomb else (f"at most {MAX_BYTES} bytes" in message)


def test_many_values_below_the_size_bound_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "wide.yaml"
    path.write_text("config: [" + "0," * 50_000 + "]\n")
    assert path.stat().st_size < MAX_BYTES
    _, message = _timed(path)
    assert "YAML values" in message
