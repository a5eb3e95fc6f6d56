"""Each readiness rule on tiny synthetic records: the smallest cluster that passes, and one change that fails."""

from __future__ import annotations

import pytest
from rehearsal_records import (
    GPU_TAINT,
    NODE_OVERLAY,
    PVC,
    cilium,
    cluster,
    gpu_operator,
    gpu_pod,
    job,
    karpenter_pool,
    node_group,
    rec,
    recording,
    rehearsed,
    release,
)
from trainyard.plan.cluster_model import Taint, Toleration, quantity
from trainyard.plan.engine_order import creation_order
from trainyard.plan.recording import ResourceRecord
from trainyard.plan.rehearse import Finding

ROOK_VALUES = {
    "cephClusterSpec": {
        "storage": {"useAllNodes": True, "useAllDevices": False, "deviceFilter": "^nvme[1-9]n1$"},
        "placement": {
            "osd": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "trainyard.io/role", "operator": "In", "values": ["storage"]}]}]}},
                "tolerations": [{"key": "trainyard.io/role", "operator": "Exists"}]}},
        "mon": {"count": 3}},
    "cephFileSystems": [{"name": "fs", "spec": {"metadataPool": {"replicated": {"size": 3}},
                                                "dataPools": [{"replicated": {"size": 3}}]},
                         "storageClass": {"enabled": True, "name": "ceph-filesystem"}}],
}
STORAGE_TAINT = {"key": "trainyard.io/role", "value": "storage", "effect": "NO_SCHEDULE"}


def findings(*records: ResourceRecord) -> list[Finding]:
    return list(rehearsed(recording(*records)).findings)


def launch_problems(*records: ResourceRecord) -> list[Finding]:
    """Only what Karpenter's rule says (these records leave out Volcano, which other rules would report)."""
    return [f for f in findings(*records) if f.rule == "karpenter-can-launch"]


def rules_of(*records: ResourceRecord) -> list[tuple[str, str]]:
    return [(f.rule, f.name) for f in findings(*records)]


def base() -> tuple[ResourceRecord, ...]:
    """EKS without aws-node, Cilium first (no wait), then a system node group: the order that converges."""
    eks = cluster()
    cni = cilium(eks)
    return eks, cni, node_group("system", eks, cni)


def storage(*after: ResourceRecord, nodes: int = 3) -> tuple[ResourceRecord, ...]:
    group = node_group("storage", *after, instance="i4i.8xlarge", nodes=nodes, taints=[STORAGE_TAINT])
    operator = release("rook", "rook-ceph", {"nodeSelector": {"trainyard.io/role": "system"}}, *after)
    ceph = release("ceph", "rook-ceph-cluster", ROOK_VALUES, operator, group, skip_await=True, atomic=False)
    return group, operator, ceph


# ------------------------------------------------------------------------------------------- model helpers


def test_quantities() -> None:
    assert quantity("500m") == 0.5
    assert quantity("64Gi") == 64 * 2**30
    assert quantity(8) == 8
    with pytest.raises(ValueError):
        quantity("8 GPUs")


def test_tolerations() -> None:
    taint = Taint.of(GPU_TAINT)
    assert Toleration("nvidia.com/gpu", "Exists").tolerates(taint)
    assert Toleration(operator="Exists").tolerates(taint)
    assert not Toleration("nvidia.com/gpu", "Equal", "false").tolerates(taint)
    assert not Toleration("nvidia.com/gpu", "Exists", effect="NoExecute").tolerates(taint)
    assert Taint.of(STORAGE_TAINT).effect == "NoSchedule"


def test_creation_order_waits_for_dependencies_parents_and_component_children() -> None:
    component = rec("trainyard:cloud:Thing", "thing", custom=False)
    child = rec("aws:s3/bucket:Bucket", "child", parent=component)
    first = rec("aws:s3/bucket:Bucket", "a-first")
    needs_component = rec("aws:s3/bucket:Bucket", "a-needs", deps=(component,))
    order, closure = creation_order([needs_component, child, component, first])
    names = [r.name for r in order]
    assert names.index("child") < names.index("a-needs")
    assert child.urn in closure[needs_component.urn]
    assert first.urn not in closure[needs_component.urn]


def test_a_dependency_cycle_is_refused() -> None:
    a = rec("aws:s3/bucket:Bucket", "a")
    b = rec("aws:s3/bucket:Bucket", "b", deps=(a,))
    with pytest.raises(ValueError, match="cycle"):
        creation_order([rec("aws:s3/bucket:Bucket", "a", deps=(b,)), b])


def test_the_converging_base_passes() -> None:
    assert findings(*base()) == []


# ------------------------------------------------------------------------------------------------- rules


def test_node_group_before_any_cni_fails() -> None:
    eks = cluster()
    assert rules_of(eks, node_group("system", eks), cilium(eks)) == [("node-needs-cni", "system-group")]
    # EKS's own vpc-cni (bootstrapSelfManagedAddons left on) is a CNI.
    bootstrapped = cluster(bootstrap=True)
    assert findings(bootstrapped, node_group("system", bootstrapped)) == []


def test_a_waiting_cni_release_before_the_nodes_hangs() -> None:
    eks = cluster()
    cni = cilium(eks, skip_await=False)
    problems = findings(eks, cni, node_group("system", eks, cni))
    assert [(f.rule, f.name) for f in problems] == [("release-needs-nodes", "cilium")]
    assert "cilium-operator" in problems[0].problem and "no Ready node" in problems[0].problem


def test_a_release_whose_pods_fit_no_pool_hangs() -> None:
    eks, cni, system = base()
    infra_taint = {"key": "trainyard.io/role", "value": "infra", "effect": "NO_SCHEDULE"}
    tainted = node_group("infra", eks, cni, taints=[infra_taint])
    selector = {"nodeSelector": {"trainyard.io/role": "infra"}}
    settings = {"settings": {"clusterName": "test"}}
    stuck = release("karpenter", "karpenter", selector | settings | {"tolerations": []}, tainted)
    problem = findings(eks, cni, system, tainted, stuck)
    assert [(f.rule, f.name) for f in problem] == [("release-needs-nodes", "karpenter")]
    assert "taint trainyard.io/role=infra:NoSchedule not tolerated" in problem[0].problem
    tolerated = release("karpenter", "karpenter", selector | settings | {"tolerations": [
        {"key": "trainyard.io/role", "operator": "Exists"}]}, tainted)
    assert findings(eks, cni, system, tainted, tolerated) == []


def test_a_controller_placed_on_the_storage_group_is_named() -> None:
    eks, cni, system = base()
    storage_group = node_group("storage", eks, cni, taints=[STORAGE_TAINT])
    values = {"nodeSelector": {"trainyard.io/role": "storage"}, "settings": {"clusterName": "test"},
              "tolerations": [{"key": "trainyard.io/role", "operator": "Exists"}]}
    placed = release("karpenter", "karpenter", values, storage_group)
    assert rules_of(eks, cni, system, storage_group, placed) == [("controllers-off-special-nodes", "karpenter")]


def test_anti_affinity_replicas_need_distinct_nodes() -> None:
    eks = cluster()
    cni = cilium(eks)
    one_node = node_group("system", eks, cni, nodes=1)
    karpenter = release("karpenter", "oci://public.ecr.aws/karpenter/karpenter",
                        {"nodeSelector": {"trainyard.io/role": "system"}, "settings": {"clusterName": "test"}},
                        one_node)
    assert rules_of(eks, cni, one_node, karpenter) == [("release-needs-nodes", "karpenter")]


def test_a_claim_on_ceph_created_before_ceph_never_binds() -> None:
    eks, cni, system = base()
    group, operator, ceph = storage(system)
    claim = rec(PVC, "ckpt", {"spec": {"storageClassName": "ceph-filesystem"}}, (system,))
    problem = findings(eks, cni, system, group, operator, ceph, claim)
    assert [(f.rule, f.name) for f in problem] == [("claim-binds", "ckpt")]
    assert "does not exist yet" in problem[0].problem
    ordered = rec(PVC, "ckpt", {"spec": {"storageClassName": "ceph-filesystem"}}, (ceph,))
    assert findings(eks, cni, system, group, operator, ceph, ordered) == []


def test_rook_without_osd_hosts_serves_nothing() -> None:
    eks, cni, system = base()
    group, operator, ceph = storage(system)
    no_nodes = dict(ROOK_VALUES, cephClusterSpec=dict(ROOK_VALUES["cephClusterSpec"], storage={
        "useAllNodes": False, "useAllDevices": False, "deviceFilter": "^nvme[1-9]n1$"}))
    broken = release("ceph", "rook-ceph-cluster", no_nodes, operator, group, skip_await=True, atomic=False)
    claim = rec(PVC, "ckpt", {"spec": {"storageClassName": "ceph-filesystem"}}, (broken,))
    problems = findings(eks, cni, system, group, operator, broken, claim)
    assert [(f.rule, f.name) for f in problems] == [("ceph-has-osds", "ceph"), ("claim-binds", "ckpt")]
    assert "Rook creates no OSD" in problems[1].problem


def test_replica_size_above_the_osd_hosts_never_binds() -> None:
    eks, cni, system = base()
    group, operator, ceph = storage(system, nodes=2)
    claim = rec(PVC, "ckpt", {"spec": {"storageClassName": "ceph-filesystem"}}, (ceph,))
    problems = findings(eks, cni, system, group, operator, ceph, claim)
    assert [(f.rule, f.name) for f in problems] == [("claim-binds", "ckpt")]
    assert "replica size 3 exceeds the 2 OSD host(s)" in problems[0].problem


def _karpenter(*after: ResourceRecord, gate: bool = True) -> ResourceRecord:
    values = {"nodeSelector": {"trainyard.io/role": "system"},
              "settings": {"clusterName": "test", "featureGates": {"nodeOverlay": gate}}}
    return release("karpenter", "karpenter", values, *after)


def test_a_mig_job_needs_a_node_overlay_and_the_gate() -> None:
    eks, cni, system = base()
    karpenter = _karpenter(system)
    node_class, pool = karpenter_pool("mig", "p5.48xlarge", karpenter, taints=[GPU_TAINT])
    mig_job = job("eval", gpu_pod("mig", {"nvidia.com/mig-2g.20gb": "1"}), pool)
    no_overlay = launch_problems(eks, cni, system, karpenter, node_class, pool, mig_job)
    assert [f.name for f in no_overlay] == ["eval"] and "mig: no instance type offers" in no_overlay[0].problem
    overlay = rec(NODE_OVERLAY, "mig-overlay", {"spec": {
        "requirements": [{"key": "karpenter.sh/nodepool", "operator": "In", "values": ["mig"]}],
        "capacity": {"nvidia.com/mig-2g.20gb": "24"}}}, (karpenter,))
    assert launch_problems(eks, cni, system, karpenter, node_class, pool, overlay, mig_job) == []
    gate_off = _karpenter(system, gate=False)
    off = launch_problems(eks, cni, system, gate_off, node_class, pool, overlay, mig_job)
    assert len(off) == 1 and "feature gate is off" in off[0].problem


def test_a_gpu_job_must_tolerate_its_pools_taint() -> None:
    eks, cni, system = base()
    karpenter = _karpenter(system)
    node_class, pool = karpenter_pool("h100", "p5.48xlarge", karpenter, taints=[GPU_TAINT])
    untolerant = job("train", gpu_pod("h100", {"nvidia.com/gpu": "8"}, tolerate=False), pool)
    problem = launch_problems(eks, cni, system, karpenter, node_class, pool, untolerant)
    assert len(problem) == 1 and "taint nvidia.com/gpu=true:NoSchedule not tolerated" in problem[0].problem
    too_big = job("train", gpu_pod("h100", {"vpc.amazonaws.com/efa": "64"}), pool)
    assert "no instance type offers vpc.amazonaws.com/efa" in launch_problems(
        eks, cni, system, karpenter, node_class, pool, too_big)[0].problem


def _volcano(actions: str, *after: ResourceRecord) -> ResourceRecord:
    conf = f'actions: "{actions}"\ntiers:\n- plugins:\n  - name: gang\n  - name: proportion\n'
    return release("volcano", "volcano", {"custom": {"scheduler_config_override": conf,
                                                     "default_ns": {"trainyard.io/role": "system"}}}, *after)


def test_enqueue_keeps_a_gang_for_an_empty_gpu_pool_pending() -> None:
    eks, cni, system = base()
    karpenter = _karpenter(system)
    node_class, pool = karpenter_pool("h100", "p5.48xlarge", karpenter, taints=[GPU_TAINT])
    gpu_job = gpu_pod("h100", {"nvidia.com/gpu": "8"})
    plugin = gpu_operator(system)
    enqueue = _volcano("enqueue, allocate, backfill", system)
    assert rules_of(eks, cni, system, karpenter, plugin, node_class, pool, enqueue,
                    job("train", gpu_job, enqueue)) == [("gang-admitted", "train")]
    allocate = _volcano("allocate, backfill", system)
    assert findings(eks, cni, system, karpenter, plugin, node_class, pool, allocate,
                    job("train", gpu_job, allocate)) == []


def test_a_reclaimable_queue_needs_the_reclaim_action() -> None:
    eks, cni, system = base()
    queue_type = "kubernetes:scheduling.volcano.sh/v1beta1:Queue"
    for actions, expected in (("allocate, backfill", [("reclaim-configured", "q")]),
                              ("allocate, backfill, reclaim", [])):
        volcano = _volcano(actions, system)
        queue = rec(queue_type, "q", {"spec": {"reclaimable": True}}, (volcano,))
        assert rules_of(eks, cni, system, volcano, queue) == expected


def test_the_scheduler_runs_the_configuration_file_the_chart_renders() -> None:
    """No override: the chart mounts the file `basic.scheduler_config_file` names (volcano 1.15.1
    templates/scheduler.yaml); its CI file runs reclaim, its default one does not."""
    eks, cni, system = base()
    queue_type = "kubernetes:scheduling.volcano.sh/v1beta1:Queue"
    for config_file, expected in (("config/volcano-scheduler.conf", [("reclaim-configured", "q")]),
                                  ("config/volcano-scheduler-ci.conf", [])):
        volcano = release("volcano", "volcano", {"basic": {"scheduler_config_file": config_file},
                                                 "custom": {"default_ns": {"trainyard.io/role": "system"}}}, system)
        queue = rec(queue_type, "q", {"spec": {"reclaimable": True}}, (volcano,))
        assert rules_of(eks, cni, system, volcano, queue) == expected


def test_cache_workers_only_placeable_on_gpu_pools_are_reported() -> None:
    eks, cni, system = base()
    karpenter = _karpenter(system)
    node_class, pool = karpenter_pool("h100", "p5.48xlarge", karpenter, labels={"trainyard.io/role": "gpu"},
                                      taints=[GPU_TAINT])
    fluid = release("fluid", "fluid", {}, system)
    runtime_type = "kubernetes:data.fluid.io/v1alpha1:AlluxioRuntime"
    on_gpu = rec(runtime_type, "cache", {"metadata": {"name": "data", "namespace": "d"}, "spec": {
        "replicas": 2, "worker": {"nodeSelector": {"trainyard.io/role": "gpu"}}}}, (fluid,))
    dataset = rec("kubernetes:data.fluid.io/v1alpha1:Dataset", "data", {
        "metadata": {"name": "data", "namespace": "d"},
        "spec": {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]}}, (fluid,))
    everything = (eks, cni, system, karpenter, node_class, pool, fluid, dataset)

    def cache_rule(*records: ResourceRecord) -> list[tuple[str, str]]:
        # Fluid on its chart defaults is also named by the rendered-object rules (its CSI plugin mounts
        # kubelet.conf, its controllers tolerate every taint): this test is about the cache workers.
        return [(f.rule, f.name) for f in findings(*records) if f.rule == "cache-off-gpu-nodes"]

    assert cache_rule(*everything, on_gpu) == [("cache-off-gpu-nodes", "cache")]
    on_system = rec(runtime_type, "cache", {"metadata": {"name": "data", "namespace": "d"}, "spec": {
        "replicas": 2, "worker": {"nodeSelector": {"trainyard.io/role": "system"}}}}, (fluid,))
    assert cache_rule(*everything, on_system) == []
    assert {"host-paths-exist", "controllers-off-special-nodes"} <= {f.rule for f in findings(*everything, on_system)}


def test_a_custom_resource_needs_its_crd_chart_first() -> None:
    eks, cni, system = base()
    karpenter = _karpenter(system)
    early = rec("kubernetes:karpenter.k8s.aws/v1:EC2NodeClass", "early", {"metadata": {"name": "x"}}, (system,))
    assert rules_of(eks, cni, system, karpenter, early) == [("crd-installed", "early")]


def test_coredns_before_any_ready_node_degrades() -> None:
    eks = cluster()
    coredns = rec("aws:eks/addon:Addon", "coredns", {"addonName": "coredns"}, (eks,))
    pod_identity = rec("aws:eks/addon:Addon", "pia", {"addonName": "eks-pod-identity-agent"}, (eks,))
    cni = cilium(eks)
    assert rules_of(eks, coredns, pod_identity, cni, node_group("system", eks, cni)) == [
        ("addon-needs-nodes", "coredns")]


def test_cilium_removes_its_agent_not_ready_taint_from_managed_nodes() -> None:
    # Cilium's EKS requirements taint managed groups node.cilium.io/agent-not-ready=true:NoExecute; the operator
    # removes it from nodes with a healthy agent (cilium 1.20.0 values.yaml, operator.removeNodeTaints true).
    eks = cluster()
    cni = cilium(eks)
    tainted = node_group("system", eks, cni, taints=[
        {"key": "node.cilium.io/agent-not-ready", "value": "true", "effect": "NO_EXECUTE"}])
    coredns = rec("aws:eks/addon:Addon", "coredns", {"addonName": "coredns"}, (tainted,))
    assert rules_of(eks, cni, tainted, coredns) == []
    # An operator told to keep the taint leaves CoreDNS without a node it tolerates.
    keeps = release("cilium", "cilium", {"operator": {"nodeSelector": {"trainyard.io/role": "system"},
                                                       "removeNodeTaints": False}}, eks, atomic=False,
                    skip_await=True)
    kept = node_group("system", eks, keeps, taints=list(tainted.inputs["taints"]))
    coredns_after = rec("aws:eks/addon:Addon", "coredns", {"addonName": "coredns"}, (kept,))
    assert ("addon-needs-nodes", "coredns") in rules_of(eks, keeps, kept, coredns_after)


def test_pod_identity_behind_a_default_deny_needs_the_host_entity() -> None:
    eks, cni, system = base()
    association = rec("aws:eks/podIdentityAssociation:PodIdentityAssociation", "trainer",
                      {"namespace": "research", "serviceAccount": "trainer"}, (eks,))
    old_rule = {"toCIDR": ["169.254.170.23/32"], "toPorts": [{"ports": [{"port": "80", "protocol": "TCP"}]}]}
    new_rule = {"toEntities": ["host"], "toPorts": [{"ports": [{"port": "80", "protocol": "TCP"}]}]}

    def policy(rule: dict[str, object]) -> ResourceRecord:
        return rec("kubernetes:cilium.io/v2:CiliumNetworkPolicy", "deny", {
            "metadata": {"namespace": "research"}, "spec": {"egress": [{"toEndpoints": [{}]}, rule]}}, (system,))

    assert rules_of(eks, cni, system, association, policy(old_rule)) == [("pod-identity-reachable", "deny")]
    assert findings(eks, cni, system, association, policy(new_rule)) == []
    # A narrower policy adding egress (the fabric check's API access) keeps the namespace-wide allow.
    narrow = rec("kubernetes:cilium.io/v2:CiliumNetworkPolicy", "api", {
        "metadata": {"namespace": "research"},
        "spec": {"endpointSelector": {"matchLabels": {"trainyard.io/job": "check"}},
                 "egress": [{"toEntities": ["kube-apiserver"]}]}}, (system,))
    assert findings(eks, cni, system, association, policy(new_rule), narrow) == []
    assert ("pod-identity-reachable", "api") in rules_of(eks, cni, system, association, policy(old_rule), narrow)


def test_a_gang_larger_than_its_queue_or_its_pools_limits_never_starts() -> None:
    eks, cni, system = base()
    karpenter = _karpenter(system)
    node_class, pool = karpenter_pool("h100", "p5.48xlarge", karpenter, taints=[GPU_TAINT])
    limited = rec(pool.type, pool.name, {**pool.inputs, "spec": {**pool.inputs["spec"],
                                                                  "limits": {"nvidia.com/gpu": "16"}}},
                  (karpenter, node_class))
    volcano = _volcano("allocate, backfill", system)
    queue = rec("kubernetes:scheduling.volcano.sh/v1beta1:Queue", "q", {
        "metadata": {"name": "team"}, "spec": {"capability": {"nvidia.com/gpu": "16"}}}, (volcano,))
    gang = job("train", gpu_pod("h100", {"nvidia.com/gpu": "8"}), volcano, queue, replicas=3)
    gang = rec(gang.type, gang.name, {"spec": {**gang.inputs["spec"], "queue": "team"}}, (volcano, queue))
    plugin = gpu_operator(system)
    problems = findings(eks, cni, system, karpenter, plugin, node_class, limited, volcano, queue, gang)
    assert [f.rule for f in problems] == ["queue-fits", "karpenter-can-launch", "queue-demand-fits"]
    assert "queue team may hold: 24 nvidia.com/gpu (capability 16)" in problems[0].problem
    assert "limits of NodePool(s) h100 allow (16)" in problems[1].problem
    assert "24 nvidia.com/gpu (capability 16)" in problems[2].problem
    # A gang of 2 fits the queue, but Volcano creates the third pod too and Karpenter buys its node (volcano 4710).
    two = rec(gang.type, gang.name, {"spec": {**gang.inputs["spec"], "minAvailable": 2}}, (volcano, queue))
    assert rules_of(eks, cni, system, karpenter, plugin, node_class, limited, volcano, queue, two) == [
        ("queue-demand-fits", "train")]
    two_of_two = rec(gang.type, gang.name, {"spec": {**two.inputs["spec"], "tasks": [
        {**two.inputs["spec"]["tasks"][0], "replicas": 2}]}}, (volcano, queue))
    assert findings(eks, cni, system, karpenter, plugin, node_class, limited, volcano, queue, two_of_two) == []


def test_the_jobs_of_a_queue_at_full_replicas_must_fit_its_capability() -> None:
    """Each job's gang fits the queue alone; together they ask more, and every pod of each is created."""
    eks, cni, system = base()
    karpenter = _karpenter(system)
    node_class, pool = karpenter_pool("h100", "p5.48xlarge", karpenter, taints=[GPU_TAINT])
    volcano = _volcano("allocate, backfill", system)
    plugin = gpu_operator(system)

    def queued(capability: str, *names: str) -> list[Finding]:
        queue = rec("kubernetes:scheduling.volcano.sh/v1beta1:Queue", "q", {
            "metadata": {"name": "team"}, "spec": {"capability": {"nvidia.com/gpu": capability}}}, (volcano,))
        jobs = []
        for name in names:
            one = job(name, gpu_pod("h100", {"nvidia.com/gpu": "8"}), volcano, queue)
            jobs.append(rec(one.type, one.name, {"spec": {**one.inputs["spec"], "queue": "team"}}, (volcano, queue)))
        return findings(eks, cni, system, karpenter, plugin, node_class, pool, volcano, queue, *jobs)

    (over,) = queued("16", "b-train", "a-train", "c-train")
    assert (over.rule, over.name) == ("queue-demand-fits", "a-train")
    assert "queue team's jobs (a-train, b-train, c-train)" in over.problem
    assert "24 nvidia.com/gpu (capability 16)" in over.problem
    assert queued("24", "b-train", "a-train", "c-train") == []
    assert queued("16", "a-train", "b-train") == []


def test_three_mons_need_three_nodes_their_placement_admits() -> None:
    eks = cluster()
    cni = cilium(eks)
    one_system = node_group("system", eks, cni, nodes=1)
    group, operator, ceph = storage(one_system)
    problems = findings(eks, cni, one_system, group, operator, ceph)
    assert [(f.rule, f.name) for f in problems] == [("ceph-has-osds", "ceph")]
    assert "3 Ceph mons need 3 node(s)" in problems[0].problem


def test_a_claim_without_a_class_gets_the_default_one_and_its_backend() -> None:
    eks, cni, system = base()
    gp3 = rec("kubernetes:storage.k8s.io/v1:StorageClass", "gp3", {
        "metadata": {"name": "gp3", "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
        "provisioner": "ebs.csi.aws.com", "volumeBindingMode": "Immediate"}, (system,))
    claim = rec(PVC, "data", {"spec": {}}, (gp3,))
    assert [f.problem for f in findings(eks, cni, system, gp3, claim)] == [
        "pulumi up waits for the claim to bind, and nothing it waits on can serve it: the aws-ebs-csi-driver EKS "
        "add-on is not installed yet"]
    ebs = rec("aws:eks/addon:Addon", "ebs", {"addonName": "aws-ebs-csi-driver"}, (system,))
    gp3_after = rec(gp3.type, gp3.name, gp3.inputs, (ebs,))
    assert findings(eks, cni, system, ebs, gp3_after, rec(PVC, "data", {"spec": {}}, (gp3_after,))) == []
    no_default = rec(PVC, "data", {"spec": {}}, (system,))
    assert "no default class" in findings(eks, cni, system, no_default)[0].problem


def test_hook_jobs_need_a_node_even_without_waiting() -> None:
    eks = cluster()
    early = release("monitoring", "kube-prometheus-stack", {}, eks, atomic=False, skip_await=True)
    cni = cilium(eks)
    problems = findings(eks, early, cni, node_group("system", eks, cni))
    assert [(f.rule, f.name) for f in problems] == [("release-needs-nodes", "monitoring")]
    assert "runs the hook for Job/monitoring-kube-prometheus-admission-create" in problems[0].problem
    no_hooks = release("monitoring", "kube-prometheus-stack", {"prometheusOperator": {"admissionWebhooks": {
        "patch": {"enabled": False}}}}, eks, atomic=False, skip_await=True)
    assert findings(eks, no_hooks, cni, node_group("system", eks, cni)) == []


# ------------------------------------------------------------------------------------------- node lifecycle


def _limited_pool(limits: dict[str, str], layout: str | None = None, instance: str = "p5.48xlarge",
                  startup: list[dict[str, str]] | None = None, expire: str = "Never") -> tuple[ResourceRecord, ...]:
    eks, cni, system = base()
    karpenter = _karpenter(eks, cni, system)
    labels = {"trainyard.io/pool": "p", **({"nvidia.com/mig.config": layout} if layout else {})}
    node_class, pool = karpenter_pool("p", instance, karpenter, labels=labels)
    pool.inputs["spec"]["limits"] = limits
    pool.inputs["spec"]["template"]["spec"].update({"startupTaints": startup or [], "expireAfter": expire})
    return eks, cni, system, karpenter, node_class, pool


def lifecycle_problems(*records: ResourceRecord) -> list[Finding]:
    return [f for f in findings(*records) if f.rule in ("pool-limits-bound", "stranded-nodes-reclaimed")]


def test_a_mig_pool_limited_only_on_whole_gpus_is_unbounded() -> None:
    # Karpenter counts an initialized node at the node's own capacity (kubernetes-sigs/karpenter v1.14.1
    # statenode.go Capacity); a partitioned node reports nvidia.com/mig-*, so its GPU limit counts zero.
    (problem,) = lifecycle_problems(*_limited_pool({"nvidia.com/gpu": "16"}, layout="training-mixed"))
    assert problem.rule == "pool-limits-bound" and "MIG-partitioned" in problem.problem
    # Near misses: the same pool bounded on nodes, a whole-GPU pool on GPUs, a layout that leaves MIG off.
    assert not lifecycle_problems(*_limited_pool({"nodes": "2", "nvidia.com/gpu": "16"}, layout="training-mixed"))
    assert not lifecycle_problems(*_limited_pool({"nvidia.com/gpu": "16"}))
    assert not lifecycle_problems(*_limited_pool({"nvidia.com/gpu": "16"}, layout="all-disabled"))


GATE = [{"key": "node.cilium.io/agent-not-ready", "value": "true", "effect": "NoExecute"},
        {"key": "trainyard.io/gpu-health", "value": "pending", "effect": "NoSchedule"}]


def _reaper(*deps: ResourceRecord, verbs: tuple[str, ...] = ("list", "delete"),
            selector: dict[str, str] | None = None) -> tuple[ResourceRecord, ...]:
    role = rec("kubernetes:rbac.authorization.k8s.io/v1:ClusterRole", "reaper", {
        "metadata": {"name": "reaper"},
        "rules": [{"apiGroups": ["karpenter.sh"], "resources": ["nodeclaims"], "verbs": list(verbs)}]}, deps)
    binding = rec("kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding", "reaper", {
        "metadata": {"name": "reaper"}, "roleRef": {"kind": "ClusterRole", "name": "reaper"},
        "subjects": [{"kind": "ServiceAccount", "name": "reaper", "namespace": "ops"}]}, (role,))
    cron = rec("kubernetes:batch/v1:CronJob", "reaper", {
        "metadata": {"name": "reaper", "namespace": "ops"},
        "spec": {"jobTemplate": {"spec": {"template": {"spec": {
            "serviceAccountName": "reaper", "nodeSelector": selector or {"trainyard.io/role": "system"},
            "containers": [{"name": "reap"}]}}}}}}, (binding,))
    return role, binding, cron


def test_a_pool_whose_admission_can_fail_needs_something_that_reclaims_its_nodes() -> None:
    gated = _limited_pool({"nodes": "2"}, startup=GATE)
    (problem,) = lifecycle_problems(*gated)
    assert problem.rule == "stranded-nodes-reclaimed" and "trainyard.io/gpu-health" in problem.problem
    assert not lifecycle_problems(*gated, *_reaper(gated[0]))
    # A reaper that may not delete NodeClaims, or that can run nowhere, reclaims nothing.
    assert lifecycle_problems(*gated, *_reaper(gated[0], verbs=("list",)))
    assert lifecycle_problems(*gated, *_reaper(gated[0], selector={"trainyard.io/role": "nowhere"}))
    # Near misses: a finite expiry ends every node; Cilium's taint alone shows as NotReady, which repair handles.
    assert not lifecycle_problems(*_limited_pool({"nodes": "2"}, startup=GATE, expire="720h"))
    assert not lifecycle_problems(*_limited_pool({"nodes": "2"}, startup=GATE[:1]))


def test_gpu_jobs_without_the_gpu_operator_would_hang() -> None:
    eks, cni, system = base()
    karpenter = _karpenter(system)
    node_class, pool = karpenter_pool("h100", "p5.48xlarge", karpenter, taints=[GPU_TAINT])
    volcano = _volcano("allocate, backfill", system)
    for resources in ({"nvidia.com/gpu": "8"}, {"nvidia.com/mig-1g.10gb": "1"}):
        train = job("train", gpu_pod("h100", resources), volcano)
        off = [f for f in findings(eks, cni, system, karpenter, node_class, pool, volcano, train)
               if f.rule == "gpu-device-plugin"]
        assert len(off) == 1 and "would hang Pending" in off[0].problem, off
        assert next(iter(resources)) in off[0].problem
        on = findings(eks, cni, system, karpenter, gpu_operator(system), node_class, pool, volcano, train)
        assert "gpu-device-plugin" not in [f.rule for f in on]
    cpu = job("cpu", gpu_pod("h100", {"cpu": "1"}), volcano)
    assert findings(eks, cni, system, karpenter, node_class, pool, volcano, cpu) == []


def test_whole_gpus_on_a_mig_pool_would_hang() -> None:
    eks, cni, system = base()
    karpenter = _karpenter(system)
    plugin = gpu_operator(system)
    volcano = _volcano("allocate, backfill", system)
    mig_labels = {"trainyard.io/pool": "h100", "nvidia.com/mig.config": "all-1g.10gb"}
    node_class, mig_pool = karpenter_pool("h100", "p5.48xlarge", karpenter, labels=mig_labels, taints=[GPU_TAINT])
    # Whole GPUs only: an EFA request would also need the EFA device plugin (nodes-initialize) in this cluster.
    fabric = job("fabric-check-h100", gpu_pod("h100", {"nvidia.com/gpu": "8"}), volcano, replicas=2)
    hang = findings(eks, cni, system, karpenter, plugin, node_class, mig_pool, volcano, fabric)
    assert [f.rule for f in hang] == ["whole-gpus-on-mig"] and "would hang Pending" in hang[0].problem
    assert "h100" in hang[0].problem
    report = rehearsed(recording(eks, cni, system, karpenter, plugin, node_class, mig_pool, volcano, fabric))
    assert not report.passed
    node_class, whole = karpenter_pool("h100", "p5.48xlarge", karpenter, taints=[GPU_TAINT])
    assert findings(eks, cni, system, karpenter, plugin, node_class, whole, volcano, fabric) == []
    slices = job("eval", gpu_pod("h100", {"nvidia.com/mig-1g.10gb": "1"}), volcano)
    assert "whole-gpus-on-mig" not in [f.rule for f in findings(eks, cni, system, karpenter, plugin, node_class,
                                                                  mig_pool, volcano, slices)]


def test_a_trainer_reading_its_dataset_where_fluid_does_not_show_it_is_named() -> None:
    """Fluid shows a source mount without `path: /` under /<mount name> of the claim (issue 19 finding 3)."""
    eks, cni, system = base()
    dataset_type = "kubernetes:data.fluid.io/v1alpha1:Dataset"
    fluid = release("fluid", "fluid", {}, system)
    tenant = rec(dataset_type, "tenant", {"metadata": {"name": "training-data", "namespace": "team"}, "spec": {
        "mounts": [{"mountPoint": "dataset://data/training-data", "readOnly": True}]}}, (fluid,))

    def served(mount: dict[str, str], data_path: str) -> list[Finding]:
        source = rec(dataset_type, "source", {"metadata": {"name": "training-data", "namespace": "data"},
                                              "spec": {"mounts": [{"name": "s3", **mount}]}}, (fluid,))
        pod = {"containers": [{"name": "trainer", "args": ["-m", "trainyard_train", data_path],
                               "volumeMounts": [{"name": "dataset", "mountPath": "/data", "readOnly": True}]}],
               "volumes": [{"name": "dataset", "persistentVolumeClaim": {"claimName": "training-data"}}]}
        train = rec("kubernetes:batch.volcano.sh/v1alpha1:Job", "train", {
            "metadata": {"name": "train", "namespace": "team"},
            "spec": {"minAvailable": 1, "tasks": [{"name": "worker", "replicas": 1, "template": {"spec": pod}}]}},
            (tenant,))
        return [f for f in findings(eks, cni, system, fluid, source, tenant, train) if f.rule == "dataset-path-served"]

    (found,) = served({"mountPoint": "s3://bucket/datasets"}, "data.path=/data/successor-v1")
    assert found.name == "train"
    assert "reads data.path=/data/successor-v1, but its claim training-data shows the dataset's prefix at /data/s3" \
        in found.problem
    assert served({"mountPoint": "s3://bucket/datasets"}, "data.path=/data/s3/successor-v1") == []
    assert served({"mountPoint": "s3://bucket/datasets", "path": "/"}, "data.path=/data/successor-v1") == []


def _hard_pool(name: str, types: list[str], capacity: list[str], *after: ResourceRecord,
               placement: bool = False, blocks: bool = False) -> tuple[ResourceRecord, ResourceRecord]:
    node_class, pool = karpenter_pool(name, types[0], *after, taints=[GPU_TAINT])
    spec = pool.inputs["spec"]["template"]["spec"]
    spec["requirements"] = [{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": types},
                            {"key": "karpenter.sh/capacity-type", "operator": "In", "values": capacity}]
    if blocks:
        spec["requirements"].append({"key": "karpenter.k8s.aws/capacity-reservation-type", "operator": "In",
                                     "values": ["capacity-block"]})
    class_spec: dict[str, object] = {}
    if placement:
        class_spec["placementGroupSelector"] = {"name": f"pg-{name}"}
    if blocks:
        class_spec["capacityReservationSelectorTerms"] = [{"id": "cr-0123456789abcdef0"}]
    node_class = rec(node_class.type, node_class.name, {**node_class.inputs, "spec": class_spec}, after)
    return node_class, rec(pool.type, pool.name, pool.inputs, (*after, node_class))


@pytest.mark.parametrize(("types", "capacity", "placement", "blocks", "replicas", "fragment"), [
    (["p5.48xlarge"], ["on-demand"], True, False, 2, None),
    (["p5.48xlarge"], ["reserved"], False, True, 2, None),
    (["p5.48xlarge"], ["spot"], True, False, 2, "reclaimed spot node"),
    (["p5e.48xlarge", "p5en.48xlarge"], ["on-demand"], True, False, 2, "not co-located"),
    (["p5.48xlarge"], ["on-demand"], False, False, 2, "not co-located"),
    (["p5.48xlarge"], ["reserved"], False, False, 2, "not co-located"),
    (["g5.48xlarge"], ["on-demand"], True, False, 2, "no EC2 network topology"),
    (["p5.48xlarge"], ["on-demand"], True, False, 3, "the job grows"),
])
def test_hard_topology_is_refused_where_karpenter_would_loop(types: list[str], capacity: list[str], placement: bool,
                                                            blocks: bool, replicas: int, fragment: str | None) -> None:
    eks, cni, system = base()
    karpenter = _karpenter(system)
    node_class, pool = _hard_pool("train", types, capacity, karpenter, placement=placement, blocks=blocks)
    hard = job("hard", gpu_pod("train", {"nvidia.com/gpu": "8"}), karpenter, replicas=replicas)
    hard.inputs["spec"].update(minAvailable=2, networkTopology={"mode": "hard", "highestTierAllowed": 3})
    found = [f for f in findings(eks, cni, system, karpenter, node_class, pool, hard)
             if f.rule == "hard-topology-co-located"]
    if fragment is None:
        assert found == []
        # Co-located is the top layer only: a lower tier is named (review-topology-bringup finding 3).
        hard.inputs["spec"]["networkTopology"]["highestTierAllowed"] = 2
        (lower,) = [f for f in findings(eks, cni, system, karpenter, node_class, pool, hard)
                    if f.rule == "hard-topology-co-located"]
        assert "highestTierAllowed 2" in lower.problem and "only tier 3" in lower.problem, lower
    else:
        assert len(found) == 1 and fragment in found[0].problem, found
    soft = job("soft", gpu_pod("train", {"nvidia.com/gpu": "8"}), karpenter, replicas=replicas)
    soft.inputs["spec"]["networkTopology"] = {"mode": "soft"}
    assert not [f for f in findings(eks, cni, system, karpenter, node_class, pool, soft)
                if f.rule == "hard-topology-co-located"]
