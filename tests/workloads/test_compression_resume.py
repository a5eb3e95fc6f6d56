"""QSGD's and top-k's residuals (error feedback) are kept per parameter and survive a checkpoint: a resumed run
sends what the interrupted one still owed."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from trainer_launch import run, steps
from trainyard_train.checkpoint import step_dir
from trainyard_train.comm import ErrorFeedback, GradCommMeter, hook_state_blob, register_compression, restore_hook_state
from trainyard_train.config import CommConfig

HOOKS = [("qsgd", {"qsgd_levels": 3}), ("topk", {"topk_ratio": 0.05})]


@pytest.fixture
def world_of_one() -> Iterator[dist.ProcessGroup]:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield dist.new_group(backend="gloo")
    finally:
        dist.destroy_process_group()


def two_layers(group: dist.ProcessGroup) -> DistributedDataParallel:
    """Four parameters over several DDP buckets (a 0.1 MB cap; the first bucket is DDP's 1 MiB default)."""
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(300, 200), torch.nn.Tanh(), torch.nn.Linear(200, 100))
    return DistributedDataParallel(module, process_group=group, bucket_cap_mb=0.1)


def step(model: DistributedDataParallel, seed: int) -> dict[str, torch.Tensor]:
    """One backward through the hook; the gradients it applied, by parameter name."""
    inputs = torch.randn(8, 300, generator=torch.Generator().manual_seed(seed))
    model.zero_grad()
    torch.manual_seed(1000 + seed)  # QSGD rounds at random: the same draws for both models
    model(inputs).pow(2).sum().backward()
    return {name: p.grad.clone() for name, p in model.module.named_parameters()}


@pytest.mark.parametrize(("hook", "settings"), HOOKS)
def test_each_parameter_keeps_its_own_residual_across_bucket_rebuilds(
    world_of_one: dist.ProcessGroup, hook: str, settings: dict[str, float]
) -> None:
    """For every parameter, whichever bucket holds it from step to step, the gradients applied plus its residual
    equal its true gradients summed."""
    model = two_layers(world_of_one)
    state = register_compression(model, CommConfig(hook=hook, **settings), world_of_one, GradCommMeter())  # type: ignore[arg-type]
    reference = two_layers(world_of_one).module
    names = [name for name, _ in model.module.named_parameters()]
    applied = {name: torch.zeros_like(p) for name, p in model.module.named_parameters()}
    true = {name: torch.zeros_like(p) for name, p in model.module.named_parameters()}
    for seed in range(4):
        for name, grad in step(model, seed).items():
            applied[name] += grad
        inputs = torch.randn(8, 300, generator=torch.Generator().manual_seed(seed))
        for name, grad in zip(names, torch.autograd.grad(reference(inputs).pow(2).sum(),
                                                           list(reference.parameters())), strict=True):
            true[name] += grad
    assert sorted(state.residuals) == sorted(names)
    for name in names:
        residual = state.residuals[name].view_as(true[name])
        error = (applied[name] + residual - true[name]).abs().max() / true[name].abs().max()
        assert error < 1e-3, (name, float(error))
        assert not torch.allclose(applied[name], true[name], rtol=1e-3, atol=1e-3), name  # it did compress


@pytest.mark.parametrize(("hook", "settings"), HOOKS)
def test_restored_residuals_continue_the_run(
    world_of_one: dist.ProcessGroup, hook: str, settings: dict[str, float]
) -> None:
    """A model whose hook state is restored from another's blob owes what that one owed: its next step's applied
    gradient plus its new residual equals the original's, parameter by parameter (the split between the two
    depends on the bucket order: QSGD's chunks follow it); a fresh state (what a resume had before) owes less."""
    cfg = CommConfig(hook=hook, **settings)  # type: ignore[arg-type]
    running = two_layers(world_of_one)
    state = register_compression(running, cfg, world_of_one, GradCommMeter())
    for seed in range(3):
        step(running, seed)
    blob = hook_state_blob(state)
    assert all(t.untyped_storage().data_ptr() != r.untyped_storage().data_ptr()
               for t, r in zip(blob.values(), state.residuals.values(), strict=True))  # copies, not bucket views
    resumed, fresh = two_layers(world_of_one), two_layers(world_of_one)
    for model in (resumed, fresh):
        model.module.load_state_dict(running.module.state_dict())
    resumed_state = register_compression(resumed, cfg, world_of_one, GradCommMeter())
    restore_hook_state(resumed_state, blob)
    fresh_state = register_compression(fresh, cfg, world_of_one, GradCommMeter())

    def owed(model: DistributedDataParallel, feedback: ErrorFeedback) -> dict[str, torch.Tensor]:
        return {name: grad + feedback.residuals[name].view_as(grad) for name, grad in step(model, 3).items()}

    expected, got, without = owed(running, state), owed(resumed, resumed_state), owed(fresh, fresh_state)
    for name, total in expected.items():
        torch.testing.assert_close(got[name], total, rtol=1e-4, atol=1e-4)
        assert not torch.allclose(without[name], total, rtol=1e-4, atol=1e-4), name


@pytest.mark.slow
def test_a_resumed_top_k_run_matches_an_uninterrupted_one(tmp_path: Path) -> None:
    """Two ranks, top-k at 1%: steps 5-8 after a resume from step 4 give the uninterrupted run's losses exactly
    (with the residuals reset they drifted by up to 6e-3). QSGD is not compared bit for bit: its 512-value chunks
    follow DDP's bucket order, which the resumed run's first step has not rebuilt yet. The resumed run starts from
    the uninterrupted run's step-4 checkpoint: a save holds the whole state, whether or not the run goes on."""
    common = ["comm.hook=topk", "comm.topk_ratio=0.01", "checkpoint.interval_steps=4"]
    full = [e["loss"] for e in steps(run(tmp_path / "full", [*common, "train.steps=8"]).events())]
    (tmp_path / "resumed" / "checkpoints").mkdir(parents=True)
    shutil.copytree(step_dir(tmp_path / "full" / "checkpoints", 4), step_dir(tmp_path / "resumed" / "checkpoints", 4))
    events = run(tmp_path / "resumed", [*common, "train.steps=8"]).events()
    assert [e for e in events if e["event"] == "start"][0]["step"] == 4
    resumed = [e["loss"] for e in steps(events) if e["step"] > 4]
    assert resumed == full[4:]
