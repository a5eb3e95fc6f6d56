"""The stack configuration model: every `trainyard:*` key, as frozen, validated types.

Field-level rules (types, ranges, name formats) live here as pydantic constraints. Rules that relate several
keys (a MIG layout against the pool's GPU, a job against its pool and tenant) live in `rules.py`, so that one
bad stack file yields one report listing every problem with its full key path.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|Ki|Mi|Gi|Ti)?$")
_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_IMAGE = re.compile(r"^[a-z0-9.\-/:_]+(@sha256:[a-f0-9]{64}|:[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127})$")
_REGION = re.compile(r"^[a-z]{2}(-gov)?-[a-z]+-[0-9]$")
_PATH_PART = re.compile(r"^[A-Za-z0-9._-]+$")
_ARN_PRINCIPAL = re.compile(r"^arn:aws[a-z-]*:iam::[0-9]{12}:(role|user)/[\w+=,.@/-]+$")


def _dns_label(value: str) -> str:
    if len(value) > 63 or not _DNS_LABEL.match(value):
        raise ValueError(
            f"{value!r} is not a DNS-1123 label: use lowercase letters, digits and '-', "
            "start and end with a letter or digit, at most 63 characters"
        )
    return value


def _quantity(value: str) -> str:
    if not _QUANTITY.match(value):
        raise ValueError(f"{value!r} is not a Kubernetes quantity such as '500m', '64', '16Gi' or '2Ti'")
    return value


def _label_key(value: str) -> str:
    if len(value) > 317 or not _LABEL_KEY.match(value):
        raise ValueError(f"{value!r} is not a valid Kubernetes label key ([prefix/]name)")
    return value


def _pinned_image(value: str) -> str:
    if not _IMAGE.match(value) or value.endswith(":latest"):
        raise ValueError(f"{value!r} must be pinned: 'repo/name:tag' (not 'latest') or 'repo/name@sha256:<digest>'")
    return value


def _relative_path(value: str) -> str:
    parts = value.split("/")
    if not all(_PATH_PART.match(p) and p not in (".", "..") for p in parts):
        raise ValueError(f"{value!r} must be a relative path of letters, digits, '.', '_' and '-' (no '..')")
    return value


def _cidr(value: str) -> str:
    try:
        net = ipaddress.IPv4Network(value, strict=True)
    except ValueError as exc:
        raise ValueError(f"{value!r} is not a valid IPv4 CIDR with no host bits set ({exc})") from None
    return str(net)


DnsLabel = Annotated[str, AfterValidator(_dns_label)]
Quantity = Annotated[str, AfterValidator(_quantity)]
LabelKey = Annotated[str, AfterValidator(_label_key)]
PinnedImage = Annotated[str, AfterValidator(_pinned_image)]
Cidr = Annotated[str, AfterValidator(_cidr)]
RelativePath = Annotated[str, AfterValidator(_relative_path)]
Region = Annotated[str, Field(pattern=_REGION.pattern)]
PrincipalArn = Annotated[str, Field(pattern=_ARN_PRINCIPAL.pattern)]
NonNegative = Annotated[int, Field(ge=0)]
Positive = Annotated[int, Field(gt=0)]

Environment = Literal["dev", "staging", "prod", "local"]
Target = Literal["aws", "local"]
PoolRole = Literal["system", "storage", "gpu"]
CapacityType = Literal["spot", "on-demand"]
TaintEffect = Literal["NoSchedule", "NoExecute", "PreferNoSchedule"]
LogType = Literal["api", "audit", "authenticator", "controllerManager", "scheduler"]
JobKind = Literal["elastic", "mig", "smoke"]

_DEFAULT_LOG_TYPES: tuple[LogType, ...] = ("api", "audit", "authenticator")
_ON_DEMAND: tuple[CapacityType, ...] = ("on-demand",)


class Model(BaseModel):
    """Stack files spell keys in camelCase; unknown keys are rejected, so a typo never passes silently."""

    model_config = ConfigDict(extra="forbid", frozen=True, alias_generator=to_camel, validate_by_name=False,
                              validate_by_alias=True)


class AwsSettings(Model):
    region: Region
    availability_zones: list[str] = Field(min_length=1, max_length=6)
    admin_principal_arns: list[PrincipalArn] = Field(min_length=1)
    tags: dict[str, str] = Field(default_factory=dict)


class LocalSettings(Model):
    """The `local` target: no AWS; the platform goes into an existing cluster such as kind."""

    kubeconfig_context: str = "kind-trainyard"


class NetworkSettings(Model):
    vpc_cidr: Cidr = "10.0.0.0/16"
    service_cidr: Cidr = "172.20.0.0/16"
    # One NAT gateway is cheap; one per AZ keeps egress up when an AZ fails.
    nat_gateways: Literal["single", "perAz"] = "single"
    # Who may reach the public API endpoint; empty means private endpoint only.
    public_access_cidrs: list[Cidr] = Field(default_factory=list)


class ClusterSettings(Model):
    kubernetes_version: Literal["1.33", "1.34"] = "1.34"
    log_types: list[LogType] = Field(default_factory=lambda: list(_DEFAULT_LOG_TYPES))


class Taint(Model):
    key: LabelKey
    value: str = ""
    effect: TaintEffect = "NoSchedule"


class NodePool(Model):
    name: DnsLabel
    role: PoolRole
    instance_types: list[str] = Field(min_length=1)
    capacity_types: list[CapacityType] = Field(default_factory=lambda: list(_ON_DEMAND), min_length=1, max_length=2)
    min_size: NonNegative = 0
    # For GPU pools (Karpenter) this is the planning figure for cost; Karpenter itself has no desired count.
    desired_size: NonNegative = 0
    max_size: Positive
    labels: dict[LabelKey, str] = Field(default_factory=dict)
    taints: list[Taint] = Field(default_factory=list)
    mig_layout: str | None = None
    efa: bool = False
    # A cluster placement group keeps a pool's nodes on one network spine; it needs a single zone.
    placement_group: bool = False
    zones: list[str] | None = None
    root_volume_gib: Annotated[int, Field(ge=20, le=16384)] = 100


class TimeSlicing(Model):
    enabled: bool = False
    replicas: Annotated[int, Field(ge=2, le=64)] = 4


class CiliumSettings(Model):
    enabled: bool = True
    hubble_ui: bool = False


class GpuOperatorSettings(Model):
    enabled: bool = True
    time_slicing: TimeSlicing = TimeSlicing()


class RookCephSettings(Model):
    enabled: bool = True
    replicas: Annotated[int, Field(ge=1, le=5)] = 3
    failure_domain: Literal["host", "zone"] = "host"
    # Periodic CephFS snapshots of checkpoint volumes (cron in UTC) and how many to keep.
    snapshot_schedule: str = "0 */6 * * *"
    snapshot_retention: Annotated[int, Field(ge=1, le=100)] = 8


class AlluxioSettings(Model):
    enabled: bool = True
    memory_cache: Quantity = "16Gi"
    ssd_cache: Quantity = "1000Gi"
    dataset_prefix: str = "datasets/"


class VolcanoSettings(Model):
    enabled: bool = True


class MonitoringSettings(Model):
    enabled: bool = True
    retention: Annotated[str, Field(pattern=r"^[0-9]+[dhw]$")] = "15d"
    storage_size: Quantity = "100Gi"


class AddonSettings(Model):
    cilium: CiliumSettings = CiliumSettings()
    gpu_operator: GpuOperatorSettings = GpuOperatorSettings()
    rook_ceph: RookCephSettings = RookCephSettings()
    alluxio: AlluxioSettings = AlluxioSettings()
    volcano: VolcanoSettings = VolcanoSettings()
    monitoring: MonitoringSettings = MonitoringSettings()


class BucketSettings(Model):
    checkpoint_noncurrent_days: Annotated[int, Field(ge=1, le=3650)] = 14
    force_destroy: bool = False


class TenantResources(Model):
    gpu: NonNegative = 0
    cpu: Quantity = "0"
    memory: Quantity = "0"


class TenantQuota(TenantResources):
    pods: Positive = 200


class Tenant(Model):
    name: DnsLabel
    namespace: DnsLabel | None = None
    weight: Positive = 1
    capability: TenantResources = TenantResources()
    quota: TenantQuota | None = None
    default: bool = False

    @property
    def namespace_name(self) -> str:
        return self.namespace or self.name


class Autoscaling(Model):
    """Elastic growth: request maxNodes pods; the gang starts at minNodes and grows as Karpenter adds nodes.

    Not an HPA on GPU utilization: a Volcano Job has no scale subresource (see the README, "Autoscaling").
    """

    enabled: bool = False


class Job(Model):
    # Pod hostnames are `<name>-worker-<i>`, DNS labels of at most 63 characters: room for 3 digits.
    name: Annotated[DnsLabel, Field(max_length=52)]
    kind: JobKind
    tenant: DnsLabel
    node_pool: DnsLabel | None = None
    min_nodes: Positive = 1
    max_nodes: Positive = 1
    gpus_per_node: NonNegative = 0
    mig_profile: str | None = None
    image: PinnedImage
    trainer_config: str = "gpt-small.yaml"
    # Token shards (manifest.json + *.bin, see workloads/README.md) under the dataset bucket's prefix, read
    # through Alluxio. Unset: the trainer generates its synthetic corpus on the checkpoint volume.
    dataset: RelativePath | None = None
    checkpoint_size: Quantity = "200Gi"
    shm_size: Quantity = "16Gi"
    # Seconds the trainer gets after SIGTERM to write a checkpoint (spot gives two minutes' notice).
    checkpoint_grace_seconds: Annotated[int, Field(ge=10, le=3600)] = 100
    autoscaling: Autoscaling = Autoscaling()


class CostSettings(Model):
    # Spot price as a fraction of on-demand, when no spot price table is given.
    spot_discount: Annotated[float, Field(gt=0, lt=1)] = 0.6


class Settings(Model):
    """Everything one stack asks for, validated. Built once by `load.load_settings`."""

    project: str
    stack: str
    environment: Environment
    target: Target
    aws: AwsSettings | None = None
    local: LocalSettings | None = None
    network: NetworkSettings = NetworkSettings()
    cluster: ClusterSettings = ClusterSettings()
    node_pools: list[NodePool] = Field(default_factory=list)
    addons: AddonSettings = AddonSettings()
    buckets: BucketSettings = BucketSettings()
    tenants: list[Tenant] = Field(default_factory=list)
    workloads: list[Job] = Field(default_factory=list)
    cost: CostSettings = CostSettings()
    # Stateful resources (buckets, KMS keys, the Ceph cluster, checkpoint volumes) are protected, and buckets and
    # keys also retained on delete. Only a non-prod stack may turn this off, to be destroyed with `pulumi destroy`.
    protect: bool = True

    def pools(self, role: PoolRole) -> list[NodePool]:
        return [p for p in self.node_pools if p.role == role]

    def pool(self, name: str) -> NodePool:
        return next(p for p in self.node_pools if p.name == name)

    def tenant(self, name: str) -> Tenant:
        return next(t for t in self.tenants if t.name == name)

    @property
    def is_aws(self) -> bool:
        return self.target == "aws"
