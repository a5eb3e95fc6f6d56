"""Default-deny network policy for a tenant namespace, with the few flows a training job needs.

Allowed: DNS to kube-dns, anything inside the namespace (torchrun's c10d rendezvous and NCCL bootstrap between
workers), scraping from the monitoring namespace, HTTPS to regional S3 (checkpoints; the VPC gateway endpoint
routes it), and the EKS Pod Identity agent (the trainer's AWS credentials). The API server is NOT allowed:
elastic torchrun rendezvouses over c10d between worker pods and never talks to Kubernetes, so a job's pods
need no API access (and get no token, see the trainer ServiceAccount).
"""

from __future__ import annotations

from typing import Any

CILIUM_API_VERSION = "cilium.io/v2"
# EKS Pod Identity agent: 169.254.170.23:80, served on every node by a hostNetwork DaemonSet (EKS user guide,
# pod-identities "Considerations"). Cilium classifies that address as the `host` entity, so a toCIDR rule never
# matches it (cilium/cilium issues 34387, 16308): it is allowed as `toEntities: [host]` on the agent's port only
# (Cilium docs, Policy Language, "Entities Based": host = the local node and its host-network pods).
POD_IDENTITY_AGENT_ENTITY = "host"
POD_IDENTITY_AGENT_PORT = "80"
_NAMESPACE_LABEL = "k8s:io.kubernetes.pod.namespace"
_DNS_PORTS = [{"port": "53", "protocol": "UDP"}, {"port": "53", "protocol": "TCP"}]


def s3_fqdns(region: str) -> list[dict[str, str]]:
    """Regional S3 names in both path style and virtual-hosted style (bucket.s3.<region>...)."""
    return [{"matchName": f"s3.{region}.amazonaws.com"}, {"matchPattern": f"*.s3.{region}.amazonaws.com"}]


def cilium_default_deny(name: str, namespace: str, *, monitoring_namespace: str, region: str | None,
                        labels: dict[str, str]) -> dict[str, Any]:
    """A CiliumNetworkPolicy object; `region` None (no AWS) leaves HTTPS egress to any address."""
    if region is None:
        https: dict[str, Any] = {"toEntities": ["world"]}
    else:
        https = {"toFQDNs": s3_fqdns(region)}
    egress = [
        {"toEndpoints": [{}]},
        {
            "toEndpoints": [{"matchLabels": {_NAMESPACE_LABEL: "kube-system", "k8s:k8s-app": "kube-dns"}}],
            # The DNS rule makes Cilium's proxy see lookups, which toFQDNs needs to learn S3's addresses.
            "toPorts": [{"ports": _DNS_PORTS, "rules": {"dns": [{"matchPattern": "*"}]}}],
        },
        {**https, "toPorts": [{"ports": [{"port": "443", "protocol": "TCP"}]}]},
    ]
    if region is not None:
        egress.append({"toEntities": [POD_IDENTITY_AGENT_ENTITY],
                       "toPorts": [{"ports": [{"port": POD_IDENTITY_AGENT_PORT, "protocol": "TCP"}]}]})
    return {
        "apiVersion": CILIUM_API_VERSION,
        "kind": "CiliumNetworkPolicy",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            # Empty selector: every pod in the namespace. Listing ingress and egress rules denies everything else.
            "endpointSelector": {},
            "ingress": [
                {"fromEndpoints": [{}]},
                {"fromEndpoints": [{"matchLabels": {_NAMESPACE_LABEL: monitoring_namespace}}]},
            ],
            "egress": egress,
        },
    }


def kubernetes_default_deny(name: str, namespace: str, *, monitoring_namespace: str,
                            labels: dict[str, str]) -> dict[str, Any]:
    """The same intent as a standard NetworkPolicy, for clusters without Cilium (FQDN rules need Cilium)."""
    by_namespace = "kubernetes.io/metadata.name"
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "podSelector": {},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [
                {"from": [{"podSelector": {}}]},
                {"from": [{"namespaceSelector": {"matchLabels": {by_namespace: monitoring_namespace}}}]},
            ],
            "egress": [
                {"to": [{"podSelector": {}}]},
                {
                    "to": [{"namespaceSelector": {"matchLabels": {by_namespace: "kube-system"}},
                            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
                    "ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}],
                },
                {"ports": [{"port": 443, "protocol": "TCP"}]},
            ],
        },
    }
