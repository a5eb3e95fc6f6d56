"""The EKS control plane, prepared for Cilium: no aws-node, no kube-proxy, API-only authentication."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from trainyard.cloud.iam import (
    VIEW_ONLY_POLICY,
    ServiceRole,
    ServiceRoleArgs,
    github_oidc_provider_arn,
    github_pull_request_trust,
)
from trainyard.cloud.kms import KmsKey, KmsKeyArgs
from trainyard.cloud.naming import DISCOVERY_TAG

CLUSTER_ADMIN_POLICY = "arn:aws:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy"
# Read-only on most Kubernetes objects, Secrets excluded (docs.aws.amazon.com/eks/latest/userguide/
# access-policy-permissions.html, AmazonEKSViewPolicy).
CLUSTER_VIEW_POLICY = "arn:aws:eks::aws:cluster-access-policy/AmazonEKSViewPolicy"
CLUSTER_MANAGED_POLICIES = ("arn:aws:iam::aws:policy/AmazonEKSClusterPolicy",)
CONTROL_PLANE_LOG_RETENTION_DAYS = 90


def kubeconfig(name: str, endpoint: str, ca_data: str, region: str) -> str:
    """A kubeconfig that fetches a fresh token per call (`aws eks get-token`): nothing long-lived in state."""
    user = {"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1", "command": "aws",
                     "args": ["eks", "get-token", "--cluster-name", name, "--region", region, "--output", "json"],
                     "interactiveMode": "Never"}}
    return json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": name,
        "clusters": [{"name": name, "cluster": {"server": endpoint, "certificate-authority-data": ca_data}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        "users": [{"name": name, "user": user}],
    })


@dataclass(frozen=True)
class EksClusterArgs:
    cluster_name: str
    kubernetes_version: str
    region: str
    vpc_id: pulumi.Input[str]
    subnet_ids: Sequence[pulumi.Input[str]]
    service_cidr: str
    public_access_cidrs: tuple[str, ...]
    log_types: tuple[str, ...]
    admin_principal_arns: tuple[str, ...]
    # The role CI's `pulumi up` runs as: without an access entry it could create the cluster but not deploy into it.
    deploy_role_arn: str
    # apiAccess private: where the deploy runner reaches the private endpoint from (HTTPS to the cluster SG).
    runner_cidrs: tuple[str, ...] = ()
    # Pull-request previews: the GitHub repository whose pull_request jobs get the read-only preview role, and the
    # role's name (deploy.preview); None: no preview role.
    preview_repository: str | None = None
    preview_role_name: str = ""
    # The secrets key: losing it loses every Kubernetes Secret of the cluster.
    protect: bool = True
    tags: dict[str, str] = field(default_factory=dict)


class EksCluster(pulumi.ComponentResource):
    """Control plane, secrets encryption, admin access entries, the node security group and a k8s provider."""

    cluster: aws.eks.Cluster
    node_security_group: aws.ec2.SecurityGroup
    access: list[pulumi.Resource]
    # The preview role and its view-only access entry, when the stack has deploy.preview.
    preview_role: aws.iam.Role | None
    provider: k8s.Provider
    kubeconfig: pulumi.Output[str]
    api_server_host: pulumi.Output[str]

    def __init__(self, name: str, args: EksClusterArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("trainyard:cloud:EksCluster", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        tags = args.tags
        role = ServiceRole(f"{name}-role", ServiceRoleArgs(f"{args.cluster_name}-cluster", "eks.amazonaws.com",
                                                           CLUSTER_MANAGED_POLICIES, tags), opts=child)
        secrets_key = KmsKey(f"{name}-secrets", KmsKeyArgs(description=f"EKS secrets for {args.cluster_name}",
                                                           alias=f"{args.cluster_name}-eks-secrets",
                                                           protect=args.protect, tags=tags), opts=child)
        # Created first with a retention, or EKS creates it on its own with logs kept forever.
        log_group = aws.cloudwatch.LogGroup(f"{name}-logs", name=f"/aws/eks/{args.cluster_name}/cluster",
                                            retention_in_days=CONTROL_PLANE_LOG_RETENTION_DAYS, tags=tags,
                                            opts=child)
        public = bool(args.public_access_cidrs)
        self.cluster = aws.eks.Cluster(
            f"{name}-cluster",
            name=args.cluster_name,
            version=args.kubernetes_version,
            role_arn=role.role.arn,
            # Cilium replaces aws-node and kube-proxy; CoreDNS comes as a managed add-on after Cilium.
            # ForceNew: changing it later replaces the cluster.
            bootstrap_self_managed_addons=False,
            access_config=aws.eks.ClusterAccessConfigArgs(
                authentication_mode="API",
                # Admins are explicit access entries below; whoever runs `pulumi up` must be one of them.
                bootstrap_cluster_creator_admin_permissions=False),
            vpc_config=aws.eks.ClusterVpcConfigArgs(
                subnet_ids=list(args.subnet_ids), endpoint_private_access=True, endpoint_public_access=public,
                public_access_cidrs=list(args.public_access_cidrs) if public else None),
            kubernetes_network_config=aws.eks.ClusterKubernetesNetworkConfigArgs(
                service_ipv4_cidr=args.service_cidr, ip_family="ipv4"),
            encryption_config=aws.eks.ClusterEncryptionConfigArgs(
                resources=["secrets"],
                provider=aws.eks.ClusterEncryptionConfigProviderArgs(key_arn=secrets_key.key.arn)),
            enabled_cluster_log_types=list(args.log_types),
            tags=tags,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[*role.attachments, log_group]))

        self.access = []
        admins = [(f"{name}-admin-{i}", arn) for i, arn in enumerate(args.admin_principal_arns)]
        for logical, principal in [*admins, (f"{name}-deploy", args.deploy_role_arn)]:
            # Access entry + AmazonEKSClusterAdminPolicy: docs.aws.amazon.com/eks/latest/userguide/access-entries.html
            entry = aws.eks.AccessEntry(logical, cluster_name=self.cluster.name,
                                        principal_arn=principal, type="STANDARD", tags=tags, opts=child)
            self.access.append(aws.eks.AccessPolicyAssociation(
                logical, cluster_name=self.cluster.name, principal_arn=principal,
                policy_arn=CLUSTER_ADMIN_POLICY,
                access_scope=aws.eks.AccessPolicyAssociationAccessScopeArgs(type="cluster"),
                opts=pulumi.ResourceOptions(parent=self, depends_on=[entry])))

        self.preview_role = self._preview_role(name, args) if args.preview_repository else None

        cluster_sg = self.cluster.vpc_config.cluster_security_group_id
        # Nodes (managed groups and Karpenter's) share one group; Karpenter selects it by the discovery tag.
        self.node_security_group = aws.ec2.SecurityGroup(
            f"{name}-nodes", name=f"{args.cluster_name}-nodes", vpc_id=args.vpc_id,
            description=f"trainyard nodes of {args.cluster_name}",
            tags={**tags, "Name": f"{args.cluster_name}-nodes", DISCOVERY_TAG: args.cluster_name}, opts=child)
        node_sg = self.node_security_group.id
        rules = {
            # All protocols node to node, both directions: pod traffic and EFA (which needs self egress too).
            "nodes-from-nodes": (aws.vpc.SecurityGroupIngressRule, node_sg, node_sg),
            "nodes-to-nodes": (aws.vpc.SecurityGroupEgressRule, node_sg, node_sg),
            "nodes-from-control-plane": (aws.vpc.SecurityGroupIngressRule, node_sg, cluster_sg),
            "control-plane-from-nodes": (aws.vpc.SecurityGroupIngressRule, cluster_sg, node_sg),
        }
        for rule_name, (kind, group, peer) in rules.items():
            kind(f"{name}-{rule_name}", security_group_id=group, referenced_security_group_id=peer,
                 ip_protocol="-1", description=rule_name, opts=child)
        # The private endpoint's ENIs carry the cluster security group, so a client outside it needs 443 there
        # (docs.aws.amazon.com/eks/latest/userguide/sec-group-reqs.html; terraform-aws-eks PR 1274 does the same).
        for i, cidr in enumerate(args.runner_cidrs):
            aws.vpc.SecurityGroupIngressRule(f"{name}-api-from-runner-{i}", security_group_id=cluster_sg,
                                             cidr_ipv4=cidr, ip_protocol="tcp", from_port=443, to_port=443,
                                             description="deploy runner to the private API endpoint", opts=child)
        aws.vpc.SecurityGroupEgressRule(f"{name}-nodes-egress", security_group_id=node_sg, cidr_ipv4="0.0.0.0/0",
                                        ip_protocol="-1", description="egress via NAT and endpoints",
                                        opts=child)

        self.api_server_host = self.cluster.endpoint.apply(lambda e: e.removeprefix("https://"))
        self.kubeconfig = pulumi.Output.secret(pulumi.Output.all(
            self.cluster.name, self.cluster.endpoint, self.cluster.certificate_authority.data,
        ).apply(lambda a: kubeconfig(a[0], a[1], a[2], args.region)))
        self.provider = k8s.Provider(
            f"{name}-k8s", kubeconfig=self.kubeconfig,
            # No delete_unreachable: it would drop in-cluster objects from state on a brief outage
            # (pulumi/pulumi-kubernetes PRs 1522, 2489). Teardown of a lost cluster: README, "Tearing down".
            opts=pulumi.ResourceOptions(parent=self, depends_on=self.access))
        self.register_outputs({"name": self.cluster.name, "endpoint": self.cluster.endpoint})

    def _preview_role(self, name: str, args: EksClusterArgs) -> aws.iam.Role:
        """`pulumi preview` on pull requests: read-only AWS and a view-only access entry, trusted for the
        repository's pull_request jobs only. pulumi-kubernetes previews without `patch` rights fall back to a
        client-side diff (pulumi/pulumi-kubernetes PR 2419)."""
        assert args.preview_repository is not None
        child = pulumi.ResourceOptions(parent=self)
        trust = github_pull_request_trust(github_oidc_provider_arn(args.deploy_role_arn), args.preview_repository)
        role = aws.iam.Role(f"{name}-preview", name=args.preview_role_name, assume_role_policy=json.dumps(trust),
                            tags=args.tags, opts=child)
        aws.iam.RolePolicyAttachment(f"{name}-preview-view-only", role=role.name, policy_arn=VIEW_ONLY_POLICY,
                                     opts=child)
        entry = aws.eks.AccessEntry(f"{name}-preview", cluster_name=self.cluster.name, principal_arn=role.arn,
                                    type="STANDARD", tags=args.tags, opts=child)
        aws.eks.AccessPolicyAssociation(
            f"{name}-preview", cluster_name=self.cluster.name, principal_arn=role.arn, policy_arn=CLUSTER_VIEW_POLICY,
            access_scope=aws.eks.AccessPolicyAssociationAccessScopeArgs(type="cluster"),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[entry]))
        return role
