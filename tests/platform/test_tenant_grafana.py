"""Each tenant's own Grafana (platform/tenant_grafana.py) as every stack renders it.

What members rely on: every tenant gets one Grafana pod of a fixed name in a namespace holding nothing else, and its
group may forward to that pod and nothing else; the pod's one data source is a label proxy on its loopback that
enforces the tenant's namespace and talks to the Prometheus the chart renders; nobody can sign in or edit; the
namespace takes no connection and reaches DNS and Prometheus only; the dashboards it shows read only series that
carry the workload's namespace. Expectations come from each stack's settings and rendered objects.
"""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from owned_stacks import FLEET, LAPTOP, Stack, planned, sample_stacks, stack_raw, stack_settings
from test_dashboards import DASHBOARD_DIR, _load, dashboard_queries, metric_names
from trainyard import names
from trainyard.catalogue.charts import load_catalogue
from trainyard.config import ConfigError, Settings
from trainyard.config.load import parse_settings
from trainyard.paths import REPO_ROOT
from trainyard.plan.runtime import PROJECT
from trainyard.plan.writers import is_kubernetes_object, manifest_of
from trainyard.platform import tenant_grafana as grafana

STACKS: list[Stack] = [FLEET, LAPTOP, *sample_stacks()]
LISTED = yaml.safe_load((DASHBOARD_DIR.parent / "metrics.yaml").read_text())


def _objects(stack: Stack, kind: str, namespace: str = grafana.NAMESPACE) -> dict[str, dict[str, Any]]:
    found = (manifest_of(r) for r in planned(stack).recording.resources if is_kubernetes_object(r))
    return {m["metadata"]["name"]: m for m in found
            if m["kind"] == kind and m["metadata"].get("namespace") == namespace}


def _on(settings: Settings) -> bool:
    return settings.addons.monitoring.enabled and settings.addons.tenant_grafana.enabled


def _containers(statefulset: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in statefulset["spec"]["template"]["spec"]["containers"]}


def _flags(container: dict[str, Any]) -> dict[str, str]:
    return dict(arg.removeprefix("-").split("=", 1) if "=" in arg else (arg.removeprefix("-"), "")
                for arg in container["args"])


@pytest.mark.parametrize("stack", STACKS, ids=[s[0] for s in STACKS])
def test_every_tenant_gets_one_grafana_whose_proxy_enforces_its_namespace(stack: Stack) -> None:
    settings = stack_settings(stack)
    statefulsets = _objects(stack, "StatefulSet")
    expected = {f"{names.TENANT_GRAFANA_PREFIX}{t.name}": t for t in settings.tenants} if _on(settings) else {}
    assert sorted(statefulsets) == sorted(expected)
    for name, tenant in expected.items():
        spec = statefulsets[name]["spec"]
        assert spec["replicas"] == 1
        containers = _containers(statefulsets[name])
        assert sorted(containers) == ["grafana", "label-proxy"]
        flags = _flags(containers["label-proxy"])
        assert flags["label"] == "namespace"
        assert flags["label-value"] == tenant.namespace_name
        # A static value only: nothing the caller sends chooses the tenant.
        assert not {"query-param", "header-name", "regex-match", "unsafe-passthrough-paths"} & set(flags)
        listen = urlsplit(f"http://{flags['insecure-listen-address']}")
        assert listen.hostname == "127.0.0.1"
        # Grafana's one data source is that address.
        data = _objects(stack, "ConfigMap")[grafana.CONFIG_MAP]["data"]
        (source,) = yaml.safe_load(data["datasources.yaml"])["datasources"]
        assert source["url"] == f"http://127.0.0.1:{listen.port}"
        pod = spec["template"]["spec"]
        assert pod["automountServiceAccountToken"] is False
        assert pod["nodeSelector"] == {names.ROLE_LABEL: "system"}
        for container in containers.values():
            context = container["securityContext"]
            assert context["runAsNonRoot"] and context["readOnlyRootFilesystem"]
            assert context["capabilities"] == {"drop": ["ALL"]} and not context["allowPrivilegeEscalation"]


@pytest.mark.parametrize("stack", STACKS, ids=[s[0] for s in STACKS])
def test_members_forward_to_their_own_tenants_pod_and_nothing_else(stack: Stack) -> None:
    settings = stack_settings(stack)
    roles, bindings = _objects(stack, "Role"), _objects(stack, "RoleBinding")
    tenants = {f"{names.TENANT_GRAFANA_PREFIX}{t.name}": t for t in settings.tenants} if _on(settings) else {}
    assert sorted(roles) == sorted(bindings) == sorted(tenants)
    for name, tenant in tenants.items():
        pod = f"{name}-0"
        granted = {(g, r, tuple(rule.get("resourceNames", ()))): set(rule["verbs"])
                   for rule in roles[name]["rules"] for g in rule["apiGroups"] for r in rule["resources"]}
        # kubectl port-forward pod/<pod>: GET the pod, then the forward (WebSocket GET, SPDY POST).
        assert granted == {("", "pods", (pod,)): {"get"}, ("", "pods/portforward", (pod,)): {"get", "create"}}
        assert bindings[name]["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name}
        assert bindings[name]["subjects"] == [{"kind": "Group", "name": tenant.group,
                                               "apiGroup": "rbac.authorization.k8s.io"}]
    # Nothing else of the namespace: no Service, no account, no other workload.
    for kind in ("Service", "ServiceAccount", "Deployment", "DaemonSet", "Secret"):
        assert not _objects(stack, kind), kind


@pytest.mark.parametrize("stack", [FLEET, LAPTOP], ids=["fleet", "laptop"])
def test_nobody_signs_in_and_nothing_is_editable(stack: Stack) -> None:
    (statefulset, *_) = _objects(stack, "StatefulSet").values()
    env = {e["name"]: e["value"] for e in _containers(statefulset)["grafana"]["env"]}
    # Anonymous Viewers only: no login form, no basic auth (API included), no admin user to sign in as, no sign-up
    # or organisations, no Explore, no editing in the browser (grafana/grafana conf/defaults.ini keys).
    assert {key: env[key] for key in (
        "GF_AUTH_ANONYMOUS_ENABLED", "GF_AUTH_ANONYMOUS_ORG_ROLE", "GF_AUTH_DISABLE_LOGIN_FORM",
        "GF_AUTH_BASIC_ENABLED", "GF_SECURITY_DISABLE_INITIAL_ADMIN_CREATION", "GF_USERS_ALLOW_SIGN_UP",
        "GF_USERS_ALLOW_ORG_CREATE", "GF_EXPLORE_ENABLED", "GF_USERS_VIEWERS_CAN_EDIT")} == {
        "GF_AUTH_ANONYMOUS_ENABLED": "true", "GF_AUTH_ANONYMOUS_ORG_ROLE": "Viewer",
        "GF_AUTH_DISABLE_LOGIN_FORM": "true", "GF_AUTH_BASIC_ENABLED": "false",
        "GF_SECURITY_DISABLE_INITIAL_ADMIN_CREATION": "true", "GF_USERS_ALLOW_SIGN_UP": "false",
        "GF_USERS_ALLOW_ORG_CREATE": "false", "GF_EXPLORE_ENABLED": "false", "GF_USERS_VIEWERS_CAN_EDIT": "false"}
    assert not any(key.startswith("GF_SECURITY_ADMIN") for key in env)
    # The image's own plugins run (Prometheus' among them), none is fetched over them on a read-only root.
    assert env["GF_PLUGINS_PREINSTALL_DISABLED"] == "true"
    data = _objects(stack, "ConfigMap")[grafana.CONFIG_MAP]["data"]
    (source,) = yaml.safe_load(data["datasources.yaml"])["datasources"]
    assert source["url"] == grafana.PROXY_URL and source["editable"] is False
    (provider,) = yaml.safe_load(data["dashboards.yaml"])["providers"]
    assert provider["allowUiUpdates"] is False and provider["disableDeletion"] is True
    mounts = {m["mountPath"]: m["name"] for m in _containers(statefulset)["grafana"]["volumeMounts"]}
    assert mounts[provider["options"]["path"]] == "dashboards"
    for stem in grafana.DASHBOARDS:
        assert json.loads(data[f"{stem}.json"]) == _load(DASHBOARD_DIR / f"{stem}.json")


def _rendered_service(stack: Stack, namespace: str, name: str) -> dict[str, Any]:
    (service,) = [o for _, o in planned(stack).rendered.objects()
                  if o["kind"] == "Service" and o["metadata"]["name"] == name
                  and o["metadata"].get("namespace") == namespace]
    return service


@pytest.mark.parametrize("stack", [FLEET, LAPTOP], ids=["fleet", "laptop"])
def test_the_proxy_and_the_policy_reach_the_prometheus_the_chart_renders(stack: Stack) -> None:
    (statefulset, *_) = _objects(stack, "StatefulSet").values()
    upstream = urlsplit(_flags(_containers(statefulset)["label-proxy"])["upstream"])
    service_name, namespace, *_ = (upstream.hostname or "").split(".")
    service = _rendered_service(stack, namespace, service_name)
    (web,) = [p for p in service["spec"]["ports"] if p["port"] == upstream.port]
    (policy,) = [*_objects(stack, "CiliumNetworkPolicy").values(), *_objects(stack, "NetworkPolicy").values()]
    selector = service["spec"]["selector"]
    if policy["kind"] == "CiliumNetworkPolicy":
        # No peer for ingress: default-deny on, nothing allowed (a forward enters the pod, past any policy).
        assert policy["spec"]["endpointSelector"] == {} and "ingress" not in policy["spec"]
        assert policy["spec"]["enableDefaultDeny"] == {"ingress": True, "egress": True}
        dns, prometheus = policy["spec"]["egress"]
        peers = prometheus["toEndpoints"]
        assert peers == [{"matchLabels": {"k8s:io.kubernetes.pod.namespace": namespace, **selector}}]
        assert prometheus["toPorts"] == [{"ports": [{"port": str(web["targetPort"]), "protocol": "TCP"}]}]
        assert dns["toEndpoints"] == [{"matchLabels": {"k8s:io.kubernetes.pod.namespace": "kube-system",
                                                       "k8s:k8s-app": "kube-dns"}}]
    else:
        assert policy["spec"]["podSelector"] == {} and policy["spec"]["ingress"] == []
        assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
        dns, prometheus = policy["spec"]["egress"]
        assert prometheus["to"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                                     "podSelector": {"matchLabels": selector}}]
        assert prometheus["ports"] == [{"port": web["targetPort"], "protocol": "TCP"}]
        assert {p["port"] for p in dns["ports"]} == {53}


def test_the_owned_stacks_cover_both_policy_kinds() -> None:
    kinds = {policy["kind"] for stack in (FLEET, LAPTOP)
             for kind in ("CiliumNetworkPolicy", "NetworkPolicy") for policy in _objects(stack, kind).values()}
    assert kinds == {"CiliumNetworkPolicy", "NetworkPolicy"}


# Series that carry the workload's own namespace: the trainer's (PodMonitor in the tenant namespace), kube-state-
# metrics' (the object's namespace) and the recorded GPU series relabelled to the workload (gpu.rules.yaml).
def _tenant_labelled(metric: str) -> bool:
    return (metric in LISTED["trainer"] or metric in LISTED["kube_state_metrics"]
            or bool(re.fullmatch(r"namespace(_pod(_gpu)?)?:\w+:\w+", metric)))


def test_tenant_dashboards_read_only_series_of_the_workloads_namespace() -> None:
    for stem in grafana.DASHBOARDS:
        for query in dashboard_queries(_load(DASHBOARD_DIR / f"{stem}.json")):
            assert "exported_" not in query, (stem, query)
            for metric in metric_names(query):
                assert _tenant_labelled(metric), (stem, metric)


def test_the_dashboards_left_out_read_the_exporters_own_series() -> None:
    """Through the proxy they would stay empty, not leak: their series carry the GPU Operator's namespace."""
    left_out = {p.stem for p in DASHBOARD_DIR.glob("*.json")} - set(grafana.DASHBOARDS)
    assert left_out
    for stem in left_out:
        metrics = {m for q in dashboard_queries(_load(DASHBOARD_DIR / f"{stem}.json")) for m in metric_names(q)}
        assert not all(_tenant_labelled(m) for m in metrics), stem


@pytest.mark.parametrize(("length", "refused"), [(44, False), (45, True)])
def test_a_tenant_name_leaves_room_for_its_grafanas_pod_labels(length: int, refused: bool) -> None:
    """`grafana-<name>` plus the revision hash's `-<10 characters>` is a label value: 63 characters at most."""
    raw = stack_raw(FLEET)
    old = raw["tenants"][0]["name"]
    name = "t" * length
    raw["tenants"][0]["name"] = name
    for job in raw.get("workloads", []):
        if job["tenant"] == old:
            job["tenant"] = name
    if not refused:
        assert len(f"{grafana.statefulset_name(name)}-0123456789") == 63
        parse_settings(PROJECT, FLEET[0], raw)
        return
    with pytest.raises(ConfigError) as caught:
        parse_settings(PROJECT, FLEET[0], raw)
    assert [p.path for p in caught.value.problems] == ["tenants[0].name"]
    assert "44" in caught.value.problems[0].message


def test_the_guides_forward_command_names_a_tenants_pod_and_grafanas_port() -> None:
    """README step 4's command: the namespace, a pod some stack renders for a tenant, and Grafana's container port."""
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    (command,) = re.findall(r"^kubectl -n (\S+) port-forward pod/(\S+) (\d+):(\d+)$", readme, re.M)
    namespace, pod, _, port = command
    assert namespace == grafana.NAMESPACE
    rendered = {f"{name}-0": statefulset for stack in STACKS
                for name, statefulset in _objects(stack, "StatefulSet").items()}
    assert pod in rendered, sorted(rendered)
    (http,) = _containers(rendered[pod])["grafana"]["ports"]
    assert int(port) == http["containerPort"]


def test_rules_attributing_gpus_to_pods_read_the_exporters_series_only() -> None:
    """A tenant's target may serve DCGM-named series; with honorLabels false their scraped namespace/pod become
    exported_* too, so each such selector must name the GPU Operator's namespace, where the exporter runs."""
    exporter_namespace = load_catalogue(REPO_ROOT).chart("gpu-operator").namespace
    rules = [rule for path in sorted((DASHBOARD_DIR.parent / "rules").glob("*.rules.yaml"))
             for group in yaml.safe_load(path.read_text())["groups"] for rule in group["rules"]]
    attributing = [rule["expr"] for rule in rules if "exported_" in rule["expr"]]
    assert attributing
    for expr in attributing:
        selectors = re.findall(r'(DCGM_\w+)?\{([^}]*)\}', expr)
        dcgm = [body for name, body in selectors if name or "DCGM_" in body]
        assert dcgm, expr
        for body in dcgm:
            assert f'namespace="{exporter_namespace}"' in body.replace(" ", ""), (body, expr)
