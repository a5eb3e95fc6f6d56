"""IAM for the cluster: roles for AWS services and EKS Pod Identity roles for in-cluster controllers.

Pod Identity over IRSA: no per-cluster OIDC provider to create and trust, one trust policy shape for every
role (`pods.eks.amazonaws.com`), and associations are plain AWS resources that need no service-account
annotation, so the platform layer's Helm values stay free of role ARNs. It needs the eks-pod-identity-agent
add-on, which runs on the host network and so works before Cilium is up.

Policy documents are built by pure functions returning dicts (with Outputs for ARNs) so tests can walk them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_aws as aws

from trainyard.names import ServiceAccountRef

Policy = dict[str, Any]

POD_IDENTITY_PRINCIPAL = "pods.eks.amazonaws.com"
# IAM roles for service accounts: the audience EKS puts in projected service account tokens (EKS user guide,
# "Create an IAM OIDC provider for your cluster" / "Assign IAM roles to Kubernetes service accounts").
IRSA_AUDIENCE = "sts.amazonaws.com"
IRSA_ROLE_ANNOTATION = "eks.amazonaws.com/role-arn"
EBS_CSI_MANAGED_POLICY = "arn:aws:iam::aws:policy/service-role/AmazonEBSCSIDriverPolicy"
NODE_MANAGED_POLICIES = (
    "arn:aws:iam::aws:policy/AmazonEKSWorkerNodePolicy",
    "arn:aws:iam::aws:policy/AmazonEC2ContainerRegistryPullOnly",
    # Session Manager instead of SSH keys: no inbound port on nodes.
    "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore",
)


def document(*statements: Mapping[str, Any]) -> Policy:
    return {"Version": "2012-10-17", "Statement": [dict(s) for s in statements]}


def allow(actions: Sequence[str], resources: Any, condition: Mapping[str, Any] | None = None,
          sid: str | None = None) -> dict[str, Any]:
    statement: dict[str, Any] = {"Effect": "Allow", "Action": list(actions), "Resource": resources}
    if sid:
        statement["Sid"] = sid
    if condition:
        statement["Condition"] = dict(condition)
    return statement


def service_trust(service: str) -> Policy:
    return document({"Effect": "Allow", "Principal": {"Service": service}, "Action": ["sts:AssumeRole"]})


# Session tags EKS Pod Identity puts on every role session, on by default (disableSessionTags false):
# docs.aws.amazon.com/eks/latest/userguide/pod-id-abac.html, "List of session tags added by EKS Pod Identity".
TAG_CLUSTER_ARN = "eks-cluster-arn"
TAG_NAMESPACE = "kubernetes-namespace"
TAG_SERVICE_ACCOUNT = "kubernetes-service-account"
# The caller's own namespace, as IAM resolves it in a policy of a Pod Identity session.
NAMESPACE_VARIABLE = "${aws:PrincipalTag/" + TAG_NAMESPACE + "}"


def pod_identity_trust(cluster_arn: pulumi.Input[str], service_accounts: Sequence[ServiceAccountRef]) -> Policy:
    """One statement per service account: only that account, in that namespace, on this cluster may assume it.

    Pod Identity's request tags are the conditions AWS documents for this trust (docs.aws.amazon.com/eks/latest/
    userguide/pod-id-role.html, "Setting Conditions"); any other cluster or namespace of the account is refused.
    """
    return document(*({
        "Effect": "Allow", "Principal": {"Service": POD_IDENTITY_PRINCIPAL},
        # sts:TagSession: Pod Identity passes the session tags these conditions read.
        "Action": ["sts:AssumeRole", "sts:TagSession"],
        "Condition": {"StringEquals": {f"aws:RequestTag/{TAG_CLUSTER_ARN}": cluster_arn,
                                       f"aws:RequestTag/{TAG_NAMESPACE}": sa.namespace,
                                       f"aws:RequestTag/{TAG_SERVICE_ACCOUNT}": sa.name}},
    } for sa in service_accounts))


def web_identity_trust(provider_arn: str, issuer: str, service_accounts: Sequence[ServiceAccountRef]) -> Policy:
    """Only these service accounts' tokens from this cluster's OIDC issuer, for STS, may assume the role
    (EKS user guide, "Configure a role trust policy" for IRSA: the `:sub` and `:aud` conditions)."""
    host = issuer.removeprefix("https://")
    return document(*({
        "Effect": "Allow", "Principal": {"Federated": provider_arn},
        "Action": "sts:AssumeRoleWithWebIdentity",
        "Condition": {"StringEquals": {f"{host}:sub": f"system:serviceaccount:{sa.namespace}:{sa.name}",
                                       f"{host}:aud": IRSA_AUDIENCE}},
    } for sa in service_accounts))


# GitHub Actions' OIDC issuer and the audience configure-aws-credentials asks for (docs.github.com, "Configuring
# OpenID Connect in Amazon Web Services": provider URL, `sts.amazonaws.com`, condition keys <host>:aud and :sub).
GITHUB_OIDC_HOST = "token.actions.githubusercontent.com"
# Read-only metadata of every service, no data (AWS managed policy reference, "ViewOnlyAccess").
VIEW_ONLY_POLICY = "arn:aws:iam::aws:policy/job-function/ViewOnlyAccess"


def github_oidc_provider_arn(account_arn: str) -> str:
    """The account's GitHub OIDC provider, from any ARN of that account (the deploy role's)."""
    partition, account = account_arn.split(":")[1], account_arn.split(":")[4]
    return f"arn:{partition}:iam::{account}:oidc-provider/{GITHUB_OIDC_HOST}"


def github_pull_request_trust(provider_arn: str, repository: str) -> Policy:
    """Only `pull_request` jobs of `repository` may assume the role: their token's subject is
    `repo:<owner>/<name>:pull_request`, while a job in a GitHub environment gets `...:environment:<name>` and a push
    `...:ref:<ref>` (docs.github.com, "About security hardening with OpenID Connect", example subject claims), so no
    deploy job and no other repository can use it."""
    return document({
        "Effect": "Allow", "Principal": {"Federated": provider_arn},
        "Action": "sts:AssumeRoleWithWebIdentity",
        "Condition": {"StringEquals": {f"{GITHUB_OIDC_HOST}:aud": IRSA_AUDIENCE,
                                       f"{GITHUB_OIDC_HOST}:sub": f"repo:{repository}:pull_request"}},
    })


def bucket_read(bucket_arn: pulumi.Input[str], key_arn: pulumi.Input[str], prefix: str = "") -> list[dict[str, Any]]:
    """List and read one bucket (optionally one prefix of it), decrypting with its KMS key."""
    objects = pulumi.Output.concat(bucket_arn, "/", prefix, "*")
    list_condition = {"StringLike": {"s3:prefix": [f"{prefix}*"]}} if prefix else None
    return [
        allow(["s3:ListBucket"], bucket_arn, list_condition),
        allow(["s3:GetBucketLocation"], bucket_arn),
        allow(["s3:GetObject", "s3:GetObjectVersion"], objects),
        allow(["kms:Decrypt", "kms:DescribeKey"], key_arn),
    ]


def namespace_read_write(bucket_arn: pulumi.Input[str], key_arn: pulumi.Input[str]) -> list[dict[str, Any]]:
    """Read, write and delete objects under `<bucket>/<caller's namespace>/` only, with multipart uploads.

    One role serves every tenant; the session's namespace tag picks the prefix, so a tenant can neither list nor
    touch another's objects. The KMS grant stays bucket-wide: with an S3 bucket key the encryption context is the
    bucket, not the object, so S3 object permissions are the boundary.
    """
    own = pulumi.Output.concat(bucket_arn, "/", NAMESPACE_VARIABLE, "/*")
    return [
        allow(["s3:ListBucket"], bucket_arn, {"StringLike": {"s3:prefix": [f"{NAMESPACE_VARIABLE}/*"]}},
              sid="ListOwnNamespace"),
        allow(["s3:GetBucketLocation"], bucket_arn),
        allow(["s3:GetObject", "s3:GetObjectVersion", "s3:PutObject", "s3:DeleteObject",
               "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"], own, sid="ObjectsOfOwnNamespace"),
        allow(["kms:Decrypt", "kms:Encrypt", "kms:GenerateDataKey", "kms:DescribeKey"], key_arn),
    ]


def alluxio_policy(dataset_bucket_arn: pulumi.Input[str], dataset_key_arn: pulumi.Input[str],
                   prefix: str) -> Policy:
    """Alluxio's under-store: read the dataset prefix of the dataset bucket, nothing else."""
    return document(*bucket_read(dataset_bucket_arn, dataset_key_arn, prefix))


def trainer_policy(checkpoint_bucket_arn: pulumi.Input[str], checkpoint_key_arn: pulumi.Input[str],
                   dataset_bucket_arn: pulumi.Input[str], dataset_key_arn: pulumi.Input[str]) -> Policy:
    """Checkpoint exports under `<checkpoint bucket>/<namespace>/`; shared datasets read-only."""
    return document(*namespace_read_write(checkpoint_bucket_arn, checkpoint_key_arn),
                    *bucket_read(dataset_bucket_arn, dataset_key_arn))


# Cilium ENI IPAM: the operator creates and attaches ENIs and assigns their secondary IPs and prefixes to pods. The
# list is Cilium's "Required Privileges" (Documentation/network/concepts/ipam/eni.rst), the prefix-list reads
# included (they resolve AWS prefix lists in policies: cilium/cilium issue 45805, PR 45806).
CILIUM_ENI_DESCRIBE = (
    "ec2:DescribeInstances", "ec2:DescribeInstanceTypes", "ec2:DescribeNetworkInterfaces", "ec2:DescribeSubnets",
    "ec2:DescribeVpcs", "ec2:DescribeSecurityGroups", "ec2:DescribeRouteTables", "ec2:DescribeTags",
    "ec2:DescribeManagedPrefixLists", "ec2:GetManagedPrefixListEntries",
)
CILIUM_ENI_MUTATE = (
    "ec2:AttachNetworkInterface", "ec2:DetachNetworkInterface", "ec2:DeleteNetworkInterface",
    "ec2:ModifyNetworkInterfaceAttribute", "ec2:AssignPrivateIpAddresses", "ec2:UnassignPrivateIpAddresses",
)
# The instance side of an attachment (EC2's AttachNetworkInterface and DetachNetworkInterface authorize both).
CILIUM_INSTANCE_ACTIONS = ("ec2:AttachNetworkInterface", "ec2:DetachNetworkInterface")


def cluster_owned_tag(cluster_name: str) -> tuple[str, str]:
    """`kubernetes.io/cluster/<name>=owned`: Karpenter puts it on the instances and ENIs it launches
    (aws/karpenter-provider-aws v1.14.1 pkg/utils/utils.go GetTags, launch template network-interface tags); the
    managed groups' launch templates and Cilium's ENI tags (platform/cilium.py) carry it too."""
    return f"kubernetes.io/cluster/{cluster_name}", "owned"


def cilium_operator_policy(region: str, cluster_name: str) -> Policy:
    """ENI IPAM on this cluster's instances and ENIs only: several stacks share an account and region
    (cloud/naming.py), and no cluster's operator may detach, delete or re-address another's. The scoping follows AWS's
    own tag-scoped CNI policy (AmazonEKSNetworkingPolicy: CreateNetworkInterface by request tag, security groups and
    subnets unconditioned)."""
    key, value = cluster_owned_tag(cluster_name)
    ec2 = f"arn:aws:ec2:{region}:*"
    eni = f"{ec2}:network-interface/*"
    owned = {"StringEquals": {f"aws:ResourceTag/{key}": value}}
    return document(
        # Describe calls support no resource-level permissions.
        allow(CILIUM_ENI_DESCRIBE, "*", sid="DescribeForEniIpam"),
        allow(["ec2:CreateNetworkInterface"], eni, {"StringEquals": {f"aws:RequestTag/{key}": value}},
              sid="CreateEnisOfThisCluster"),
        allow(["ec2:CreateNetworkInterface"], [f"{ec2}:subnet/*", f"{ec2}:security-group/*"],
              sid="CreateEnisInSubnets"),
        # Tags only as part of creating an ENI (Cilium passes its eniTags in CreateNetworkInterface's
        # TagSpecifications), so no existing ENI can be re-tagged into this cluster.
        allow(["ec2:CreateTags"], eni, {"StringEquals": {"ec2:CreateAction": "CreateNetworkInterface"}},
              sid="TagEnisAtCreation"),
        allow(CILIUM_ENI_MUTATE, eni, owned, sid="ManageEnisOfThisCluster"),
        allow(CILIUM_INSTANCE_ACTIONS, f"{ec2}:instance/*", owned, sid="AttachToInstancesOfThisCluster"),
    )


@dataclass(frozen=True)
class PodIdentityRoleArgs:
    """A role assumed through EKS Pod Identity by the given service accounts of one cluster."""

    cluster_name: pulumi.Input[str]
    # The trust policy admits sessions of this cluster only (the eks-cluster-arn request tag).
    cluster_arn: pulumi.Input[str]
    role_name: str
    service_accounts: tuple[ServiceAccountRef, ...]
    policy: Policy | None = None
    managed_policy_arns: tuple[str, ...] = ()
    tags: dict[str, str] = field(default_factory=dict)


class PodIdentityRole(pulumi.ComponentResource):
    """An IAM role, its permissions, and one Pod Identity association per service account."""

    role: aws.iam.Role
    associations: list[aws.eks.PodIdentityAssociation]

    def __init__(self, name: str, args: PodIdentityRoleArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("trainyard:cloud:PodIdentityRole", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.role = aws.iam.Role(f"{name}-role", name=args.role_name,
                                 assume_role_policy=pulumi.Output.json_dumps(
                                     pod_identity_trust(args.cluster_arn, args.service_accounts)),
                                 tags=args.tags, opts=child)
        grants: list[pulumi.Resource] = []
        if args.policy is not None:
            grants.append(aws.iam.RolePolicy(f"{name}-policy", role=self.role.name,
                                             policy=pulumi.Output.json_dumps(args.policy), opts=child))
        for i, arn in enumerate(args.managed_policy_arns):
            grants.append(aws.iam.RolePolicyAttachment(f"{name}-managed-{i}", role=self.role.name, policy_arn=arn,
                                                       opts=child))
        # The association only after the permissions exist, so a pod never starts with a half-granted role.
        self.associations = [
            aws.eks.PodIdentityAssociation(
                f"{name}-{sa.namespace}", cluster_name=args.cluster_name, namespace=sa.namespace,
                service_account=sa.name, role_arn=self.role.arn, tags=args.tags,
                opts=pulumi.ResourceOptions(parent=self, depends_on=grants))
            for sa in args.service_accounts
        ]
        self.register_outputs({"roleArn": self.role.arn})


@dataclass(frozen=True)
class ServiceRoleArgs:
    role_name: str
    service: str
    managed_policy_arns: tuple[str, ...]
    tags: dict[str, str] = field(default_factory=dict)


class ServiceRole(pulumi.ComponentResource):
    """A role an AWS service assumes (EKS control plane, EC2 nodes) with AWS managed policies."""

    role: aws.iam.Role
    attachments: list[aws.iam.RolePolicyAttachment]

    def __init__(self, name: str, args: ServiceRoleArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("trainyard:cloud:ServiceRole", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.role = aws.iam.Role(f"{name}-role", name=args.role_name,
                                 assume_role_policy=pulumi.Output.json_dumps(service_trust(args.service)),
                                 tags=args.tags, opts=child)
        self.attachments = [
            aws.iam.RolePolicyAttachment(f"{name}-managed-{i}", role=self.role.name, policy_arn=arn, opts=child)
            for i, arn in enumerate(args.managed_policy_arns)
        ]
        self.register_outputs({"roleArn": self.role.arn})


@dataclass(frozen=True)
class WebIdentityRoleArgs:
    """A role assumed with a service account token (IRSA), for clients whose AWS SDK predates Pod Identity."""

    provider_arn: pulumi.Input[str]
    issuer: pulumi.Input[str]
    role_name: str
    service_accounts: tuple[ServiceAccountRef, ...]
    policy: Policy
    tags: dict[str, str] = field(default_factory=dict)


class WebIdentityRole(pulumi.ComponentResource):
    """An IAM role trusted through the cluster's OIDC provider, with its inline permissions."""

    role: aws.iam.Role
    grants: list[pulumi.Resource]

    def __init__(self, name: str, args: WebIdentityRoleArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("trainyard:cloud:WebIdentityRole", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        trust = pulumi.Output.all(args.provider_arn, args.issuer).apply(
            lambda values: web_identity_trust(values[0], values[1], args.service_accounts))
        self.role = aws.iam.Role(f"{name}-role", name=args.role_name,
                                 assume_role_policy=pulumi.Output.json_dumps(trust), tags=args.tags, opts=child)
        self.grants = [aws.iam.RolePolicy(f"{name}-policy", role=self.role.name,
                                          policy=pulumi.Output.json_dumps(args.policy), opts=child)]
        self.register_outputs({"roleArn": self.role.arn})
