"""Every command the README shows runs as written after the step it follows (`make plan`, then `make test`).

Commands in ```bash blocks are run, in a clone of this checkout with its `.venv` and `.upstream` but the clone's own
code and data, except those that need a cloud account or a cluster (CLOUD, and `submit` without `--dry-run`/`--out`)
and `make test`, which CI runs itself (`.ci/run`). Commands inside prose and `$ ` lines of example output are not
run, but must name an interpreter that exists: the venv's, never a bare `python` or `torchrun`, which a fresh machine
lacks or which lacks the project. Every command is in a ```bash block: a ```text block holds output only.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from trainyard.plan.conformance import upstream_dir

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# Need a cloud account, a Pulumi backend, a cluster or Docker: shown for the reader, not runnable here.
CLOUD = ("pulumi", "kubectl", "kind", "docker", "argo", "export", ".venv/bin/python -m pytest tests/acceptance")
# The suite itself: CI runs it (tests/ci/test_make_test.py), and it runs this test.
SUITE = "make test"
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
_SPAN = re.compile(r"`([^`\n]+)`")
_BARE = re.compile(r"^(python3?|pytest|torchrun)\s")


def _blocks() -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in _FENCE.finditer(README.read_text())]


def _commands(block: str) -> list[str]:
    joined = re.sub(r"\\\n\s*", " ", block)
    lines = (line.split(" #")[0].strip() for line in joined.splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def _shown() -> list[str]:
    """Every command line the README shows: bash blocks, `$ ` lines of example output, commands in prose."""
    found = [c for kind, block in _blocks() if kind == "bash" for c in _commands(block)]
    found += [line[2:].split(" #")[0].strip() for kind, block in _blocks() if kind != "bash"
              for line in block.splitlines() if line.startswith("$ ")]
    prose = _FENCE.sub("", README.read_text())
    found += [span for span in _SPAN.findall(prose) if span.startswith((".venv/bin/", "python -m trainyard ",
                                                                        "python tools/", "python bench/"))]
    return found


def _needs_a_cluster(command: str) -> bool:
    """A cloud tool, or `submit` applying to the kubeconfig's cluster (only --dry-run and --out stay offline)."""
    words = command.split()
    return command.startswith(CLOUD) or ("submit" in words[:4] and not {"--dry-run", "--out"} & set(words))


RUNNABLE = [c for kind, block in _blocks() if kind == "bash" for c in _commands(block)
            if not _needs_a_cluster(c) and c != SUITE]
# Old enough for make to take the linked venv and Helm as up to date: the clone must never reinstall into them.
_CLONED_MTIME = 946684800  # 2000-01-01


def test_the_readme_shows_runnable_commands() -> None:
    assert len(RUNNABLE) >= 5, RUNNABLE
    assert "make plan" in RUNNABLE


def test_no_command_hides_in_a_text_block() -> None:
    hidden = [line for kind, block in _blocks() if kind == "text" for line in _commands(block)
              if line.startswith((".venv/", "make ", *CLOUD))]
    assert not hidden, f"commands in ```text blocks are neither run nor checked: use ```bash: {hidden}"


@pytest.mark.parametrize("command", _shown())
def test_every_command_names_an_interpreter_the_steps_installed(command: str) -> None:
    assert not _BARE.search(command), f"{command!r}: a fresh machine's {command.split()[0]} lacks the project: " \
                                     "use .venv/bin/"
    program = shlex.split(command)[0]
    if program.startswith(".venv/bin/"):
        assert (ROOT / program).is_file(), f"{command!r}: {program} is not installed by make plan / make test"


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This checkout (uncommitted changes included) with the venv the quick start made."""
    copy = tmp_path_factory.mktemp("readme") / "repo"
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(copy)], check=True)
    changed = subprocess.run(["git", "ls-files", "-m", "-o", "--exclude-standard"], cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout.split()
    for name in changed:
        source = ROOT / name
        if source.is_file() and not source.is_symlink():  # a linked venv or cache is linked below, not copied
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, copy / name)
    subprocess.run(["git", "add", "-A"], cwd=copy, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "wip"],
                   cwd=copy, check=True)
    for path in copy.rglob("*"):
        os.utime(path, (_CLONED_MTIME, _CLONED_MTIME), follow_symlinks=False)
    (copy / ".venv").symlink_to(ROOT / ".venv")
    return copy


@pytest.mark.slow
@pytest.mark.parametrize("command", RUNNABLE)
def test_each_command_runs_as_written(clone: Path, command: str) -> None:
    # The clone's code, not the checkout's the venv's editable installs name; the checkout's upstream cache
    # (tools/upstream.py refuses a linked one) and render cache (keyed by everything a render reads).
    env = {**os.environ, "PYTHONPATH": f"{clone / 'infra'}{os.pathsep}{clone / 'workloads'}",
           "TRAINYARD_UPSTREAM": str(upstream_dir(ROOT)),
           "TRAINYARD_RENDER_CACHE": str(ROOT / "build" / "render-cache")}
    result = subprocess.run(command, shell=True, cwd=clone, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"{command}\n{result.stdout[-2000:]}{result.stderr[-3000:]}"
