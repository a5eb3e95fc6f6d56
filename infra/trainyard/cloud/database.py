"""MLflow's backend store on AWS: Amazon RDS for PostgreSQL, a cloud resource like the buckets.

It lives outside the cluster so runs and the model registry survive a cluster rebuild: nothing here depends on the
EKS cluster but the one security group rule admitting its nodes, which a new cluster replaces without touching the
instance. Encrypted with a key of its own, protected (Pulumi `protect`, RDS deletion protection) and kept on delete
like the other stateful resources, Multi-AZ in prod, in the private subnets, reachable on 5432 from the cluster's
nodes only.

Which pods reach it: with Cilium's ENI IPAM a pod's address is a secondary address of an ENI the operator attaches,
and those ENIs carry the security groups of the node's eth0 unless a CiliumNode names others (Cilium docs, "AWS ENI",
ENI allocation parameters: spec.eni.security-groups "If unspecified, the security group IDs of eth0 will be used";
first-interface-index 0, so eth0 holds pods too). Every node, managed or Karpenter's, carries the shared node
security group (cloud/cluster.py; EC2NodeClass securityGroupSelectorTerms by the discovery tag), so that group is the
one this instance admits: a security group cannot tell one pod from another here. Which pods may open the connection
is Cilium's to decide (tenant namespaces are default-deny and allow no egress to the VPC, platform/network_policy.py);
the password, in a Secret of the MLflow namespace only, is the other half.

The master password is generated (random, in Pulumi state as a secret), not RDS-managed: RDS rotates a managed
password in Secrets Manager every 7 days by default, which a Kubernetes Secret copied at deploy time would not follow.

Clients verify the server (`sslmode=verify-full`): its certificate is signed by the certificate authority the
instance names (`ca_cert_identifier`), whose root for the stack's region is release data (config/rds_ca.py), and
names the instance's endpoint; a spoofed endpoint inside the VPC gets no password.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pulumi
import pulumi_aws as aws
import pulumi_random as random

from trainyard.cloud.context import DatabaseFacts
from trainyard.cloud.kms import KmsKey, KmsKeyArgs
from trainyard.config import rds_ca
from trainyard.config.model import TrackingDatabaseSettings

ENGINE = "postgres"
# PostgreSQL 18: RDS for PostgreSQL offers 18 (RDS PostgreSQL release notes, "PostgreSQL 18 versions"), and it is the
# major CloudNativePG 1.30.0 runs by default on `local` (pkg/versions/versions.go DefaultImageName 18.4), so both
# backends run one major. A major alone makes RDS pick its newest minor ("If you specify a major version but not a
# minor version, Amazon RDS defaults to the latest release of the major version": RDS PostgreSQL release notes,
# "Amazon RDS for PostgreSQL updates"); minor upgrades then arrive in the maintenance window.
ENGINE_MAJOR = "18"
PARAMETER_FAMILY = f"postgres{ENGINE_MAJOR}"
PORT = 5432
DATABASE = "mlflow"
USERNAME = "mlflow"
# Letters and digits only: the password goes into a postgresql:// URI, and RDS refuses '/', '@', '"' and spaces in a
# master password (RDS CreateDBInstance MasterUserPassword constraints).
PASSWORD_LENGTH = 40


@dataclass(frozen=True)
class TrackingDatabaseArgs:
    # `trainyard-<stack>-mlflow`: instance identifier, subnet group, parameter group, security group and KMS alias.
    name: str
    settings: TrackingDatabaseSettings
    multi_az: bool
    vpc_id: pulumi.Input[str]
    subnet_ids: Sequence[pulumi.Input[str]]
    # The security group every node carries (cloud/cluster.py): the only source admitted on PORT.
    node_security_group_id: pulumi.Input[str]
    protect: bool
    # The stack's region: its root of the instance's certificate authority is what clients trust.
    region: str
    tags: dict[str, str] = field(default_factory=dict)


def tls_query(root_certificate_path: str | None) -> str:
    """TLS required (RDS for PostgreSQL 15 and later force SSL by default, and the parameter group below says so);
    with the path of the server's root CA the client also verifies the server's certificate and host name (libpq
    `sslmode=verify-full`, `sslrootcert`: PostgreSQL docs, libpq "Parameter Key Words"; SQLAlchemy's psycopg2
    dialect hands the URI's query to libpq as it is: dialects/postgresql/_psycopg_common.py create_connect_args)."""
    if root_certificate_path is None:
        return "sslmode=require"
    return f"sslmode=verify-full&sslrootcert={root_certificate_path}"


def connection_uri(facts: DatabaseFacts, root_certificate_path: str | None = None) -> pulumi.Output[str]:
    """The SQLAlchemy URI of the database (tls_query); a secret, since it carries the password."""
    return pulumi.Output.secret(pulumi.Output.format(
        "postgresql://{0}:{1}@{2}:{3}/{4}?{5}", facts.username, facts.password, facts.host, facts.port, facts.name,
        tls_query(root_certificate_path)))


class TrackingDatabase(pulumi.ComponentResource):
    """An RDS for PostgreSQL instance with its key, subnet group, parameter group and security group."""

    instance: aws.rds.Instance
    facts: DatabaseFacts

    def __init__(self, name: str, args: TrackingDatabaseArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("trainyard:cloud:TrackingDatabase", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        tags = args.tags
        self.kms = KmsKey(f"{name}-kms", KmsKeyArgs(description=f"RDS storage of {args.name}", alias=args.name,
                                                    protect=args.protect, tags=tags), opts=child)
        subnets = aws.rds.SubnetGroup(f"{name}-subnets", name=args.name, subnet_ids=list(args.subnet_ids),
                                      description=f"private subnets of {args.name}", tags=tags, opts=child)
        parameters = aws.rds.ParameterGroup(
            f"{name}-parameters", name=args.name, family=PARAMETER_FAMILY,
            description=f"TLS only for {args.name}",
            # rds.force_ssl (RDS User Guide, "Using SSL with a PostgreSQL DB instance"): plaintext connections refused.
            parameters=[aws.rds.ParameterGroupParameterArgs(name="rds.force_ssl", value="1")], tags=tags, opts=child)
        self.security_group = aws.ec2.SecurityGroup(
            f"{name}-sg", name=args.name, vpc_id=args.vpc_id, description=f"PostgreSQL of {args.name} from nodes",
            tags={**tags, "Name": args.name}, opts=child)
        # No egress rule: the provider drops the default allow-all egress of a new group (the database initiates
        # nothing), and this one ingress rule is the whole path in.
        aws.vpc.SecurityGroupIngressRule(
            f"{name}-from-nodes", security_group_id=self.security_group.id,
            referenced_security_group_id=args.node_security_group_id, ip_protocol="tcp", from_port=PORT,
            to_port=PORT, description="PostgreSQL from the cluster's nodes (their pods' ENIs)", opts=child)
        password = random.RandomPassword(f"{name}-password", length=PASSWORD_LENGTH, special=False, opts=child)
        settings = args.settings
        self.instance = aws.rds.Instance(
            f"{name}-instance",
            identifier=args.name,
            engine=ENGINE,
            engine_version=ENGINE_MAJOR,
            auto_minor_version_upgrade=True,
            allow_major_version_upgrade=False,
            instance_class=settings.instance_class,
            db_name=DATABASE,
            username=USERNAME,
            password=password.result,
            port=PORT,
            parameter_group_name=parameters.name,
            db_subnet_group_name=subnets.name,
            vpc_security_group_ids=[self.security_group.id],
            publicly_accessible=False,
            multi_az=args.multi_az,
            storage_type="gp3",
            allocated_storage=settings.storage_gib,
            max_allocated_storage=settings.max_storage_gib,
            storage_encrypted=True,
            kms_key_id=self.kms.key.arn,
            backup_retention_period=settings.backup_retention_days,
            copy_tags_to_snapshot=True,
            # Deletion protection and a final snapshot wherever the stack protects its state (always in prod).
            deletion_protection=args.protect,
            skip_final_snapshot=not args.protect,
            final_snapshot_identifier=f"{args.name}-final" if args.protect else None,
            # Automated backups stay after a deletion, until their retention ends.
            delete_automated_backups=False,
            enabled_cloudwatch_logs_exports=["postgresql", "upgrade"],
            # The CA whose regional root clients verify the server against (config/rds_ca.py).
            ca_cert_identifier=rds_ca.CA_IDENTIFIER,
            tags=tags,
            opts=pulumi.ResourceOptions(parent=self, protect=args.protect, retain_on_delete=args.protect))
        self.facts = DatabaseFacts(host=self.instance.address, port=PORT, name=DATABASE, username=USERNAME,
                                   password=pulumi.Output.secret(password.result),
                                   root_certificate=rds_ca.regional_roots()[args.region])
        self.register_outputs({"endpoint": self.instance.endpoint, "securityGroupId": self.security_group.id})
