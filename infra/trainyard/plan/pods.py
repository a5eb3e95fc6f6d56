"""The pods rendered objects make: who runs them, how many, where they may go, what they mount and request.

Every pod template a chart renders (Deployment, StatefulSet, DaemonSet, Job, CronJob, Pod) is read as Helm would
install it; a template is the truth, so there is no model of a chart's pods to keep in step with its values. Pods
that controllers create from custom resources at run time (the GPU Operator's operands from its ClusterPolicy,
Ceph CSI's node plugins from Driver objects, Fluid's cache pods from an AlluxioRuntime) appear in no render: the
rules read those custom resources' own placement fields instead.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from trainyard.plan.cluster_model import PodNeeds, Requirement, Toleration, quantity

WORKLOAD_KINDS = frozenset({"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "CronJob", "Pod"})
# Helm runs these hooks during an install, and waits for their Jobs (helm.sh/docs/topics/charts_hooks).
INSTALL_HOOKS = frozenset({"pre-install", "post-install"})
HOSTNAME = "kubernetes.io/hostname"


def lookup(values: Mapping[str, Any], path: str, default: Any = None) -> Any:
    current: Any = values
    for part in (p for p in path.split(".") if p):
        if not isinstance(current, Mapping) or part not in current:
            return default
        current = current[part]
    return current


def affinity_terms(affinity: Mapping[str, Any]) -> tuple[tuple[Requirement, ...], ...]:
    """The required node affinity terms of a pod `affinity` (preferred terms never block scheduling)."""
    required = lookup(affinity, "nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution", {}) or {}
    return tuple(tuple(Requirement.of(e) for e in term.get("matchExpressions") or ())
                 for term in required.get("nodeSelectorTerms") or ())


def requests_of(spec: Mapping[str, Any]) -> dict[str, float]:
    """What the scheduler reserves for a pod. A container's request of a resource defaults to its limit of it, per
    resource (kubernetes pkg/apis/core/v1/defaults.go SetDefaults_Pod). The pod asks for the larger of its app
    containers' and sidecars' sum (init containers with restartPolicy Always keep running) and each init
    container's request plus the sidecars started before it (kubernetes.io/docs/concepts/workloads/pods/
    sidecar-containers, "Resource sharing within containers")."""
    def of(container: Mapping[str, Any]) -> dict[str, float]:
        resources = container.get("resources") or {}
        asked = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        return {str(k): quantity(v) for k, v in asked.items()}

    def plus(a: Mapping[str, float], b: Mapping[str, float]) -> dict[str, float]:
        return {r: a.get(r, 0.0) + b.get(r, 0.0) for r in sorted({*a, *b})}

    running: dict[str, float] = {}
    for container in spec.get("containers") or ():
        running = plus(running, of(container))
    sidecars: dict[str, float] = {}
    peak: dict[str, float] = {}
    for container in spec.get("initContainers") or ():
        if container.get("restartPolicy") == "Always":
            sidecars = plus(sidecars, of(container))
            starting = sidecars
        else:
            starting = plus(sidecars, of(container))
        peak = {r: max(peak.get(r, 0.0), starting.get(r, 0.0)) for r in sorted({*peak, *starting})}
    total = plus(running, sidecars)
    return {r: max(total.get(r, 0.0), peak.get(r, 0.0)) for r in sorted({*total, *peak})}


def pod_needs(name: str, spec: Mapping[str, Any], distinct_nodes: int = 1) -> PodNeeds:
    """A pod spec's placement and requests."""
    return PodNeeds(name=name, node_selector={str(k): str(v) for k, v in (spec.get("nodeSelector") or {}).items()},
                    affinity_terms=affinity_terms(spec.get("affinity") or {}),
                    tolerations=tuple(Toleration.of(t) for t in spec.get("tolerations") or ()),
                    requests=requests_of(spec), distinct_nodes=distinct_nodes)


@dataclass(frozen=True)
class Workload:
    """One rendered object that makes pods."""

    kind: str
    name: str
    replicas: int  # pods it keeps (a DaemonSet: 1 per node it lands on; a Job: its parallelism)
    spec: Mapping[str, Any]  # the pod template's spec
    hooks: frozenset[str]  # helm.sh/hook events it runs on (none: an ordinary object)

    @property
    def daemon(self) -> bool:
        return self.kind == "DaemonSet"

    @property
    def label(self) -> str:
        return f"{self.kind}/{self.name}"

    def needs(self) -> PodNeeds:
        return pod_needs(self.label, self.spec, distinct_nodes=self.replicas if self.spread else 1)

    @property
    def spread(self) -> bool:
        """Replicas kept on distinct nodes by a required pod anti-affinity on the hostname."""
        terms = lookup(self.spec, "affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution") or ()
        return any(term.get("topologyKey") == HOSTNAME for term in terms)

    def host_paths(self) -> Iterator[tuple[str, str, str]]:
        """(volume name, path, type) of every hostPath volume."""
        for volume in self.spec.get("volumes") or ():
            host = volume.get("hostPath")
            if isinstance(host, Mapping):
                yield str(volume.get("name")), str(host.get("path")), str(host.get("type") or "")


def workload(obj: Mapping[str, Any]) -> Workload | None:
    kind = obj.get("kind")
    if kind not in WORKLOAD_KINDS:
        return None
    metadata = obj.get("metadata") or {}
    hooks = frozenset(h.strip() for h in str((metadata.get("annotations") or {}).get("helm.sh/hook", "")).split(",")
                      if h.strip())
    spec = obj.get("spec") or {}
    if kind == "Pod":
        template, replicas = spec, 1
    elif kind == "CronJob":
        template, replicas = lookup(spec, "jobTemplate.spec.template.spec", {}), 0  # runs later, on its schedule
    else:
        template = lookup(spec, "template.spec", {})
        default = 1
        replicas = int(spec.get("parallelism", 1) if kind == "Job" else spec.get("replicas", default) or 0)
    return Workload(kind=str(kind), name=str(metadata.get("name")), replicas=replicas, spec=template or {},
                    hooks=hooks)


def workloads(objects: Iterator[Mapping[str, Any]] | tuple[Mapping[str, Any], ...]) -> list[Workload]:
    return [w for w in map(workload, objects) if w is not None]


# Custom resources whose operator makes pods with the resource's own placement: prometheus-operator copies
# spec.nodeSelector, tolerations, affinity and volumes into the StatefulSet it makes for a Prometheus, Alertmanager
# or ThanosRuler (prometheus-operator pkg/prometheus/server/statefulset.go makeStatefulSetSpec, and alike in
# pkg/alertmanager, pkg/thanos), and spec.resources into the main container. A Prometheus with spec.shards N runs N
# StatefulSets of spec.replicas pods each (prometheus-operator Documentation/user-guides/shards-and-replicas.md:
# "shards multiplied by replicas pods"); the other kinds have no shards.
OPERATED_KINDS = {"monitoring.coreos.com": frozenset({"Prometheus", "Alertmanager", "ThanosRuler"})}


def operated(obj: Mapping[str, Any]) -> Workload | None:
    """The pods an operator makes from a custom resource of OPERATED_KINDS, as a workload."""
    group = str(obj.get("apiVersion", "")).rpartition("/")[0]
    if obj.get("kind") not in OPERATED_KINDS.get(group, frozenset()):
        return None
    spec = obj.get("spec") or {}
    template = {key: spec[key] for key in ("nodeSelector", "tolerations", "affinity", "volumes") if key in spec}
    template["containers"] = [{"resources": spec.get("resources") or {}}]
    # prometheus-operator shardsNumber: a missing, zero or negative spec.shards is one shard.
    shards = max(1, int(spec.get("shards") or 1)) if obj["kind"] == "Prometheus" else 1
    return Workload(kind=str(obj["kind"]), name=str(lookup(obj, "metadata.name")),
                    replicas=int(spec.get("replicas", 1) or 0) * shards, spec=template, hooks=frozenset())


def pod_makers(objects: Iterator[Mapping[str, Any]] | tuple[Mapping[str, Any], ...]) -> list[Workload]:
    """Every workload of the objects, and the pods operators make from custom resources of OPERATED_KINDS."""
    found = []
    for obj in objects:
        if (made := workload(obj) or operated(obj)) is not None:
            found.append(made)
    return found


def awaited_by_install(workloads_: list[Workload], *, waits: bool) -> list[Workload]:
    """What a `helm install` waits for: install hook Jobs always; with --wait also every Deployment and
    StatefulSet with replicas (a DaemonSet with no node to run on is ready with none) (helm.sh/docs/helm/
    helm_install, "--wait"; charts_hooks)."""
    found = []
    for w in workloads_:
        if w.hooks:
            if w.kind in ("Job", "Pod") and w.hooks & INSTALL_HOOKS:
                found.append(w)
        elif waits and w.kind in ("Deployment", "StatefulSet") and w.replicas > 0:
            found.append(w)
    return found
