"""Rules that relate several keys of a stack. Each returns problems with the key path they concern."""

from __future__ import annotations

import ipaddress
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Literal

from trainyard import names
from trainyard.config import exposure, name_rules, rds_ca
from trainyard.config.instance_types import CPU_ONLY_MEMORY_BYTES, INSTANCE_TYPES, InstanceType, pod_share
from trainyard.config.instance_types import smallest as smallest_type
from trainyard.config.mig import MigCatalog
from trainyard.config.model import Job, NodePool, RunnerSettings, Settings, TenantQuota, TenantResources
from trainyard.config.quantity import parse_quantity
from trainyard.names import FABRIC_CHECK_NAMESPACE, FABRIC_CHECK_QUEUE, fabric_check_job

RESERVED_NAMESPACES = frozenset({"default", "kube-system", "kube-public", "kube-node-lease"})
# Queues Volcano creates itself (volcano-sh/volcano pkg/scheduler/cache/cache.go newDefaultAndRootQueue, v1.15): a
# tenant's queue is named after it, so only the default tenant may stand for `default` (it patches that queue).
VOLCANO_QUEUES = frozenset({"default", "root"})
LOWERCASE = frozenset("abcdefghijklmnopqrstuvwxyz")
# RFC 5737 documentation ranges: an example value left in a stack, never a runner's address.
DOCUMENTATION_RANGES = tuple(ipaddress.IPv4Network(n) for n in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24"))
# The ranges EKS takes a service CIDR from, and its size (serviceIpv4Cidr in
# https://docs.aws.amazon.com/eks/latest/APIReference/API_KubernetesNetworkConfigRequest.html).
SERVICE_CIDR_RANGES = tuple(ipaddress.IPv4Network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"))
SERVICE_CIDR_PREFIXES = range(12, 25)
# A trainer config is named, never addressed by path: only files directly in workloads/configs/ ship to pods.
_CONFIG_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\.ya?ml")
# The longest suffixes the cloud layer puts after `trainyard-<stack>-` for each kind of name (cloud/buckets.py,
# cloud/karpenter.py, cloud/database.py); the plan tests render a stack with the longest accepted name and check every
# name.
ACCOUNT_ID = "123456789012"
_GENERATED = (
    (name_rules.s3_bucket_problem, f"checkpoints-{ACCOUNT_ID}"),
    (name_rules.IAM_ROLE.problem, "karpenter-controller"),
    (name_rules.EVENTBRIDGE_RULE.problem, "karpenter-capacity-reservation-interruption"),
    (name_rules.SQS_QUEUE.problem, "karpenter"),
    (name_rules.EKS_CLUSTER.problem, ""),
    (name_rules.RDS_INSTANCE.problem, "mlflow"),
)


# A problem with the stack's name rather than one of its keys.
STACK_NAME = "(stack name)"


@dataclass(frozen=True, slots=True)
class Problem:
    path: str  # key path below the project namespace, e.g. "nodePools[1].minSize"
    message: str
    # `path` is a whole key of another namespace ("trainyrd:buckets"), shown as it is.
    foreign: bool = False

    def key(self, project: str) -> str:
        """The key as the stack file spells it."""
        return self.path if self.foreign or self.path == STACK_NAME else f"{project}:{self.path}"


def check(settings: Settings, mig: MigCatalog, trainer_configs: Path, *,
          platform_namespaces: frozenset[str] = frozenset(), aws_region: str | None = None) -> list[Problem]:
    """Every cross-key problem of a structurally valid stack, in key order.

    `platform_namespaces`: namespaces the platform installs into (no tenant may take one); `aws_region`: the
    stack's `aws:region`, when set, which must be the region the program deploys to.
    """
    checks = (_names, _target, _network, _deploy, _node_pools, _addons, _buckets, _fabric_check)
    problems = [p for rule in checks for p in rule(settings)]
    if aws_region is not None and settings.aws is not None and aws_region != settings.aws.region:
        problems.append(Problem("aws.region", f"{settings.aws.region!r} differs from aws:region {aws_region!r} in "
                                              "the same stack: the two must agree (or leave aws:region unset)"))
    problems += _tenants(settings, platform_namespaces | RESERVED_NAMESPACES)
    problems += _mig_layouts(settings, mig)
    problems += _workloads(settings, mig, trainer_configs)
    return problems


def _allowed(values: object) -> str:
    return ", ".join(sorted(str(v) for v in values))  # type: ignore[attr-defined]


def _duplicates(names: list[str]) -> set[str]:
    return {n for n, count in Counter(names).items() if count > 1}


def _names(s: Settings) -> Iterator[Problem]:
    """The stack name is part of every AWS name (`trainyard-<stack>-...`): each must stay within its rules."""
    if s.target != "aws":
        return
    prefix = f"trainyard-{s.stack}"
    if not name_rules.DNS1123_LABEL.pattern.fullmatch(s.stack):
        yield Problem(STACK_NAME, f"{s.stack!r} goes into S3 bucket names: use lowercase letters, digits and '-', "
                                  "starting and ending with a letter or digit")
        return
    for rule, suffix in _GENERATED:
        problem = rule("-".join(filter(None, (prefix, suffix))))
        if problem is not None:
            yield Problem(STACK_NAME, f"{s.stack!r} is too long for the names it generates: {problem}")
    for i, pool in enumerate(s.node_pools):
        if pool.role != "gpu" and (problem := name_rules.EKS_NODE_GROUP.problem(f"{prefix}-{pool.name}")):
            yield Problem(f"nodePools[{i}].name", problem)


def _target(s: Settings) -> Iterator[Problem]:
    if s.target == "aws":
        if s.aws is None:
            yield Problem("aws", "is required when target is 'aws' (region, availabilityZones, adminPrincipalArns)")
        if s.local is not None:
            yield Problem("local", "is only allowed when target is 'local'")
        if s.environment == "local":
            yield Problem("environment", "'local' requires target 'local'")
    else:
        if s.aws is not None:
            yield Problem("aws", "is not allowed when target is 'local': the local stack creates no AWS resource")
        if s.environment != "local":
            yield Problem("target", f"'local' is only allowed for environment 'local', not {s.environment!r}")
    if s.aws is None:
        return
    for i, zone in enumerate(s.aws.availability_zones):
        # A zone name is its region's name and one letter (https://docs.aws.amazon.com/global-infrastructure/latest/
        # regions/aws-availability-zones.html); Local and Wavelength Zones are not for EKS node subnets here.
        if not (zone.startswith(s.aws.region) and len(zone) == len(s.aws.region) + 1 and zone[-1] in LOWERCASE):
            yield Problem(f"aws.availabilityZones[{i}]", f"{zone!r} is not a zone of region {s.aws.region!r}")
    for zone in _duplicates(s.aws.availability_zones):
        yield Problem("aws.availabilityZones", f"{zone!r} is listed twice")
    for key in s.aws.tags:
        if key in PROGRAM_TAGS:
            yield Problem(f"aws.tags.{key}", f"{key!r} is a tag trainyard sets on every resource itself")
        elif key.startswith(DISCOVERY_TAG_PREFIXES):
            yield Problem(f"aws.tags.{key}", f"{key!r}: tags under {', '.join(DISCOVERY_TAG_PREFIXES)} are read by "
                                             "Karpenter and EKS to pick subnets and security groups; on every resource "
                                             "(public subnets too) they would put all of them in play")
    if s.environment == "prod" and len(s.aws.availability_zones) < 3:
        yield Problem("aws.availabilityZones", "prod needs at least 3 availability zones")


def _network(s: Settings) -> Iterator[Problem]:
    vpc = ipaddress.IPv4Network(s.network.vpc_cidr)
    service = ipaddress.IPv4Network(s.network.service_cidr)
    if not 16 <= vpc.prefixlen <= 20:
        yield Problem("network.vpcCidr", f"{vpc} must be between /16 and /20 to hold a public and a private "
                                         "subnet per zone with room for pod IPs")
    if vpc.overlaps(service):
        yield Problem("network.serviceCidr", f"{service} overlaps network.vpcCidr {vpc}")
    if not any(service.subnet_of(r) for r in SERVICE_CIDR_RANGES) or service.prefixlen not in SERVICE_CIDR_PREFIXES:
        yield Problem("network.serviceCidr", f"{service}: EKS takes a service CIDR between /12 and /24 inside "
                                             + ", ".join(map(str, SERVICE_CIDR_RANGES)))
    yield from _exposure(s, "network.publicAccessCidrs", s.network.public_access_cidrs, "the public API endpoint")
    if s.deploy is not None:
        # The private endpoint's security group admits these on 443 (cloud/cluster.py): the same judgement.
        yield from _exposure(s, "deploy.runnerCidrs", s.deploy.runner_cidrs,
                             "the private API endpoint's security group")


def _exposure(s: Settings, at: str, cidrs: list[str], what: str) -> Iterator[Problem]:
    """A list that admits most of the internet is 0.0.0.0/0, however it is split or spelt (config/exposure.py)."""
    if not exposure.opens_to_anyone(cidrs):
        return
    # Name the entries that open it alone; only a split list is named as a whole.
    alone = [(f"{at}[{i}]", [c]) for i, c in enumerate(cidrs) if exposure.opens_to_anyone([c])]
    for path, opening in alone or [(at, cidrs)]:
        subject = f"{opening[0]} opens" if len(opening) == 1 else "together they open"
        opened = f"{subject} {what} to {exposure.describe(opening)}, as good as 0.0.0.0/0"
        if s.environment == "prod":
            yield Problem(path, f"prod may not open the API endpoint to the internet: {opened}")
        elif not s.network.allow_any_public_access:
            yield Problem(path, f"{opened}; list your own egress ranges, or set network.allowAnyPublicAccess: true "
                                "to mean it")


def _placeholders(at: str, cidrs: list[str]) -> Iterator[Problem]:
    for i, cidr in enumerate(cidrs):
        net = ipaddress.IPv4Network(cidr)
        # Inside a documentation range: a wider block that merely holds one is judged by _exposure instead.
        if any(net.subnet_of(doc) for doc in DOCUMENTATION_RANGES):
            yield Problem(f"{at}[{i}]", f"{cidr} is a documentation range (RFC 5737: 192.0.2.0/24, "
                                        "198.51.100.0/24, 203.0.113.0/24), not your deploy runners' addresses")


def _deploy(s: Settings) -> Iterator[Problem]:
    """The deploy workflow must be able to reach the API server it deploys to, as the role it assumes."""
    d = s.deploy
    if d is None:
        if s.target == "aws":
            yield Problem("deploy", "is required when target is 'aws': roleArn (the role CI assumes) and "
                                    "apiAccess (public | private) say how `pulumi up` reaches the API server")
        return
    if s.target != "aws":
        yield Problem("deploy", "is only allowed when target is 'aws'")
    public = s.network.public_access_cidrs
    yield from _placeholders("network.publicAccessCidrs", public)
    yield from _placeholders("deploy.runnerCidrs", d.runner_cidrs)
    if d.api_access == "public":
        if not public:
            yield Problem("network.publicAccessCidrs", "is required with deploy.apiAccess 'public': the egress "
                                                       "ranges of the deploy runners (or use apiAccess 'private')")
        if d.runner_cidrs:
            yield Problem("deploy.runnerCidrs", "is only used with deploy.apiAccess 'private'")
    else:
        if public:
            yield Problem("network.publicAccessCidrs", "must be empty with deploy.apiAccess 'private' "
                                                       "(the public endpoint is off)")
        if not d.runner_cidrs:
            yield Problem("deploy.runnerCidrs", "is required with deploy.apiAccess 'private': the ranges the "
                                                "self-hosted runner reaches the VPC from")
    if s.aws is not None and s.aws.allowed_account_ids and d.role_arn.split(":")[4] not in s.aws.allowed_account_ids:
        yield Problem("aws.allowedAccountIds", f"does not hold deploy.roleArn's account "
                                               f"{d.role_arn.split(':')[4]!r}: the provider would refuse every "
                                               "deployment with that role's credentials")
    if s.aws is not None and d.role_arn in s.aws.admin_principal_arns:
        yield Problem("deploy.roleArn", "is also in aws.adminPrincipalArns; list it once (deploy.roleArn "
                                        "gets its own access entry)")
    runners = [("deploy.runner", d.runner)]
    if d.preview is not None and d.preview.runner is not None:
        runners.append(("deploy.preview.runner", d.preview.runner))
    for at, runner in runners:
        if problem := runner_problem(s, runner):
            yield Problem(at, problem)


# GitHub's standard hosted runners (ubuntu-24.04, ubuntu-latest, windows-2025, macos-15, ... and their -arm/-intel
# variants) are fresh VMs with no fixed egress address, outside any VPC (docs.github.com, "About GitHub-hosted
# runners"); static IP addresses are a larger-runner feature, chosen by a label or group of the organisation's
# own (docs.github.com, "About larger runners"); only a self-hosted runner (its default label `self-hosted`,
# docs.github.com "Using self-hosted runners in a workflow") can sit in, or be routed to, the VPC.
_STANDARD_HOSTED = re.compile(r"(ubuntu|windows|macos)-(latest|slim|[0-9]+(\.[0-9]+)?)(-(arm|intel))?")
RunnerKind = Literal["self-hosted", "standard", "larger"]


def runner_kind(runner: RunnerSettings) -> RunnerKind:
    if "self-hosted" in runner.labels:
        return "self-hosted"
    if any(_STANDARD_HOSTED.fullmatch(label) for label in runner.labels):
        return "standard"
    return "larger"


def runner_problem(s: Settings, runner: RunnerSettings) -> str | None:
    """Why `runner` cannot reach the stack's Kubernetes API endpoint, or None (pure: the rehearsal reuses it)."""
    d = s.deploy
    if d is None:
        return None
    kind, labels = runner_kind(runner), ", ".join(runner.labels)
    if d.api_access == "private" and kind != "self-hosted":
        where = "GitHub's standard hosted runners" if kind == "standard" else "a GitHub-hosted (larger) runner"
        return (f"[{labels}] is {where}, outside the VPC: deploy.apiAccess 'private' has no public endpoint, so "
                "only a self-hosted runner (labels include 'self-hosted') in or routed to the VPC reaches it")
    # Their egress may be any internet address: only a list whose union admits all of them reaches (review
    # finding 8: 0.0.0.0/1 + 128.0.0.0/1 does, as config/exposure.py judges every public-exposure rule).
    everyone = exposure.internet_addresses(s.network.public_access_cidrs) == exposure.INTERNET_ADDRESSES
    if d.api_access == "public" and kind == "standard" and not everyone:
        return (f"[{labels}] are GitHub's standard hosted runners, which have no fixed egress address, so they "
                f"cannot reach an endpoint open only to network.publicAccessCidrs "
                f"({', '.join(s.network.public_access_cidrs)}): use a larger runner with static IP addresses or a "
                "self-hosted runner, and list its egress ranges there")
    return None


def _pool_types(pool: NodePool) -> list[InstanceType]:
    return [INSTANCE_TYPES[t] for t in pool.instance_types if t in INSTANCE_TYPES]


def _node_pools(s: Settings) -> Iterator[Problem]:
    if s.target == "local" and s.node_pools:
        yield Problem("nodePools", "must be empty when target is 'local': the local cluster brings its own nodes")
        return
    for name in _duplicates([p.name for p in s.node_pools]):
        yield Problem("nodePools", f"pool name {name!r} is used more than once")
    if s.target == "aws" and len(s.pools("system")) != 1:
        yield Problem("nodePools", "an AWS stack needs exactly one pool with role 'system' for the controllers")
    zones = set(s.aws.availability_zones) if s.aws else set()
    for i, pool in enumerate(s.node_pools):
        yield from _node_pool(f"nodePools[{i}]", pool, zones)


def _node_pool(at: str, pool: NodePool, zones: set[str]) -> Iterator[Problem]:
    for j, name in enumerate(pool.instance_types):
        if name not in INSTANCE_TYPES:
            yield Problem(f"{at}.instanceTypes[{j}]", f"unknown instance type {name!r}; allowed: "
                                                       f"{_allowed(INSTANCE_TYPES)}")
    types = _pool_types(pool)
    if pool.min_size > pool.desired_size:
        yield Problem(f"{at}.minSize", f"{pool.min_size} is greater than desiredSize {pool.desired_size}")
    if pool.desired_size > pool.max_size:
        yield Problem(f"{at}.desiredSize", f"{pool.desired_size} is greater than maxSize {pool.max_size}")
    if len(set(pool.capacity_types)) != len(pool.capacity_types):
        yield Problem(f"{at}.capacityTypes", "lists a capacity type twice")
    if pool.role == "gpu":
        if any(t.gpu is None for t in types):
            yield Problem(f"{at}.instanceTypes", "a 'gpu' pool may only list GPU instance types")
        if len({t.gpu for t in types}) > 1:
            yield Problem(f"{at}.instanceTypes", "all instance types of a pool must carry the same GPU model, "
                                                 f"got {_allowed({str(t.gpu) for t in types})}")
        if pool.min_size != 0:
            yield Problem(f"{at}.minSize", "GPU pools are provisioned by Karpenter and scale from zero: must be 0")
    else:
        if any(t.gpu is not None for t in types):
            yield Problem(f"{at}.instanceTypes", f"a {pool.role!r} pool may not use GPU instance types")
        if len(pool.capacity_types) != 1 or "reserved" in pool.capacity_types:
            yield Problem(f"{at}.capacityTypes", "managed node groups take exactly one of: on-demand, spot "
                                                 "('reserved' is for 'gpu' pools, which Karpenter launches)")
        if pool.mig_layout is not None:
            yield Problem(f"{at}.migLayout", "only 'gpu' pools can have a MIG layout")
    if pool.role == "storage" and any(t.nvme_devices == 0 for t in types):
        yield Problem(f"{at}.instanceTypes", "a 'storage' pool needs NVMe instance store for Ceph OSDs; "
                                             "choose from: " + _allowed(n for n, t in INSTANCE_TYPES.items()
                                                                       if t.gpu is None and t.nvme_devices))
    if pool.efa:
        for j, t in enumerate(types):
            if t.efa_interfaces == 0:
                yield Problem(f"{at}.efa", f"{t.name} (instanceTypes[{j}]) has no EFA interface; EFA-capable: "
                                           + _allowed(n for n, it in INSTANCE_TYPES.items() if it.efa_interfaces))
        if pool.role != "gpu":
            yield Problem(f"{at}.efa", "EFA is only configured on 'gpu' pools")
    yield from _pool_labels(at, pool)
    yield from _pool_taints(at, pool)
    if pool.zones == []:
        yield Problem(f"{at}.zones", "is empty, which would read as no zone: list the zones the pool may use, or "
                                     "leave zones out for every zone of aws.availabilityZones")
    if pool.zones is not None:
        for zone in _duplicates(pool.zones):
            yield Problem(f"{at}.zones", f"{zone!r} is listed twice")
        for j, zone in enumerate(pool.zones):
            if zones and zone not in zones:
                yield Problem(f"{at}.zones[{j}]", f"{zone!r} is not one of aws.availabilityZones: {_allowed(zones)}")
    if pool.placement_group and (pool.zones is None or len(pool.zones) != 1):
        yield Problem(f"{at}.placementGroup", "a cluster placement group lives in one zone: set exactly one entry "
                                              "in zones")
    yield from _capacity_reservations(at, pool, zones)
    if pool.gpu_sharing is not None and pool.role != "gpu":
        yield Problem(f"{at}.gpuSharing", "only 'gpu' pools share GPUs")
    if pool.gpu_sharing is not None and pool.mig_layout is not None:
        yield Problem(f"{at}.gpuSharing", "a pool shares its GPUs either by migLayout or by time-slicing, not both")


# EC2 User Guide, capacity-blocks-purchase.html: "Each Capacity Block can have up to 64 instances".
CAPACITY_BLOCK_MAX_INSTANCES = 64


def _capacity_reservations(at: str, pool: NodePool, zones: set[str]) -> Iterator[Problem]:
    """A reserved pool launches into its reservations only: Karpenter needs each one selected and usable."""
    reserved = "reserved" in pool.capacity_types
    if reserved and not pool.capacity_reservations and pool.role == "gpu":
        yield Problem(f"{at}.capacityTypes", "'reserved' needs capacityReservations: the ODCRs or Capacity Blocks "
                                             "the pool's nodes launch into")
    if pool.capacity_reservations and not reserved:
        yield Problem(f"{at}.capacityReservations", "need 'reserved' in capacityTypes: Karpenter launches into a "
                                                    "reservation only with that capacity type")
    if pool.capacity_reservations and pool.role != "gpu":
        yield Problem(f"{at}.capacityReservations", "only 'gpu' pools (launched by Karpenter) use reservations")
    for rid in _duplicates([r.id for r in pool.capacity_reservations]):
        yield Problem(f"{at}.capacityReservations", f"{rid} is listed twice")
    pool_zones = set(pool.zones) if pool.zones is not None else zones
    for j, r in enumerate(pool.capacity_reservations):
        here = f"{at}.capacityReservations[{j}]"
        if r.instance_type not in pool.instance_types:
            yield Problem(f"{here}.instanceType", f"{r.instance_type!r} is not one of the pool's instanceTypes: "
                                                  f"{_allowed(pool.instance_types)}")
        if pool_zones and r.zone not in pool_zones:
            yield Problem(f"{here}.zone", f"{r.zone!r} is not a zone the pool launches in: {_allowed(pool_zones)}")
        block = r.type == "capacity-block"
        for key, value in (("upfrontFeeUsd", r.upfront_fee_usd), ("durationHours", r.duration_hours)):
            if block and value is None:
                yield Problem(f"{here}.{key}", "is required for a capacity-block: it is paid in full at purchase, "
                                               "and the plan prices the pool from it")
            if not block and value is not None:
                yield Problem(f"{here}.{key}", "is only for type 'capacity-block' (an ODCR is billed per hour at "
                                               "the on-demand rate)")
        if block and r.instance_count > CAPACITY_BLOCK_MAX_INSTANCES:
            yield Problem(f"{here}.instanceCount", f"a Capacity Block holds at most {CAPACITY_BLOCK_MAX_INSTANCES} "
                                                   "instances")
    reserved_nodes = sum(r.instance_count for r in pool.capacity_reservations)
    if pool.capacity_reservations and pool.capacity_types == ["reserved"] and pool.desired_size > reserved_nodes:
        yield Problem(f"{at}.desiredSize", f"{pool.desired_size} nodes, but a pool with only 'reserved' capacity "
                                           f"launches no more than its {reserved_nodes} reserved instances")
    if reserved_nodes > pool.max_size:
        yield Problem(f"{at}.maxSize", f"{pool.max_size} is below the {reserved_nodes} reserved instances: the rest "
                                       "would be paid for and never launched")


# EKS managed node groups (system and storage pools) take label keys and values of 1-63 characters and taint keys
# of 1-63 (labels in https://docs.aws.amazon.com/eks/latest/APIReference/API_CreateNodegroup.html, key in
# API_Taint.html); GPU pools are Karpenter NodePools, whose template labels Karpenter validates itself.
EKS_LABEL_MAX = 63
# Taints the platform sets and removes itself (GPU admission, Cilium's agent-not-ready): a pool's own taint with
# the same key would duplicate it (Karpenter refuses a repeated key and effect across taints and startupTaints) or
# never be removed.
PLATFORM_TAINT_KEYS = frozenset({names.GPU_HEALTH_TAINT_KEY, names.GPU_HEALTH_FAILED_TAINT_KEY,
                                 names.CILIUM_AGENT_NOT_READY_TAINT_KEY})
# Tags the program puts on every AWS resource (cloud/naming.py base_tags), and prefixes of the tags controllers
# discover resources by: Karpenter's subnet and security group selectors (karpenter.sh/discovery, karpenter.sh
# docs "EC2NodeClasses"), EKS and load balancer subnet roles (kubernetes.io/cluster/<name>, kubernetes.io/role/elb:
# docs.aws.amazon.com/eks/latest/userguide/network-load-balancing.html).
PROGRAM_TAGS = frozenset({"trainyard.io/stack", "managed-by"})
DISCOVERY_TAG_PREFIXES = ("karpenter.sh/", "karpenter.k8s.aws/", "kubernetes.io/", "k8s.io/", "trainyard.io/")
# Labels the program sets on every node from the pool's role, name, MIG layout and GPU sharing (cloud/aws.py
# pool_labels).
PROGRAM_LABELS = frozenset({names.ROLE_LABEL, names.POOL_LABEL, names.MIG_CONFIG_LABEL, names.GPU_SHARING_KEY,
                            names.DEVICE_PLUGIN_CONFIG_LABEL})


def _pool_labels(at: str, pool: NodePool) -> Iterator[Problem]:
    for key, value in pool.labels.items():
        where = f"{at}.labels.{key}"
        if key in PROGRAM_LABELS:
            yield Problem(where, f"label {key!r} is set by trainyard from the pool's role, name, migLayout and "
                                 "gpuSharing")
        elif pool.role == "gpu":
            if problem := name_rules.karpenter_label_problem(key):
                yield Problem(where, problem)
        elif problem := name_rules.kubelet_label_problem(key):
            yield Problem(where, problem)
        elif len(key) > EKS_LABEL_MAX:
            yield Problem(where, f"label key {key!r} has {len(key)} characters; an EKS managed node group takes "
                                 f"at most {EKS_LABEL_MAX}")
        elif not value:
            yield Problem(where, "an EKS managed node group takes no empty label value (1-63 characters)")


def _pool_taints(at: str, pool: NodePool) -> Iterator[Problem]:
    # Taints are unique by key and effect on a node (k8s.io/kubernetes pkg/apis/core/validation/validation.go
    # validateNodeTaints) and in a NodePool (sigs.k8s.io/karpenter pkg/apis/v1/nodeclaim_validation.go
    # validateTaintsField): a repeat is refused, never merged.
    seen: dict[tuple[str, str], int] = {}
    for j, taint in enumerate(pool.taints):
        where = f"{at}.taints[{j}]"
        if (taint.key, taint.effect) in seen:
            yield Problem(where, f"repeats taints[{seen[taint.key, taint.effect]}] ({taint.key}:{taint.effect}); a "
                                 "node's taints are unique by key and effect")
        seen.setdefault((taint.key, taint.effect), j)
        if taint.key in PLATFORM_TAINT_KEYS:
            yield Problem(f"{where}.key", f"{taint.key!r} is a taint the platform sets and removes itself")
        if pool.role != "gpu" and len(taint.key) > EKS_LABEL_MAX:
            yield Problem(f"{where}.key", f"taint key {taint.key!r} has {len(taint.key)} characters; an EKS managed "
                                          f"node group takes at most {EKS_LABEL_MAX}")


def _mig_layouts(s: Settings, mig: MigCatalog) -> Iterator[Problem]:
    for i, pool in enumerate(s.node_pools):
        if pool.mig_layout is None or pool.role != "gpu":
            continue
        at = f"nodePools[{i}].migLayout"
        for gpu in {t.gpu for t in _pool_types(pool) if t.gpu is not None}:
            if not gpu.mig_capable:
                yield Problem(at, f"{gpu} GPUs do not support MIG; MIG-capable instance types: "
                                  + _allowed(n for n, t in INSTANCE_TYPES.items() if t.gpu and t.gpu.mig_capable))
            elif pool.mig_layout not in mig.layouts:
                yield Problem(at, f"unknown MIG layout {pool.mig_layout!r}; layouts in "
                                  f"platform/gpu-operator/mig-layouts.yaml: {_allowed(mig.layouts)}")
            elif not mig.supports(pool.mig_layout, gpu):
                yield Problem(at, f"layout {pool.mig_layout!r} has no geometry for {gpu}; layouts for it: "
                                  + _allowed(n for n in mig.layouts if mig.supports(n, gpu)))


def _addons(s: Settings) -> Iterator[Problem]:
    a = s.addons
    if s.target == "aws" and not a.cilium.enabled:
        yield Problem("addons.cilium.enabled", "must be true on AWS: the cluster is created without aws-node and "
                                               "kube-proxy, so Cilium is the only CNI")
    if s.aws is not None and a.mlflow.enabled and s.aws.region not in rds_ca.regional_roots():
        yield Problem("aws.region", f"{s.aws.region!r} has no root of the RDS certificate authority "
                                    f"{rds_ca.CA_IDENTIFIER} in {rds_ca.RDS_CA_FILE.name} ({rds_ca.SOURCE}), and "
                                    "MLflow's database connection verifies the server's certificate against it")
    if s.target == "local":
        for key, on in (("gpuOperator", a.gpu_operator.enabled), ("rookCeph", a.rook_ceph.enabled),
                        ("alluxio", a.alluxio.enabled), ("gpuHealth", a.gpu_health.enabled)):
            if on:
                yield Problem(f"addons.{key}.enabled", "must be false for target 'local' (CPU only, no NVMe)")
        if a.gpu_health.repair:
            yield Problem("addons.gpuHealth.repair", "must be false for target 'local': node repair needs EKS "
                                                     "(node monitoring agent) and Karpenter")
    sliced = [i for i, p in enumerate(s.node_pools) if p.gpu_sharing == "time-sliced"]
    for i in sliced:
        if not (a.gpu_operator.enabled and a.gpu_operator.time_slicing.enabled):
            yield Problem(f"nodePools[{i}].gpuSharing", "time-sliced needs addons.gpuOperator.timeSlicing.enabled: "
                                                        "the device plugin config its nodes select")
    if a.gpu_operator.time_slicing.enabled and not sliced:
        yield Problem("addons.gpuOperator.timeSlicing.enabled", "no pool has gpuSharing: time-sliced, so nothing "
                                                                "would use the time-sliced device plugin config")
    if s.target == "aws" and not a.gpu_operator.enabled:
        # Without the GPU Operator no device plugin advertises nvidia.com/gpu or a MIG slice and mig-manager never
        # partitions a node (NVIDIA k8s-device-plugin README): such pods stay Pending forever.
        for i, job in enumerate(s.workloads):
            if job.gpus_per_node or job.mig_profile:
                yield Problem(f"workloads[{i}]", "requests GPUs while addons.gpuOperator.enabled is false: no device "
                                                 "plugin advertises them, so the job would hang Pending")
        for pool in s.fabric_checked_pools:
            yield Problem(f"nodePools[{s.node_pools.index(pool)}].efa",
                          "the fabric check takes whole GPUs while addons.gpuOperator.enabled is false: it would "
                          "hang Pending (or set fabricCheck.enabled: false)")
        for i, pool in enumerate(s.node_pools):
            if pool.mig_layout is not None:
                yield Problem(f"nodePools[{i}].migLayout", "needs addons.gpuOperator.enabled: mig-manager, which "
                                                           "applies the layout, is part of the GPU Operator")
    if s.target == "aws" and a.gpu_health.enabled and not a.gpu_operator.enabled:
        yield Problem("addons.gpuHealth.enabled", "the admission check waits for GPU Operator validation: needs "
                                                  "addons.gpuOperator.enabled")
    if a.gpu_health.enabled and (least := a.gpu_health.wait_minutes + _CHECK_MINUTES[a.gpu_health.diag_level]) \
            > a.gpu_health.stuck_minutes:
        yield Problem("addons.gpuHealth.stuckMinutes", f"must be at least {least}: waitMinutes plus the time its "
                                                       f"DCGM check may take at diagLevel {a.gpu_health.diag_level}, "
                                                       "or healthy nodes still being checked count as stuck")
    if s.target == "aws" and a.rook_ceph.enabled:
        storage = s.pools("storage")
        if not storage:
            yield Problem("addons.rookCeph.enabled", "needs a node pool with role 'storage' for the OSDs")
        elif storage[0].min_size < a.rook_ceph.replicas:
            yield Problem("addons.rookCeph.replicas", f"{a.rook_ceph.replicas} replicas across hosts need the "
                                                      f"storage pool's minSize >= {a.rook_ceph.replicas}, "
                                                      f"it is {storage[0].min_size}")
        if storage and a.rook_ceph.failure_domain == "zone":
            zones = storage[0].zones or (s.aws.availability_zones if s.aws else [])
            if len(zones) < a.rook_ceph.replicas:
                yield Problem("addons.rookCeph.failureDomain",
                              f"zone puts each of the {a.rook_ceph.replicas} replicas in another zone: the storage "
                              f"pool spans {len(zones)} ({', '.join(zones)}); lower replicas or use 'host'")
        if s.environment == "prod" and a.rook_ceph.replicas < 3:
            yield Problem("addons.rookCeph.replicas", "prod keeps at least 3 replicas")
    yield from _tracking(s)
    if a.alluxio.enabled and not s.pools("gpu"):
        yield Problem("addons.alluxio.enabled", "the dataset cache serves GPU jobs: add a 'gpu' pool")
    if s.target == "aws" and a.alluxio.enabled:
        yield from _cache_on_storage_nodes(s)


def _tracking(s: Settings) -> Iterator[Problem]:
    """MLflow's database: RDS on AWS, CloudNativePG on `local` (platform/addons.yaml: cloudnativePg)."""
    mlflow = s.addons.mlflow
    if not mlflow.enabled:
        return
    at = "addons.mlflow.database"
    if s.target == "local" and not s.addons.cloudnative_pg.enabled:
        yield Problem("addons.cloudnativePg.enabled", "MLflow's database on target 'local' is a CloudNativePG "
                                                      "cluster: must be true while addons.mlflow is on")
    if mlflow.database.max_storage_gib < mlflow.database.storage_gib:
        yield Problem(f"{at}.maxStorageGib", f"{mlflow.database.max_storage_gib} is below storageGib "
                                             f"{mlflow.database.storage_gib}: storage autoscaling only grows")
    if s.environment == "prod" and mlflow.database.multi_az is False:
        yield Problem(f"{at}.multiAz", "prod's tracking database keeps a standby in a second zone: must be true "
                                       "(or unset)")
    for i, tenant in enumerate(s.tenants):  # each is an MLflow user and workspace of its name (names.py)
        if tenant.name in names.MLFLOW_RESERVED_NAMES or len(tenant.name) < names.MLFLOW_MIN_NAME:
            yield Problem(f"tenants[{i}].name", f"{tenant.name!r} names the tenant's MLflow user and workspace, and "
                                                f"MLflow keeps {_allowed(names.MLFLOW_RESERVED_NAMES)} and names "
                                                f"under {names.MLFLOW_MIN_NAME} characters for itself: choose "
                                                "another while addons.mlflow is on")


# Minutes an admission check may take after its wait, per diagLevel: twice NVIDIA's run times for levels 1-3
# (`dcgmi diag --help`: short, medium ~2 min, long ~15 min; NVIDIA/DCGM v4.6.0 dcgmi/CommandLineParser.cpp), rounded
# up to 30 min, which also covers the MIG pools' 90 s of health watches; level 4 has no published run time, so
# this blueprint allows two hours.
_CHECK_MINUTES = {1: 30, 2: 30, 3: 30, 4: 120}


# The cache workers share storage nodes with Ceph (OSDs, MDS): what a worker may hold (its memory tier, JVM heap
# and direct buffers, all requested) may take half of the smallest node's memory, leaving the rest to Ceph and
# the kubelet.
CACHE_MEMORY_SHARE = Decimal("0.5")


def _cache_on_storage_nodes(s: Settings) -> Iterator[Problem]:
    """Alluxio's workers run on the storage pool (never on GPU nodes), one per always-on node, in memory."""
    storage = s.pools("storage")
    if not storage or sum(p.min_size for p in storage) == 0:
        yield Problem("addons.alluxio.enabled", "the cache workers run on the 'storage' pool: it needs minSize >= 1")
        return
    types = [t for p in storage for t in _pool_types(p)]
    smallest = min(t.memory_gib for t in types) if types else 0
    limit = Decimal(smallest) * CACHE_MEMORY_SHARE * 2**30
    cache = s.addons.alluxio
    holds = sum(map(parse_quantity, (cache.memory_cache, cache.worker_heap, cache.worker_direct_memory)))
    if smallest and holds > limit:
        yield Problem("addons.alluxio.memoryCache",
                      f"{cache.memory_cache} plus the worker's heap ({cache.worker_heap}, workerHeap) and direct "
                      f"memory ({cache.worker_direct_memory}, workerDirectMemory) is more than half of the smallest "
                      f"storage node's memory ({smallest}Gi), which Ceph shares")


def _buckets(s: Settings) -> Iterator[Problem]:
    if s.environment == "prod" and not s.protect:
        yield Problem("protect", "prod's stateful resources are always protected: must be true")
    if s.environment == "prod" and s.buckets.force_destroy:
        yield Problem("buckets.forceDestroy", "prod buckets may never be force-destroyed: must be false")


def _tenants(s: Settings, taken: frozenset[str]) -> Iterator[Problem]:
    for name in _duplicates([t.name for t in s.tenants]):
        yield Problem("tenants", f"tenant name {name!r} is used more than once")
    for ns in _duplicates([t.namespace_name for t in s.tenants]):
        yield Problem("tenants", f"namespace {ns!r} is used by more than one tenant")
    defaults = [i for i, t in enumerate(s.tenants) if t.default]
    for i in defaults[1:]:
        yield Problem(f"tenants[{i}].default", f"at most one tenant may be the default; tenants[{defaults[0]}] "
                                               "already is")
    for i, t in enumerate(s.tenants):
        if t.name in VOLCANO_QUEUES and not t.default:
            yield Problem(f"tenants[{i}].name", f"{t.name!r} is the name of a queue Volcano creates itself, and a "
                                                "tenant's queue takes its name: choose another (only the default "
                                                "tenant takes over Volcano's default queue)")
        if t.namespace_name in taken:
            key = "namespace" if t.namespace is not None else "name"
            yield Problem(f"tenants[{i}].{key}", f"namespace {t.namespace_name!r} is reserved for Kubernetes or the "
                                                 f"platform: {_allowed(taken)}")
        if t.quota is not None:
            yield from _quota_below_capability(f"tenants[{i}].quota", t.quota, t.capability)
    yield from _claims_within_quota(s)
    yield from _tenant_access(s)


def _claims_within_quota(s: Settings) -> Iterator[Problem]:
    """The stack's jobs' checkpoint claims must fit their namespace's storage quota, or the API server refuses them
    (Kubernetes docs, "Resource Quotas": requests.storage, persistentvolumeclaims)."""
    for i, t in enumerate(s.tenants):
        sizes = [job.checkpoint_size for job in s.workloads if job.tenant == t.name]
        quota = t.quota or TenantQuota()
        if sum(parse_quantity(size) for size in sizes) > parse_quantity(quota.storage):
            yield Problem(f"tenants[{i}].quota.storage", f"{quota.storage} cannot hold the checkpoint claims of "
                                                         f"its jobs in this stack ({' + '.join(sizes)})")
        if len(sizes) > quota.claims:
            yield Problem(f"tenants[{i}].quota.claims", f"{quota.claims} is fewer than its jobs' checkpoint claims "
                                                        f"in this stack ({len(sizes)})")


def _tenant_access(s: Settings) -> Iterator[Problem]:
    """EKS keeps one access entry per IAM principal (CreateAccessEntry: "You can't specify the same ARN in more than
    one access entry"): a tenant principal may be neither an admin nor the deploy role."""
    platform = {*(s.aws.admin_principal_arns if s.aws else ()), *([s.deploy.role_arn] if s.deploy else ())}
    for i, t in enumerate(s.tenants):
        at = f"tenants[{i}].access.principalArns"
        if t.access.principal_arns and s.target != "aws":
            yield Problem(at, "EKS access entries exist on target 'aws' only: leave it empty for 'local' (bind the "
                              "group to your own kubeconfig user there)")
        for arn in _duplicates(list(t.access.principal_arns)):
            yield Problem(at, f"{arn!r} is listed more than once")
        for arn in sorted(set(t.access.principal_arns) & platform):
            yield Problem(at, f"{arn!r} is already a cluster admin or the deploy role (aws.adminPrincipalArns, "
                              "deploy.roleArn): EKS allows one access entry per principal")
    groups = [t.group for t in s.tenants]
    for group in _duplicates(groups):
        yield Problem("tenants", f"access group {group!r} is bound by more than one tenant: each tenant's members "
                                 "need a group of their own")


def _quota_below_capability(at: str, quota: TenantResources, capability: TenantResources) -> Iterator[Problem]:
    """A namespace quota below its queue's capability (0 = unlimited on either side) strands the difference."""
    for key in ("gpu", "cpu", "memory"):
        limit, share = parse_quantity(str(getattr(quota, key))), parse_quantity(str(getattr(capability, key)))
        if limit and share and limit < share:
            yield Problem(f"{at}.{key}", f"{getattr(quota, key)} is below the queue capability "
                                         f"{getattr(capability, key)}: the queue could never be used fully")


def notices(s: Settings) -> list[Problem]:
    """What a valid stack asks for that cannot take effect: said as a warning, not refused."""
    return [problem for i, t in enumerate(s.tenants) if t.quota is not None
            for problem in _quota_above_capability(f"tenants[{i}].quota", t.quota, t.capability)]


def _quota_above_capability(at: str, quota: TenantResources, capability: TenantResources) -> Iterator[Problem]:
    """Volcano admits a queue's jobs up to its capability, so a namespace quota above it binds only pods outside the
    queue. A warning, not an error: that room can be meant (pods Volcano does not schedule count against a
    ResourceQuota too: kubernetes.io/docs/concepts/policy/resource-quotas), yet for a tenant's training jobs the
    difference is never reached."""
    for key in ("gpu", "cpu", "memory"):
        asked, cap = getattr(quota, key), getattr(capability, key)
        limit, share = parse_quantity(str(asked)), parse_quantity(str(cap))
        if limit and share and limit > share:
            yield Problem(f"{at}.{key}", f"{asked} is above the queue capability {cap}: the tenant's queued jobs stop "
                                         f"at {cap}; only pods outside its Volcano queue can use the rest")


def _trainer_config(at: str, name: str, configs: Path) -> Iterator[Problem]:
    available = _allowed(p.name for p in configs.glob("*.y*ml") if p.is_file()) or "none"
    if not _CONFIG_NAME.fullmatch(name):
        yield Problem(at, f"{name!r} must be the name of a file in workloads/configs/ (no folders, '..' or absolute "
                          f"paths); available: {available}")
        return
    path = configs / name
    # A link out of the folder would ship whatever it points at to every pod: the real file must be inside.
    if not path.is_file() or not path.resolve().is_relative_to(configs.resolve()):
        yield Problem(at, f"{name!r} is not a file in workloads/configs/; available: {available}")


# Pod hostnames `<job>-worker-<i>` are DNS labels; the same room as workloads[].name leaves.
_JOB_NAME_MAX = 52


def _fabric_check(s: Settings) -> Iterator[Problem]:
    """The check runs as a gang of two whole nodes of each EFA pool, in its own namespace and queue."""
    pools = s.fabric_checked_pools
    if not pools:
        return
    off = "or set fabricCheck.enabled: false"
    if s.fabric_check.image is None:
        yield Problem("fabricCheck.image", f"is required while a pool has efa: the trainer image that runs the "
                                           f"check, {off}")
    for i, tenant in enumerate(s.tenants):
        if tenant.name == FABRIC_CHECK_QUEUE or tenant.namespace_name == FABRIC_CHECK_NAMESPACE:
            yield Problem(f"tenants[{i}]", f"{FABRIC_CHECK_QUEUE!r} and {FABRIC_CHECK_NAMESPACE!r} are the fabric "
                                           f"check's own queue and namespace: pick another name, {off}")
    jobs = {j.name for j in s.workloads}
    for pool in pools:
        at = f"nodePools[{s.node_pools.index(pool)}]"
        name = fabric_check_job(pool.name)
        if pool.mig_layout is not None:
            # The check requests whole GPUs (nvidia.com/gpu); with the mixed MIG strategy
            # (platform/gpu-operator/values.yaml) a MIG-partitioned GPU is advertised only as its slices.
            yield Problem(f"{at}.efa", f"the fabric check takes whole GPUs, which a pool with migLayout "
                                       f"{pool.mig_layout!r} never advertises: it would hang Pending; drop efa or "
                                       f"migLayout, {off}")
        if pool.max_size < 2:
            yield Problem(f"{at}.maxSize", f"the fabric check runs on 2 nodes of every EFA pool: must be at least 2, "
                                           f"{off}")
        if len(name) > _JOB_NAME_MAX:
            yield Problem(f"{at}.name", f"the fabric check's job {name!r} would be longer than {_JOB_NAME_MAX} "
                                        "characters: shorten the pool name")
        if name in jobs:
            yield Problem(f"{at}.name", f"workloads already has a job named {name!r}, the name of this pool's "
                                        "fabric check")


def _workloads(s: Settings, mig: MigCatalog, trainer_configs: Path) -> Iterator[Problem]:
    for name in _duplicates([j.name for j in s.workloads]):
        yield Problem("workloads", f"job name {name!r} is used more than once")
    if s.workloads and not s.addons.volcano.enabled:
        yield Problem("addons.volcano.enabled", "training jobs are Volcano jobs: must be true when workloads exist")
    tenants = {t.name for t in s.tenants}
    pools = {p.name: p for p in s.node_pools}
    for i, job in enumerate(s.workloads):
        at = f"workloads[{i}]"
        if job.tenant not in tenants:
            yield Problem(f"{at}.tenant", f"unknown tenant {job.tenant!r}; tenants: {_allowed(tenants) or 'none'}")
        if job.min_nodes > job.max_nodes:
            yield Problem(f"{at}.minNodes", f"{job.min_nodes} is greater than maxNodes {job.max_nodes}")
        if job.kind in ("smoke", "mig") and job.max_nodes != 1:
            yield Problem(f"{at}.maxNodes", f"a {job.kind!r} job runs on one node: must be 1")
        if job.max_nodes > 1 and not (s.is_aws and s.addons.rook_ceph.enabled):
            yield Problem(f"{at}.maxNodes", "a job over more than one node shares its checkpoints on a ReadWriteMany "
                                            "volume (CephFS): needs addons.rookCeph on an AWS stack, or maxNodes 1")
        if job.autoscaling.enabled and job.kind != "elastic":
            yield Problem(f"{at}.autoscaling.enabled", f"only 'elastic' jobs grow between minNodes and maxNodes, "
                                                       f"this is a {job.kind!r} job")
        yield from _trainer_config(f"{at}.trainerConfig", job.trainer_config, trainer_configs)
        yield from _network_topology(f"{at}.networkTopology", job)
        if job.dataset is not None and not s.addons.alluxio.enabled:
            yield Problem(f"{at}.dataset", "datasets are read through Alluxio: addons.alluxio.enabled must be true")
        if s.target == "local":
            if job.node_pool is not None:
                yield Problem(f"{at}.nodePool", "must be unset for target 'local'")
            if job.gpus_per_node or job.mig_profile:
                yield Problem(f"{at}.gpusPerNode", "the local stack is CPU only: must be 0 with no migProfile")
            yield from _shm_fits(f"{at}.shmSize", job, CPU_ONLY_MEMORY_BYTES)
            continue
        if job.node_pool not in pools:
            yield Problem(f"{at}.nodePool", f"unknown pool {job.node_pool!r}; GPU pools: "
                                            f"{_allowed(p.name for p in s.pools('gpu')) or 'none'}")
            continue
        yield from _job_on_pool(at, job, pools[job.node_pool], mig)


def _shm_fits(at: str, job: Job, memory_bytes: int) -> Iterator[Problem]:
    """/dev/shm is a memory-backed emptyDir, counted against the container's memory limit (Kubernetes docs,
    "emptyDir" with medium Memory): at the pod's whole limit nothing is left for the trainer itself."""
    if parse_quantity(job.shm_size) >= memory_bytes:
        yield Problem(at, f"{job.shm_size} leaves no memory in the pod's {memory_bytes // 2**20}Mi limit (its share "
                          "of the node, workloads/sizing.py): make it smaller")


def _network_topology(at: str, job: Job) -> Iterator[Problem]:
    topology = job.network_topology
    if topology is None:
        return
    if job.max_nodes == 1:
        yield Problem(at, "places the nodes of a multi-node job; this job runs on one node (maxNodes 1)")
    if topology.mode == "soft" and topology.highest_tier is not None:
        yield Problem(f"{at}.highestTier", "has no effect in soft mode: Volcano relaxes a soft job to the whole "
                                           "cluster (set mode: hard to bound it)")
    if topology.mode == "hard" and topology.highest_tier is None:
        yield Problem(f"{at}.highestTier", "is required in hard mode: without it Volcano applies no bound "
                                           "(JobInfo.IsHardTopologyMode needs a tier)")
    if topology.mode == "hard" and job.autoscaling.enabled:
        yield Problem(f"{at}.mode", "hard cannot grow: a running hard job's new pods fit only inside the HyperNode "
                                    "it already holds, while Karpenter launches their nodes anywhere in the pool "
                                    "(use soft with autoscaling)")


def co_located(pool: NodePool) -> bool:
    """Whether every node the pool can launch sits in one known part of the EC2 network: reserved-only capacity
    from Capacity Blocks (placed in EC2 UltraClusters), or one instance type in a cluster placement group."""
    blocks = bool(pool.capacity_reservations) and all(r.type == "capacity-block" for r in pool.capacity_reservations)
    if pool.capacity_types == ["reserved"] and blocks:
        return True
    return pool.placement_group and len(pool.instance_types) == 1 and "spot" not in pool.capacity_types


def _hard_topology_on_pool(at: str, job: Job, pool: NodePool) -> Iterator[Problem]:
    """A hard job whose nodes Karpenter may launch outside any one HyperNode stays Pending on empty nodes, which
    Karpenter removes after consolidateAfter and launches again: refuse it where the pool cannot promise."""
    topology = job.network_topology
    if topology is None or topology.mode != "hard":
        return
    types = _pool_types(pool)
    unlabelled = [t.name for t in types if t.network_layers == 0]
    if unlabelled:
        yield Problem(f"{at}.networkTopology.mode", f"hard on pool {pool.name!r}: {', '.join(unlabelled)} report no "
                                                    "EC2 network topology, so their nodes are in no HyperNode and the "
                                                    "job would never start")
    elif types and topology.highest_tier is not None and topology.highest_tier > min(t.network_layers for t in types):
        yield Problem(f"{at}.networkTopology.highestTier", f"{topology.highest_tier} is above the "
                                                           f"{min(t.network_layers for t in types)} network layers "
                                                           f"of pool {pool.name!r}")
    elif types and topology.highest_tier is not None and co_located(pool) and \
            topology.highest_tier < (top := min(t.network_layers for t in types)):
        # Tier 1 is one network-node-layer-3 node (Volcano label.go generateHyperNodeInfo @v1.15.1); EC2 places a
        # Capacity Block "close together inside Amazon EC2 UltraClusters" and a cluster placement group "close
        # together inside an Availability Zone" (EC2 User Guide), neither under one lower network node.
        yield Problem(f"{at}.networkTopology.highestTier", f"{topology.highest_tier} asks for one network node of a "
                                                           f"lower layer, which pool {pool.name!r} does not promise: "
                                                           f"only its top tier ({top}) is co-located by construction")
    if "spot" in pool.capacity_types:
        yield Problem(f"{at}.networkTopology.mode", f"hard on spot pool {pool.name!r}: a reclaimed node's replacement "
                                                    "may land outside the job's HyperNode and its pod never bind "
                                                    "(use soft)")
    elif not co_located(pool):
        yield Problem(f"{at}.networkTopology.mode", f"hard needs capacity known to be co-located; pool {pool.name!r} "
                                                    "has neither Capacity Blocks only (capacityTypes [reserved]) nor "
                                                    "one instance type in a placement group (use soft)")


# The spot path, timed (README, "Spot interruptions"): EC2 terminates a spot instance two minutes after its
# interruption warning (EC2 User Guide, spot-instance-termination-notices.html). The warning reaches the trainer as
# EventBridge -> SQS -> Karpenter (long poll, returns on arrival: pkg/providers/sqs/sqs.go @v1.14.1) -> NodeClaim
# deletion -> drain -> eviction -> the kubelet's SIGTERM -> torchrun -> the trainer; this budget is what that chain
# may take (Karpenter measures its part: karpenter_interruption_message_queue_duration_seconds, alerted on in
# platform/monitoring/rules/training.rules.yaml). What is left is the trainer's checkpoint grace.
SPOT_NOTICE_SECONDS = 120
INTERRUPTION_REACTION_SECONDS = 20


def _spot_grace(at: str, job: Job, pool: NodePool) -> Iterator[Problem]:
    budget = SPOT_NOTICE_SECONDS - INTERRUPTION_REACTION_SECONDS
    if "spot" in pool.capacity_types and job.checkpoint_grace_seconds > budget:
        yield Problem(f"{at}.checkpointGraceSeconds", f"{job.checkpoint_grace_seconds}s on spot pool {pool.name!r}: "
                                                      f"the {SPOT_NOTICE_SECONDS}s interruption notice leaves "
                                                      f"{budget}s once Karpenter has drained the pod "
                                                      f"({INTERRUPTION_REACTION_SECONDS}s allowed); a checkpoint "
                                                      "still running when the instance goes is lost")


def _job_on_pool(at: str, job: Job, pool: NodePool, mig: MigCatalog) -> Iterator[Problem]:
    if pool.role != "gpu":
        yield Problem(f"{at}.nodePool", f"{pool.name!r} is a {pool.role!r} pool; training runs on 'gpu' pools")
        return
    yield from _hard_topology_on_pool(at, job, pool)
    yield from _spot_grace(at, job, pool)
    if job.max_nodes > pool.max_size:
        yield Problem(f"{at}.maxNodes", f"{job.max_nodes} exceeds pool {pool.name!r} maxSize {pool.max_size}")
    types = _pool_types(pool)
    gpu_count = min((t.gpu_count for t in types), default=0)
    gpu = types[0].gpu if types else None
    # A layout the pool can't use is reported on the pool; here it simply offers no slices.
    usable = pool.mig_layout is not None and gpu is not None and mig.supports(pool.mig_layout, gpu)
    profiles = dict(mig.slices(pool.mig_layout, gpu)) if usable and pool.mig_layout and gpu else {}
    partitioned = bool(profiles)
    if job.kind == "mig":
        if job.gpus_per_node:
            yield Problem(f"{at}.gpusPerNode", "a 'mig' job requests a MIG slice (migProfile), not whole GPUs: "
                                               "must be 0")
        if job.mig_profile not in profiles:
            yield Problem(f"{at}.migProfile", f"{job.mig_profile!r} is not a slice of pool {pool.name!r} "
                                              f"(layout {pool.mig_layout}); slices: {_allowed(profiles) or 'none'}")
        elif types:
            node = smallest_type(pool.instance_types)
            yield from _shm_fits(f"{at}.shmSize", job,
                                 pod_share(node, 1 / (node.gpu_count * sum(profiles.values())))[1])
        return
    if job.mig_profile is not None:
        yield Problem(f"{at}.migProfile", f"only 'mig' jobs take a migProfile, this is a {job.kind!r} job")
    if not 1 <= job.gpus_per_node <= gpu_count:
        yield Problem(f"{at}.gpusPerNode", f"must be between 1 and {gpu_count} (GPUs per node in pool "
                                           f"{pool.name!r})")
    elif types:
        node = smallest_type(pool.instance_types)
        yield from _shm_fits(f"{at}.shmSize", job, pod_share(node, job.gpus_per_node / node.gpu_count)[1])
    if partitioned:
        yield Problem(f"{at}.nodePool", f"pool {pool.name!r} partitions its GPUs with MIG layout "
                                        f"{pool.mig_layout!r}; whole-GPU jobs need a pool without MIG")
    if pool.gpu_sharing is not None:
        yield Problem(f"{at}.nodePool", f"pool {pool.name!r} time-slices its GPUs (gpuSharing); a training job "
                                        "takes whole GPUs no other pod shares: use a pool without gpuSharing")
