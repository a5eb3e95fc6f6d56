"""The jobs as the whole program renders them: real cloud and platform layers, every stack file."""

from __future__ import annotations

import pytest
from jobs_render import JOB_TYPE, training_jobs, volcano_schema_errors
from owned_stacks import planned
from trainyard.config import load_settings
from trainyard.plan.recording import Recording
from trainyard.plan.runtime import STACKS_DIR, available_stacks, read_stack, render

KIND_TYPES = {"elastic": "ElasticTrainingJob", "mig": "MigTrainingJob", "smoke": "SmokeTrainingJob"}


def _program(stack: str) -> Recording:
    return planned((stack, STACKS_DIR)).recording


def _configured_jobs(stack: str) -> dict[str, str]:
    """job name -> kind, as the stack file asks."""
    jobs: dict[str, str] = {}

    def capture() -> None:
        settings, _ = load_settings()
        jobs.update({job.name: job.kind for job in settings.workloads})

    render(read_stack(stack), entrypoint=capture)
    return jobs


@pytest.mark.parametrize("stack", available_stacks())
def test_every_configured_job_renders_as_a_valid_volcano_job(stack: str) -> None:
    recording = _program(stack)
    rendered = training_jobs(recording)
    configured = _configured_jobs(stack)
    assert set(rendered) == set(configured)
    for name, kind in configured.items():
        record = rendered[name]
        assert record.parent is not None and f"trainyard:workloads:{KIND_TYPES[kind]}::{name}" in record.parent
        errors = volcano_schema_errors(record)
        assert not errors, f"{stack}/{name}: " + "; ".join(errors[:5])


@pytest.mark.parametrize("stack", available_stacks())
def test_jobs_wait_for_volcano_and_their_tenant(stack: str) -> None:
    recording = _program(stack)
    for record in (r for r in recording.resources if r.type == JOB_TYPE):
        namespace = record.inputs["metadata"]["namespace"]
        assert any("trainyard:platform:Volcano$" in urn for urn in record.depends_on), record.name
        namespaces = [r for r in recording.resources if r.type == "kubernetes:core/v1:Namespace"
                      and r.inputs["metadata"]["name"] == namespace]
        assert namespaces and namespaces[0].urn in record.depends_on, record.name


@pytest.mark.parametrize("stack", available_stacks())
def test_pod_monitors_wait_for_the_monitoring_release(stack: str) -> None:
    recording = _program(stack)
    monitors = [r for r in recording.resources if r.type == "kubernetes:monitoring.coreos.com/v1:PodMonitor"
                and "trainyard:workloads:" in (r.parent or "")]
    assert len(monitors) == len(training_jobs(recording))  # monitoring is on in every stack file
    for monitor in monitors:
        assert any("trainyard:platform:Monitoring$kubernetes:helm.sh/v3:Release" in urn
                   for urn in monitor.depends_on), monitor.name
