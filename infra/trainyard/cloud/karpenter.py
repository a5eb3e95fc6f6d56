"""AWS side of Karpenter: node role and access entry, controller role, interruption queue, placement groups.

The controller policy follows Karpenter 1.14.1's reference CloudFormation (website/content/en/docs/
getting-started/getting-started-with-karpenter/cloudformation.yaml) statement for statement but one: every
mutating EC2 call is scoped by the `kubernetes.io/cluster/<name>=owned` and `eks:eks-cluster-name` tags
Karpenter puts on what it launches; instance profiles by cluster, region and node-class tags. Left out:
ZonalShiftPolicy (`arc-zonal-shift:GetManagedResource`), which only the zonal-shift feature calls; the chart keeps
it off (values.yaml settings.enableZonalShift false -> ENABLE_ZONAL_SHIFT, pkg/operator/options/options.go), and
tests/cloud/test_karpenter.py fails if the stack turns it on without the statement.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_aws as aws

from trainyard.cloud.iam import (
    NODE_MANAGED_POLICIES,
    PodIdentityRole,
    PodIdentityRoleArgs,
    Policy,
    ServiceRole,
    ServiceRoleArgs,
    allow,
    document,
)
from trainyard.names import KARPENTER

# EventBridge events Karpenter's interruption controller acts on (detail-type per source).
INTERRUPTION_EVENTS: dict[str, tuple[str, str]] = {
    "scheduled-change": ("aws.health", "AWS Health Event"),
    "spot-interruption": ("aws.ec2", "EC2 Spot Instance Interruption Warning"),
    "rebalance": ("aws.ec2", "EC2 Instance Rebalance Recommendation"),
    "state-change": ("aws.ec2", "EC2 Instance State-change Notification"),
    "capacity-reservation-interruption": ("aws.ec2", "EC2 Capacity Reservation Instance Interruption Warning"),
}
QUEUE_RETENTION_SECONDS = 300  # messages older than the two-minute spot notice are worthless


def controller_policy(cluster_name: str, region: str, cluster_arn: pulumi.Input[str],
                      node_role_arn: pulumi.Input[str], queue_arn: pulumi.Input[str]) -> Policy:
    ec2 = f"arn:aws:ec2:{region}"
    owned = {f"aws:ResourceTag/kubernetes.io/cluster/{cluster_name}": "owned"}
    request_owned = {f"aws:RequestTag/kubernetes.io/cluster/{cluster_name}": "owned",
                     "aws:RequestTag/eks:eks-cluster-name": cluster_name}
    created = ("fleet", "instance", "volume", "network-interface", "launch-template", "spot-instances-request")
    profile = "arn:aws:iam::*:instance-profile/*"
    profile_owned = {f"aws:ResourceTag/kubernetes.io/cluster/{cluster_name}": "owned",
                     "aws:ResourceTag/topology.kubernetes.io/region": region}
    in_region = {"StringEquals": {"aws:RequestedRegion": region}}
    statements: list[dict[str, Any]] = [
        allow(["ec2:RunInstances", "ec2:CreateFleet"],
              [f"{ec2}::image/*", f"{ec2}::snapshot/*", f"{ec2}:*:security-group/*", f"{ec2}:*:subnet/*",
               f"{ec2}:*:capacity-reservation/*", f"{ec2}:*:placement-group/*"],
              sid="AllowScopedEC2InstanceAccessActions"),
        allow(["ec2:RunInstances", "ec2:CreateFleet"], f"{ec2}:*:launch-template/*",
              {"StringEquals": owned, "StringLike": {"aws:ResourceTag/karpenter.sh/nodepool": "*"}},
              sid="AllowScopedEC2LaunchTemplateAccessActions"),
        allow(["ec2:RunInstances", "ec2:CreateFleet", "ec2:CreateLaunchTemplate"],
              [f"{ec2}:*:{kind}/*" for kind in created],
              {"StringEquals": request_owned, "StringLike": {"aws:RequestTag/karpenter.sh/nodepool": "*"}},
              sid="AllowScopedEC2InstanceActionsWithTags"),
        allow(["ec2:CreateTags"], [f"{ec2}:*:{kind}/*" for kind in created],
              {"StringEquals": {**request_owned,
                                "ec2:CreateAction": ["RunInstances", "CreateFleet", "CreateLaunchTemplate"]},
               "StringLike": {"aws:RequestTag/karpenter.sh/nodepool": "*"}},
              sid="AllowScopedResourceCreationTagging"),
        allow(["ec2:CreateTags"], f"{ec2}:*:instance/*",
              {"StringEquals": owned, "StringLike": {"aws:ResourceTag/karpenter.sh/nodepool": "*"},
               "StringEqualsIfExists": {"aws:RequestTag/eks:eks-cluster-name": cluster_name},
               "ForAllValues:StringEquals": {"aws:TagKeys": ["eks:eks-cluster-name", "karpenter.sh/nodeclaim",
                                                            "Name"]}},
              sid="AllowScopedResourceTagging"),
        allow(["ec2:TerminateInstances", "ec2:DeleteLaunchTemplate"],
              [f"{ec2}:*:instance/*", f"{ec2}:*:launch-template/*"],
              {"StringEquals": owned, "StringLike": {"aws:ResourceTag/karpenter.sh/nodepool": "*"}},
              sid="AllowScopedDeletion"),
        allow(["ec2:DescribeCapacityReservations", "ec2:DescribeImages", "ec2:DescribeInstances",
               "ec2:DescribeInstanceStatus", "ec2:DescribeInstanceTypeOfferings", "ec2:DescribeInstanceTypes",
               "ec2:DescribeLaunchTemplates", "ec2:DescribePlacementGroups", "ec2:DescribeSecurityGroups",
               "ec2:DescribeSpotPriceHistory", "ec2:DescribeSubnets"], "*", in_region,
              sid="AllowRegionalReadActions"),
        allow(["ssm:GetParameter"], f"arn:aws:ssm:{region}::parameter/aws/service/*", sid="AllowSSMReadActions"),
        allow(["pricing:GetProducts"], "*", sid="AllowPricingReadActions"),
        allow(["sqs:DeleteMessage", "sqs:GetQueueUrl", "sqs:ReceiveMessage"], queue_arn,
              sid="AllowInterruptionQueueActions"),
        allow(["iam:PassRole"], node_role_arn,
              {"StringEquals": {"iam:PassedToService": ["ec2.amazonaws.com"]}}, sid="AllowPassingInstanceRole"),
        allow(["iam:CreateInstanceProfile"], profile,
              {"StringEquals": {f"aws:RequestTag/kubernetes.io/cluster/{cluster_name}": "owned",
                                "aws:RequestTag/eks:eks-cluster-name": cluster_name,
                                "aws:RequestTag/topology.kubernetes.io/region": region},
               "StringLike": {"aws:RequestTag/karpenter.k8s.aws/ec2nodeclass": "*"}},
              sid="AllowScopedInstanceProfileCreationActions"),
        allow(["iam:TagInstanceProfile"], profile,
              {"StringEquals": {**profile_owned,
                                f"aws:RequestTag/kubernetes.io/cluster/{cluster_name}": "owned",
                                "aws:RequestTag/eks:eks-cluster-name": cluster_name,
                                "aws:RequestTag/topology.kubernetes.io/region": region},
               "StringLike": {"aws:ResourceTag/karpenter.k8s.aws/ec2nodeclass": "*",
                              "aws:RequestTag/karpenter.k8s.aws/ec2nodeclass": "*"}},
              sid="AllowScopedInstanceProfileTagActions"),
        allow(["iam:AddRoleToInstanceProfile", "iam:RemoveRoleFromInstanceProfile", "iam:DeleteInstanceProfile"],
              profile,
              {"StringEquals": profile_owned,
               "StringLike": {"aws:ResourceTag/karpenter.k8s.aws/ec2nodeclass": "*"}},
              sid="AllowScopedInstanceProfileActions"),
        allow(["iam:ListInstanceProfiles"], "*", sid="AllowUnscopedInstanceProfileListAction"),
        allow(["iam:GetInstanceProfile"], profile, sid="AllowInstanceProfileReadActions"),
        allow(["eks:DescribeCluster"], cluster_arn, sid="AllowAPIServerEndpointDiscovery"),
    ]
    return document(*statements)


def queue_policy(queue_arn: pulumi.Input[str]) -> Policy:
    return document(
        {"Sid": "EventBridgeAndSqsSend", "Effect": "Allow",
         "Principal": {"Service": ["events.amazonaws.com", "sqs.amazonaws.com"]},
         "Action": "sqs:SendMessage", "Resource": queue_arn},
        {"Sid": "DenyHTTP", "Effect": "Deny", "Principal": "*", "Action": "sqs:*", "Resource": queue_arn,
         "Condition": {"Bool": {"aws:SecureTransport": "false"}}},
    )


@dataclass(frozen=True)
class KarpenterInfraArgs:
    cluster_name: str
    cluster: aws.eks.Cluster
    region: str
    # GPU pools that want a cluster placement group (EFA all-reduce on one network spine).
    placement_group_pools: tuple[str, ...] = ()
    tags: dict[str, str] = field(default_factory=dict)


class KarpenterInfra(pulumi.ComponentResource):
    """Everything Karpenter needs from AWS before its chart is installed by the platform layer."""

    node_role: aws.iam.Role
    node_access: aws.eks.AccessEntry
    controller: PodIdentityRole
    queue: aws.sqs.Queue
    placement_groups: dict[str, aws.ec2.PlacementGroup]

    def __init__(self, name: str, args: KarpenterInfraArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("trainyard:cloud:KarpenterInfra", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        tags = args.tags
        # Karpenter v1 manages the instance profile itself from the role name in each EC2NodeClass.
        self.node_role_name = f"{args.cluster_name}-karpenter-node"
        self.queue_name = f"{args.cluster_name}-karpenter"
        node = ServiceRole(f"{name}-node", ServiceRoleArgs(self.node_role_name,
                                                           "ec2.amazonaws.com", NODE_MANAGED_POLICIES, tags),
                           opts=child)
        self.node_role = node.role
        # Authentication mode API ignores aws-auth: Karpenter's nodes join through this entry.
        self.node_access = aws.eks.AccessEntry(f"{name}-node", cluster_name=args.cluster.name,
                                               principal_arn=node.role.arn, type="EC2_LINUX", tags=tags,
                                               opts=child)

        self.queue = aws.sqs.Queue(f"{name}-interruption", name=self.queue_name,
                                   message_retention_seconds=QUEUE_RETENTION_SECONDS, sqs_managed_sse_enabled=True,
                                   tags=tags, opts=child)
        queue_policy_resource = aws.sqs.QueuePolicy(
            f"{name}-interruption", queue_url=self.queue.url,
            policy=pulumi.Output.json_dumps(queue_policy(self.queue.arn)), opts=child)
        for event, (source, detail_type) in INTERRUPTION_EVENTS.items():
            rule = aws.cloudwatch.EventRule(
                f"{name}-{event}", name=f"{args.cluster_name}-karpenter-{event}",
                event_pattern=json.dumps({"source": [source], "detail-type": [detail_type]}), tags=tags,
                opts=child)
            aws.cloudwatch.EventTarget(f"{name}-{event}", rule=rule.name, arn=self.queue.arn,
                                       target_id="KarpenterInterruptionQueueTarget",
                                       opts=pulumi.ResourceOptions(parent=self, depends_on=[queue_policy_resource]))

        self.controller = PodIdentityRole(f"{name}-controller", PodIdentityRoleArgs(
            cluster_name=args.cluster.name, cluster_arn=args.cluster.arn,
            role_name=f"{args.cluster_name}-karpenter-controller",
            service_accounts=(KARPENTER,),
            policy=controller_policy(args.cluster_name, args.region, args.cluster.arn, node.role.arn,
                                     self.queue.arn),
            tags=tags), opts=child)

        self.placement_groups = {
            pool: aws.ec2.PlacementGroup(f"{name}-{pool}", name=f"{args.cluster_name}-{pool}", strategy="cluster",
                                         tags=tags, opts=child)
            for pool in args.placement_group_pools
        }
        self.register_outputs({"queue": self.queue.name, "nodeRole": self.node_role.name})
