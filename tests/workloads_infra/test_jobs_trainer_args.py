"""The command line every job gives the trainer is one the trainer accepts, with the config file it mounts."""

from __future__ import annotations

from pathlib import Path

import pytest
from jobs_render import training_jobs
from owned_stacks import Stack, every_stack, stack_file
from trainyard.plan.runtime import render, settings_of
from trainyard_train.config import load_config

CONFIGS = Path(__file__).resolve().parents[2] / "workloads" / "configs"


def _trainer_argv(job: dict) -> list[str]:
    container = job["spec"]["tasks"][0]["template"]["spec"]["containers"][0]
    argv = [*container["command"], *container["args"]]
    return argv[argv.index("trainyard_train") + 1:]


@pytest.mark.parametrize("stack", every_stack())
def test_every_job_passes_the_trainer_a_valid_config(stack: Stack) -> None:
    file = stack_file(stack)
    jobs = {j.name: j for j in settings_of(file).workloads}
    rendered = training_jobs(render(file))
    assert set(rendered) == set(jobs)
    for name, record in rendered.items():
        argv = _trainer_argv(record.inputs)
        assert argv[:2] == ["--config", f"/etc/trainyard/{jobs[name].trainer_config}"]
        config = load_config(CONFIGS / jobs[name].trainer_config, argv[2:])
        assert config.run_dir == "/checkpoints"
        assert config.shutdown.grace_period_s == jobs[name].checkpoint_grace_seconds
        if jobs[name].dataset is None:
            assert config.data.generate and not Path(config.data.path).is_absolute()
        else:
            assert config.data.path == f"/data/{jobs[name].dataset}" and not config.data.generate
