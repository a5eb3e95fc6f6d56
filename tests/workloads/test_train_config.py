"""Config parsing: errors name the key, overrides apply, the resolved config round-trips."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import trainer_launch
from trainyard_train.config import Config, ConfigError, load_config, parse_config
from trainyard_train.exitcodes import CONFIG_ERROR as CONFIG_ERROR_EXIT_CODE
from trainyard_train.loop import changed_keys

CONFIGS = Path(trainer_launch.WORKLOADS) / "configs"


@pytest.mark.parametrize(
    ("raw", "overrides", "key"),
    [
        ({"model": {"d_modle": 64}}, [], "model.d_modle"),
        ({"bogus": 1}, [], "bogus"),
        ({}, ["train.stpes=5"], "train.stpes"),
        ({}, ["checkpoint.keep_last=1"], "checkpoint.keep_last"),
        ({}, ["model.n_heads=3"], "model.d_model"),
        ({}, ["train.steps=ten"], "train.steps"),
        ({}, ["checkpoint.async_save=1"], "checkpoint.async_save"),
        ({}, ["comm.hook=ring"], "comm.hook"),
        ({}, ["optim.betas=[0.9]"], "optim.betas"),
        ({}, ["train.global_batch_size=0"], "train.global_batch_size"),
        ({"model": 5}, [], "model"),
        ({}, ["model=5", "model.d_model=8"], "model"),
    ],
)
def test_errors_name_the_key(raw: dict, overrides: list[str], key: str) -> None:
    with pytest.raises(ConfigError) as excinfo:
        parse_config(raw, overrides)
    assert str(excinfo.value).startswith(f"{key}:"), str(excinfo.value)


def test_overrides_parse_yaml_values_and_win_over_file() -> None:
    cfg = load_config(CONFIGS / "tiny.yaml", ["train.steps=7", "optim.lr=1e-4", "checkpoint.async_save=true"])
    assert cfg.train.steps == 7 and cfg.optim.lr == 1e-4 and cfg.checkpoint.async_save is True
    assert cfg.model.d_model == 64  # untouched keys keep the file's value


def test_config_is_frozen_and_round_trips() -> None:
    cfg = load_config(CONFIGS / "gpt-small.yaml")
    with pytest.raises(AttributeError):
        cfg.train.steps = 1  # type: ignore[misc]
    assert parse_config(__import__("yaml").safe_load(cfg.to_yaml())) == cfg


def test_shipped_configs_are_valid() -> None:
    for path in CONFIGS.glob("*.yaml"):
        load_config(path)


def test_changed_keys_lists_dotted_paths() -> None:
    assert changed_keys({"a": {"b": 1, "c": 2}, "d": 3}, {"a": {"b": 1, "c": 5}, "d": 4}) == ["a.c", "d"]


def _trainer(tmp_path: Path, *args: str, module: str = "trainyard_train") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        env=trainer_launch.subprocess_env(),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["train.stpes=5"], "train.stpes: unknown key"),
        (["train.steps=ten"], "train.steps: expected an integer, got 'ten'"),
        (["optim.lr=-0.1"], "optim.lr: must be > 0"),
        (["--config", "missing.yaml"], "--config: cannot read missing.yaml: No such file or directory"),
        (["run_dir=blocker/run"], "run_dir: blocker/run is not writable"),
    ],
)
@pytest.mark.parametrize("module", ["trainyard_train", "trainyard_train.preflight"])
@pytest.mark.slow
def test_bad_input_is_one_line_and_a_final_exit_code(
    tmp_path: Path, args: list[str], message: str, module: str
) -> None:
    (tmp_path / "blocker").write_text("a file where run_dir needs a directory")
    argv = args if module == "trainyard_train" else ["--nnodes=1", "-m", "trainyard_train", *args]
    done = _trainer(tmp_path, *argv, module=module)
    assert done.returncode == CONFIG_ERROR_EXIT_CODE, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"trainyard_train: config error: {message}"), done.stderr


def test_preflight_passes_a_valid_line(tmp_path: Path) -> None:
    argv = ["--nnodes=1:2", "-m", "trainyard_train", "--config", str(CONFIGS / "tiny.yaml"), f"run_dir={tmp_path}"]
    assert _trainer(tmp_path, *argv, module="trainyard_train.preflight").returncode == 0


@pytest.mark.parametrize("module", ["agent", "preflight", "train"])
def test_a_refused_line_never_imports_torch(tmp_path: Path, module: str) -> None:
    """The node agent, preflight and the trainer check a line before torch loads: a refused launch costs 0.2
    CPU-s, not 2.5, in every pod (and worker) of a job whose config is wrong."""
    probe = (f"import sys; from trainyard_train import {module}; code = {module}.main(sys.argv[1:]); "
             "print(code, 'torch' in sys.modules)")
    argv = ["--config", str(CONFIGS / "tiny.yaml"), f"run_dir={tmp_path}", "train.steps=0"]
    if module != "train":
        argv = ["--nnodes=1", "-m", "trainyard_train", *argv]
    done = subprocess.run([sys.executable, "-c", probe, *argv], env=trainer_launch.subprocess_env(),
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.stdout.split("\n")[0] == f"{CONFIG_ERROR_EXIT_CODE} False", done.stdout + done.stderr
    assert "config error: train.steps: must be >= 1" in done.stderr


# --- hostile and unusual input (issue 24): one ConfigError naming the key or file, never a crash -------------

BOMB = "".join(f"{a}: &{a} [{', '.join([f'*{p}'] * 9) if p else ', '.join(['x'] * 9)}]\n"
               for p, a in zip([None, *"abcdefg"], "abcdefgh", strict=True))


@pytest.mark.parametrize(
    ("text", "overrides", "key"),
    [
        ("optim:\n  lr: .inf\n", [], "optim.lr"),
        ("", ["comm.timeout_s=.inf"], "comm.timeout_s"),
        ("", ["shutdown.grace_period_s=-.inf"], "shutdown.grace_period_s"),
        ("", ["optim.lr=.nan"], "optim.lr"),
        ("", ["optim.betas=[0.9, .nan]"], "optim.betas[1]"),
        ("", ["optim.lr=[1"], "optim.lr"),
        ("", ["train.steps={a: b"], "train.steps"),
        ("", ["train..steps=3"], "train..steps"),
        ("", ["run_dir=a\x01b"], "run_dir"),
    ],
)
def test_hostile_values_name_their_key(tmp_path: Path, text: str, overrides: list[str], key: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as excinfo:
        load_config(path, overrides)
    assert str(excinfo.value).startswith(f"{key}:"), str(excinfo.value)


def test_an_alias_bomb_is_refused_without_expanding_it(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(BOMB)  # 9^8 = 43 million values once expanded; old code: MemoryError
    with pytest.raises(ConfigError, match=r"^--config: .*bomb.yaml is not valid YAML: expands to more than"):
        load_config(path)
    with pytest.raises(ConfigError, match="expands to more than"):
        load_config(None, [f"data.path={{{BOMB.replace(chr(10), ', ')}}}"])


def test_ordinary_aliases_are_still_yaml(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("optim:\n  betas: &b [0.8, 0.9]\ntrain: &t {steps: 3, log_every: 2}\n")
    cfg = load_config(path, ["train.seed=7"])
    assert cfg.optim.betas == (0.8, 0.9) and cfg.train.steps == 3 and cfg.train.seed == 7


@pytest.mark.parametrize(
    "text",
    [
        "optim:\n  lr: 0.01\t# a tab before the comment\n",
        "optim:\n  lr:\t0.01\n",
        "\t# a comment line that starts with a tab\noptim:\n  lr: 0.01\n",
        "optim: {lr:\t0.01}\n",
        "optim:\n  lr: 0.01 \t \n",
    ],
)
def test_tabs_where_yaml_allows_them_are_accepted(tmp_path: Path, text: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    assert load_config(path).optim.lr == 0.01


def test_a_tab_as_indentation_is_still_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("optim:\n\tlr: 0.01\n")  # YAML forbids tabs for indentation (spec 1.2.2, 6.1)
    with pytest.raises(ConfigError, match="is not valid YAML"):
        load_config(path)


def test_a_binary_config_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_bytes(b"\x7fELF\x02\x01\x01\x00\xd0\xff")
    with pytest.raises(ConfigError, match=r"^--config: .*c.yaml is not UTF-8 text"):
        load_config(path)


@pytest.mark.parametrize("raw", ["abc", "-1", "65536", "9108 ", "１２３", "0x10"])
def test_a_garbage_metrics_port_env_is_a_config_error(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    from trainyard_train.metrics import PORT_ENV, resolve_port

    monkeypatch.setenv(PORT_ENV, raw)
    with pytest.raises(ConfigError, match=f"^{PORT_ENV}: expected a port number"):
        resolve_port(9108)


def test_a_metrics_port_in_use_is_a_config_error() -> None:
    import socket

    from trainyard_train.metrics import TrainMetrics

    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=f"^metrics.port: port {port} is already in use"):
            TrainMetrics().serve(port)


@pytest.mark.parametrize(
    ("manifest", "reason"),
    [
        ('{"num_shards": 2, "records_per', "is not a dataset manifest"),
        ("", "is not a dataset manifest"),
        ('{"num_shards": 2}', "is not a dataset manifest (no 'records_per_shard')"),
        ('{"num_shards": "2", "records_per_shard": 1, "record_len": 3, "vocab_size": 4}', "must be positive integers"),
        ("[]", "is not a dataset manifest"),
    ],
)
def test_a_broken_dataset_manifest_is_named_before_the_rendezvous(tmp_path: Path, manifest: str, reason: str) -> None:
    from trainyard_train.preflight import check_command_line

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "manifest.json").write_text(manifest)
    with pytest.raises(ConfigError, match=rf"^data.path: .*manifest.json:? .*{reason[:20]}"):
        check_command_line([f"run_dir={tmp_path}", "data.path=data", "data.generate=false"])


# --- memory (issue 24 #7): the planner's estimate against what this node has, before anything is allocated ------

def _cpu_need(cfg: Config, world_size: int) -> int:
    from trainyard_train.planner import estimate

    return estimate(cfg, world_size=world_size, local_world_size=world_size, device_type="cpu").total


@pytest.mark.parametrize("world_size", [1, 4])
def test_a_config_the_host_cannot_hold_is_refused(monkeypatch: pytest.MonkeyPatch, world_size: int) -> None:
    """On CPU the node's processes share the host: all of them together must fit."""
    from trainyard_train import preflight

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg = load_config(CONFIGS / "tiny.yaml")
    need = _cpu_need(cfg, world_size) * world_size
    monkeypatch.setattr(preflight, "host_memory_bytes", lambda: need)
    preflight.check_memory(cfg, world_size=world_size, local_world_size=world_size, local_rank=0)
    monkeypatch.setattr(preflight, "host_memory_bytes", lambda: need - 1)
    with pytest.raises(ConfigError, match=rf"^parallel: ddp{world_size} needs .* per process on CPU at a world of "
                                          rf"{world_size}.*, more than the host's"):
        preflight.check_memory(cfg, world_size=world_size, local_world_size=world_size, local_rank=0)


def test_a_config_the_gpu_cannot_hold_is_refused_with_a_layout_that_fits(monkeypatch: pytest.MonkeyPatch) -> None:
    """On CUDA each rank's estimate (its reserve included) against its own GPU, as torch.cuda.mem_get_info says."""
    from trainyard_train import preflight
    from trainyard_train.planner import estimate

    cfg = load_config(CONFIGS / "gpt-small.yaml", ["train.micro_batch_size=32"])
    need = estimate(cfg, world_size=8, local_world_size=8).total
    gpu = {"total": need}
    asked: list[int] = []

    def mem_get_info(device: int) -> tuple[int, int]:
        asked.append(device)
        return 0, gpu["total"]

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    preflight.check_memory(cfg, world_size=8, local_world_size=8, local_rank=5)
    gpu["total"] = need - 1
    with pytest.raises(ConfigError, match=r"^parallel: ddp8 needs .* per GPU at a world of 8, more than the GPU's "
                                          r".*; a layout that fits: parallel\.data_parallel=ddp parallel\.ac=full"):
        preflight.check_memory(cfg, world_size=8, local_world_size=8, local_rank=5)
    assert asked == [5, 5]


@pytest.mark.parametrize(("limit", "physical"), [("max\n", True), ("1073741824\n", False), (None, True)])
def test_host_memory_is_the_cgroup_limit_when_there_is_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, limit: str | None, physical: bool
) -> None:
    import os

    from trainyard_train import preflight

    path = tmp_path / "memory.max"
    if limit is not None:
        path.write_text(limit)
    monkeypatch.setattr(preflight, "CGROUP_MEMORY_MAX", path)
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert preflight.host_memory_bytes() == (ram if physical else min(ram, 2**30))


@pytest.mark.slow
def test_an_absurd_model_is_one_line_and_exit_2_before_allocating(tmp_path: Path) -> None:
    """d_model = 2^40: the old trainer died in the embedding's allocation ("Storage size calculation overflowed")."""
    done = _trainer(tmp_path, "--config", str(CONFIGS / "tiny.yaml"), f"run_dir={tmp_path / 'run'}",
                    f"model.d_model={2**40}")
    assert done.returncode == CONFIG_ERROR_EXIT_CODE, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("trainyard_train: config error: parallel: ddp1 needs "), done.stderr
