"""The rule on a NodePool's startup taints: each one is removed by something that runs on the new node (a DaemonSet
allowed to patch Nodes, or the CNI's own agent), or nothing is ever scheduled there."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

from trainyard.plan.cluster_model import Pool, Taint, admits
from trainyard.plan.cluster_state import may_patch_nodes
from trainyard.plan.pods import Workload, lookup, workload
from trainyard.plan.recording import ResourceRecord
from trainyard.plan.resource_types import CONFIG_MAP, NODE_POOL
from trainyard.plan.rules.base import Moment, of_type, pool_of, rule

GPU_HEALTH_TAINT = "trainyard.io/gpu-health"
EXPECTED = "expected.tsv"  # the GPU admission check's table: one row per pool (platform/gpu_health.py)
_TAINT_REMOVAL = re.compile(r"kubectl\s+taint\b[^\n]*-[\"']?\s*($|\|\||&&|;|\))", re.MULTILINE)


def _objects(moment: Moment) -> Iterator[Mapping[str, Any]]:
    """Every Kubernetes object of the run: rendered by a chart or created by the program."""
    for _, obj in moment.rendered.objects():
        yield obj
    for record in moment.records.values():
        if record.type.startswith("kubernetes:") and "kind" in record.inputs:
            yield record.inputs


def taint_removers(moment: Moment, key: str) -> Iterator[Workload]:
    """DaemonSets that remove the taint `key`: their service account may patch Nodes (a taint is part of the
    Node's spec; kubernetes.io/docs/reference/access-authn-authz/rbac), and their command, or a script they mount
    from a ConfigMap, names the key and runs a `kubectl taint ... <key>-` removal."""
    objects = list(_objects(moment))
    scripts = {(str(lookup(o, "metadata.namespace") or ""), str(lookup(o, "metadata.name"))):
               "\n".join(map(str, (o.get("data") or {}).values())) for o in objects if o.get("kind") == "ConfigMap"}
    for pod, namespace in _node_patchers(objects):
        containers = [*(pod.spec.get("initContainers") or ()), *(pod.spec.get("containers") or ())]
        text = "\n".join([json.dumps([(c.get("command"), c.get("args"), c.get("env")) for c in containers]), *(
            scripts.get((namespace, str(lookup(v, "configMap.name"))), "") for v in pod.spec.get("volumes") or ())])
        if key in text and _TAINT_REMOVAL.search(text):
            yield pod


def _node_patchers(objects: list[Mapping[str, Any]]) -> Iterator[tuple[Workload, str]]:
    for obj in objects:
        pod = workload(obj)
        if pod is not None and pod.daemon and may_patch_nodes(objects, obj):
            yield pod, str(lookup(obj, "metadata.namespace") or "")


def startup_taints(record: ResourceRecord, moment: Moment) -> tuple[Taint, ...]:
    """The NodePool's startup taints still on a new node once the CNI runs there (the CNI's own taint goes then:
    `cluster_state` reads which from the rendered CNI)."""
    return tuple(t for t in map(Taint.of, lookup(record.inputs, "spec.template.spec.startupTaints", ()) or ())
                 if t.key not in moment.after.removed_taints)


# A NodePool's startupTaints stay until something removes them, and Karpenter counts such a node as capacity to
# come (statenode.go Taints()): every startup taint needs a DaemonSet that lands on the new node (tolerating all
# its taints) and may patch the Node to remove it, or the pool's pods never schedule; the CNI's own taint goes once
# the CNI runs.
@rule("startup-taints-removable", of_type(NODE_POOL),
      "kubernetes-sigs/karpenter v1.14.1 statenode Taints(); NVIDIA/DCGM v4.6.0 IsMigModeDiagCompatible")
def startup_taints_removable(record: ResourceRecord, moment: Moment) -> str | None:
    pool = pool_of(record, moment)
    every = tuple(Taint.of(t) for t in lookup(record.inputs, "spec.template.spec.startupTaints", ()) or ())
    startup = startup_taints(record, moment)
    if pool is None or not every:
        return None
    for taint in every:
        if taint.key in moment.after.removed_taints:
            continue
        runners = [d.needs() for d in taint_removers(moment, taint.key)]
        if not any(admits(d, pool, startup) and any(t.tolerates(taint) for t in d.tolerations) for d in runners):
            return (f"no DaemonSet that removes its startup taint {taint} lands on a new {pool.name} node: the "
                    "taint stays, and nothing is ever scheduled there")
        if problem := _gpu_health_unreachable(pool, taint, moment):
            return problem
    return None


# The GPU admission check removes trainyard.io/gpu-health only when its DCGM check passes; `dcgmi diag` refuses
# MIG-partitioned GPUs (NVIDIA/DCGM v4.6.0 nvvs/src/Gpu.cpp IsMigModeDiagCompatible), so on a pool with a MIG
# layout it can never pass (expected.tsv names each pool's layout and check; without a check column: diag).
def _gpu_health_unreachable(pool: Pool, taint: Taint, moment: Moment) -> str | None:
    if taint.key != GPU_HEALTH_TAINT:
        return None
    for row in _expected_rows(moment):
        if row.get("pool") == pool.name and row.get("mig-layout", "-") != "-" and \
                row.get("check", "dcgm-diag") == "dcgm-diag":
            return (f"the GPU admission check runs dcgmi diag on {pool.name}, whose GPUs are MIG-partitioned "
                    f"(layout {row['mig-layout']}): DCGM refuses the diagnostic there, so {taint} never goes")
    return None


def _expected_rows(moment: Moment) -> Iterator[Mapping[str, str]]:
    for record in moment.records.values():
        text = (record.inputs.get("data") or {}).get(EXPECTED) if record.type == CONFIG_MAP else None
        if not isinstance(text, str):
            continue
        lines = [line for line in text.splitlines() if line.strip()]
        header = next((line.lstrip("# ").split() for line in lines if line.startswith("# pool")), [])
        yield from (dict(zip(header, line.split(), strict=False)) for line in lines if not line.startswith("#"))
