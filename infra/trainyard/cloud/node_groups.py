"""EKS managed node groups for the system and storage pools, each with its own launch template.

With no CNI a node stays NotReady ("cni plugin not initialized") and the group ends CREATE_FAILED "Unhealthy nodes
in the kubernetes cluster" (terraform-aws-modules/terraform-aws-eks issues 3160, 3446), so the cloud layer creates
the groups only after the CNI release (`ControlPlane.join_nodes`).
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass, field

import pulumi
import pulumi_aws as aws

from trainyard.cloud.userdata import NodeRole, render_user_data
from trainyard.config.model import CapacityType, Taint

ROOT_DEVICE = "/dev/xvda"  # AL2023 root volume
AMI_TYPE = "AL2023_x86_64_STANDARD"
# IMDSv2 only, and one hop: pods (in their own network namespace) cannot reach the node's credentials;
# every controller that calls AWS gets its own role through Pod Identity.
IMDS_HOP_LIMIT = 1
_EFFECTS = {"NoSchedule": "NO_SCHEDULE", "NoExecute": "NO_EXECUTE", "PreferNoSchedule": "PREFER_NO_SCHEDULE"}
_CAPACITY = {"on-demand": "ON_DEMAND", "spot": "SPOT"}


@dataclass(frozen=True)
class ManagedNodeGroupArgs:
    cluster_name: pulumi.Input[str]
    group_name: str  # physical
    role: NodeRole
    node_role_arn: pulumi.Input[str]
    subnet_ids: Sequence[pulumi.Input[str]]
    security_group_ids: Sequence[pulumi.Input[str]]
    instance_types: tuple[str, ...]
    capacity_type: CapacityType
    min_size: int
    desired_size: int
    max_size: int
    root_volume_gib: int
    release_version: str
    labels: dict[str, str]
    taints: tuple[Taint, ...] = ()
    tags: dict[str, str] = field(default_factory=dict)
    # Tags of the group's instances and ENIs only, besides `tags` (the cluster-owned tag Cilium's IAM is scoped by).
    node_tags: dict[str, str] = field(default_factory=dict)


class ManagedNodeGroup(pulumi.ComponentResource):
    """A launch template (IMDSv2, encrypted gp3 root, trainyard user data) and the managed group using it."""

    node_group: aws.eks.NodeGroup
    launch_template: aws.ec2.LaunchTemplate

    def __init__(self, name: str, args: ManagedNodeGroupArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("trainyard:cloud:ManagedNodeGroup", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        user_data = base64.b64encode(render_user_data(args.role).encode()).decode()
        instance_tags = {**args.tags, **args.node_tags, "Name": args.group_name}
        self.launch_template = aws.ec2.LaunchTemplate(
            f"{name}-lt", name=args.group_name, update_default_version=True, user_data=user_data,
            # With custom groups EKS does not add the cluster security group itself.
            vpc_security_group_ids=list(args.security_group_ids),
            metadata_options=aws.ec2.LaunchTemplateMetadataOptionsArgs(
                http_endpoint="enabled", http_tokens="required", http_put_response_hop_limit=IMDS_HOP_LIMIT),
            block_device_mappings=[aws.ec2.LaunchTemplateBlockDeviceMappingArgs(
                device_name=ROOT_DEVICE,
                ebs=aws.ec2.LaunchTemplateBlockDeviceMappingEbsArgs(
                    volume_size=args.root_volume_gib, volume_type="gp3", encrypted="true",
                    delete_on_termination="true"))],
            tag_specifications=[aws.ec2.LaunchTemplateTagSpecificationArgs(resource_type=kind, tags=instance_tags)
                                for kind in ("instance", "volume", "network-interface")],
            tags=args.tags, opts=child)
        self.node_group = aws.eks.NodeGroup(
            f"{name}-group",
            cluster_name=args.cluster_name,
            node_group_name=args.group_name,
            node_role_arn=args.node_role_arn,
            subnet_ids=list(args.subnet_ids),
            instance_types=list(args.instance_types),
            capacity_type=_CAPACITY[args.capacity_type],
            ami_type=AMI_TYPE,
            release_version=args.release_version,
            scaling_config=aws.eks.NodeGroupScalingConfigArgs(
                min_size=args.min_size, desired_size=args.desired_size, max_size=args.max_size),
            # One node at a time: storage nodes carry Ceph OSDs on instance store that a replacement loses.
            update_config=aws.eks.NodeGroupUpdateConfigArgs(max_unavailable=1),
            launch_template=aws.eks.NodeGroupLaunchTemplateArgs(
                id=self.launch_template.id, version=self.launch_template.latest_version.apply(str)),
            labels=args.labels,
            taints=[aws.eks.NodeGroupTaintArgs(key=t.key, value=t.value or None, effect=_EFFECTS[t.effect])
                    for t in args.taints],
            tags=args.tags, opts=child)
        self.register_outputs({"nodeGroup": self.node_group.node_group_name})
