"""Every training job of every stack, run from its rendered Volcano Job on CPU (see rendered_jobs.py for what stands
in for the cluster): it reaches its first step at MIN and MAX nodes of its range, each failure class exits with the
code the job's own rendered policies map to the intended action, and nothing of its run directory is lost.

Jobs whose runs would be the same (the same rendered launch, config, policies and node counts, told apart only by
their stack's, namespace's and own names: the smoke test every AWS stack carries) run once, under one id naming
them all."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import signal
import time
from pathlib import Path

import pytest
from rendered_jobs import (
    Cluster,
    RenderedJob,
    kill,
    processes_per_pod,
    rendered_training_jobs,
    run_key,
    volcano_action,
    wait_all,
)
from trainyard.plan.runtime import available_stacks
from trainyard_train.checkpoint import COMMIT, complete_checkpoints
from trainyard_train.exitcodes import CONFIG_ERROR, CRASH, STOPPED, STORE_LOST

pytestmark = pytest.mark.slow
JOBS = [job for stack in available_stacks() for job in rendered_training_jobs(stack)]
# One run per distinct run: the first job of each, and every job it stands for.
RUNS: dict[str, list[RenderedJob]] = {}
for _job in JOBS:
    RUNS.setdefault(run_key(_job), []).append(_job)


def intended(job: RenderedJob, exit_code: int) -> str:
    """The action each failure class should get (README, "Job failure semantics")."""
    if exit_code == CONFIG_ERROR:
        return "TerminateJob"  # final: no retry can fix it
    if job.job.kind == "smoke":
        return "TerminateJob"  # a smoke test that fails must show as failed
    if exit_code == STORE_LOST:
        return "RestartJob"  # worker-0 took the rendezvous store: every survivor fails, the job restarts once
    return "RestartPod"  # a lost or crashed pod alone; the others go on


def claim_snapshot(cluster: Cluster) -> tuple[list[int], str]:
    """Committed steps and the progress log: what must survive every later run."""
    progress = cluster.checkpoint_claim / "progress.jsonl"
    return ([r.step for r in complete_checkpoints(cluster.checkpoint_claim / "checkpoints")],
            progress.read_text() if progress.exists() else "")


def assert_nothing_lost(cluster: Cluster, before: tuple[list[int], str], keep_last: int = 3) -> None:
    committed, progress = claim_snapshot(cluster)
    assert progress.startswith(before[1]), "progress.jsonl lost lines"
    survivors = before[0][-keep_last:]
    assert [s for s in committed if s in before[0]] == [s for s in survivors if s in committed]
    assert committed and committed[-1] >= (before[0][-1] if before[0] else 0), (before[0], committed)


def world(job: RenderedJob, nodes: int) -> int:
    return nodes * processes_per_pod(job, nodes)


@pytest.mark.parametrize("job", [same[0] for same in RUNS.values()],
                         ids=["+".join(f"{j.stack}-{j.job.name}" for j in same) for same in RUNS.values()])
def test_rendered_job_runs_and_fails_as_its_policies_intend(job: RenderedJob, tmp_path: Path,
                                                           s3_server: str) -> None:
    cluster = Cluster(job, tmp_path, s3_server)
    cluster.prepare_dataset()
    policies = job.spec["policies"]
    low, high = job.node_counts[0], job.node_counts[-1]
    pods: list = []
    try:
        # A config error, found before any rendezvous: final.
        pods = cluster.start(1, "train.steps=0")
        (code,) = wait_all(pods)
        assert code == CONFIG_ERROR, pods[0].output()
        assert volcano_action(policies, code) == intended(job, code)

        # MIN nodes reach their first step.
        pods = cluster.start(low, "train.steps=100000")
        cluster.wait_for_event(pods, lambda e: e["event"] == "step")
        first = [e for e in cluster.events() if e["event"] == "start"][0]
        assert first["world_size"] == world(job, low) and first["step"] == 0

        # A killed worker: its node agent restarts the workers from the last checkpoint (the smoke job has no
        # restarts: it fails, and its policy ends the job).
        cluster.wait_for_event(pods, lambda e: e["event"] == "checkpoint")
        before = claim_snapshot(cluster)
        os.kill(pods[0].workers()[0], signal.SIGKILL)
        if job.job.kind == "smoke":
            assert wait_all(pods) == [CRASH] * low, pods[0].output()
            assert volcano_action(policies, CRASH) == intended(job, CRASH)
            assert_nothing_lost(cluster, before)
            return
        cluster.wait_for_event(pods, lambda e: e["event"] == "start" and e["restart_count"] >= 1)
        restarted = [e for e in cluster.events() if e["event"] == "start"][-1]
        assert restarted["step"] >= before[0][-1] and restarted["resumed_from"].endswith(f"{restarted['step']:08d}")
        cluster.wait_for_event(pods, lambda e: e["event"] == "step" and e["step"] > restarted["step"])

        # Stopped by a signal (every pod deleted or evicted): a committed checkpoint, then the stop code.
        logged = [len(pod.output()) for pod in pods]  # the kill above left the peer's crash in the log
        for pod in pods:
            os.kill(pod.proc.pid, signal.SIGTERM)
        codes = wait_all(pods)
        assert codes == [STOPPED] * low, "\n".join(p.output()[-3000:] for p in pods)
        assert all("Traceback" not in p.output()[n:] for p, n in zip(pods, logged, strict=True))
        assert volcano_action(policies, STOPPED) == intended(job, STOPPED)
        stopped = [e for e in cluster.events() if e["event"] == "stopped"][-1]
        assert (cluster.checkpoint_claim / "checkpoints" / f"step-{stopped['step']:08d}" / COMMIT).exists()
        assert_nothing_lost(cluster, before)
        if (target := cluster.export_target) is not None:  # the stop's checkpoint left the cluster too
            assert target.step_prefix(stopped["step"]) + COMMIT in cluster.exported_keys()

        # MAX nodes (the pods recreated, the range grown): resumed from the stop's checkpoint, one more step.
        if high != low:
            before = claim_snapshot(cluster)
            pods = cluster.start(high, f"train.steps={stopped['step'] + 1}")
            assert wait_all(pods) == [0] * high, "\n".join(p.output()[-3000:] for p in pods)
            start = [e for e in cluster.events() if e["event"] == "start"][-1]
            assert start["world_size"] == world(job, high) and start["step"] == stopped["step"]
            assert cluster.events()[-1] == {**cluster.events()[-1], "event": "done", "step": stopped["step"] + 1}
            assert_nothing_lost(cluster, before)

        # worker-0's node lost (its pod killed outright): the c10d store it hosted goes with it, and every other
        # pod ends with the store-lost code, which restarts the job once (review-incluster finding 1). At the
        # fewest nodes of the range with two survivors (its top if smaller): survivors whose workers fail with a
        # peer gone and whose agents then re-rendezvous among themselves still end with it.
        if high > 1:
            nodes, begun = min(high, max(low, 3)), time.time()
            pods = cluster.start(nodes, "train.steps=100000")
            cluster.wait_for_event(pods, lambda e: e["event"] == "start" and e["time"] > begun
                                   and e["world_size"] == world(job, nodes))  # every pod in, late joiners too
            joined = [e for e in cluster.events() if e["event"] == "start"][-1]
            cluster.wait_for_event(pods, lambda e: e["event"] == "step" and e["time"] > joined["time"])
            kill(pods[:1])
            assert wait_all(pods[1:]) == [STORE_LOST] * (nodes - 1), "\n".join(p.output()[-3000:] for p in pods[1:])
            assert volcano_action(policies, STORE_LOST) == intended(job, STORE_LOST)
    finally:
        kill(pods)


def test_the_runner_covers_every_training_job_of_every_stack() -> None:
    from trainyard.plan.runtime import read_stack, settings_of

    expected = {(s, j.name) for s in available_stacks() for j in settings_of(read_stack(s)).workloads}
    assert {(j.stack, j.job.name) for same in RUNS.values() for j in same} == expected and expected
    # A job stands for another only when the runner would see the same thing once the names are set aside.
    for first, *others in RUNS.values():
        assert all(run_key(other) == run_key(first) and other.job.kind == first.job.kind for other in others)


def test_jobs_apart_only_by_their_names_run_once() -> None:
    """Renaming a job's stack, namespace and job leaves its run the same; any other change to what the runner
    reads (an argument, an env value, a policy, the config) makes it a run of its own."""
    job = next(j for j in JOBS if j.job.dataset is None)
    renamed = dataclasses.replace(job, stack="other", job=job.job.model_copy(update={"name": "renamed"}),
                                  manifest=_renamed(job.manifest, job, "other", "renamed"),
                                  config_maps={k.replace(job.job.name, "renamed"): v
                                               for k, v in job.config_maps.items()})
    assert run_key(renamed) == run_key(job)
    changed = copy.deepcopy(job.manifest)
    changed["spec"]["tasks"][0]["template"]["spec"]["containers"][0]["args"].append("train.steps=7")
    assert run_key(dataclasses.replace(job, manifest=changed)) != run_key(job)
    changed = copy.deepcopy(job.manifest)
    changed["spec"]["policies"] = changed["spec"]["policies"][1:]
    assert run_key(dataclasses.replace(job, manifest=changed)) != run_key(job)
    maps = {k: {f: t + "\n# another config" for f, t in v.items()} for k, v in job.config_maps.items()}
    assert run_key(dataclasses.replace(job, config_maps=maps)) != run_key(job)


def _renamed(manifest: dict, job: RenderedJob, stack: str, name: str) -> dict:
    text = json.dumps(manifest).replace(f"trainyard-{job.stack}-", f"trainyard-{stack}-").replace(job.job.name, name)
    return dict(json.loads(text))


def test_volcano_action_follows_policy_order() -> None:
    policies = [{"exitCode": 2, "action": "TerminateJob"}, {"event": "PodFailed", "action": "RestartPod"}]
    assert [volcano_action(policies, c) for c in (0, 1, 2, 143)] == ["SyncJob", "RestartPod", "TerminateJob",
                                                                     "RestartPod"]
    # Events of a policy are matched before its own exit code, and earlier policies first (applyPolicies).
    assert volcano_action(list(reversed(policies)), 2) == "RestartPod"
