"""Every stack's `pulumi up` rehearses clean, and each bring-up defect of issue 9, put back, is named.

A defect is put back on the rendered recording the way the old code produced it (a dependency the old code
lacked, a value it set), so each test keeps working whatever shape the fix took.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from owned_stacks import OWNED_STACKS, recording
from rehearsal_records import Match, edited, rehearsed
from trainyard.config import Settings
from trainyard.config.instance_types import INSTANCE_TYPES
from trainyard.names import POOL_LABEL
from trainyard.plan.engine_order import creation_order
from trainyard.plan.pods import lookup
from trainyard.plan.recording import Recording, ResourceRecord
from trainyard.plan.rehearse import Finding
from trainyard.plan.rendering import chart_name
from trainyard.plan.runtime import STACKS_DIR, available_stacks, read_stack, render, settings_of
from trainyard.plan.volcano_jobs import job_demand

ROOT = Path(__file__).resolve().parents[2]


# A stack is (name, folder): the sample stacks in stacks/, which users edit, or the stacks the tests own, which the
# defects below are put back on (their expectations name its pools, jobs and tenants).
Stack = tuple[str, Path]
FLEET: Stack = ("fleet", OWNED_STACKS)
LAPTOP: Stack = ("laptop", OWNED_STACKS)


def rendered(stack: Stack) -> Recording:
    return recording(stack)


def fresh(stack: Stack = FLEET) -> Recording:
    return Recording(resources=list(rendered(stack).resources))


def stacks_where(has: Callable[[Settings], bool]) -> list[Any]:
    """The fleet and every sample stack whose settings `has` the feature a test puts a defect back on."""
    samples = [(name, STACKS_DIR) for name in available_stacks() if has(settings_of(read_stack(name)))]
    return [pytest.param(stack, id=stack[0]) for stack in [FLEET, *samples]]


def every_stack() -> list[Stack]:
    """The fleet, then every sample stack."""
    return [FLEET, *((name, STACKS_DIR) for name in available_stacks())]


def of_type(suffix: str) -> Match:
    return lambda r: r.type.endswith(suffix)


def release_of(chart: str) -> Match:
    return lambda r: r.type == "kubernetes:helm.sh/v3:Release" and chart_name(str(r.inputs.get("chart"))) == chart



def drop(recording: Recording, match: Match) -> Recording:
    return Recording(resources=[r for r in recording.resources if not match(r)])


def cut(recording: Recording, who: Match, what: Match) -> Recording:
    """Remove every dependency through which a `who` record (or a component above it) waits on a `what` record."""
    by_urn = recording.by_urn()
    _, closure = creation_order(recording.resources)
    children: dict[str, list[str]] = {}
    for r in recording.resources:
        if r.parent:
            children.setdefault(r.parent, []).append(r.urn)

    def reaches(urn: str) -> bool:
        pending, seen = [urn], set()
        while pending:
            current = pending.pop()
            if current in seen or current not in by_urn:
                continue
            seen.add(current)
            if what(by_urn[current]):
                return True
            pending += closure[current]
            if not by_urn[current].custom:
                pending += children.get(current, [])
        return False

    targets: set[str] = set()
    for record in recording.resources:
        if who(record):
            current: str | None = record.urn
            while current in by_urn:
                targets.add(current)
                current = by_urn[current].parent
    resources = [replace(r, depends_on=tuple(d for d in r.depends_on if not reaches(d))) if r.urn in targets else r
                 for r in recording.resources]
    return Recording(resources=resources)


def named(findings: tuple[Finding, ...], rule: str, match: Match, recording: Recording) -> list[Finding]:
    by_urn = recording.by_urn()
    return [f for f in findings if f.rule == rule and match(by_urn[f.urn])]


# -------------------------------------------------------------------------------------------- every stack


@pytest.mark.parametrize("stack", stacks_where(lambda _: True))
def test_every_stack_rehearses_clean(stack: Stack) -> None:
    result = rehearsed(rendered(stack))
    assert result.passed, "\n".join(str(f) for f in result.findings)
    assert result.order and result.checks


def test_the_rehearsal_is_deterministic() -> None:
    first, second = rehearsed(render(read_stack(*FLEET))), rehearsed(rendered(FLEET))
    assert first == second


def test_cli_rehearse_exits_1_exactly_when_the_rehearsal_fails(tmp_path: Path) -> None:
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    (stacks / "Pulumi.laptop.yaml").write_text((OWNED_STACKS / "Pulumi.laptop.yaml").read_text())
    run = subprocess.run([sys.executable, "-m", "trainyard", "plan", "--stack", "laptop", "--quiet", "--rehearse",
                          "--stacks-dir", str(stacks)], capture_output=True, text=True, cwd=ROOT, timeout=120)
    result = rehearsed(rendered(LAPTOP))
    assert run.returncode == (0 if result.passed else 1), run.stdout + run.stderr
    if result.passed:
        assert "Rehearsal of `pulumi up` for laptop: converges" in run.stdout
    else:
        assert f"First resource that would hang or fail:\n  {result.findings[0]}" in run.stdout


# --------------------------------------------------------------------------------- issue 9, put back one by one


def test_item_1_node_groups_before_the_cni_are_named_first() -> None:
    old = cut(fresh(), of_type("eks/nodeGroup:NodeGroup"), release_of("cilium"))
    findings = rehearsed(old).findings
    assert findings and findings[0].rule == "node-needs-cni", findings[:1]
    assert {f.name for f in named(findings, "node-needs-cni", of_type("NodeGroup"), old)} >= {
        "system-group", "storage-group"}


def test_item_1_a_cilium_release_that_waits_for_pods_is_named() -> None:
    def waits(inputs: dict[str, Any]) -> None:
        inputs["atomic"] = True
        inputs.pop("skipAwait", None)

    old = edited(fresh(), release_of("cilium"), waits)
    found = named(rehearsed(old).findings, "release-needs-nodes", release_of("cilium"), old)
    assert found and "cilium-operator" in found[0].problem


def test_item_3_rook_selecting_no_node_is_named() -> None:
    def no_nodes(inputs: dict[str, Any]) -> None:
        storage = inputs["values"]["cephClusterSpec"]["storage"]
        for key in ("nodes", "storageClassDeviceSets"):
            storage.pop(key, None)
        storage["useAllNodes"] = False

    old = edited(fresh(), release_of("rook-ceph-cluster"), no_nodes)
    found = named(rehearsed(old).findings, "ceph-has-osds", release_of("rook-ceph-cluster"), old)
    assert found and "Rook creates no OSD" in found[0].problem


def test_item_4_checkpoint_claims_racing_ceph_are_named() -> None:
    is_ceph = release_of("rook-ceph-cluster")
    old = cut(fresh(), of_type("core/v1:PersistentVolumeClaim"), is_ceph)
    found = named(rehearsed(old).findings, "claim-binds", of_type("PersistentVolumeClaim"), old)
    assert {f.name for f in found} >= {"pretrain-h100-checkpoints", "eval-mig-checkpoints"}
    assert all("pulumi up waits for the claim to bind" in f.problem for f in found)


@pytest.mark.parametrize("stack", stacks_where(lambda s: any(p.mig_layout for p in s.node_pools)))
def test_item_5_mig_pools_without_a_node_overlay_are_named(stack: Stack) -> None:
    old = drop(fresh(stack), of_type(":NodeOverlay"))
    found = named(rehearsed(old).findings, "karpenter-can-launch", of_type("volcano.sh/v1alpha1:Job"), old)
    assert found and all("nvidia.com/mig-" in f.problem for f in found)


def test_item_5_the_node_overlay_feature_gate_off_is_named() -> None:
    def gate_off(inputs: dict[str, Any]) -> None:
        inputs["values"].setdefault("settings", {}).setdefault("featureGates", {})["nodeOverlay"] = False

    old = edited(fresh(), release_of("karpenter"), gate_off)
    found = named(rehearsed(old).findings, "karpenter-can-launch", of_type("volcano.sh/v1alpha1:Job"), old)
    assert found and "feature gate is off" in found[0].problem


def _set_actions(actions: str) -> Callable[[dict[str, Any]], None]:
    def change(inputs: dict[str, Any]) -> None:
        custom = inputs["values"].setdefault("custom", {})
        text = str(custom.get("scheduler_config_override") or "")
        lines = [line for line in text.splitlines() if not line.startswith("actions:")]
        custom["scheduler_config_override"] = "\n".join([f'actions: "{actions}"', *lines]) + "\n"
    return change


def test_item_6_enqueue_before_gpu_pools_scale_is_named() -> None:
    old = edited(fresh(), release_of("volcano"), _set_actions("enqueue, allocate, backfill"))
    found = named(rehearsed(old).findings, "gang-admitted", of_type("volcano.sh/v1alpha1:Job"), old)
    assert {f.name for f in found} >= {"pretrain-h100", "finetune-h200"}


def test_item_6_reclaimable_queues_without_reclaim_are_named() -> None:
    old = edited(fresh(), release_of("volcano"), _set_actions("allocate, backfill"))
    found = named(rehearsed(old).findings, "reclaim-configured", lambda r: "Queue" in r.type, old)
    reclaimable = [r for r in old.resources if "Queue" in r.type and lookup(r.inputs, "spec.reclaimable")]
    assert reclaimable, "no reclaimable queue left to check"
    assert len(found) == len(reclaimable)


def test_item_9_cache_workers_pinned_to_gpu_nodes_are_named() -> None:
    gpu_only = {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "trainyard.io/role", "operator": "In", "values": ["gpu"]}]}]}

    def on_gpu_runtime(inputs: dict[str, Any]) -> None:
        inputs["spec"]["replicas"] = 9
        inputs["spec"].setdefault("worker", {})["nodeSelector"] = {"trainyard.io/role": "gpu"}

    def on_gpu_dataset(inputs: dict[str, Any]) -> None:
        inputs["spec"]["nodeAffinity"] = {"required": gpu_only}
        inputs["spec"]["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]

    old = edited(fresh(), of_type(":AlluxioRuntime"), on_gpu_runtime)
    old = edited(old, lambda r: r.type.endswith(":Dataset") and not str(
        lookup(r.inputs, "spec.mounts", [{}])[0].get("mountPoint", "")).startswith("dataset://"), on_gpu_dataset)
    found = named(rehearsed(old).findings, "cache-off-gpu-nodes", of_type(":AlluxioRuntime"), old)
    assert found and "GPU pools" in found[0].problem


def test_item_15_prometheus_on_ceph_is_named() -> None:
    def on_ceph(inputs: dict[str, Any]) -> None:
        spec = inputs["values"].setdefault("prometheus", {}).setdefault("prometheusSpec", {})
        spec["storageSpec"] = {"volumeClaimTemplate": {"spec": {"storageClassName": "ceph-block",
                                                                "resources": {"requests": {"storage": "500Gi"}}}}}

    old = edited(fresh(), release_of("kube-prometheus-stack"), on_ceph)
    found = named(rehearsed(old).findings, "release-volumes-bind", release_of("kube-prometheus-stack"), old)
    assert found and "ceph-block" in found[0].problem


def test_item_8_pod_identity_allowed_by_cidr_only_is_named() -> None:
    def by_cidr(inputs: dict[str, Any]) -> None:
        egress = [rule for rule in inputs["spec"].get("egress") or () if "host" not in (rule.get("toEntities") or ())]
        egress.append({"toCIDR": ["169.254.170.23/32"], "toPorts": [{"ports": [{"port": "80", "protocol": "TCP"}]}]})
        inputs["spec"]["egress"] = egress

    old = edited(fresh(), of_type("cilium.io/v2:CiliumNetworkPolicy"), by_cidr)
    found = named(rehearsed(old).findings, "pod-identity-reachable", of_type("CiliumNetworkPolicy"), old)
    assert {lookup(old.by_urn()[f.urn].inputs, "metadata.namespace") for f in found} >= {"research", "foundation"}


def test_item_1_coredns_before_any_node_is_named() -> None:
    def is_coredns(record: ResourceRecord) -> bool:
        return record.type == "aws:eks/addon:Addon" and record.inputs.get("addonName") == "coredns"

    old = cut(fresh(), is_coredns, of_type("eks/nodeGroup:NodeGroup"))
    found = named(rehearsed(old).findings, "addon-needs-nodes", is_coredns, old)
    assert found and "no Ready node" in found[0].problem


# -------------------------------------------------------------------------------- issue 18, put back one by one


def _mig_pools(recording: Recording) -> set[str]:
    return {str(lookup(r.inputs, "metadata.name")) for r in recording.resources if r.type.endswith(":NodePool")
            and (lookup(r.inputs, "spec.template.metadata.labels", {}) or {}).get("nvidia.com/mig.config")}


@pytest.mark.parametrize("stack", stacks_where(lambda s: any(p.mig_layout for p in s.node_pools)))
def test_issue_18_item_9_mig_pools_limited_on_whole_gpus_are_named(stack: Stack) -> None:
    def gpu_limit_only(inputs: dict[str, Any]) -> None:
        inputs["spec"]["limits"] = {"nvidia.com/gpu": "16"}

    old = edited(fresh(stack), of_type(":NodePool"), gpu_limit_only)
    found = named(rehearsed(old).findings, "pool-limits-bound", of_type(":NodePool"), old)
    # Only the partitioned pools: a whole-GPU pool's nvidia.com/gpu limit still counts its nodes.
    assert {str(lookup(old.by_urn()[f.urn].inputs, "metadata.name")) for f in found} == _mig_pools(old) != set()


@pytest.mark.parametrize("stack", stacks_where(lambda s: s.is_aws and any(p.role == "gpu" for p in s.node_pools)))
def test_issue_18_item_3_gpu_pools_without_a_reaper_are_named(stack: Stack) -> None:
    old = drop(fresh(stack), of_type("batch/v1:CronJob"))
    found = named(rehearsed(old).findings, "stranded-nodes-reclaimed", of_type(":NodePool"), old)
    pools = [r for r in old.resources if r.type.endswith(":NodePool")]
    assert pools and len(found) == len(pools)
    assert all("bills until someone deletes it" in f.problem for f in found)


def test_issue_18_item_3_a_reaper_that_may_not_delete_nodeclaims_is_named() -> None:
    def list_only(inputs: dict[str, Any]) -> None:
        for rule in inputs.get("rules") or ():
            rule["verbs"] = [v for v in rule["verbs"] if v != "delete"]

    old = edited(fresh(), lambda r: r.type.endswith(":ClusterRole") and r.name.endswith("reaper"), list_only)
    assert named(rehearsed(old).findings, "stranded-nodes-reclaimed", of_type(":NodePool"), old)


def _efa_job_pools(recording: Recording) -> set[str]:
    """Pools some Volcano job's pods select by name while requesting EFA devices."""
    return {str(lookup(task, "template.spec.nodeSelector", {}).get(POOL_LABEL))
            for r in recording.resources if r.type.endswith("volcano.sh/v1alpha1:Job")
            for task in lookup(r.inputs, "spec.tasks", ()) or ()
            for container in lookup(task, "template.spec.containers", ()) or ()
            if "vpc.amazonaws.com/efa" in (lookup(container, "resources.requests", {}) or {})}


def _class_names(findings: list[Finding], recording: Recording) -> set[str]:
    return {str(lookup(recording.by_urn()[f.urn].inputs, "metadata.name")) for f in findings}


@pytest.mark.parametrize("stack", stacks_where(lambda s: s.is_aws and any(p.efa for p in s.node_pools)))
def test_review_finding_1_efa_pools_on_interfaces_with_ips_are_named(stack: Stack) -> None:
    """The old node classes of EFA pools listed no networkInterfaces: Karpenter's default `efa` interfaces carry
    IPs, which Cilium's ENI IPAM hands to pods (cilium/cilium 42600)."""
    settings = settings_of(read_stack(*stack))
    efa_pools = {p.name for p in settings.node_pools if p.efa} & _efa_job_pools(fresh(stack))
    assert efa_pools, "no EFA pool with EFA jobs"

    def default_interfaces(inputs: dict[str, Any]) -> None:
        inputs["spec"].pop("networkInterfaces", None)

    old = edited(fresh(stack), of_type(":EC2NodeClass"), default_interfaces)
    found = named(rehearsed(old).findings, "efa-interfaces-ip-less", of_type(":EC2NodeClass"), old)
    assert _class_names(found, old) == efa_pools
    assert all("lists no networkInterfaces" in f.problem for f in found)

    def card_1_with_ips(inputs: dict[str, Any]) -> None:
        for interface in inputs["spec"].get("networkInterfaces") or ():
            if interface["networkCardIndex"] == 1:
                interface["interfaceType"] = "interface"

    old = edited(fresh(stack), lambda r: r.type.endswith(":EC2NodeClass")
               and lookup(r.inputs, "metadata.name") in efa_pools, card_1_with_ips)
    found = named(rehearsed(old).findings, "efa-interfaces-ip-less", of_type(":EC2NodeClass"), old)
    cards = {name for name in efa_pools if min(INSTANCE_TYPES[t].efa_interfaces
                                               for t in settings.pool(name).instance_types) > 1}
    assert _class_names(found, old) == cards
    assert all("card 1/device 1" in f.problem for f in found)


@pytest.mark.parametrize("stack", stacks_where(lambda s: s.is_aws))
def test_review_finding_9_a_job_the_engine_stops_awaiting_first_is_named(stack: Stack) -> None:
    """The old Pod Identity check: no customTimeouts, and a deadline of 30 x (10 + 10) + 60 s, past the
    provider's 10-minute Job await."""
    is_check = of_type("batch/v1:Job")
    jobs = [r for r in fresh(stack).resources if is_check(r) and r.custom_timeouts]
    assert jobs, "no awaited Job with a create timeout"

    def old_deadline(inputs: dict[str, Any]) -> None:
        inputs["spec"]["activeDeadlineSeconds"] = 660

    old = edited(fresh(stack), lambda r: r in jobs, old_deadline)
    old = Recording(resources=[replace(r, custom_timeouts={}) if is_check(r) else r for r in old.resources])
    found = named(rehearsed(old).findings, "job-ends-before-its-await", is_check, old)
    assert {f.name for f in found} == {j.name for j in jobs}
    assert all("the provider's default 10 min" in f.problem for f in found)


# -------------------------------------------------------------------------------------------- issue 19


def _queue_with_gpu_jobs() -> tuple[Stack, str, float]:
    """A Volcano queue with a GPU capability and GPU jobs in it, on the fleet or a sample stack: (stack, queue, the
    jobs' GPUs)."""
    for stack in every_stack():
        records = rendered(stack).resources
        jobs = [r for r in records if r.type.endswith("volcano.sh/v1alpha1:Job")]
        for queue in (r for r in records if r.type.endswith(":Queue")):
            name = lookup(queue.inputs, "metadata.name")
            if "nvidia.com/gpu" not in (lookup(queue.inputs, "spec.capability", {}) or {}):
                continue
            gpus = sum(job_demand(j).get("nvidia.com/gpu", 0.0) for j in jobs
                       if (lookup(j.inputs, "spec.queue", "default") or "default") == name)
            if gpus:
                return stack, str(name), gpus
    raise AssertionError("no stack has a queue with a GPU capability and GPU jobs in it")


def test_issue_19_finding_7_a_queue_handed_more_than_its_capability_is_named() -> None:
    """The old stacks handed a queue jobs whose pods, all created at once (volcano 4710), exceeded its capability."""
    stack, queue, gpus = _queue_with_gpu_jobs()

    def short(inputs: dict[str, Any]) -> None:
        inputs["spec"]["capability"]["nvidia.com/gpu"] = str(int(gpus) - 1)

    old = edited(fresh(stack), lambda r: r.type.endswith(":Queue") and lookup(r.inputs, "metadata.name") == queue,
               short)
    (found,) = named(rehearsed(old).findings, "queue-demand-fits", of_type("volcano.sh/v1alpha1:Job"), old)
    assert f"queue {queue}'s jobs" in found.problem and f"{gpus:g} nvidia.com/gpu" in found.problem, found.problem


def test_issue_19_finding_3_the_source_mount_under_its_name_is_named() -> None:
    """The old source Dataset mounted the S3 prefix without `path: /`, so Fluid showed it under /s3 of every claim
    while the jobs read the claim's root."""
    stack = next(s for s in every_stack() if any(
        str(a).startswith("data.path=") for r in rendered(s).resources if r.type.endswith("volcano.sh/v1alpha1:Job")
        for t in lookup(r.inputs, "spec.tasks", ()) for c in lookup(t, "template.spec.containers", ())
        for a in c.get("args", ())))

    def under_its_name(inputs: dict[str, Any]) -> None:
        for mount in inputs["spec"]["mounts"]:
            mount.pop("path", None)

    old = edited(fresh(stack), lambda r: r.type.endswith(":Dataset") and not any(
        str(m.get("mountPoint", "")).startswith("dataset://") for m in lookup(r.inputs, "spec.mounts", ())),
        under_its_name)
    found = named(rehearsed(old).findings, "dataset-path-served", of_type("volcano.sh/v1alpha1:Job"), old)
    readers = {r.name for r in old.resources if r.type.endswith("volcano.sh/v1alpha1:Job") and "data.path=" in str(
        r.inputs)}
    assert readers and {f.name for f in found} == readers
    assert all("shows the dataset's prefix at /data/s3" in f.problem for f in found), found


def _cache_stack() -> Stack:
    return next(s for s in every_stack() if any(release_of("fluid")(r) for r in rendered(s).resources))


def test_issue_19_finding_1_the_csi_plugin_borrowing_the_kubelet_kubeconfig_is_named() -> None:
    """Fluid's default node authorization mounts /etc/kubernetes/kubelet.conf, which AL2023 nodes lack."""
    def node_authorization(inputs: dict[str, Any]) -> None:
        inputs["values"].setdefault("csi", {})["useNodeAuthorization"] = True

    old = edited(fresh(_cache_stack()), release_of("fluid"), node_authorization)
    (found,) = named(rehearsed(old).findings, "host-paths-exist", release_of("fluid"), old)
    assert "/etc/kubernetes/kubelet.conf" in found.problem, found.problem


def test_issue_19_finding_8_fluid_controllers_tolerating_every_taint_are_named() -> None:
    """The old values let Fluid's controllers and webhook tolerate every taint (GPU and storage pools included)."""
    def everywhere(inputs: dict[str, Any]) -> None:
        values = inputs["values"]
        for key in ("dataset", "webhook"):
            values.setdefault(key, {})["tolerations"] = [{"operator": "Exists"}]
        values.setdefault("runtime", {}).setdefault("alluxio", {})["tolerations"] = [{"operator": "Exists"}]

    old = edited(fresh(_cache_stack()), release_of("fluid"), everywhere)
    (found,) = named(rehearsed(old).findings, "controllers-off-special-nodes", release_of("fluid"), old)
    assert "alluxioruntime-controller" in found.problem and "can land on" in found.problem, found.problem


# ------------------------------------------------------------------------- issue 22: hard topology on Karpenter

VOLCANO_JOB = "kubernetes:batch.volcano.sh/v1alpha1:Job"
NODE_POOL = "kubernetes:karpenter.sh/v1:NodePool"
NODE_CLASS = "kubernetes:karpenter.k8s.aws/v1:EC2NodeClass"
INSTANCE_TYPE = "node.kubernetes.io/instance-type"
CAPACITY_TYPE = "karpenter.sh/capacity-type"


def _pool_of(job: ResourceRecord) -> str | None:
    tasks = lookup(job.inputs, "spec.tasks") or ()
    return (lookup(tasks[0], "template.spec.nodeSelector") or {}).get("trainyard.io/pool") if tasks else None


def _types(pool: ResourceRecord) -> list[str]:
    return next((list(r["values"]) for r in lookup(pool.inputs, "spec.template.spec.requirements") or ()
                 if r["key"] == INSTANCE_TYPE), [])


def _topology_case(stack: Stack) -> tuple[ResourceRecord, ResourceRecord] | None:
    """The stack's first Volcano job on a Karpenter pool whose instance types report an EC2 network topology."""
    records = rendered(stack).resources
    pools = {lookup(r.inputs, "metadata.name"): r for r in records if r.type == NODE_POOL}
    for job in (r for r in records if r.type == VOLCANO_JOB):
        pool = pools.get(_pool_of(job))
        if pool and _types(pool) and all(t in INSTANCE_TYPES and INSTANCE_TYPES[t].network_layers
                                         for t in _types(pool)):
            return job, pool
    return None


def _hard_on(stack: Stack, job: ResourceRecord, pool: ResourceRecord, capacity: str, grow: bool) -> Recording:
    """On a copy: the job asks for hard topology on its pool, made one instance type of `capacity` in a cluster
    placement group (co-located by construction unless spot); `grow` gives it one pod more than its gang."""
    class_name = lookup(pool.inputs, "spec.template.spec.nodeClassRef.name")

    def hard(inputs: dict[str, Any]) -> None:
        inputs["spec"]["networkTopology"] = {"mode": "hard", "highestTierAllowed": 3}
        pods = sum(int(t.get("replicas", 1)) for t in inputs["spec"]["tasks"])
        inputs["spec"]["minAvailable"] = pods
        if grow:
            inputs["spec"]["tasks"][0]["replicas"] = int(inputs["spec"]["tasks"][0].get("replicas", 1)) + 1

    def placed(inputs: dict[str, Any]) -> None:
        inputs["spec"]["template"]["spec"]["requirements"] = [
            {"key": INSTANCE_TYPE, "operator": "In", "values": _types(pool)[:1]},
            {"key": CAPACITY_TYPE, "operator": "In", "values": [capacity]}]

    def grouped(inputs: dict[str, Any]) -> None:
        inputs["spec"]["placementGroupSelector"] = {"name": "trainyard-test"}

    recording = edited(fresh(stack), lambda r: r.urn == job.urn, hard)
    recording = edited(recording, lambda r: r.urn == pool.urn, placed)
    return edited(recording, lambda r: r.type == NODE_CLASS and lookup(r.inputs, "metadata.name") == class_name,
                grouped)


def test_hard_topology_where_karpenter_would_loop_is_refused_on_a_copy() -> None:
    """On rendered stacks (the fleet and each sample stack with such a job): a hard job on one instance type in a
    placement group rehearses clean; the same on spot, or grown past its gang, is named (the rule's other cases:
    tests/rehearsal/test_rules.py)."""
    stacks = [FLEET, *((name, STACKS_DIR) for name in available_stacks())]
    cases = [(stack, case) for stack in stacks if (case := _topology_case(stack))]
    assert cases and cases[0][0] == FLEET, "the fleet has no Volcano job on a Karpenter pool of EC2-topology types"
    for stack, (job, pool) in cases:
        for capacity, grow, fragment in (("on-demand", False, None), ("spot", False, "reclaimed spot node"),
                                         ("on-demand", True, "the job grows")):
            copy_ = _hard_on(stack, job, pool, capacity, grow)
            found = [f for f in rehearsed(copy_).findings if f.rule == "hard-topology-co-located" and f.urn == job.urn]
            if fragment is None:
                assert found == [], (stack, [str(f) for f in found])
            else:
                assert len(found) == 1 and fragment in found[0].problem, (stack, [str(f) for f in found])
