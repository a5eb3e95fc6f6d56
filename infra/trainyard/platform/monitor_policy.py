"""What a tenant's PodMonitor may ask of the shared Prometheus: a ValidatingAdmissionPolicy bound to tenant namespaces.

Prometheus selects PodMonitors from every namespace, and kube-prometheus-stack leaves the operator's own guards off
(chart 88.5.3 values.yaml prometheusSpec: ignoreNamespaceSelectors false, enforcedNamespaceLabel "",
enforcedSampleLimit false). Turning them on would reach the platform's monitors too: ignoreNamespaceSelectors breaks
the chart's own ServiceMonitors of other namespaces (the API server's, the kubelet's), and enforcedNamespaceLabel
rewrites the `namespace` label of every series and rule, the DCGM exporter's per-pod attribution included. So the
bounds are set where members write: a tenant's PodMonitor scrapes its own namespace only, cannot rewrite or
import the `namespace` label its series carry (the operator sets it from the target's namespace before a monitor's
relabelings run, and a scraped label would win with honorLabels), and accepts at most SAMPLE_LIMIT samples a scrape.
Its targets are its namespace's pods, which the tenant's quota bounds: no target relabeling may write a `__`-prefixed
label (`__address__`, `__scheme__`, `__metrics_path__`, `__param_<name>` say where and how Prometheus scrapes:
Prometheus relabel_config, "labels starting with __ are removed after relabeling"; a metric relabeling may, as
renaming `__name__` steers nothing), no endpoint names a proxy or an OAuth2 token URL (PodMetricsEndpoint proxyUrl,
proxyFromEnvironment, oauth2.tokenUrl @ prometheus-operator 0.93.1), and every endpoint says `followRedirects:
false` (Prometheus follows a target's redirects unless told not to: scrape_config follow_redirects defaults to
true), each of which would otherwise send the shared Prometheus's requests to a host of the tenant's choosing, past
its network policy.
"""

from __future__ import annotations

from typing import Any

POD_MONITOR_POLICY = "trainyard-tenant-pod-monitors"
# Samples one scrape of a tenant target may return (PodMonitor spec.sampleLimit; a scrape over it fails whole:
# Prometheus scrape_config sample_limit). The trainer exports about ten series (workloads/trainyard_train/metrics.py).
SAMPLE_LIMIT = 5000
_LABEL = "namespace"
# Relabel actions that write label names taken from the data, or drop labels by name (Prometheus relabel_config:
# labelmap, labeldrop, labelkeep; the operator also takes the CamelCase spellings): dropping the target's namespace
# label lets a namespace label the pod exposes stand in its place.
_NAMING_ACTIONS = ("labelmap", "LabelMap", "labeldrop", "LabelDrop", "labelkeep", "LabelKeep")


# PodMetricsEndpoint fields that make Prometheus connect somewhere other than the target (CRD podmonitors @ 0.93.1).
_ELSEWHERE = ("proxyUrl", "oauth2")


def _rule_keeps_namespace(rule: str, steering: bool) -> str:
    # A target label may also name a regex group (`${1}`), which can spell any label; on targets (`steering`), `__`
    # labels steer the scrape.
    steers = f" || {rule}.targetLabel.startsWith('__')" if steering else ""
    target = (f"(has({rule}.targetLabel) && ({rule}.targetLabel == '{_LABEL}' || {rule}.targetLabel.contains('$')"
              f"{steers}))")
    naming = f"(has({rule}.action) && {rule}.action in [{', '.join(repr(a) for a in _NAMING_ACTIONS)}])"
    return f"!{target} && !{naming}"


def _rules_keep_namespace(endpoint: str, field: str) -> str:
    rule = _rule_keeps_namespace("r", steering=field == "relabelings")
    return f"(!has({endpoint}.{field}) || {endpoint}.{field}.all(r, {rule}))"


def pod_monitor_policy() -> dict[str, Any]:
    """The policy's spec (admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy, GA in Kubernetes 1.30)."""
    spec = "object.spec"
    selector = f"{spec}.namespaceSelector"
    endpoints = f"{spec}.podMetricsEndpoints"
    return {
        "failurePolicy": "Fail",
        "matchConstraints": {"resourceRules": [
            {"apiGroups": ["monitoring.coreos.com"], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"],
             "resources": ["podmonitors"]},
        ]},
        "validations": [
            {
                # Empty matchNames with any false is the monitor's own namespace (PodMonitor spec.namespaceSelector).
                "expression": f"!has({selector}) || ((!has({selector}.any) || !{selector}.any) && "
                              f"(!has({selector}.matchNames) || "
                              f"{selector}.matchNames.all(n, n == namespaceObject.metadata.name)))",
                "message": "a tenant's PodMonitor scrapes its own namespace only: spec.namespaceSelector may name no "
                           "other namespace and not set any",
                "reason": "Forbidden",
            },
            {
                "expression": f"!has({endpoints}) || {endpoints}.all(e, !(has(e.honorLabels) && e.honorLabels) && "
                              f"{_rules_keep_namespace('e', 'relabelings')} && "
                              f"{_rules_keep_namespace('e', 'metricRelabelings')})",
                "message": f"a tenant's PodMonitor keeps the {_LABEL} label its targets get and the address they "
                           f"are scraped at: no honorLabels, no relabeling with targetLabel {_LABEL} or a $ "
                           "reference, no target relabeling of a __ label, no labelmap, labeldrop or labelkeep",
                "reason": "Forbidden",
            },
            {
                "expression": f"!has({endpoints}) || {endpoints}.all(e, "
                              + " && ".join(f"!has(e.{f})" for f in _ELSEWHERE)
                              + " && !(has(e.proxyFromEnvironment) && e.proxyFromEnvironment)"
                              + " && has(e.followRedirects) && !e.followRedirects)",
                "message": "a tenant's PodMonitor scrapes its pods directly: no proxyUrl, proxyFromEnvironment or "
                           "oauth2, and followRedirects: false, in every spec.podMetricsEndpoints entry",
                "reason": "Forbidden",
            },
            {
                "expression": f"!has({spec}.podTargetLabels) || !('{_LABEL}' in {spec}.podTargetLabels)",
                "message": f"a tenant's PodMonitor may not copy a pod label named {_LABEL} onto its series",
                "reason": "Forbidden",
            },
            {
                "expression": f"has({spec}.sampleLimit) && {spec}.sampleLimit > 0 && "
                              f"{spec}.sampleLimit <= {SAMPLE_LIMIT}",
                "message": f"a tenant's PodMonitor sets spec.sampleLimit, at most {SAMPLE_LIMIT}",
                "reason": "Forbidden",
            },
        ],
    }


def binding_spec(tenant_label: str) -> dict[str, Any]:
    """Bound to the namespaces that carry the tenant label: the platform's own monitors are not a tenant's."""
    return {"policyName": POD_MONITOR_POLICY, "validationActions": ["Deny"],
            "matchResources": {"namespaceSelector": {"matchExpressions": [
                {"key": tenant_label, "operator": "Exists"}]}}}
