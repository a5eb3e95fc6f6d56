"""End-to-end torchrun runs on CPU/gloo: convergence, worker kill, SIGTERM, torn checkpoints, resize,
PowerSGD traffic. Each run trains the tiny config for a few seconds."""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import pytest
from trainer_launch import TINY, Launch, launch, run, running, steps
from trainyard_train.checkpoint import COMMIT, read_commit, step_dir
from trainyard_train.config import load_config
from trainyard_train.exitcodes import STOPPED
from trainyard_train.model import DecoderLM

pytestmark = pytest.mark.slow
CFG = load_config(TINY)
GLOBAL_BATCH = CFG.train.global_batch_size


def mean_loss(events: list[dict], first: int, last: int) -> float:
    losses = [e["loss"] for e in steps(events) if first <= e["step"] <= last]
    return sum(losses) / len(losses)


def assert_positions_consistent(events: list[dict]) -> None:
    """The data position (samples consumed) must be exactly step x global batch at every checkpoint."""
    checkpoints = [e for e in events if e["event"] == "checkpoint"]
    assert checkpoints
    for e in checkpoints:
        assert e["samples"] == e["step"] * GLOBAL_BATCH, e


def expected_grad_bytes(rank: int, min_rate: float) -> tuple[int, int]:
    """(plain all-reduce bytes, PowerSGD bytes) per step, from parameter shapes alone.

    PowerSGD views each gradient as n x m = shape[0] x rest; with r = min(n, m, rank) it sends P (n x r)
    and Q (m x r) when (n + m) r * min_rate < n m, else the tensor as is.
    """
    plain = compressed = 0
    for param in DecoderLM(CFG.model).parameters():
        n = param.shape[0]
        m = param.numel() // n
        r = min(n, m, rank)
        plain += n * m
        compressed += (n + m) * r if (n + m) * r * min_rate < n * m else n * m
    return plain * 4, compressed * 4  # float32 gradients


@pytest.fixture(scope="module")
def two_rank_run(tmp_path_factory: pytest.TempPathFactory) -> Launch:
    """The tiny config's own run on two ranks (150 steps, a checkpoint every 25): read, never changed."""
    return run(tmp_path_factory.mktemp("two-ranks") / "run")


@pytest.fixture(scope="module")
def thirty_steps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A one-process run to step 30 keeping checkpoints 10, 20 and 30: each test damages a copy."""
    run_dir = tmp_path_factory.mktemp("thirty-steps") / "run"
    run(run_dir, ["train.steps=30", *TORN_OVERRIDES], nproc=1, torchrun=False)
    return run_dir


TORN_OVERRIDES = ["checkpoint.interval_steps=10", "checkpoint.keep_last=3"]


def test_two_process_run_converges(two_rank_run: Launch) -> None:
    events = two_rank_run.events()
    start = events[0]
    assert start["event"] == "start" and start["world_size"] == 2 and start["accum"] == 2
    initial, final = mean_loss(events, 1, 5), mean_loss(events, 140, 150)
    assert final < 0.7 * initial, (initial, final)
    assert events[-1] == {**events[-1], "event": "done", "step": 150, "samples": 150 * GLOBAL_BATCH}
    plain, _ = expected_grad_bytes(CFG.comm.powersgd_rank, CFG.comm.powersgd_min_compression_rate)
    assert {e["grad_bytes"] for e in steps(events)} == {plain}
    assert_positions_consistent(events)


def test_worker_sigkill_restarts_and_resumes_from_checkpoint(tmp_path: Path, cleanup_launches: list) -> None:
    interval = 20
    launched = launch(tmp_path / "run", ["train.steps=200", f"checkpoint.interval_steps={interval}"], max_restarts=2)
    cleanup_launches.append(launched)
    launched.wait_for(lambda ev: any(e["event"] == "step" and e["step"] >= 50 for e in ev))
    os.kill(launched.worker_pids()[-1], signal.SIGKILL)
    assert launched.wait() == 0, launched.output()

    events = launched.events()
    starts = [i for i, e in enumerate(events) if e["event"] == "start"]
    assert len(starts) == 2, events
    before, resumed = events[: starts[1]], events[starts[1]]
    last_step_before = max(e["step"] for e in steps(before))
    last_checkpoint_before = max(e["step"] for e in before if e["event"] == "checkpoint")
    assert resumed["restart_count"] == 1
    assert resumed["step"] == last_checkpoint_before
    assert resumed["resumed_from"].endswith(f"step-{last_checkpoint_before:08d}")
    assert 0 <= last_step_before - resumed["step"] <= interval
    assert events[-1]["event"] == "done" and events[-1]["step"] == 200
    assert_positions_consistent(events)


def assert_stopped_once_without_restart(
    launched: Launch, run_dir: Path, signal_names: set[str], workers: list[int]
) -> int:
    """One start, one stop, a committed checkpoint at the stop step, then the stop code; the agent stopped, did
    not restart, printed no traceback, and left none of its workers running."""
    rc = launched.wait()
    assert running(workers) == [], launched.output()
    assert rc == STOPPED, launched.output()  # non-zero: an interrupted run must not look finished
    assert "Traceback" not in launched.output()
    events = launched.events()
    assert [e["event"] for e in events].count("start") == 1, launched.output()
    stopped = events[-1]
    assert stopped["event"] == "stopped" and stopped["signal"] in signal_names, launched.output()
    stop_step = stopped["step"]
    assert [e["step"] for e in events if e["event"] == "checkpoint"] == [stop_step]
    assert (step_dir(run_dir / "checkpoints", stop_step) / COMMIT).exists()
    assert read_commit(step_dir(run_dir / "checkpoints", stop_step))["world_size"] == 2
    assert "stopped by SIGTERM, workers shut down (exit 143)" in launched.output()  # the agent's one line
    return int(stop_step)


def test_sigterm_to_a_worker_saves_once_and_is_not_restarted(tmp_path: Path, cleanup_launches: list) -> None:
    run_dir = tmp_path / "run"
    launched = launch(run_dir, ["train.steps=400", "checkpoint.interval_steps=1000"], max_restarts=3)
    cleanup_launches.append(launched)
    launched.wait_for(lambda ev: any(e["event"] == "step" and e["step"] >= 30 for e in ev))
    workers = launched.worker_pids()
    os.kill(workers[1], signal.SIGTERM)
    # Rank 0 writes the event: it names the signal if it got it, else that it stopped with a peer.
    stop_step = assert_stopped_once_without_restart(launched, run_dir, {"SIGTERM", "peer-signal"}, workers)
    assert 30 <= stop_step < 400
    assert "stopping_node_agent" in launched.output()

    resumed = run(run_dir, [f"train.steps={stop_step + 10}", "checkpoint.interval_steps=1000"]).events()
    start = [e for e in resumed if e["event"] == "start"][-1]
    assert start["step"] == stop_step and start["samples"] == stop_step * GLOBAL_BATCH
    assert resumed[-1]["event"] == "done" and resumed[-1]["step"] == stop_step + 10


def test_sigterm_to_torchrun_saves_once_and_is_not_restarted(tmp_path: Path, cleanup_launches: list) -> None:
    run_dir = tmp_path / "run"
    launched = launch(run_dir, ["train.steps=400", "checkpoint.interval_steps=1000"], max_restarts=3)
    cleanup_launches.append(launched)
    launched.wait_for(lambda ev: any(e["event"] == "step" and e["step"] >= 30 for e in ev))
    workers = launched.worker_pids()
    os.kill(launched.proc.pid, signal.SIGTERM)  # the agent forwards it to every worker
    assert 30 <= assert_stopped_once_without_restart(launched, run_dir, {"SIGTERM"}, workers) < 400
    # The workers' stop did not signal the agent a second time: it was already stopping.
    assert "stopping_node_agent" not in launched.output() and "while stopping" not in launched.output()


@pytest.mark.parametrize("damage", ["commit_missing", "file_truncated", "metadata_corrupt", "distcp_bytes_flipped"])
def test_torn_checkpoint_falls_back_to_previous(tmp_path: Path, thirty_steps: Path, damage: str) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(thirty_steps, run_dir)
    overrides = TORN_OVERRIDES
    newest = step_dir(run_dir / "checkpoints", 30)
    if damage == "commit_missing":
        (newest / COMMIT).unlink()
    elif damage == "file_truncated":
        shard = next(newest.glob("*.distcp"))
        shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    elif damage == "metadata_corrupt":  # same size, so only the checksum can notice
        metadata = newest / ".metadata"
        metadata.write_bytes(b"\0" * metadata.stat().st_size)
    else:  # 64 bytes inverted inside the tensor data: DCP itself would load these without complaint
        shard = next(newest.glob("*.distcp"))
        data = bytearray(shard.read_bytes())
        middle = len(data) // 2
        data[middle : middle + 64] = bytes(b ^ 0xFF for b in data[middle : middle + 64])
        shard.write_bytes(bytes(data))

    launched = run(run_dir, ["train.steps=35", *overrides], nproc=1, torchrun=False)
    start = [e for e in launched.events() if e["event"] == "start"][-1]
    assert start["step"] == 20 and start["resumed_from"].endswith("step-00000020")
    expected_warning = "checkpoint_ignored" if damage in ("commit_missing", "file_truncated") else "checkpoint_corrupt"
    warnings = [line for line in launched.output().splitlines() if "WARNING checkpoint_" in line]
    assert len(warnings) == 1 and expected_warning in warnings[0], launched.output()


def test_resume_with_smaller_world_continues_position(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    # 4 -> 2 ranks (at 1 there is no DDP, so no PowerSGD state to reinitialise).
    run(run_dir, ["train.steps=60", "checkpoint.interval_steps=30", "comm.hook=powersgd"], nproc=4)
    launched = run(run_dir, ["train.steps=90", "checkpoint.interval_steps=30", "comm.hook=powersgd"], nproc=2)
    events = launched.events()
    start = [e for e in events if e["event"] == "start"][-1]
    assert start["world_size"] == 2 and start["accum"] == 2  # same global batch, twice the accumulation
    assert start["step"] == 60 and start["samples"] == 60 * GLOBAL_BATCH
    assert "powersgd_state_reinitialized" in launched.output()
    assert events[-1]["event"] == "done" and events[-1]["step"] == 90
    assert_positions_consistent(events)
    # The model kept learning across the resize instead of starting over.
    assert mean_loss(events, 61, 65) < 0.7 * mean_loss(events, 1, 5)


def test_powersgd_cuts_gradient_bytes_by_expected_factor_converges_and_resumes_compressing(tmp_path: Path) -> None:
    """The factor, the convergence, and a resume with the world unchanged: with the hook's step counter restored,
    compression continues at once instead of a new warm-up of start_iter steps."""
    rank, start_iter = 2, 5
    overrides = ["comm.hook=powersgd", f"comm.powersgd_rank={rank}", f"comm.powersgd_start_iter={start_iter}"]
    events = run(tmp_path / "run", overrides).events()
    plain, compressed = expected_grad_bytes(rank, CFG.comm.powersgd_min_compression_rate)
    by_step = {e["step"]: e["grad_bytes"] for e in steps(events)}
    assert all(by_step[s] == plain for s in range(1, start_iter + 1))  # warm-up: plain all-reduce
    assert {by_step[s] for s in range(start_iter + 1, 151)} == {compressed}
    assert plain / compressed > 5
    assert mean_loss(events, 140, 150) < 0.7 * mean_loss(events, 1, 5)

    resumed = run(tmp_path / "run", [*overrides, f"train.steps={150 + start_iter}"]).events()
    assert [e for e in resumed if e["event"] == "start"][-1]["step"] == 150
    assert {e["grad_bytes"] for e in steps(resumed) if e["step"] > 150} == {compressed}


def test_checkpoint_layout_matches_readme(two_rank_run: Launch) -> None:
    ckpt = step_dir(two_rank_run.run_dir / "checkpoints", 150)
    names = {p.name for p in ckpt.iterdir()}
    assert {COMMIT, ".metadata", "__0_0.distcp", "__1_0.distcp"} <= names
    assert set(read_commit(ckpt)["files"]) == names - {COMMIT}


def test_resize_two_one_three_reads_every_sample_once_per_epoch(tmp_path: Path) -> None:
    """2 -> 1 -> 3 ranks over 2 shards (3 ranks > shards), then 1 rank with a smaller global batch: the
    record ids each rank actually read, step by step, form one permutation of all records per epoch: none
    repeated, none skipped, across resizes and a batch-size change."""
    run_dir = tmp_path / "run"
    shards, per_shard = 2, 64  # 128 records; 24-sample steps straddle epoch boundaries
    common = [f"data.num_shards={shards}", f"data.records_per_shard={per_shard}", "data.trace=true",
              "train.micro_batch_size=4", "checkpoint.interval_steps=1000"]  # fmt: skip
    phases = ((2, 8, 24), (1, 14, 24), (3, 20, 24), (1, 24, 8))  # (ranks, until step, global batch)
    for nproc, until, batch in phases:
        run(run_dir, [*common, f"train.global_batch_size={batch}", f"train.steps={until}"], nproc=nproc)

    entries = [json.loads(line) for f in sorted((run_dir / "trace").glob("rank-*.jsonl"))
               for line in f.read_text().splitlines()]  # fmt: skip
    by_step: dict[int, dict[int, list[int]]] = {}
    for e in entries:
        assert e["rank"] not in by_step.setdefault(e["step"], {}), f"step {e['step']} read twice"
        by_step[e["step"]][e["rank"]] = e["records"]
    assert sorted(by_step) == list(range(1, 25))
    world = {s: len(ranks) for s, ranks in by_step.items()}
    assert [world[s] for s in (1, 8, 9, 14, 15, 20, 21, 24)] == [2, 2, 1, 1, 3, 3, 1, 1]
    stream = [r for s in sorted(by_step) for rank in sorted(by_step[s]) for r in by_step[s][rank]]
    total = shards * per_shard
    assert len(stream) == 20 * 24 + 4 * 8 == 4 * total
    for epoch in range(4):
        assert sorted(stream[epoch * total : (epoch + 1) * total]) == list(range(total)), epoch


def test_async_checkpoints_commit_in_the_background_on_two_ranks(tmp_path: Path) -> None:
    """Async saves (DCP's background thread on the gloo group, rank 0's checksum-and-commit thread) under a
    default group that refuses CPU tensors: every interval commits, and the run resumes from the last. A save every
    step, so step 1's is still writing (collectives on its own thread) when step 2's memory report all-gathers: on
    one shared group the two threads' collectives cross and both ranks hang until the (30 s) timeout."""
    run_dir = tmp_path / "run"
    overrides = ["checkpoint.interval_steps=1", "checkpoint.async_save=true", "checkpoint.keep_last=5",
                 "comm.timeout_s=30"]
    events = run(run_dir, ["train.steps=20", *overrides]).events()
    assert [e["step"] for e in events if e["event"] == "checkpoint"] == list(range(1, 21))
    assert [e["step"] for e in events if e["event"] == "memory"] == [2]
    kept = range(16, 21)
    assert [r.name for r in sorted((run_dir / "checkpoints").iterdir())] == [f"step-{s:08d}" for s in kept]
    assert all("crc32" in read_commit(step_dir(run_dir / "checkpoints", s)) for s in kept)
    resumed = run(run_dir, ["train.steps=22", *overrides]).events()
    assert [e for e in resumed if e["event"] == "start"][-1]["step"] == 20
