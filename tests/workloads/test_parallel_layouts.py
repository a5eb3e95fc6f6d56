"""Every layout trains the same model to the same losses and gradient norms as one process (gloo, up to 8
processes), at any world size, and a checkpoint saved in one layout resumes in others with the reference ones.

All runs are the real trainer under torchrun (strict_trainer: the default group refuses CPU tensors, as NCCL's
does) on the tiny config with 4 layers, 4 steps, global batch 16, micro-batches of at most 4 and a gradient clip
that scales every step. Losses are fp32 sums in a different order per layout; they agreed to within 4.8e-7 (one
fp32 ulp at 4.5) when this was written. Without the pipeline's all-reduce of the squared norm (each stage
clipping by its own) pp2_1f1b's norms were 0.15 instead of 1.04 and its last two losses differed.
Each run is one node (max_nodes=1): the node agent checks a layout over the whole --nnodes range first, and the
16-sample batch cannot feed a pipeline, or every rank, at the harness's default of up to nproc nodes.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from trainer_launch import TINY, run, steps
from trainyard_train.checkpoint import step_dir
from trainyard_train.config import load_config
from trainyard_train.planner import estimate_rank
from trainyard_train.progress import read_progress

pytestmark = pytest.mark.slow
STEPS = 4
CLIP = 0.1
# Clipping binds at every step (the gradient norm is about 1 at steps 1-4), so a norm reduced wrongly over a mesh
# (a stage's own, a shard's own, a tensor-parallel part counted twice) changes every later loss.
COMMON = [f"train.steps={STEPS}", "model.n_layers=4", "checkpoint.interval_steps=2", f"optim.grad_clip={CLIP}"]
FSDP = "parallel.data_parallel=fsdp"
TOLERANCE = 5e-6  # ten times the largest difference seen

# name: (processes, overrides, the layout the trainer reports)
LAYOUTS: dict[str, tuple[int, list[str], str]] = {
    "ddp2": (2, [], "ddp2"),
    "fsdp2": (2, [FSDP], "dp_shard2"),
    "hsdp2x2": (4, [FSDP, "parallel.dp_replicate=2"], "dp_replicate2xdp_shard2"),
    "fsdp2_tp2": (4, [FSDP, "parallel.tp=2"], "dp_shard2xtp2"),
    "pp2_1f1b": (2, [FSDP, "parallel.pp=2"], "pp2xdp_shard1 1F1B"),
    "pp2_interleaved": (2, [FSDP, "parallel.pp=2", "parallel.pp_schedule=Interleaved1F1B"],
                        "pp2xdp_shard1 Interleaved1F1B 2 stages per rank"),
    "pp2_fsdp2_tp2": (8, [FSDP, "parallel.pp=2", "parallel.tp=2"], "pp2xdp_shard2xtp2 1F1B"),
    # Any world size: 16 samples over 3 ranks are shares of 6, 5 and 5 (2 micro-batches of 3 rows each).
    "ddp3": (3, [], "ddp3"),
    "fsdp3": (3, [FSDP], "dp_shard3"),
}
# Resumed from the pp2_fsdp2_tp2 checkpoint at step 2.
RESUMED: dict[str, tuple[int, list[str]]] = {
    "one_process": (1, []),
    "pp2_fsdp3": (6, [FSDP, "parallel.pp=2"]),  # an odd data-parallel degree under pipelining: shares 6, 5, 5
    "pp2_tp2_zbv": (4, [FSDP, "parallel.pp=2", "parallel.tp=2", "parallel.pp_schedule=ZBVZeroBubble"]),
}


def trajectory(events: list[dict[str, Any]]) -> list[float]:
    """Each step's loss and gradient norm (before clipping), in order."""
    return [value for e in steps(events) for value in (e["loss"], e["grad_norm"])]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> list[float]:
    """One process, DDP's layout without a wrapper."""
    events = run(tmp_path_factory.mktemp("reference") / "run", COMMON, nproc=1).events()
    assert events[0]["layout"] == "ddp1"
    assert [e["step"] for e in steps(events)] == list(range(1, STEPS + 1))
    assert all(e["grad_norm"] > 2 * CLIP for e in steps(events))  # clipping scales every step
    return trajectory(events)


@pytest.fixture(scope="module")
def three_d(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 8-process pp2 x dp_shard2 x tp2 run, kept for its checkpoints."""
    nproc, overrides, _ = LAYOUTS["pp2_fsdp2_tp2"]
    run_dir = tmp_path_factory.mktemp("three_d") / "run"
    run(run_dir, [*COMMON, *overrides], nproc=nproc, max_nodes=1)
    return run_dir


def assert_states_as_planned(events: list[dict[str, Any]], overrides: list[str], nproc: int) -> None:
    """What each rank holds after its first step is the planner's count for its pipeline coordinate."""
    cfg = load_config(TINY, [*COMMON, *overrides])
    memory = next(e for e in events if e["event"] == "memory")
    per_pp = nproc // cfg.parallel.pp  # pp is the outermost mesh dimension
    for pp_rank in range(cfg.parallel.pp):
        held = memory["ranks"][pp_rank * per_pp : (pp_rank + 1) * per_pp]
        planned = estimate_rank(cfg, world_size=nproc, pp_rank=pp_rank, device_type="cpu")
        for key in ("params", "grads", "optimizer"):
            assert max(r[key] for r in held) == getattr(planned, key), (key, pp_rank, held)


@pytest.mark.parametrize("name", LAYOUTS)
def test_layout_trains_like_one_process(name: str, reference: list[float], tmp_path: Path,
                                        request: pytest.FixtureRequest) -> None:
    nproc, overrides, described = LAYOUTS[name]
    if name == "pp2_fsdp2_tp2":  # the run the resume tests start from
        events = read_progress(request.getfixturevalue("three_d") / "progress.jsonl")
    else:
        events = run(tmp_path / "run", [*COMMON, *overrides], nproc=nproc, max_nodes=1).events()
    assert events[0]["layout"] == described and events[0]["world_size"] == nproc
    assert trajectory(events) == pytest.approx(reference, abs=TOLERANCE)
    assert_states_as_planned(events, overrides, nproc)


@pytest.mark.parametrize("name", RESUMED)
def test_checkpoint_resumes_in_another_layout(name: str, reference: list[float], three_d: Path,
                                              tmp_path: Path) -> None:
    nproc, overrides = RESUMED[name]
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    shutil.copytree(step_dir(three_d / "checkpoints", 2), step_dir(run_dir / "checkpoints", 2))
    events = run(run_dir, [*COMMON, *overrides], nproc=nproc, max_nodes=1).events()
    assert events[0]["event"] == "start" and events[0]["step"] == 2, events[0]
    assert trajectory(events) == pytest.approx(reference[4:], abs=TOLERANCE)  # steps 3 and 4
