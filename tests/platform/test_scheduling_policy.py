"""Volcano's scheduler policy as it decides (issue 19 findings 6 and 19): whom `reclaim` may evict, whether
`preempt` can act at all, and whether GPU scheduling survives a scheduler restart.

The victim choice is a port of Volcano v1.15.1's `Session.Reclaimable` (pkg/scheduler/framework/session_plugins.go):
tiers in order; in a tier, every enabled plugin with a reclaimable function names candidates and the victims are
their intersection; a plugin naming none (or an empty intersection) voids the tier, and the first tier left with
victims decides. The plugins' functions are modelled from plugins/gang/gang.go (only tasks beyond the job's
minAvailable), plugins/conformance/conformance.go (never critical pods) and plugins/proportion/proportion.go
(only while the victim's queue holds more than its deserved share).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import pytest
import yaml
from owned_stacks import recording
from trainyard.plan.runtime import STACKS_DIR, available_stacks
from trainyard.plan.writers import HELM_RELEASE, release_of

STACKS = available_stacks()
VOLCANO_JOB = "kubernetes:batch.volcano.sh/v1alpha1:Job"


@dataclass(frozen=True)
class Task:
    name: str
    job: str
    queue: str
    gpus: int = 8
    critical: bool = False


@dataclass(frozen=True)
class Cluster:
    min_available: dict[str, int]  # job -> minAvailable
    ready: dict[str, int]  # job -> running tasks
    allocated: dict[str, int]  # queue -> GPUs held
    deserved: dict[str, int]  # queue -> GPUs deserved


Reclaimable = Callable[[Cluster, Sequence[Task]], list[Task]]


def _gang(cluster: Cluster, tasks: Sequence[Task]) -> list[Task]:
    occupied = dict(cluster.ready)
    victims = []
    for task in tasks:
        if occupied[task.job] > cluster.min_available[task.job]:
            occupied[task.job] -= 1
            victims.append(task)
    return victims


def _conformance(_: Cluster, tasks: Sequence[Task]) -> list[Task]:
    return [t for t in tasks if not t.critical]


def _proportion(cluster: Cluster, tasks: Sequence[Task]) -> list[Task]:
    allocated = dict(cluster.allocated)
    victims = []
    for task in tasks:
        if allocated[task.queue] > cluster.deserved[task.queue]:
            allocated[task.queue] -= task.gpus
            victims.append(task)
    return victims


RECLAIMABLE: dict[str, Reclaimable] = {"gang": _gang, "conformance": _conformance, "proportion": _proportion}


def reclaim_victims(tiers: Sequence[Sequence[dict[str, Any]]], cluster: Cluster,
                    reclaimees: Sequence[Task]) -> list[Task]:
    for tier in tiers:
        victims: list[Task] | None = None
        for plugin in tier:
            function = RECLAIMABLE.get(plugin["name"])
            if function is None or plugin.get("enableReclaimable") is False:
                continue
            candidates = function(cluster, reclaimees)
            if not candidates:
                victims = None
                break
            victims = candidates if victims is None else [v for v in victims if v in candidates] or None
        if victims is not None:
            return victims
    return []


@cache
def _scheduler(stack: str) -> tuple[dict[str, Any], dict[str, Any]]:
    (values,) = [release_of(r)["values"] for r in recording((stack, STACKS_DIR)).resources
                 if r.type == HELM_RELEASE and release_of(r)["chart"] == "volcano"]
    return values["custom"], yaml.safe_load(values["custom"]["scheduler_config_override"])


def _tiers(stack: str) -> list[list[dict[str, Any]]]:
    return [tier["plugins"] for tier in _scheduler(stack)[1]["tiers"]]


# Queue `a` runs an elastic job `e` (minAvailable 2) on 4 nodes; another queue reclaims.
ELASTIC = [Task(f"e-{i}", "e", "a") for i in range(4)]


@pytest.mark.parametrize("stack", STACKS)
def test_reclaim_spares_a_queue_within_its_share(stack: str) -> None:
    within_share = Cluster(min_available={"e": 2}, ready={"e": 4}, allocated={"a": 32}, deserved={"a": 48})
    assert reclaim_victims(_tiers(stack), within_share, ELASTIC) == []


@pytest.mark.parametrize("stack", STACKS)
def test_reclaim_never_breaks_a_running_gang(stack: str) -> None:
    gang = [Task(f"g-{i}", "g", "a") for i in range(2)]
    over_share = Cluster(min_available={"g": 2}, ready={"g": 2}, allocated={"a": 16}, deserved={"a": 8})
    assert reclaim_victims(_tiers(stack), over_share, gang) == []


@pytest.mark.parametrize("stack", STACKS)
def test_reclaim_takes_back_only_the_elastic_extras_lent_beyond_the_share(stack: str) -> None:
    over_share = Cluster(min_available={"e": 2}, ready={"e": 4}, allocated={"a": 32}, deserved={"a": 16})
    victims = reclaim_victims(_tiers(stack), over_share, ELASTIC)
    assert victims == ELASTIC[:2]
    critical = [Task("c-0", "e", "a", critical=True), *ELASTIC[1:]]
    assert Task("c-0", "e", "a", critical=True) not in reclaim_victims(_tiers(stack), over_share, critical)


@pytest.mark.parametrize("stack", STACKS)
def test_the_model_is_sensitive_to_the_tiers(stack: str) -> None:
    """With proportion in tier 2 (the old policy) reclaim took elastic extras from a queue within its share."""
    old = [[p for p in tier if p["name"] != "proportion"] for tier in _tiers(stack)]
    old[1].append({"name": "proportion"})
    within_share = Cluster(min_available={"e": 2}, ready={"e": 4}, allocated={"a": 32}, deserved={"a": 48})
    assert reclaim_victims(old, within_share, ELASTIC) == ELASTIC[:2]


@pytest.mark.parametrize("stack", STACKS)
def test_preempt_runs_only_where_priorities_differ(stack: str) -> None:
    """The priority plugin never names a victim of equal priority (plugins/priority/priority.go)."""
    _, conf = _scheduler(stack)
    actions = [a.strip() for a in conf["actions"].split(",")]
    priorities = {r.inputs["spec"]["priorityClassName"] for r in recording((stack, STACKS_DIR)).resources
                  if r.type == VOLCANO_JOB}
    if len(priorities) <= 1:
        assert "preempt" not in actions


@pytest.mark.parametrize("stack", STACKS)
def test_a_scheduler_restart_does_not_stop_scheduling(stack: str) -> None:
    custom, _ = _scheduler(stack)
    assert custom["scheduler_replicas"] >= 2 and custom["controller_replicas"] >= 2
    assert custom["leader_elect_enable"] is True
