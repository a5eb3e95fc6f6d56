"""The stack configuration model: every `trainyard:*` key, as frozen, validated types.

Field-level rules (types, ranges, name formats) live here as pydantic constraints. Rules that relate several
keys (a MIG layout against the pool's GPU, a job against its pool and tenant) live in `rules.py`, so that one
bad stack file yields one report listing every problem with its full key path.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from trainyard import names
from trainyard.config import name_rules
from trainyard.config.quantity import parse_quantity

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_PATH_PART = re.compile(r"[A-Za-z0-9._-]+")
# Tag keys 1-128 and values 0-256 characters of letters, digits, spaces and _ . : / = + - @; keys may not start with
# the reserved `aws:` (https://docs.aws.amazon.com/tag-editor/latest/userguide/tagging.html#tag-conventions).
_TAG_TEXT = re.compile(r"[\w .:/=+\-@]*")
# Monitoring retention as Prometheus' --storage.tsdb.retention.time reads it (a whole number of days, hours or weeks).
_RETENTION = re.compile(r"[0-9]+[dhw]")
# A runner label or group name: letters, digits and . _ - (GitHub refuses others in runner labels).
_RUNNER_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
# A GitHub repository as <owner>/<name> (the `repository` claim of its OIDC tokens).
# An AWS account ID is 12 digits (docs.aws.amazon.com/accounts/latest/reference/manage-acct-identifiers.html).
_ACCOUNT_ID = re.compile(r"[0-9]{12}")
_REPOSITORY = re.compile(r"[A-Za-z0-9-]{1,39}/[A-Za-z0-9._-]{1,100}")


def _dns_label(value: str) -> str:
    if len(value) > 63 or not _DNS_LABEL.fullmatch(value):
        raise ValueError(
            f"{value!r} is not a DNS-1123 label: use lowercase letters, digits and '-', "
            "start and end with a letter or digit, at most 63 characters"
        )
    return value


def _quantity(value: str) -> str:
    # Kubernetes refuses a negative request, limit or quota (k8s.io/kubernetes pkg/apis/core/validation
    # ValidateNonnegativeQuantity).
    if parse_quantity(value) < 0:
        raise ValueError(f"{value!r} is negative: a resource amount is 0 or more")
    return value


def _positive(value: str) -> str:
    if parse_quantity(value) <= 0:
        raise ValueError(f"{value!r} is no size: must be more than 0")
    return value


def _label_key(value: str) -> str:
    if problem := name_rules.qualified_name_problem(value):
        raise ValueError(problem)
    return value


def _pinned_image(value: str) -> str:
    if problem := name_rules.image_pin_problem(value):
        raise ValueError(problem)
    return value


def _region(value: str) -> str:
    partition = name_rules.partition_of(value)
    if partition is None:
        raise ValueError(f"{value!r} is not an AWS region name (such as 'us-west-2')")
    if partition != name_rules.PROGRAM_PARTITION:
        raise ValueError(f"{value!r} is a region of partition {partition!r}; this program deploys to the "
                         f"{name_rules.PROGRAM_PARTITION!r} partition only (the ARNs it writes)")
    return value


def _principal_arn(value: str) -> str:
    if problem := name_rules.principal_arn_problem(value):
        raise ValueError(problem)
    return value


def _role_arn(value: str) -> str:
    if problem := name_rules.principal_arn_problem(value, kinds=("role",)):
        raise ValueError(problem)
    return value


def _account_id(value: object) -> object:
    # Before the type check: YAML reads an unquoted ID as a number and drops its leading zeros.
    if not (isinstance(value, str) and _ACCOUNT_ID.fullmatch(value)):
        raise ValueError(f"{value!r} is not an AWS account ID: write its 12 digits in quotes")
    return value


def _runner_label(value: str) -> str:
    if not _RUNNER_LABEL.fullmatch(value):
        raise ValueError(f"{value!r} is not a runner label: up to 100 letters, digits, '.', '_' and '-'")
    return value


def _repository(value: str) -> str:
    if not _REPOSITORY.fullmatch(value):
        raise ValueError(f"{value!r} is not a GitHub repository: write <owner>/<name>")
    return value


def _retention(value: str) -> str:
    if not _RETENTION.fullmatch(value):
        raise ValueError(f"{value!r} is not a retention such as '15d', '48h' or '2w'")
    return value


def _label_value(value: str) -> str:
    if problem := name_rules.LABEL_VALUE.problem(value):
        raise ValueError(f"not a valid Kubernetes label value: {problem}")
    return value


def _tag_key(value: str) -> str:
    if problem := name_rules.tag_key_problem(value):
        raise ValueError(problem)
    if not _TAG_TEXT.fullmatch(value):
        raise ValueError(f"{value!r} is not a valid AWS tag key: letters, digits, spaces or _ . : / = + - @")
    return value


def _tag_value(value: str) -> str:
    if len(value) > 256 or not _TAG_TEXT.fullmatch(value):
        raise ValueError(f"{value!r} is not a valid AWS tag value: at most 256 letters, digits, spaces or "
                         "_ . : / = + - @")
    return value


def _number_as_text(value: object) -> object:
    """YAML reads `cpu: 16` as a number; a quantity is the same thing written as text (a bool stays refused)."""
    return str(value) if isinstance(value, int | float) and not isinstance(value, bool) else value


def _version_as_text(value: object) -> object:
    """YAML reads `1.34` as a number; it means the version "1.34". `1.30` would read as 1.3, hence the message."""
    if isinstance(value, float) and not isinstance(value, bool):
        text = str(value)
        if text not in KUBERNETES_VERSIONS:
            raise ValueError(f"{value} (a number in YAML): write the version quoted, one of "
                             + ", ".join(f"'{v}'" for v in KUBERNETES_VERSIONS))
        return text
    return value


def _whole_number(value: object) -> object:
    """pydantic matches a Literal of ints by equality, even in strict mode: `yes` (True) would read as 1, 1.0 too."""
    if isinstance(value, bool | float):
        raise ValueError(f"expected a whole number, got {type(value).__name__} {value!r}")
    return value


def _flag_text(value: object) -> object:
    """The engine hands a top-level `true` over as the text "true"; only those two words are flags."""
    return {"true": True, "false": False}.get(value, value) if isinstance(value, str) else value


def _is_relative_path(value: str) -> bool:
    return all(_PATH_PART.fullmatch(p) and p not in (".", "..") for p in value.split("/"))


def _relative_path(value: str) -> str:
    if not _is_relative_path(value):
        raise ValueError(f"{value!r} must be a relative path of letters, digits, '.', '_' and '-' (no '..')")
    return value


def _dataset_prefix(value: str) -> str:
    # IAM reads `*`, `?` and `${...}` in a resource ARN as wildcards and variables
    # (https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_elements_resource.html), and a prefix
    # without its final '/' grants every key that merely starts with it ("datasets" also grants "datasets-private/").
    if value and not (value.endswith("/") and _is_relative_path(value.removesuffix("/"))):
        raise ValueError(f"{value!r} must be folders of letters, digits, '.', '_' and '-' ending in '/' (such as "
                         "'datasets/'), or '' for the whole dataset bucket")
    return value


def _cidr(value: str) -> str:
    try:
        net = ipaddress.IPv4Network(value, strict=True)
    except ValueError as exc:
        raise ValueError(f"{value!r} is not a valid IPv4 CIDR with no host bits set ({exc})") from None
    return str(net)


DnsLabel = Annotated[str, AfterValidator(_dns_label)]
Quantity = Annotated[str, BeforeValidator(_number_as_text), Field(max_length=32), AfterValidator(_quantity)]
# A volume or memory size: Kubernetes refuses a claim for 0 bytes (ValidatePositiveQuantityValue on
# spec.resources.requests.storage, k8s.io/kubernetes pkg/apis/core/validation/validation.go), and a cache or /dev/shm
# of 0 holds nothing.
Size = Annotated[Quantity, AfterValidator(_positive)]
LabelValue = Annotated[str, AfterValidator(_label_value)]
TagKey = Annotated[str, AfterValidator(_tag_key)]
TagValue = Annotated[str, AfterValidator(_tag_value)]
LabelKey = Annotated[str, AfterValidator(_label_key)]
PinnedImage = Annotated[str, AfterValidator(_pinned_image)]
Cidr = Annotated[str, AfterValidator(_cidr)]
RelativePath = Annotated[str, AfterValidator(_relative_path)]
Region = Annotated[str, AfterValidator(_region)]
PrincipalArn = Annotated[str, Field(max_length=2048), AfterValidator(_principal_arn)]
RoleArn = Annotated[str, Field(max_length=2048), AfterValidator(_role_arn)]
AccountId = Annotated[str, BeforeValidator(_account_id)]
RunnerLabel = Annotated[str, AfterValidator(_runner_label)]
# Upper bounds keep a typo (`maxSize: 4294967296`) from reaching AWS; ints are strict, so `true` is no 1.
Positive = Annotated[int, Field(gt=0, le=100_000)]
# Nodes per pool: an EKS managed node group holds at most 450 nodes by default
# (https://docs.aws.amazon.com/eks/latest/userguide/service-quotas.html); Karpenter pools get the same bound.
NodeCount = Annotated[int, Field(ge=0, le=450)]
# Kubernetes versions with a node AMI and add-on pins in releases.py.
KUBERNETES_VERSIONS = ("1.33", "1.34")

Environment = Literal["dev", "staging", "prod", "local"]
Target = Literal["aws", "local"]
PoolRole = Literal["system", "storage", "gpu"]
# reserved: instances in the pool's capacityReservations (Karpenter's own capacity type for ODCRs and Capacity Blocks,
# karpenter-provider-aws website/content/en/docs/tasks/odcrs.md @v1.14.1).
CapacityType = Literal["spot", "on-demand", "reserved"]
TaintEffect = Literal["NoSchedule", "NoExecute", "PreferNoSchedule"]
LogType = Literal["api", "audit", "authenticator", "controllerManager", "scheduler"]
JobKind = Literal["elastic", "mig", "smoke"]

_DEFAULT_LOG_TYPES: tuple[LogType, ...] = ("api", "audit", "authenticator")
_ON_DEMAND: tuple[CapacityType, ...] = ("on-demand",)


class Model(BaseModel):
    """Stack files spell keys in camelCase; unknown keys are rejected, so a typo never passes silently."""

    # strict: no silent coercion (`maxSize: true` is not 1, `efa: "no"` is not a flag); where YAML's reading of a
    # value differs from its meaning (quantities, versions), a validator converts that one case explicitly.
    model_config = ConfigDict(extra="forbid", frozen=True, alias_generator=to_camel, validate_by_name=False,
                              validate_by_alias=True, strict=True)


class AwsSettings(Model):
    region: Region
    # An EKS cluster needs subnets in at least two AZs
    # (https://docs.aws.amazon.com/eks/latest/userguide/network-reqs.html).
    availability_zones: list[str] = Field(min_length=2, max_length=6)
    admin_principal_arns: list[PrincipalArn] = Field(min_length=1, max_length=20)
    # At most 50 user tags per AWS resource (tagging doc above); the program adds two of its own.
    tags: dict[TagKey, TagValue] = Field(default_factory=dict, max_length=48)
    # The program's AWS provider refuses credentials of any other account (pulumi-aws Provider allowedAccountIds).
    allowed_account_ids: list[AccountId] = Field(default_factory=list, max_length=20)


class LocalSettings(Model):
    """The `local` target: no AWS; the platform goes into an existing cluster such as kind."""

    kubeconfig_context: str = "kind-trainyard"


class NetworkSettings(Model):
    vpc_cidr: Cidr = "10.0.0.0/16"
    service_cidr: Cidr = "172.20.0.0/16"
    # One NAT gateway is cheap; one per AZ keeps egress up when an AZ fails.
    nat_gateways: Literal["single", "perAz"] = "single"
    # Who may reach the public API endpoint (deploy.apiAccess public); empty means private endpoint only.
    # 40: our bound, far above any real allow-list (each entry is a rule a reviewer must read).
    public_access_cidrs: list[Cidr] = Field(default_factory=list, max_length=40)
    # 0.0.0.0/0 in publicAccessCidrs is refused unless this says so (and always in prod).
    allow_any_public_access: bool = False


class RunnerSettings(Model):
    """A GitHub Actions runner as a job's `runs-on` selects it: all of `labels`, within `group` when set
    (docs.github.com, "Choosing the runner for a job")."""

    labels: list[RunnerLabel] = Field(min_length=1, max_length=10)
    group: RunnerLabel | None = None


class PreviewSettings(Model):
    """Pull-request previews: a read-only role the program creates, trusted for this repository's `pull_request`
    jobs only, with a view-only access entry (never the deploy role, which stays behind its environment)."""

    # owner/name of the GitHub repository whose pull requests preview this stack.
    repository: Annotated[str, AfterValidator(_repository)]
    # The runner previews run on; unset: deploy.runner. A runner that runs pull-request code should be ephemeral.
    runner: RunnerSettings | None = None


class DeploySettings(Model):
    """How CI's `pulumi up` gets into an AWS stack's cluster: the role it assumes, the runner it runs on and the path
    from that runner to the API server."""

    # The role the deploy workflow assumes (GitHub OIDC); it gets a cluster-admin access entry.
    role_arn: RoleArn
    # public: the runner's egress addresses are network.publicAccessCidrs. private: the runner sits in (or is
    # routed to) the VPC and reaches the private endpoint from runnerCidrs; the public endpoint is off.
    api_access: Literal["public", "private"] = "public"
    runner_cidrs: list[Cidr] = Field(default_factory=list, max_length=40)
    # Where .github/workflows/deploy-stack.yml runs `pulumi up` (rules.py checks it can reach the endpoint).
    runner: RunnerSettings
    preview: PreviewSettings | None = None


class ClusterSettings(Model):
    kubernetes_version: Annotated[Literal["1.33", "1.34"], BeforeValidator(_version_as_text)] = "1.34"
    log_types: list[LogType] = Field(default_factory=lambda: list(_DEFAULT_LOG_TYPES), max_length=5)


class Taint(Model):
    key: LabelKey
    value: LabelValue = ""
    effect: TaintEffect = "NoSchedule"


class CapacityReservation(Model):
    """An EC2 On-Demand Capacity Reservation or Capacity Block for ML the pool's nodes launch into.

    Karpenter selects it by id (EC2NodeClass capacityReservationSelectorTerms) and launches into it with capacity
    type `reserved`. The count, type and zone are what the reservation was bought with (`aws ec2
    describe-capacity-reservations`): the plan prices it and checks the pool can use all of it.
    """

    id: Annotated[str, Field(pattern=r"^cr-[0-9a-z]+$")]
    # EC2's reservation types as Karpenter labels them (karpenter.k8s.aws/capacity-reservation-type).
    type: Literal["default", "capacity-block"] = "default"
    instance_type: str
    zone: str
    instance_count: Annotated[int, Field(gt=0, le=450)]
    # A Capacity Block is paid in full when it is bought: its upfront fee and length (EC2
    # DescribeCapacityBlockOfferings UpfrontFee and CapacityBlockDurationHours). Required for capacity-block only.
    upfront_fee_usd: Annotated[float, Field(gt=0, le=100_000_000)] | None = None
    # At most 182 days (EC2 User Guide, capacity-blocks-purchase.html: up to 182 days in 7-day steps).
    duration_hours: Annotated[int, Field(gt=0, le=182 * 24)] | None = None


class NodePool(Model):
    name: DnsLabel
    role: PoolRole
    instance_types: list[str] = Field(min_length=1, max_length=20)
    capacity_types: list[CapacityType] = Field(default_factory=lambda: list(_ON_DEMAND), min_length=1, max_length=2)
    min_size: NodeCount = 0
    # For GPU pools (Karpenter) this is the planning figure for cost; Karpenter itself has no desired count.
    # Unset, it is minSize (see _desired_defaults_to_min).
    desired_size: NodeCount = 0
    max_size: Annotated[NodeCount, Field(gt=0)]
    labels: dict[LabelKey, LabelValue] = Field(default_factory=dict, max_length=50)
    taints: list[Taint] = Field(default_factory=list, max_length=50)
    mig_layout: str | None = None
    efa: bool = False
    # A cluster placement group keeps a pool's nodes on one network spine; it needs a single zone.
    placement_group: bool = False
    zones: list[str] | None = Field(default=None, max_length=6)
    root_volume_gib: Annotated[int, Field(ge=20, le=16384)] = 100
    # Several pods per GPU, said explicitly: the device plugin's time-sliced config (addons.gpuOperator.timeSlicing)
    # on this pool's nodes, which advertise nvidia.com/gpu.shared instead of nvidia.com/gpu.
    gpu_sharing: Literal["time-sliced"] | None = None
    # Needs `reserved` in capacityTypes; Karpenter 1.14 takes at most 30 selector terms (EC2NodeClass CRD maxItems).
    capacity_reservations: list[CapacityReservation] = Field(default_factory=list, max_length=30)

    @model_validator(mode="before")
    @classmethod
    def _desired_defaults_to_min(cls, data: object) -> object:
        if isinstance(data, dict) and "desiredSize" not in data and isinstance(data.get("minSize"), int):
            return {**data, "desiredSize": data["minSize"]}
        return data


class TimeSlicing(Model):
    enabled: bool = False
    replicas: Annotated[int, Field(ge=2, le=64)] = 4


class AddonSwitch(Model):
    """An add-on's section of `addons`: its switch, and the settings a subclass adds."""

    enabled: bool = True


class CiliumSettings(AddonSwitch):
    hubble_ui: bool = False


class GpuOperatorSettings(AddonSwitch):
    time_slicing: TimeSlicing = TimeSlicing()


class RookCephSettings(AddonSwitch):
    replicas: Annotated[int, Field(ge=1, le=5)] = 3
    # CRUSH failure domain: `zone` puts each replica in another availability zone (Rook maps the nodes'
    # topology.kubernetes.io/zone into CRUSH, pkg/operator/ceph/cluster/osd/topology), so an AZ loss keeps
    # min_size; `host` only keeps replicas on distinct nodes, several of which may share a zone.
    failure_domain: Literal["host", "zone"] = "host"


class AlluxioSettings(AddonSwitch):
    # The memory tier of each cache worker (one per storage node, next to Ceph's OSDs).
    memory_cache: Size = "16Gi"
    # The worker JVM's heap and direct-memory ceilings; the defaults are Fluid's own worker defaults (-Xmx12G,
    # -XX:MaxDirectMemorySize=32g: pkg/ddc/alluxio/transform_optimization.go optimizeDefaultForWorker @ v1.0.8).
    # The worker requests the tier plus both.
    worker_heap: Size = "12Gi"
    worker_direct_memory: Size = "32Gi"
    # Goes into the cache's IAM grant (`<bucket>/<prefix>*`) and its S3 mount: plain folders only (see
    # _dataset_prefix), or "" for the whole dataset bucket.
    dataset_prefix: Annotated[str, Field(max_length=512), AfterValidator(_dataset_prefix)] = "datasets/"


class MonitoringSettings(AddonSwitch):
    retention: Annotated[str, Field(max_length=16), AfterValidator(_retention)] = "15d"
    storage_size: Size = "100Gi"


class GpuHealthSettings(AddonSwitch):
    """GPU node admission (a startup taint only a passed health check removes) and repair of broken nodes.

    See the README, "GPU node health". Run times per diagLevel are NVIDIA's (dcgmi diag reference): 1 seconds,
    2 about two minutes, 3 about 15 minutes, 4 longer.
    """

    diag_level: Annotated[Literal[1, 2, 3, 4], BeforeValidator(_whole_number)] = 1
    # A GPU must report at least this share of its instance type's nominal memory (A10G/L4/L40S report ~94%).
    min_memory_percent: Annotated[int, Field(ge=50, le=100)] = 90
    # How long the check waits for GPU Operator validation and the MIG layout before it fails the node.
    wait_minutes: Annotated[int, Field(ge=5, le=120)] = 30
    # A node with no verdict this long after it registered counts as failed (reason admission-stuck).
    stuck_minutes: Annotated[int, Field(ge=30, le=1440)] = 120
    # A failed node stays this long for inspection, then its NodeClaim is deleted (0: at once).
    failed_hold_hours: Annotated[int, Field(ge=0, le=168)] = 4
    # Failed nodes a pool keeps at once for inspection; older ones beyond these are deleted at once.
    max_failed_nodes_per_pool: Annotated[int, Field(ge=0, le=10)] = 1
    # EKS node monitoring agent (node conditions) + Karpenter's NodeRepair feature gate (replaces the node).
    repair: bool = True


class TrackingDatabaseSettings(Model):
    """MLflow's PostgreSQL: Amazon RDS on AWS (cloud/database.py), CloudNativePG on `local` (one instance)."""

    # RDS DB instance classes are `db.<family>.<size>` (RDS User Guide, "DB instance classes").
    instance_class: Annotated[str, Field(pattern=r"^db\.[a-z0-9-]+\.[a-z0-9]+$", max_length=32)] = "db.t4g.medium"
    # gp3 volumes for RDS for PostgreSQL: 20 GiB to 64 TiB (RDS User Guide, "Amazon RDS DB instance storage").
    # On `local` this is the size of the CloudNativePG instance's volume.
    storage_gib: Annotated[int, Field(ge=20, le=65536)] = 20
    # RDS storage autoscaling grows the volume up to this (MaxAllocatedStorage); at least storageGib.
    max_storage_gib: Annotated[int, Field(ge=20, le=65536)] = 100
    # Automated backups and point-in-time recovery: 1-35 days (RDS BackupRetentionPeriod; 0, no backups, refused).
    backup_retention_days: Annotated[int, Field(ge=1, le=35)] = 7
    # A standby in a second zone. Unset: on in prod (where off is refused), off elsewhere.
    multi_az: bool | None = None


class MlflowSettings(AddonSwitch):
    """The MLflow Tracking Server (platform/mlflow.py) and its database."""

    # Server pods on the system nodes; each is stateless (runs and the registry live in PostgreSQL).
    replicas: Annotated[int, Field(ge=1, le=5)] = 2
    database: TrackingDatabaseSettings = TrackingDatabaseSettings()
    # `local` only (no S3 there): the volume the server keeps artifacts on.
    artifact_volume: Size = "10Gi"


class AddonSettings(Model):
    """The typed view of the add-ons whose settings other layers read (config rules, the cloud layer).

    The `addons` section stacks are validated against is built from the add-on declarations
    (`config.addons.addons_section`): one key per add-on of platform/addons.yaml with a stack switch, typed as
    declared here, a plain AddonSwitch when it has no field here. A field naming no such add-on is refused.
    """

    cilium: CiliumSettings = CiliumSettings()
    gpu_operator: GpuOperatorSettings = GpuOperatorSettings()
    gpu_health: GpuHealthSettings = GpuHealthSettings()
    rook_ceph: RookCephSettings = RookCephSettings()
    alluxio: AlluxioSettings = AlluxioSettings()
    volcano: AddonSwitch = AddonSwitch()
    monitoring: MonitoringSettings = MonitoringSettings()
    mlflow: MlflowSettings = MlflowSettings()
    # MLflow's database operator on `local` (on AWS it is RDS, and this add-on never applies).
    cloudnative_pg: AddonSwitch = AddonSwitch()
    argo_workflows: AddonSwitch = AddonSwitch()
    # Each tenant's own Grafana (platform/tenant_grafana.py); it applies only with monitoring on.
    tenant_grafana: AddonSwitch = AddonSwitch()


class BucketSettings(Model):
    checkpoint_noncurrent_days: Annotated[int, Field(ge=1, le=3650)] = 14
    force_destroy: bool = False


class TenantResources(Model):
    gpu: Annotated[int, Field(ge=0, le=100_000)] = 0
    cpu: Quantity = "0"
    memory: Quantity = "0"


class TenantQuota(TenantResources):
    pods: Positive = 200
    # What the namespace's claims on the checkpoint class may request in all and how many it may hold (a per-class
    # quota: platform/tenants.quota_spec): the stack's own jobs' checkpoint claims must fit (config/rules.py), and
    # what members submit shares the rest.
    storage: Size = "10Ti"
    claims: Positive = 20


def _kubernetes_group(value: str) -> str:
    # `system:` names are Kubernetes' own (RBAC docs, "Referring to subjects": the system: prefix is reserved).
    if value.startswith("system:"):
        raise ValueError(f"{value!r} starts with 'system:', which Kubernetes reserves for its own groups")
    if not _GROUP.fullmatch(value):
        raise ValueError(f"{value!r} is not a group name: letters, digits and : . _ @ / -, at most 128 characters, "
                         "starting with a letter or digit")
    return value


# Our bound for a Kubernetes group name (RBAC takes any string; EKS access entries carry it as kubernetesGroups).
_GROUP = re.compile(r"[A-Za-z0-9][A-Za-z0-9:._@/-]{0,127}")
KubernetesGroup = Annotated[str, AfterValidator(_kubernetes_group)]


class TenantAccess(Model):
    """Who may use a tenant's namespace: a Kubernetes group its RoleBinding names, and on AWS the IAM principals
    whose EKS access entries put them in that group (nothing outside the namespace; README, "Tenant access")."""

    # Unset: names.tenant_group(<tenant>), `trainyard:tenant:<name>`.
    group: KubernetesGroup | None = None
    principal_arns: list[PrincipalArn] = Field(default_factory=list, max_length=20)


class Tenant(Model):
    # Its Grafana is the StatefulSet `grafana-<name>` (platform/tenant_grafana.py), whose pods carry the label
    # controller-revision-hash `<statefulset>-<10-character hash>`, a label value of at most 63 characters.
    name: Annotated[DnsLabel, Field(max_length=44)]
    namespace: DnsLabel | None = None
    # Volcano queue weight: a share, not a count; 1000 allows any ratio a platform needs.
    weight: Annotated[int, Field(gt=0, le=1000)] = 1
    capability: TenantResources = TenantResources()
    quota: TenantQuota | None = None
    default: bool = False
    access: TenantAccess = TenantAccess()

    @property
    def namespace_name(self) -> str:
        return self.namespace or self.name

    @property
    def group(self) -> str:
        """The Kubernetes group bound to the tenant's role in its namespace."""
        return self.access.group or names.tenant_group(self.name)


class Autoscaling(Model):
    """Elastic growth: request maxNodes pods; the gang starts at minNodes and grows as Karpenter adds nodes.

    Not an HPA on GPU utilization: a Volcano Job has no scale subresource (see the README, "Autoscaling").
    """

    enabled: bool = False


class NetworkTopology(Model):
    """Volcano's `networkTopology` for a multi-node job: how close its nodes must sit in the EC2 network tree.

    Tiers are the HyperNodes built from the EKS topology labels (platform/volcano/values.yaml): 1 = the nodes share a
    layer-3 network node, 2 = layer-2, 3 = layer-1. soft prefers the lowest tier that fits and never waits for one;
    hard keeps the job Pending until one HyperNode of at most highestTier holds it (README, "Network topology").
    """

    mode: Literal["soft", "hard"]
    highest_tier: Annotated[int, Field(ge=1, le=3)] | None = None


class Job(Model):
    # Pod hostnames are `<name>-worker-<i>`, DNS labels of at most 63 characters: room for 3 digits.
    name: Annotated[DnsLabel, Field(max_length=52)]
    kind: JobKind
    tenant: DnsLabel
    node_pool: DnsLabel | None = None
    min_nodes: Positive = 1
    max_nodes: Positive = 1
    gpus_per_node: Annotated[int, Field(ge=0, le=64)] = 0
    mig_profile: str | None = None
    image: PinnedImage
    # The name of a file in workloads/configs/ (checked in rules.py): never a path.
    trainer_config: Annotated[str, Field(max_length=100)] = "gpt-small.yaml"
    # Token shards (manifest.json + *.bin, see workloads/README.md) under the dataset bucket's prefix, read
    # through Alluxio. Unset: the trainer generates its synthetic corpus on the checkpoint volume.
    dataset: RelativePath | None = None
    checkpoint_size: Size = "200Gi"
    shm_size: Size = "16Gi"
    # Seconds the trainer gets after SIGTERM to write a checkpoint (spot gives two minutes' notice).
    checkpoint_grace_seconds: Annotated[int, Field(ge=10, le=3600)] = 100
    autoscaling: Autoscaling = Autoscaling()
    # Unset: soft on a multi-node job, none on a one-node job.
    network_topology: NetworkTopology | None = None


class FabricCheckSettings(Model):
    """The all-reduce bus-bandwidth check run once on two nodes of every EFA pool (README, "Reading the fabric
    check"); its threshold comes from the instance-type table."""

    enabled: bool = True
    # The trainer image: it carries `trainyard_train.commcheck` and the EFA libraries. Required while a pool has EFA.
    image: PinnedImage | None = None
    # It runs in a namespace and Volcano queue of its own (names.FABRIC_CHECK_NAMESPACE/_QUEUE), never a tenant's.


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
    deploy: DeploySettings | None = None
    cluster: ClusterSettings = ClusterSettings()
    node_pools: list[NodePool] = Field(default_factory=list, max_length=30)
    addons: AddonSettings = AddonSettings()
    buckets: BucketSettings = BucketSettings()
    tenants: list[Tenant] = Field(default_factory=list, max_length=100)
    workloads: list[Job] = Field(default_factory=list, max_length=200)
    fabric_check: FabricCheckSettings = FabricCheckSettings()
    cost: CostSettings = CostSettings()
    # Stateful resources (buckets, KMS keys, the Ceph cluster, checkpoint volumes) are protected, and buckets and
    # keys also retained on delete. Only a non-prod stack may turn this off, to be destroyed with `pulumi destroy`.
    protect: Annotated[bool, BeforeValidator(_flag_text)] = True

    def pools(self, role: PoolRole) -> list[NodePool]:
        return [p for p in self.node_pools if p.role == role]

    def pool(self, name: str) -> NodePool:
        return next(p for p in self.node_pools if p.name == name)

    def tenant(self, name: str) -> Tenant:
        return next(t for t in self.tenants if t.name == name)

    @property
    def default_tenant(self) -> Tenant | None:
        return next((t for t in self.tenants if t.default), None)

    @property
    def fabric_checked_pools(self) -> list[NodePool]:
        """The pools the fabric check runs on: every EFA pool, unless the check is off."""
        return [p for p in self.node_pools if p.efa] if self.fabric_check.enabled else []

    @property
    def is_aws(self) -> bool:
        return self.target == "aws"
