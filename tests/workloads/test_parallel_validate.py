"""Layouts that cannot work are refused by key before any process group exists: in the config itself, at a world
size (check_launch, what the trainer runs from torchrun's environment) and over a job's node range
(check_node_range, what the platform's plan runs per job). The micro-batch plan keeps the global batch at any
world size."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import trainer_launch
from trainyard_train.config import Config, ConfigError, load_config, parse_config
from trainyard_train.exitcodes import CONFIG_ERROR
from trainyard_train.layout import micro_batch_plan, rank_share, resolve, stage_layers
from trainyard_train.validate import check_launch, check_node_range, check_torchrun_command

FSDP = "parallel.data_parallel=fsdp"


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["parallel.tp=2"], "parallel.tp"),  # DDP is data-parallel only
        (["parallel.pp=2"], "parallel.pp"),
        (["parallel.dp_replicate=2"], "parallel.dp_replicate"),
        ([FSDP, "parallel.dp_replicate=-1", "parallel.dp_shard=-1"], "parallel.dp_replicate"),
        ([FSDP, "parallel.tp=0"], "parallel.tp"),
        ([FSDP, "comm.hook=powersgd"], "comm.hook"),  # PowerSGD is a DDP hook: none under FSDP2
        ([FSDP, "model.tie_embeddings=true"], "model.tie_embeddings"),
        # 3 heads of 16 over tp=3, but a SwiGLU width of 128 (8 x 48 / 3, rounded up to 64s) does not split.
        ([FSDP, "parallel.tp=3", "model.n_heads=3", "model.n_kv_heads=3", "model.d_model=48"], "model.ffn_hidden"),
        ([FSDP, "parallel.tp=8"], "model.n_heads"),
        ([FSDP, "parallel.tp=2", "model.seq_len=31"], "model.seq_len"),  # sequence parallel splits the sequence
        ([FSDP, "parallel.pp=2", "parallel.pp_schedule=Interleaved1F1B"], "model.n_layers"),  # 2 layers, 4 stages
        ([FSDP, "parallel.pp_schedule=ZBVZeroBubble", "parallel.pp_stages_per_rank=3"], "parallel.pp_stages_per_rank"),
        ([FSDP, "parallel.pp_schedule=LoopedBFS", "parallel.pp_stages_per_rank=1"], "parallel.pp_stages_per_rank"),
        (["parallel.ac=some"], "parallel.ac"),
        (["model.n_kv_heads=3"], "model.n_kv_heads"),
        (["model.n_heads=64"], "model.n_heads"),  # head_dim 1: rotary embeddings need pairs of channels
    ],
)
def test_config_refuses_layouts_by_key(overrides: list[str], key: str) -> None:
    with pytest.raises(ConfigError) as excinfo:
        load_config(trainer_launch.TINY, overrides)
    assert str(excinfo.value).startswith(f"{key}:"), str(excinfo.value)


def tiny(*overrides: str) -> Config:
    return load_config(trainer_launch.TINY, [FSDP, *overrides])


@pytest.mark.parametrize(
    ("overrides", "world", "local", "key", "why"),
    [
        # TP across nodes: 4 TP ranks on nodes of 2 processes.
        (["parallel.tp=4", "model.n_kv_heads=4"], 8, 2, "parallel.tp", "must sit on one node"),
        (["parallel.tp=2"], 6, 3, "parallel.tp", "must sit on one node"),
        # A model copy of tp x pp = 4 ranks over nodes of 2: 3 nodes do not hold whole copies.
        (["parallel.tp=2", "parallel.pp=2"], 6, 2, "parallel.pp", "multiple of 2"),
        (["parallel.tp=2", "parallel.pp=3", "model.n_layers=3"], 8, 4, "parallel.pp", "fill whole nodes"),
        (["parallel.tp=2"], 5, 5, "parallel.tp", "must sit on one node"),
        (["parallel.pp=2"], 3, 3, "parallel.pp", "do not divide the world of 3"),
        (["parallel.dp_replicate=-1", "parallel.dp_shard=4"], 6, 6, "parallel.dp_shard",
         "does not divide the 6 data-parallel ranks"),
        (["parallel.dp_replicate=2", "parallel.dp_shard=2"], 8, 8, "parallel.dp_shard", "is not the 8"),
        # Pipelining with too few micro-batches: 16 samples over dp 2 are 8 each, one micro-batch of 8.
        (["parallel.pp=2", "train.micro_batch_size=8"], 4, 4, "train.micro_batch_size", "needs at least 2"),
        # 2 micro-batches of 8 are enough for 1F1B over pp 2; DualPipeV wants one per stage (4).
        (["parallel.pp=2", "parallel.pp_schedule=DualPipeV", "model.n_layers=4", "train.micro_batch_size=8"], 2, 2,
         "train.micro_batch_size", "needs at least 4"),
        (["parallel.pp=2", "parallel.pp_schedule=Interleaved1F1B", "model.n_layers=4", "train.global_batch_size=10",
          "train.micro_batch_size=2"], 2, 2, "train.micro_batch_size", "multiple of its 2 rounds"),
        (["train.global_batch_size=4"], 8, 8, "train.global_batch_size", "cannot give each of the 8"),
    ],
)
def test_launch_refuses_worlds_the_layout_cannot_use(
    overrides: list[str], world: int, local: int, key: str, why: str
) -> None:
    with pytest.raises(ConfigError) as excinfo:
        check_launch(tiny(*overrides), world_size=world, local_world_size=local)
    message = str(excinfo.value)
    assert message.startswith(f"{key}:") and why in message, message


@pytest.mark.parametrize(
    ("overrides", "world", "local"),
    [
        (["parallel.tp=2"], 8, 4),  # TP inside a node, FSDP over the rest
        (["parallel.tp=2", "parallel.pp=2", "train.micro_batch_size=2"], 16, 2),  # a copy spans 2 of 8 nodes
        (["parallel.pp=2", "parallel.pp_schedule=DualPipeV", "model.n_layers=4"], 2, 2),  # 4 micro-batches
        (["parallel.dp_replicate=-1", "parallel.dp_shard=4"], 12, 4),  # HSDP: shard in a node, replicate across
        ([], 7, 7),  # any world: FSDP over 7 ranks, shares of 3 or 2 samples
    ],
)
def test_launch_accepts_what_the_layout_can_use(overrides: list[str], world: int, local: int) -> None:
    check_launch(tiny(*overrides), world_size=world, local_world_size=local)


def test_node_range_refuses_a_copy_spanning_nodes_under_an_elastic_range() -> None:
    cfg = tiny("parallel.tp=2", "parallel.pp=4", "model.n_layers=4", "train.global_batch_size=64")
    check_node_range(cfg, nproc_per_node=4, min_nodes=2, max_nodes=2)
    check_node_range(cfg, nproc_per_node=8, min_nodes=1, max_nodes=4)
    with pytest.raises(ConfigError) as excinfo:
        check_node_range(cfg, nproc_per_node=4, min_nodes=2, max_nodes=4)
    message = str(excinfo.value)
    assert message.startswith("parallel.pp:") and "at 3 node(s) of 4 processes" in message, message


def test_node_range_checks_pipeline_micro_batches_at_every_node_count() -> None:
    cfg = tiny("parallel.pp=2", "train.global_batch_size=32", "train.micro_batch_size=4")
    # Nodes of 2 processes (one pp pair): at 7 nodes (dp 7) shares of 5 make 2 micro-batches; at 8, shares of 4 one.
    check_node_range(cfg, nproc_per_node=2, min_nodes=1, max_nodes=7)
    with pytest.raises(ConfigError, match=r"^train.micro_batch_size: .* at a world of 16 .*at 8 node"):
        check_node_range(cfg, nproc_per_node=2, min_nodes=1, max_nodes=16)


def test_resolve_infers_the_data_parallel_dimension() -> None:
    hsdp = parse_config({"parallel": {"data_parallel": "fsdp", "dp_replicate": -1, "dp_shard": 4, "tp": 2}})
    layout = resolve(hsdp.parallel, 32)
    assert (layout.pp, layout.dp_replicate, layout.dp_shard, layout.tp, layout.dp) == (1, 4, 4, 2, 16)
    assert layout.describe() == "dp_replicate4xdp_shard4xtp2"
    ddp = resolve(parse_config({}).parallel, 3)
    assert (ddp.dp, ddp.describe()) == (3, "ddp3")


def test_the_layout_names_its_stages_per_rank() -> None:
    """The restore check compares described layouts: rank-local state must not cross a change of stage count."""
    def interleaved(stages: int) -> str:
        cfg = parse_config({"model": {"n_layers": 8}, "parallel": {"data_parallel": "fsdp", "pp": 2,
                            "pp_schedule": "Interleaved1F1B", "pp_stages_per_rank": stages}})
        return resolve(cfg.parallel, 4).describe()

    assert interleaved(2) == "pp2xdp_shard2 Interleaved1F1B 2 stages per rank"
    assert interleaved(4) == "pp2xdp_shard2 Interleaved1F1B 4 stages per rank"


@pytest.mark.parametrize(("global_batch", "micro", "dp", "count", "rows"),
                         [(512, 8, 8, 8, 8), (512, 8, 64, 1, 8), (16, 4, 3, 2, 3), (16, 4, 1, 4, 4), (10, 4, 1, 3, 4),
                          (4, 4, 8, 1, 1)])
def test_micro_batch_plan_fits_the_largest_share(global_batch: int, micro: int, dp: int, count: int,
                                                 rows: int) -> None:
    plan = micro_batch_plan(global_batch, micro, dp)
    assert (plan.count, plan.rows) == (count, rows)
    shares = [rank_share(global_batch, dp, r) for r in range(dp)]
    assert sum(c for _, c in shares) == global_batch and max(c for _, c in shares) <= count * rows
    assert all(prev[0] + prev[1] == nxt[0] for prev, nxt in zip(shares, shares[1:], strict=False))


def test_stage_layers_are_contiguous_and_balanced() -> None:
    assert stage_layers(10, 4) == [range(0, 3), range(3, 6), range(6, 8), range(8, 10)]
    assert [len(r) for r in stage_layers(32, 8)] == [4] * 8


def test_the_trainer_refuses_a_layout_before_the_rendezvous(tmp_path: Path) -> None:
    """Under torchrun's environment (2 processes of one node) but before any process group: one line, exit 2."""
    env = {**trainer_launch.subprocess_env(), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "RANK": "0",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}  # nothing listens there: a rendezvous would hang
    result = subprocess.run(
        [sys.executable, "-m", "trainyard_train", "--config", str(trainer_launch.TINY), f"run_dir={tmp_path}",
         FSDP, "parallel.tp=4", "model.n_kv_heads=4"],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == CONFIG_ERROR, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("trainyard_train: config error: parallel.tp: 4 "), (
        result.stderr
    )


@pytest.mark.parametrize(
    ("flags", "refused"),
    [
        (["--nnodes=2:4", "--nproc-per-node=4"], "at 3 node(s) of 4 processes"),  # a copy spans 2 nodes of 4
        (["--nnodes", "2", "--nproc_per_node", "4"], None),
        (["--nnodes=1:2", "--nproc-per-node=8"], None),  # a copy within a node: any count
        (["--standalone", "--nproc-per-node=2"], "parallel.pp: a model copy spans 4 nodes"),
        (["--nnodes=1:2", "--nproc-per-node=gpu"], None),  # known only on the node: the trainer checks it
        (["--nnodes=two", "--nproc-per-node=8"], "--nnodes: 'two' is not"),
    ],
)
def test_a_torchrun_command_is_checked_at_every_node_count_it_allows(flags: list[str], refused: str | None) -> None:
    cfg = tiny("parallel.tp=2", "parallel.pp=4", "model.n_layers=4", "train.global_batch_size=64")
    argv = [*flags, "-m", "trainyard_train", "--config", "c.yaml", "--nnodes=9"]  # trainer args are not torchrun's
    if refused is None:
        check_torchrun_command(cfg, argv)
        return
    with pytest.raises(ConfigError) as excinfo:
        check_torchrun_command(cfg, argv)
    assert refused in str(excinfo.value), str(excinfo.value)


def test_preflight_refuses_a_launch_whose_node_range_the_layout_cannot_use(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "trainyard_train.preflight", "--nnodes=1:3", "--nproc-per-node=2", "-m",
         "trainyard_train", "--config", str(trainer_launch.TINY), f"run_dir={tmp_path}", FSDP, "parallel.pp=2",
         "parallel.tp=2"],
        env=trainer_launch.subprocess_env(), capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == CONFIG_ERROR, result.stderr
    assert result.stderr.strip().startswith("trainyard_train: config error: parallel.pp: a model copy spans 2 nodes"), (
        result.stderr
    )
