"""The AWS target: network, buckets, EKS, managed node groups, IAM and Karpenter's AWS side → ClusterContext."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import pulumi
import pulumi_aws as aws

from trainyard import names
from trainyard.cloud.access import TenantAccess, TenantAccessArgs, principal_groups
from trainyard.cloud.addons import EksAddons, before_cni_addons
from trainyard.cloud.buckets import Buckets, BucketsArgs
from trainyard.cloud.cluster import EksCluster, EksClusterArgs
from trainyard.cloud.context import ClusterContext, ControlPlane, KarpenterFacts, PoolFacts
from trainyard.cloud.database import TrackingDatabase, TrackingDatabaseArgs
from trainyard.cloud.iam import (
    EBS_CSI_MANAGED_POLICY,
    IRSA_AUDIENCE,
    NODE_MANAGED_POLICIES,
    PodIdentityRole,
    PodIdentityRoleArgs,
    ServiceRole,
    ServiceRoleArgs,
    WebIdentityRole,
    WebIdentityRoleArgs,
    alluxio_policy,
    cilium_operator_policy,
    cluster_owned_tag,
    trainer_policy,
)
from trainyard.cloud.karpenter import KarpenterInfra, KarpenterInfraArgs
from trainyard.cloud.naming import PREVIEW_ROLE, base_tags, cluster_name, physical
from trainyard.cloud.network import Network, NetworkArgs
from trainyard.cloud.node_groups import ManagedNodeGroup, ManagedNodeGroupArgs
from trainyard.cloud.userdata import NodeRole, render_user_data
from trainyard.config.instance_types import INSTANCE_TYPES
from trainyard.config.mig import gpu_sharing, load_mig_catalog
from trainyard.config.model import NodePool, Settings, Taint
from trainyard.config.releases import KUBERNETES_RELEASES

# Only Ceph (which tolerates `trainyard.io/role`) may land on storage nodes: their CPU and NVMe belong to OSDs.
STORAGE_TAINT = Taint.model_validate({"key": names.ROLE_LABEL, "value": "storage", "effect": "NoSchedule"})
GPU_TAINT = Taint.model_validate({"key": names.GPU_TAINT_KEY, "value": "true", "effect": "NoSchedule"})
# Held from boot until the GPU health check passes (platform/gpu_health.py); NoSchedule, so nothing running is evicted.
GPU_HEALTH_TAINT = Taint.model_validate({"key": names.GPU_HEALTH_TAINT_KEY, "value": "pending",
                                         "effect": "NoSchedule"})
# On the managed groups' nodes from registration until Cilium's operator sees a healthy agent there and removes it
# (Cilium's EKS requirements, docs.cilium.io installation/requirements-eks.rst: managedNodeGroups tainted
# node.cilium.io/agent-not-ready=true:NoExecute); Karpenter's pools carry it as a startup taint.
CILIUM_AGENT_NOT_READY = Taint.model_validate({"key": names.CILIUM_AGENT_NOT_READY_TAINT_KEY, "value": "true",
                                               "effect": "NoExecute"})


def _sharing(pool: NodePool) -> str | None:
    gpu = INSTANCE_TYPES[pool.instance_types[0]].gpu if pool.instance_types[0] in INSTANCE_TYPES else None
    return gpu_sharing(pool.mig_layout, pool.gpu_sharing, gpu, load_mig_catalog())


def pool_labels(pool: NodePool) -> dict[str, str]:
    labels = {**pool.labels, names.ROLE_LABEL: pool.role, names.POOL_LABEL: pool.name}
    if pool.mig_layout is not None:
        labels[names.MIG_CONFIG_LABEL] = pool.mig_layout
    if sharing := _sharing(pool):
        labels[names.GPU_SHARING_KEY] = sharing
    if pool.gpu_sharing == "time-sliced":
        # The device plugin's config of that name (platform/gpu-operator/values.yaml): replicas as *.shared.
        labels[names.DEVICE_PLUGIN_CONFIG_LABEL] = names.TIME_SLICED_CONFIG
    return labels


def pool_taints(pool: NodePool) -> tuple[Taint, ...]:
    implied = {"storage": (STORAGE_TAINT,), "gpu": (GPU_TAINT,), "system": ()}[pool.role]
    if pool.role == "gpu" and (sharing := _sharing(pool)):
        # Pods must tolerate sharing to land here: a whole-GPU pod (or Karpenter launching for one) never does.
        implied += (Taint.model_validate({"key": names.GPU_SHARING_KEY, "value": sharing, "effect": "NoSchedule"}),)
    configured = tuple(pool.taints)
    return configured + tuple(t for t in implied if all(c.key != t.key for c in configured))


def build_aws(settings: Settings) -> ControlPlane:
    assert settings.aws is not None and settings.deploy is not None
    region = settings.aws.region
    zones = tuple(settings.aws.availability_zones)
    name = cluster_name(settings)
    tags = base_tags(settings)
    release = KUBERNETES_RELEASES[settings.cluster.kubernetes_version]

    # The program's AWS provider, made from the validated region and accounts, so no resource falls back to the
    # default provider and its `aws:region` (rules.py refuses a stack where the two differ). An explicit provider
    # reads no `aws:*` config (pulumi/pulumi-aws#1307), so config/load.py refuses those keys. Moving resources from
    # the default provider to this one with the same config replaces nothing: the engine asks DiffConfig
    # (pulumi/pulumi#18509).
    provider = aws.Provider("aws", region=region, allowed_account_ids=list(settings.aws.allowed_account_ids) or None)
    on_aws = pulumi.ResourceOptions(providers=[provider])
    network = Network("network", NetworkArgs(
        name_prefix=name, cluster_name=name, vpc_cidr=settings.network.vpc_cidr, zones=zones,
        nat_per_zone=settings.network.nat_gateways == "perAz", region=region, tags=tags), opts=on_aws)
    account_id = aws.get_caller_identity_output(opts=pulumi.InvokeOutputOptions(provider=provider)).account_id
    buckets = Buckets("buckets", BucketsArgs(
        name_prefix=name, account_id=account_id, protect=settings.protect,
        force_destroy=settings.buckets.force_destroy,
        checkpoint_noncurrent_days=settings.buckets.checkpoint_noncurrent_days, tags=tags), opts=on_aws)
    eks = EksCluster("eks", EksClusterArgs(
        cluster_name=name, kubernetes_version=settings.cluster.kubernetes_version, region=region,
        vpc_id=network.vpc.id, subnet_ids=network.private_subnet_ids, service_cidr=settings.network.service_cidr,
        public_access_cidrs=tuple(settings.network.public_access_cidrs),
        log_types=tuple(settings.cluster.log_types), admin_principal_arns=tuple(settings.aws.admin_principal_arns),
        deploy_role_arn=settings.deploy.role_arn, runner_cidrs=tuple(settings.deploy.runner_cidrs),
        preview_repository=settings.deploy.preview.repository if settings.deploy.preview else None,
        preview_role_name=physical(settings, PREVIEW_ROLE),
        protect=settings.protect, tags=tags), opts=on_aws)
    cluster = eks.cluster

    # The pod identity agent is a host-network DaemonSet: with no node yet it is healthy at zero pods, and it must
    # be there before Cilium, whose operator gets its EC2 rights through Pod Identity (terraform-aws-eks installs
    # it `before_compute` for the same reason: github.com/terraform-aws-modules/terraform-aws-eks, README "addons").
    early_addons = EksAddons("eks-early-addons", before_cni_addons(settings, cluster.name), opts=on_aws)

    def identity(logical: str, role: str, accounts: tuple[names.ServiceAccountRef, ...],
                 policy: dict[str, object] | None = None, managed: tuple[str, ...] = ()) -> PodIdentityRole:
        return PodIdentityRole(logical, PodIdentityRoleArgs(
            cluster_name=cluster.name, cluster_arn=cluster.arn, role_name=physical(settings, role),
            service_accounts=accounts,
            policy=policy, managed_policy_arns=managed, tags=tags), opts=on_aws)

    datasets, checkpoints = buckets.datasets, buckets.checkpoints

    def tenant_accounts(account: str) -> tuple[names.ServiceAccountRef, ...]:
        return tuple(names.ServiceAccountRef(t.namespace_name, account) for t in settings.tenants)

    # What a tenant's pods may do in S3: write under its own namespace prefix of the checkpoint bucket (checkpoints,
    # MLflow and Argo artifacts; the session's namespace tag scopes it) and read the datasets.
    tenant_policy = trainer_policy(checkpoints.bucket.arn, checkpoints.kms.key.arn, datasets.bucket.arn,
                                   datasets.kms.key.arn)
    identities = [
        identity("cilium-operator", "cilium-operator", (names.CILIUM_OPERATOR,),
                 cilium_operator_policy(region, name)),
        identity("ebs-csi", "ebs-csi", (names.EBS_CSI,), managed=(EBS_CSI_MANAGED_POLICY,)),
        # No permissions: the bring-up check only proves that credentials reach a pod through Cilium.
        identity("pod-identity-check", "pod-identity-check", (names.POD_IDENTITY_CHECK,)),
        identity("trainer", "trainer", tenant_accounts(names.TRAINER_SERVICE_ACCOUNT), tenant_policy),
    ]
    if settings.addons.argo_workflows.enabled:
        # The pipeline's steps (and Argo's executor saving their artifacts) as the tenant's workflow account.
        identities.append(identity("workflow", "workflow", tenant_accounts(names.WORKFLOW_SERVICE_ACCOUNT),
                                   tenant_policy))
    tracking = None
    if settings.addons.mlflow.enabled:
        # No AWS role for the server: it would read every tenant's artifacts for whoever asks it (MLflow has no
        # per-tenant access here: platform/mlflow.py), so clients read and write their own prefix themselves.
        database = settings.addons.mlflow.database
        tracking = TrackingDatabase("tracking-db", TrackingDatabaseArgs(
            name=physical(settings, "mlflow"), settings=database,
            multi_az=database.multi_az if database.multi_az is not None else settings.environment == "prod",
            vpc_id=network.vpc.id, subnet_ids=network.private_subnet_ids,
            node_security_group_id=eks.node_security_group.id, protect=settings.protect, region=region,
            tags=tags), opts=on_aws)
    if principals := principal_groups(settings.tenants):
        TenantAccess("tenant-access", TenantAccessArgs(cluster_name=cluster.name, principals=principals, tags=tags),
                     opts=on_aws)

    # Alluxio's S3 client is the AWS Java SDK v1 of Fluid 1.0.8's default image (alluxio/alluxio-dev:2.9.0, from
    # 2022), older than the first v1 release that reads Pod Identity credentials (1.12.746, EKS user guide
    # "pod-id-minimum-sdk"); its default chain does read web identity tokens (aws-java-sdk-sts, Alluxio PR 13173).
    # So Alluxio alone gets its role through IRSA: the cluster's OIDC provider and a role trusted for its account.
    issuer = cluster.identities[0].oidcs[0].issuer.apply(lambda url: url or "")
    oidc = aws.iam.OpenIdConnectProvider("eks-oidc", url=issuer, client_id_lists=[IRSA_AUDIENCE], tags=tags,
                                         opts=on_aws)
    dataset_cache = WebIdentityRole("alluxio", WebIdentityRoleArgs(
        provider_arn=oidc.arn, issuer=issuer, role_name=physical(settings, "alluxio"),
        service_accounts=(names.ALLUXIO,),
        policy=alluxio_policy(datasets.bucket.arn, datasets.kms.key.arn, settings.addons.alluxio.dataset_prefix),
        tags=tags), opts=on_aws)

    gpu_pools = settings.pools("gpu")
    karpenter = KarpenterInfra("karpenter", KarpenterInfraArgs(
        cluster_name=name, cluster=cluster, region=region,
        placement_group_pools=tuple(p.name for p in gpu_pools if p.placement_group), tags=tags), opts=on_aws)

    gpu_user_data = render_user_data(NodeRole.GPU)
    pools: list[PoolFacts] = []
    for pool in settings.node_pools:
        types = [INSTANCE_TYPES[t] for t in pool.instance_types]
        facts = PoolFacts(
            name=pool.name, role=pool.role, node_labels=pool_labels(pool), taints=pool_taints(pool),
            zones=tuple(pool.zones or zones), gpu=types[0].gpu, gpus_per_node=min(t.gpu_count for t in types),
            mig_layout=pool.mig_layout, gpu_sharing=pool.gpu_sharing,
            efa_interfaces=min(t.efa_interfaces for t in types) if pool.efa else 0,
            nvme_devices=min(t.nvme_devices for t in types), root_volume_gib=pool.root_volume_gib)
        if pool.role == "gpu":
            placement = karpenter.placement_groups.get(pool.name)
            facts = dataclasses.replace(
                facts, startup_taints=(GPU_HEALTH_TAINT,) if settings.addons.gpu_health.enabled else (),
                instance_types=tuple(pool.instance_types), capacity_types=tuple(pool.capacity_types),
                max_nodes=pool.max_size, user_data=gpu_user_data,
                placement_group=placement.name if placement is not None else None,
                capacity_reservations=tuple(r.id for r in pool.capacity_reservations),
                capacity_blocks_only=pool.capacity_types == ["reserved"] and bool(pool.capacity_reservations)
                and all(r.type == "capacity-block" for r in pool.capacity_reservations))
        pools.append(facts)

    ready: tuple[pulumi.Resource, ...] = (
        *eks.access, karpenter.node_access, *early_addons.addons.values(),
        *(a for i in identities for a in i.associations), *dataset_cache.grants,
    )
    # Plain strings where the physical name is known up front, so the plan shows real names in Helm values;
    # ordering comes from `ready` (access entries and pod identity associations depend on these).
    context = ClusterContext(
        name=name,
        provider=eks.provider,
        cluster=cluster,
        api_server_host=eks.api_server_host,
        api_server_port=443,
        pools=tuple(pools),
        region=region,
        kubeconfig=eks.kubeconfig,
        dataset_bucket=datasets.bucket.bucket,
        checkpoint_bucket=checkpoints.bucket.bucket,
        dataset_cache_role_arn=dataset_cache.role.arn,
        tracking_database=tracking.facts if tracking is not None else None,
        karpenter=KarpenterFacts(interruption_queue=karpenter.queue_name, node_role=karpenter.node_role_name,
                                 discovery_tag=name, ami_alias=release.karpenter_ami_alias),
        aws_provider=provider,
        ready=ready,
    )
    return ControlPlane(context, functools.partial(_join_nodes, settings, context, network, eks, on_aws))


def _join_nodes(settings: Settings, context: ClusterContext, network: Network, eks: EksCluster,
                on_aws: pulumi.ResourceOptions, after: Sequence[pulumi.Resource]) -> ClusterContext:
    """The managed node groups, created once the CNI exists (`after`), and a context whose `ready` includes them.

    With no CNI a node stays NotReady ("cni plugin not initialized") and a managed node group ends CREATE_FAILED
    (terraform-aws-modules/terraform-aws-eks issues 3106, 3160, 3446: install the CNI between control plane and
    nodes). Cilium's EKS requirements ask for the groups to be tainted node.cilium.io/agent-not-ready=true:NoExecute
    so that pods start only once Cilium manages the node (docs.cilium.io, installation/requirements-eks.rst); its
    operator removes the taint from a node whose agent is healthy (cilium 1.20.0 values.yaml, removeNodeTaints).
    """
    tags = base_tags(settings)
    zones = tuple(settings.aws.availability_zones) if settings.aws is not None else ()
    release = KUBERNETES_RELEASES[settings.cluster.kubernetes_version]
    cluster = eks.cluster
    node_role = ServiceRole("managed-nodes", ServiceRoleArgs(physical(settings, "managed-node"),
                                                             "ec2.amazonaws.com", NODE_MANAGED_POLICIES, tags),
                            opts=on_aws)
    groups: dict[str, ManagedNodeGroup] = {}
    for pool in settings.node_pools:
        if pool.role == "gpu":
            continue
        pool_zones = tuple(pool.zones or zones)
        groups[pool.name] = ManagedNodeGroup(pool.name, ManagedNodeGroupArgs(
            cluster_name=cluster.name, group_name=physical(settings, pool.name), role=NodeRole(pool.role),
            node_role_arn=node_role.role.arn,
            subnet_ids=[network.private_subnets_by_zone[z] for z in pool_zones],
            security_group_ids=[cluster.vpc_config.cluster_security_group_id, eks.node_security_group.id],
            instance_types=tuple(pool.instance_types), capacity_type=pool.capacity_types[0],
            min_size=pool.min_size, desired_size=pool.desired_size, max_size=pool.max_size,
            root_volume_gib=pool.root_volume_gib, release_version=release.node_group_release,
            labels=pool_labels(pool), taints=(*pool_taints(pool), CILIUM_AGENT_NOT_READY), tags=tags,
            node_tags=dict([cluster_owned_tag(cluster_name(settings))])),
            opts=pulumi.ResourceOptions.merge(on_aws, pulumi.ResourceOptions(depends_on=[*node_role.attachments,
                                                                                         *after])))
    return dataclasses.replace(context, ready=(*context.ready, *(g.node_group for g in groups.values())))
