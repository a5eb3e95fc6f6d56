"""Deterministic stand-ins for what the cloud would compute (ids, ARNs, endpoints), so plans are reproducible."""

from __future__ import annotations

import base64
from typing import Any

import pulumi

ACCOUNT = "000000000000"


class PlaceholderMocks(pulumi.runtime.Mocks):
    """Echo inputs back as state and add the outputs the program reads, derived only from names."""

    def __init__(self, region: str) -> None:
        self.region = region

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        state = dict(args.inputs)
        name = args.name
        package, _, kind = args.typ.partition(":")
        if package == "aws":
            service = kind.split("/", 1)[0]
            state.setdefault("arn", self._arn(args.typ, service, name, state))
            state.setdefault("name", name)
            state.update(self._aws_outputs(args.typ, name, state))
        elif args.typ == "kubernetes:helm.sh/v3:Release":
            state.setdefault("status", {"name": state.get("name", name), "namespace": state.get("namespace"),
                                        "status": "deployed"})
        return f"{name}-id", state

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict[str, Any], list[tuple[str, str]] | None]:
        # An empty failure list, not None: the mock monitor iterates it.
        if args.token == "aws:index/getCallerIdentity:getCallerIdentity":
            return {"accountId": ACCOUNT, "arn": f"arn:aws:iam::{ACCOUNT}:user/plan", "userId": "plan"}, []
        if args.token == "aws:index/getPartition:getPartition":
            return {"partition": "aws", "dnsSuffix": "amazonaws.com"}, []
        if args.token == "aws:index/getRegion:getRegion":
            return {"name": self.region, "region": self.region}, []
        raise NotImplementedError(f"the offline plan has no placeholder for function {args.token}")

    def _arn(self, typ: str, service: str, name: str, state: dict[str, Any]) -> str:
        if service == "s3":
            return f"arn:aws:s3:::{state.get('bucket', name)}"
        if service == "iam":
            return f"arn:aws:iam::{ACCOUNT}:{typ.rsplit(':', 1)[-1].lower()}/{state.get('name', name)}"
        return f"arn:aws:{service}:{self.region}:{ACCOUNT}:{name}"

    def _aws_outputs(self, typ: str, name: str, state: dict[str, Any]) -> dict[str, Any]:
        if typ == "aws:eks/cluster:Cluster":
            return {
                "endpoint": f"https://{name.upper()}.gr7.{self.region}.eks.amazonaws.com",
                "certificateAuthority": {"data": base64.b64encode(b"placeholder-ca").decode()},
                "identities": [{"oidcs": [{"issuer": f"https://oidc.eks.{self.region}.amazonaws.com/id/{name.upper()}"}]}],
                "clusterSecurityGroupId": "sg-cluster",
                "vpcConfig": {**state.get("vpcConfig", {}), "clusterSecurityGroupId": "sg-cluster"},
            }
        if typ == "aws:s3/bucket:Bucket":
            return {"bucket": state.get("bucket", name)}
        if typ == "aws:sqs/queue:Queue":
            return {"url": f"https://sqs.{self.region}.amazonaws.com/{ACCOUNT}/{state.get('name', name)}"}
        if typ == "aws:kms/key:Key":
            return {"keyId": f"{name}-key-id"}
        if typ == "aws:ec2/launchTemplate:LaunchTemplate":
            return {"latestVersion": 1}
        if typ == "aws:rds/instance:Instance":
            # RDS endpoints are `<identifier>.<account-and-region hash>.<region>.rds.amazonaws.com`.
            address = f"{state.get('identifier', name)}.placeholder.{self.region}.rds.amazonaws.com"
            return {"address": address, "endpoint": f"{address}:{state.get('port', 5432)}"}
        return {}
