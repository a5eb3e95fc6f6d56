"""The VPC: subnet layout, tags, NAT gateways and the S3 endpoint, per stack."""

from __future__ import annotations

import ipaddress

import pytest
from aws_plan import AWS_STACKS, of_type, one, plan
from trainyard.cloud.network import plan_subnets
from trainyard.config.model import AwsSettings, Settings
from trainyard.plan.runtime import read_stack, settings_of


def _settings(stack: str) -> tuple[Settings, AwsSettings]:
    settings = settings_of(read_stack(stack))
    assert settings.aws is not None
    return settings, settings.aws


def test_subnet_plan_is_disjoint_inside_the_vpc() -> None:
    for zones in (("a",), ("a", "b"), ("a", "b", "c"), tuple("abcdef")):
        for vpc in ("10.0.0.0/16", "10.20.0.0/20"):
            subnets = plan_subnets(vpc, zones)
            nets = [ipaddress.IPv4Network(c) for s in subnets for c in (s.private, s.public)]
            assert all(n.subnet_of(ipaddress.IPv4Network(vpc)) for n in nets)
            assert all(not a.overlaps(b) for i, a in enumerate(nets) for b in nets[i + 1:])
            # Pods take VPC addresses (Cilium ENI mode): private subnets are the big ones.
            assert all(ipaddress.IPv4Network(s.private).num_addresses > ipaddress.IPv4Network(s.public).num_addresses
                       for s in subnets)


def test_subnet_plan_for_prod_shape() -> None:
    subnets = plan_subnets("10.30.0.0/16", ("us-west-2a", "us-west-2b", "us-west-2c"))
    assert [s.private for s in subnets] == ["10.30.0.0/18", "10.30.64.0/18", "10.30.128.0/18"]
    assert [s.public for s in subnets] == ["10.30.192.0/20", "10.30.208.0/20", "10.30.224.0/20"]


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_subnets_per_zone_and_nat_count(stack: str) -> None:
    settings, aws = _settings(stack)
    zones = len(aws.availability_zones)
    nats = zones if settings.network.nat_gateways == "perAz" else 1
    rec = plan(stack)
    subnets = of_type(rec, "aws:ec2/subnet:Subnet")
    private = [s for s in subnets if "kubernetes.io/role/internal-elb" in s.inputs["tags"]]
    public = [s for s in subnets if "kubernetes.io/role/elb" in s.inputs["tags"]]
    assert len(private) == len(public) == zones
    assert len({s.inputs["availabilityZone"] for s in private}) == zones
    for s in private:
        assert s.inputs["tags"]["karpenter.sh/discovery"] == f"trainyard-{stack}"
        assert ipaddress.IPv4Network(s.inputs["cidrBlock"]).prefixlen <= 19
    for s in public:
        assert "karpenter.sh/discovery" not in s.inputs["tags"]
        assert s.inputs["mapPublicIpOnLaunch"] is False
    assert len(of_type(rec, "aws:ec2/natGateway:NatGateway")) == nats
    assert len(of_type(rec, "aws:ec2/eip:Eip")) == nats
    private_tables = [t for t in of_type(rec, "aws:ec2/routeTable:RouteTable") if "-private-" in t.name]
    assert len(private_tables) == zones
    assert len({t.inputs["routes"][0]["natGatewayId"] for t in private_tables}) == nats


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_s3_gateway_endpoint_on_private_routes(stack: str) -> None:
    _, aws = _settings(stack)
    rec = plan(stack)
    endpoint = one(rec, "aws:ec2/vpcEndpoint:VpcEndpoint")
    assert endpoint.inputs["vpcEndpointType"] == "Gateway"
    assert endpoint.inputs["serviceName"] == f"com.amazonaws.{aws.region}.s3"
    assert len(endpoint.inputs["routeTableIds"]) == len(aws.availability_zones)
