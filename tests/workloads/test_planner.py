"""The memory planner counts what the model holds: its parameters exactly, its saved activations as autograd does
on CPU, layouts dividing what they shard; it refuses a model that cannot fit a GPU and says what would.
(The per-rank states of every layout are checked against live runs in test_parallel_layouts.py.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import trainer_launch
from torch.autograd.graph import saved_tensors_hooks
from trainyard_train.config import ConfigError, load_config
from trainyard_train.exitcodes import CONFIG_ERROR
from trainyard_train.model import DecoderLM
from trainyard_train.planner import (
    NVIDIA_SMI_MIB,
    GiB,
    MiB,
    check_fits,
    estimate,
    gpu_memory_bytes,
    parameter_count,
    suggest,
)

CONFIGS = Path(trainer_launch.WORKLOADS) / "configs"
SEVEN_B = CONFIGS / "llama-7b.yaml"


@pytest.mark.parametrize(
    ("config", "overrides"),
    [("tiny.yaml", []), ("tiny.yaml", ["model.tie_embeddings=true"]), ("tiny.yaml", ["model.n_kv_heads=0"]),
     ("gpt-small.yaml", []), ("llama-7b.yaml", [])],
)
def test_parameter_count_is_the_models(config: str, overrides: list[str]) -> None:
    cfg = load_config(CONFIGS / config, overrides)
    with torch.device("meta"):
        model = DecoderLM(cfg.model)
    assert parameter_count(cfg) == sum(p.numel() for p in model.parameters())


def test_shipped_sizes_are_as_documented() -> None:
    assert parameter_count(load_config(CONFIGS / "gpt-small.yaml")) == 125_848_320  # the "124M" class
    assert parameter_count(load_config(SEVEN_B)) == 7_516_459_008


def saved_activation_bytes(overrides: list[str]) -> int:
    """Bytes autograd keeps for backward over one micro-batch's forward (distinct storages, weights excluded)."""
    cfg = load_config(trainer_launch.TINY, overrides)
    model = DecoderLM(cfg.model, loss_chunk_tokens=cfg.perf.loss_chunk_tokens)
    weights = {t.untyped_storage().data_ptr() for t in [*model.parameters(), model.rope]}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in weights:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    tokens = torch.randint(0, cfg.model.vocab_size, (cfg.train.micro_batch_size, cfg.model.seq_len))
    with saved_tensors_hooks(pack, lambda t: t):
        model(tokens, tokens)
    return sum(saved.values())


@pytest.mark.parametrize(
    "overrides",
    [[], ["model.n_layers=8", "model.n_kv_heads=4"], ["train.micro_batch_size=16", "model.n_heads=8"],
     ["model.d_model=256", "model.seq_len=128", "model.vocab_size=512", "perf.loss_chunk_tokens=128"]],
)
def test_activation_estimate_covers_what_autograd_saves_on_cpu(overrides: list[str]) -> None:
    cfg = load_config(trainer_launch.TINY, overrides)
    planned = estimate(cfg, world_size=1, local_world_size=1, device_type="cpu")
    measured = saved_activation_bytes(overrides)
    # Never below what autograd keeps; above it by the loss chunk's transient logits (5.3 % when written).
    assert measured <= planned.activations + planned.logits <= 1.1 * measured, (planned, measured)


def test_layouts_divide_what_they_shard() -> None:
    cfg = load_config(SEVEN_B)
    one = estimate(cfg, world_size=8, local_world_size=8)
    sixteen = estimate(cfg, world_size=16, local_world_size=8)
    assert sixteen.states * 2 == one.states  # FSDP over twice the ranks: half the model states each
    ddp = estimate(load_config(SEVEN_B, ["parallel.data_parallel=ddp", "parallel.ac=none"]), world_size=8,
                   local_world_size=8)
    assert ddp.states == 16 * parameter_count(cfg)  # DDP: every rank holds 16 bytes per parameter
    # TP over the node instead of FSDP: the same split but for the 65 norm weights, whole on every TP rank.
    tp = estimate(load_config(SEVEN_B, ["parallel.tp=8"]), world_size=8, local_world_size=8)
    assert tp.states == one.states + 16 * 4096 * (2 * 32 + 1) * 7 // 8
    no_ac = estimate(load_config(SEVEN_B, ["parallel.ac=none"]), world_size=16, local_world_size=8)
    assert no_ac.activations > 10 * sixteen.activations  # recompute keeps one input per block


def test_check_fits_refuses_by_key_with_a_layout_that_fits() -> None:
    cfg = load_config(SEVEN_B, ["parallel.data_parallel=ddp"])
    h100 = gpu_memory_bytes("H100-80GB")
    with pytest.raises(ConfigError) as excinfo:
        check_fits(cfg, world_size=16, local_world_size=8, device_memory_bytes=h100)
    message = str(excinfo.value)
    assert message.startswith("parallel: ddp16 needs ") and "a layout that fits: parallel.data_parallel=fsdp" in message
    with pytest.raises(ConfigError, match="no layout fits"):
        check_fits(cfg, world_size=1, local_world_size=1, device_memory_bytes=24 * GiB)
    # The shipped layout fits an H100 pool over its whole documented node range, and a 40 GB A100 pool.
    shipped = load_config(SEVEN_B)
    for nodes in range(2, 9):
        check_fits(shipped, world_size=8 * nodes, local_world_size=8, device_memory_bytes=h100)
    check_fits(shipped, world_size=16, local_world_size=8, device_memory_bytes=gpu_memory_bytes("A100-40GB"))


@pytest.mark.parametrize("gpu", sorted(NVIDIA_SMI_MIB))
def test_gpu_memory_is_below_what_nvidia_smi_reports_and_its_nominal_size(gpu: str) -> None:
    nominal = int(gpu.rsplit("-", 1)[1].removesuffix("GB"))  # "H200-141GB": 141
    assert gpu_memory_bytes(gpu) < NVIDIA_SMI_MIB[gpu] * MiB <= nominal * GiB


def test_suggestions_fit_and_prefer_the_fewest_model_parallel_ranks() -> None:
    cfg = load_config(SEVEN_B)
    found = suggest(cfg, world_size=16, local_world_size=8, device_memory_bytes=40 * GiB)
    assert found and all(need.total <= 40 * GiB for _, need in found)
    spans = [p.tp * p.pp for p, _ in found]
    assert spans == sorted(spans) and found[0][0].data_parallel == "fsdp"


def plan_layout(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trainyard_train.plan_layout", *args],
                          env=trainer_launch.subprocess_env(), capture_output=True, text=True, timeout=300, check=False)


def test_plan_layout_cli_exit_codes() -> None:
    fits = plan_layout("--config", str(SEVEN_B), "--gpu", "H100-80GB", "--nodes", "2:8")
    assert fits.returncode == 0, fits.stderr
    assert "config layout dp_shard16 (ac full) at 2 node(s): busiest rank" in fits.stdout and ": fits" in fits.stdout
    too_big = plan_layout("--config", str(SEVEN_B), "--gpu", "L4-24GB", "--gpus-per-node", "4",
                          "parallel.data_parallel=ddp")
    assert too_big.returncode == 1 and "does NOT fit" in too_big.stdout, too_big.stdout
    bad = plan_layout("--config", str(SEVEN_B), "--gpu", "H100-80GB", "parallel.tp=3")
    assert bad.returncode == CONFIG_ERROR
    assert bad.stderr.strip() == ("python -m trainyard_train.plan_layout: config error: model.n_heads: 32 does not "
                                  "split over parallel.tp=3 ranks")
    spans = plan_layout("--config", str(SEVEN_B), "--gpu", "H100-80GB", "--nodes", "2:3", "parallel.tp=8",
                        "parallel.pp=2")
    assert spans.returncode == CONFIG_ERROR and "at 3 node(s) of 8 processes" in spans.stderr, spans.stderr
