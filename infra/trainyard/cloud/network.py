"""The VPC: private subnets for nodes and pods, public subnets for load balancers and NAT, an S3 endpoint."""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass, field

import pulumi
import pulumi_aws as aws

from trainyard.cloud.naming import DISCOVERY_TAG


@dataclass(frozen=True, slots=True)
class SubnetPlan:
    zone: str
    private: str
    public: str


def plan_subnets(vpc_cidr: str, zones: tuple[str, ...]) -> tuple[SubnetPlan, ...]:
    """Split the VPC deterministically: one large private block per zone, public subnets from the last block.

    With Cilium in ENI mode every pod takes a VPC address, so private subnets get most of the space
    (a /16 over three zones gives /18s); the public subnets only hold NAT gateways and load balancers.
    """
    if not zones:
        raise ValueError("at least one availability zone is needed")
    vpc = ipaddress.IPv4Network(vpc_cidr)
    bits = math.ceil(math.log2(len(zones) + 1))
    blocks = list(vpc.subnets(prefixlen_diff=bits))
    public_bits = max(1, math.ceil(math.log2(len(zones))))
    public = list(blocks[-1].subnets(prefixlen_diff=public_bits))
    return tuple(SubnetPlan(zone, str(blocks[i]), str(public[i])) for i, zone in enumerate(zones))


@dataclass(frozen=True)
class NetworkArgs:
    name_prefix: str  # physical names: trainyard-<stack>
    cluster_name: str
    vpc_cidr: str
    zones: tuple[str, ...]
    nat_per_zone: bool
    region: str
    tags: dict[str, str] = field(default_factory=dict)


class Network(pulumi.ComponentResource):
    """VPC over the configured zones with NAT egress (one gateway, or one per zone) and an S3 gateway endpoint."""

    vpc: aws.ec2.Vpc
    private_subnet_ids: list[pulumi.Output[str]]
    public_subnet_ids: list[pulumi.Output[str]]

    def __init__(self, name: str, args: NetworkArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("trainyard:cloud:Network", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        tags = args.tags

        def named(suffix: str) -> dict[str, str]:
            return {**tags, "Name": f"{args.name_prefix}-{suffix}"}

        self.vpc = aws.ec2.Vpc(f"{name}-vpc", cidr_block=args.vpc_cidr, enable_dns_support=True,
                               enable_dns_hostnames=True, tags=named("vpc"), opts=child)
        igw = aws.ec2.InternetGateway(f"{name}-igw", vpc_id=self.vpc.id, tags=named("igw"), opts=child)
        public_routes = aws.ec2.RouteTable(
            f"{name}-public", vpc_id=self.vpc.id,
            routes=[aws.ec2.RouteTableRouteArgs(cidr_block="0.0.0.0/0", gateway_id=igw.id)],
            tags=named("public"), opts=child)

        cluster_tag = {f"kubernetes.io/cluster/{args.cluster_name}": "shared"}
        public_subnets: list[aws.ec2.Subnet] = []
        private_subnets: list[aws.ec2.Subnet] = []
        nat_gateways: list[aws.ec2.NatGateway] = []
        private_tables: list[aws.ec2.RouteTable] = []
        for plan in plan_subnets(args.vpc_cidr, args.zones):
            zone = plan.zone
            public = aws.ec2.Subnet(
                f"{name}-public-{zone}", vpc_id=self.vpc.id, availability_zone=zone, cidr_block=plan.public,
                map_public_ip_on_launch=False,
                tags={**named(f"public-{zone}"), **cluster_tag, "kubernetes.io/role/elb": "1"}, opts=child)
            aws.ec2.RouteTableAssociation(f"{name}-public-{zone}", subnet_id=public.id,
                                          route_table_id=public_routes.id, opts=child)
            public_subnets.append(public)
            # Single mode: one gateway in the first zone; every private route table points at it.
            if args.nat_per_zone or not nat_gateways:
                eip = aws.ec2.Eip(f"{name}-nat-{zone}", domain="vpc", tags=named(f"nat-{zone}"), opts=child)
                nat_gateways.append(aws.ec2.NatGateway(
                    f"{name}-nat-{zone}", allocation_id=eip.id, subnet_id=public.id, tags=named(f"nat-{zone}"),
                    opts=pulumi.ResourceOptions(parent=self, depends_on=[igw])))
            private = aws.ec2.Subnet(
                f"{name}-private-{zone}", vpc_id=self.vpc.id, availability_zone=zone, cidr_block=plan.private,
                tags={**named(f"private-{zone}"), **cluster_tag, "kubernetes.io/role/internal-elb": "1",
                      DISCOVERY_TAG: args.cluster_name},
                opts=child)
            table = aws.ec2.RouteTable(
                f"{name}-private-{zone}", vpc_id=self.vpc.id,
                routes=[aws.ec2.RouteTableRouteArgs(cidr_block="0.0.0.0/0", nat_gateway_id=nat_gateways[-1].id)],
                tags=named(f"private-{zone}"), opts=child)
            aws.ec2.RouteTableAssociation(f"{name}-private-{zone}", subnet_id=private.id,
                                          route_table_id=table.id, opts=child)
            private_subnets.append(private)
            private_tables.append(table)

        # Dataset reads and checkpoint writes go to S3 without NAT data charges.
        self.s3_endpoint = aws.ec2.VpcEndpoint(
            f"{name}-s3", vpc_id=self.vpc.id, service_name=f"com.amazonaws.{args.region}.s3",
            vpc_endpoint_type="Gateway", route_table_ids=[t.id for t in private_tables], tags=named("s3"),
            opts=child)
        self.private_subnet_ids = [s.id for s in private_subnets]
        self.public_subnet_ids = [s.id for s in public_subnets]
        self.private_subnets_by_zone = dict(zip(args.zones, self.private_subnet_ids, strict=True))
        self.nat_gateway_count = len(nat_gateways)
        self.register_outputs({"vpcId": self.vpc.id, "privateSubnetIds": self.private_subnet_ids,
                               "publicSubnetIds": self.public_subnet_ids})
