"""Config parsing: errors name the key, overrides apply, the resolved config round-trips."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import trainer_launch
from trainyard_train.config import ConfigError, load_config, parse_config
from trainyard_train.exitcodes import CONFIG_ERROR as CONFIG_ERROR_EXIT_CODE
from trainyard_train.loop import accumulation_steps, changed_keys

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
        ({}, ["train.global_batch_size=10", "train.micro_batch_size=4"], "train.global_batch_size"),
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


def test_accumulation_keeps_global_batch_across_world_sizes() -> None:
    assert [accumulation_steps(512, 8, w) for w in (8, 16, 32, 64)] == [8, 4, 2, 1]
    with pytest.raises(ConfigError, match="train.global_batch_size"):
        accumulation_steps(16, 4, 3)


def test_changed_keys_lists_dotted_paths() -> None:
    assert changed_keys({"a": {"b": 1, "c": 2}, "d": 3}, {"a": {"b": 1, "c": 5}, "d": 4}) == ["a.c", "d"]


def _trainer(tmp_path: Path, *args: str, module: str = "trainyard_train") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        env=trainer_launch.subprocess_env(),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
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
