"""EKS control plane, access, add-ons, node groups and the hand-over, checked on the rendered plans."""

from __future__ import annotations

import base64
import json

import pytest
from aws_plan import by_urn, cloud_and_karpenter, of_type, one, plan
from owned_stacks import FLEET, Stack, recording, stack_file, stack_settings, stacks_where
from trainyard.cloud.cluster import kubeconfig
from trainyard.cloud.userdata import NodeRole, render_user_data
from trainyard.config.model import AwsSettings, Settings
from trainyard.config.releases import KUBERNETES_RELEASES, KubernetesRelease
from trainyard.plan.placeholders import ACCOUNT
from trainyard.plan.recording import ResourceRecord
from trainyard.plan.runtime import StackFile, render

CLUSTER_ADMIN = "arn:aws:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy"
# The tests' fleet, then every AWS stack of stacks/.
AWS = stacks_where(lambda s: s.is_aws)


def _settings(stack: Stack) -> tuple[Settings, AwsSettings]:
    settings = stack_settings(stack)
    assert settings.aws is not None
    return settings, settings.aws


def _release(settings: Settings) -> KubernetesRelease:
    return KUBERNETES_RELEASES[settings.cluster.kubernetes_version]


def _private_api(file: StackFile) -> StackFile:
    """The stack with its API endpoint private, reached from a runner inside the VPC."""
    network = {**json.loads(file.values["trainyard:network"]), "publicAccessCidrs": []}
    deploy = {**json.loads(file.values["trainyard:deploy"]), "apiAccess": "private", "runnerCidrs": ["10.200.0.0/24"],
              "runner": {"labels": ["self-hosted", "trainyard-vpc"]}}
    return StackFile(file.stack, {**file.values, "trainyard:network": json.dumps(network),
                                  "trainyard:deploy": json.dumps(deploy)}, file.secret_keys)


@pytest.mark.parametrize("stack", AWS)
def test_cluster_for_cilium_with_api_auth_and_encrypted_secrets(stack: Stack) -> None:
    settings, aws = _settings(stack)
    rec = plan(*stack)
    cluster = one(rec, "aws:eks/cluster:Cluster")
    i = cluster.inputs
    assert i["name"] == f"trainyard-{stack[0]}"
    assert i["version"] == settings.cluster.kubernetes_version
    assert i["bootstrapSelfManagedAddons"] is False
    assert i["accessConfig"] == {"authenticationMode": "API", "bootstrapClusterCreatorAdminPermissions": False}
    assert i["vpcConfig"]["endpointPrivateAccess"] is True
    cidrs = settings.network.public_access_cidrs
    assert i["vpcConfig"]["endpointPublicAccess"] is bool(cidrs)
    assert i["vpcConfig"].get("publicAccessCidrs") == (cidrs or None)
    assert len(i["vpcConfig"]["subnetIds"]) == len(aws.availability_zones)
    assert i["kubernetesNetworkConfig"]["serviceIpv4Cidr"] == settings.network.service_cidr
    assert i["encryptionConfig"]["resources"] == ["secrets"]
    key_arn = i["encryptionConfig"]["provider"]["keyArn"]
    key = next(k for k in of_type(rec, "aws:kms/key:Key") if key_arn.endswith(k.name))
    assert key.inputs["enableKeyRotation"] is True and key.protect
    assert i["enabledClusterLogTypes"] == settings.cluster.log_types
    log_group = one(rec, "aws:cloudwatch/logGroup:LogGroup")
    assert log_group.inputs["name"] == f"/aws/eks/trainyard-{stack[0]}/cluster"
    assert log_group.urn in cluster.depends_on


def test_the_fleet_logs_the_default_control_plane_logs() -> None:
    cluster = one(plan(*FLEET), "aws:eks/cluster:Cluster")
    assert cluster.inputs["enabledClusterLogTypes"] == ["api", "audit", "authenticator"]


@pytest.mark.parametrize("stack", AWS)
def test_admin_access_entries_and_cluster_admin_policy(stack: Stack) -> None:
    settings, aws = _settings(stack)
    assert settings.deploy is not None
    rec = plan(*stack)
    admins = sorted({*aws.admin_principal_arns, settings.deploy.role_arn})
    entries = [e for e in of_type(rec, "aws:eks/accessEntry:AccessEntry") if e.inputs["type"] == "STANDARD"
               and e.name != "eks-preview"]
    assert sorted(e.inputs["principalArn"] for e in entries) == admins
    associations = [a for a in of_type(rec, "aws:eks/accessPolicyAssociation:AccessPolicyAssociation")
                    if a.name != "eks-preview"]
    assert sorted(a.inputs["principalArn"] for a in associations) == admins
    for a in associations:
        assert a.inputs["policyArn"] == CLUSTER_ADMIN
        assert a.inputs["accessScope"] == {"type": "cluster"}
    provider = one(rec, "pulumi:providers:kubernetes")
    # Opt-in only for a documented teardown (PULUMI_K8S_DELETE_UNREACHABLE), never in the program.
    assert "deleteUnreachable" not in provider.inputs
    assert {a.urn for a in associations} <= set(provider.depends_on)


def test_the_fleets_admins_are_its_admin_principals_and_deploy_role() -> None:
    entries = of_type(plan(*FLEET), "aws:eks/accessEntry:AccessEntry")
    assert sorted(e.inputs["principalArn"] for e in entries if e.inputs["type"] == "STANDARD"
                  and e.name != "eks-preview") == [
        "arn:aws:iam::111122223333:role/platform-admins", "arn:aws:iam::111122223333:role/trainyard-deploy-fleet"]


def test_public_endpoint_off_without_cidrs() -> None:
    vpc = one(render(_private_api(stack_file(FLEET)), cloud_and_karpenter), "aws:eks/cluster:Cluster").inputs[
        "vpcConfig"]
    assert vpc["endpointPublicAccess"] is False
    assert vpc["endpointPrivateAccess"] is True
    assert "publicAccessCidrs" not in vpc


def test_kubeconfig_uses_a_short_lived_exec_token() -> None:
    config = json.loads(kubeconfig("c", "https://x", "Y2E=", "us-west-2"))
    user = config["users"][0]["user"]
    assert set(user) == {"exec"}
    assert user["exec"]["command"] == "aws"
    assert user["exec"]["args"] == ["eks", "get-token", "--cluster-name", "c", "--region", "us-west-2",
                                    "--output", "json"]


def test_full_program_exports_kubeconfig_as_secret() -> None:
    rec = recording(FLEET)
    assert rec.outputs["kubeconfig"] == "[secret]"
    assert rec.outputs["clusterName"] == "trainyard-fleet"
    assert rec.outputs["checkpointBucket"] == f"trainyard-fleet-checkpoints-{ACCOUNT}"


@pytest.mark.parametrize("stack", AWS)
def test_pod_identity_agent_before_nodes_and_others_left_for_the_platform(stack: Stack) -> None:
    rec = plan(*stack)
    addons = {a.inputs["addonName"]: a for a in of_type(rec, "aws:eks/addon:Addon")}
    assert set(addons) == {"eks-pod-identity-agent"}
    assert addons["eks-pod-identity-agent"].inputs["addonVersion"] == _release(_settings(stack)[0]).pod_identity_agent
    # Installed with the control plane, before any node (Cilium needs it, and the nodes need Cilium).
    groups = {g.urn for g in of_type(rec, "aws:eks/nodeGroup:NodeGroup")}
    component = by_urn(rec, addons["eks-pod-identity-agent"].parent or "")
    assert groups and not groups & {*component.depends_on, *addons["eks-pod-identity-agent"].depends_on}


def test_after_cni_addons_are_pinned() -> None:
    from trainyard.cloud.addons import after_cni_addons
    settings = stack_settings(FLEET)
    release = _release(settings)
    args = after_cni_addons(settings, "trainyard-fleet")
    assert {p.name: p.version for p in args.addons} == {
        "coredns": release.coredns, "aws-ebs-csi-driver": release.ebs_csi_driver,
        "snapshot-controller": release.snapshot_controller,
        # addons.gpuHealth.repair (default on): the node conditions Karpenter's node repair acts on.
        "eks-node-monitoring-agent": release.node_monitoring_agent}


@pytest.mark.parametrize("stack", AWS)
def test_managed_node_groups(stack: Stack) -> None:
    settings, aws = _settings(stack)
    rec = plan(*stack)
    groups = {g.name: g for g in of_type(rec, "aws:eks/nodeGroup:NodeGroup")}
    pools = [p for p in settings.node_pools if p.role != "gpu"]  # GPU nodes are Karpenter's
    assert set(groups) == {f"{p.name}-group" for p in pools}
    for pool in pools:
        g = groups[f"{pool.name}-group"].inputs
        assert g["nodeGroupName"] == f"trainyard-{stack[0]}-{pool.name}"
        assert g["amiType"] == "AL2023_x86_64_STANDARD"
        assert g["releaseVersion"] == _release(settings).node_group_release
        assert g["capacityType"] == {"on-demand": "ON_DEMAND", "spot": "SPOT"}[pool.capacity_types[0]]
        assert (g["scalingConfig"]["minSize"], g["scalingConfig"]["desiredSize"],
                g["scalingConfig"]["maxSize"]) == (pool.min_size, pool.desired_size, pool.max_size)
        assert g["updateConfig"] == {"maxUnavailable": 1}
        assert g["labels"]["trainyard.io/role"] == pool.role
        assert g["labels"]["trainyard.io/pool"] == pool.name
        assert len(g["subnetIds"]) == len(pool.zones or aws.availability_zones)  # spread over its zones
        # Cilium's EKS requirements: managed groups tainted agent-not-ready until its agent runs on the node
        # (docs.cilium.io installation/requirements-eks.rst); its operator removes it (removeNodeTaints).
        assert g["taints"][-1] == {"key": "node.cilium.io/agent-not-ready", "value": "true", "effect": "NO_EXECUTE"}


def test_the_fleets_node_groups() -> None:
    groups = {g.name: g.inputs for g in of_type(plan(*FLEET), "aws:eks/nodeGroup:NodeGroup")}
    assert {name: (g["scalingConfig"]["minSize"], g["scalingConfig"]["desiredSize"], g["scalingConfig"]["maxSize"],
                   g["capacityType"], len(g["subnetIds"])) for name, g in groups.items()} == {
        "system-group": (3, 3, 6, "ON_DEMAND", 3), "storage-group": (3, 3, 6, "ON_DEMAND", 3)}
    cilium = {"key": "node.cilium.io/agent-not-ready", "value": "true", "effect": "NO_EXECUTE"}
    assert groups["storage-group"]["taints"] == [
        {"key": "trainyard.io/role", "value": "storage", "effect": "NO_SCHEDULE"}, cilium]
    assert groups["system-group"]["taints"] == [cilium]


@pytest.mark.parametrize("stack", AWS)
def test_launch_templates_imdsv2_encrypted_and_user_data(stack: Stack) -> None:
    rec = plan(*stack)
    for pool in (p for p in _settings(stack)[0].node_pools if p.role != "gpu"):
        lt = one(rec, "aws:ec2/launchTemplate:LaunchTemplate", f"{pool.name}-lt").inputs
        assert lt["metadataOptions"] == {"httpEndpoint": "enabled", "httpTokens": "required",
                                         "httpPutResponseHopLimit": 1}
        (root,) = lt["blockDeviceMappings"]
        assert root["deviceName"] == "/dev/xvda"
        assert root["ebs"]["encrypted"] == "true" and root["ebs"]["volumeType"] == "gp3"
        assert base64.b64decode(lt["userData"]).decode() == render_user_data(NodeRole(pool.role))
        assert len(lt["vpcSecurityGroupIds"]) == 2
        group = one(rec, "aws:eks/nodeGroup:NodeGroup", f"{pool.name}-group").inputs
        assert group["launchTemplate"]["version"] == "1"


@pytest.mark.parametrize("stack", AWS)
def test_node_security_group_is_discoverable_and_self_referencing(stack: Stack) -> None:
    rec = plan(*stack)
    sg = one(rec, "aws:ec2/securityGroup:SecurityGroup", "eks-nodes")
    assert sg.inputs["tags"]["karpenter.sh/discovery"] == f"trainyard-{stack[0]}"
    sg_id = f"{sg.name}-id"
    ingress = of_type(rec, "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule")
    egress = of_type(rec, "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule")
    # EFA needs all-protocol traffic to the same group in both directions.
    for rules in (ingress, egress):
        assert any(r.inputs["securityGroupId"] == sg_id and r.inputs.get("referencedSecurityGroupId") == sg_id
                   and r.inputs["ipProtocol"] == "-1" for r in rules)


@pytest.mark.parametrize("stack", AWS)
def test_deploy_role_is_a_cluster_admin(stack: Stack) -> None:
    """Issue 9 item 13: the role CI assumes (deploy.roleArn) gets an access entry with the admin policy."""
    settings, _ = _settings(stack)
    assert settings.deploy is not None
    rec = plan(*stack)
    role = settings.deploy.role_arn
    entry = one(rec, "aws:eks/accessEntry:AccessEntry", "eks-deploy")
    assert entry.inputs["principalArn"] == role and entry.inputs["type"] == "STANDARD"
    association = one(rec, "aws:eks/accessPolicyAssociation:AccessPolicyAssociation", "eks-deploy")
    assert association.inputs["principalArn"] == role
    assert association.inputs["policyArn"] == CLUSTER_ADMIN
    assert association.inputs["accessScope"] == {"type": "cluster"}
    assert entry.urn in association.depends_on
    # Nothing in the cluster is created before the deploying role may create it.
    assert association.urn in one(rec, "pulumi:providers:kubernetes").depends_on


def test_private_api_access_opens_https_from_the_runner_only() -> None:
    rec = render(_private_api(stack_file(FLEET)), cloud_and_karpenter)
    vpc = one(rec, "aws:eks/cluster:Cluster").inputs["vpcConfig"]
    assert vpc["endpointPublicAccess"] is False
    rule = one(rec, "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule", "eks-api-from-runner-0").inputs
    assert (rule["cidrIpv4"], rule["ipProtocol"], rule["fromPort"], rule["toPort"]) == ("10.200.0.0/24", "tcp", 443,
                                                                                       443)
    assert not [r for r in of_type(plan(*FLEET), "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule")
                if r.name.startswith("eks-api-from-runner")]


def _preview(stack: Stack) -> tuple[ResourceRecord, ResourceRecord, ResourceRecord]:
    rec = plan(*stack)
    return (one(rec, "aws:iam/role:Role", "eks-preview"), one(rec, "aws:eks/accessEntry:AccessEntry", "eks-preview"),
            one(rec, "aws:eks/accessPolicyAssociation:AccessPolicyAssociation", "eks-preview"))


@pytest.mark.parametrize("stack", stacks_where(lambda s: s.is_aws and s.deploy is not None
                                               and s.deploy.preview is not None))
def test_previews_get_their_own_read_only_role_trusted_for_pull_requests_only(stack: Stack) -> None:
    """Issue 18 item 4: pull-request code never holds the deploy role; its role reads, and only pull_request jobs
    of the stack's repository may assume it (docs.github.com, "About security hardening with OpenID Connect":
    subject repo:<owner>/<name>:pull_request; a job in an environment gets ...:environment:<name>)."""
    settings = stack_settings(stack)
    assert settings.deploy is not None and settings.deploy.preview is not None
    role, entry, association = _preview(stack)
    assert role.inputs["name"] == f"trainyard-{stack[0]}-preview"
    account = settings.deploy.role_arn.split(":")[4]
    (statement,) = json.loads(role.inputs["assumeRolePolicy"])["Statement"]
    assert statement == {
        "Effect": "Allow", "Action": "sts:AssumeRoleWithWebIdentity",
        "Principal": {"Federated": f"arn:aws:iam::{account}:oidc-provider/token.actions.githubusercontent.com"},
        "Condition": {"StringEquals": {
            "token.actions.githubusercontent.com:aud": "sts.amazonaws.com",
            "token.actions.githubusercontent.com:sub": f"repo:{settings.deploy.preview.repository}:pull_request"}}}
    rec = plan(*stack)
    grants = [r for r in rec.resources if r.type in ("aws:iam/rolePolicyAttachment:RolePolicyAttachment",
                                                      "aws:iam/rolePolicy:RolePolicy")
              and r.inputs.get("role") == role.inputs["name"]]
    assert [(g.type, g.inputs.get("policyArn")) for g in grants] == [
        ("aws:iam/rolePolicyAttachment:RolePolicyAttachment", "arn:aws:iam::aws:policy/job-function/ViewOnlyAccess")]
    # Its access entry views; the admin policy stays with the deploy role and the admins.
    assert entry.inputs["principalArn"] == association.inputs["principalArn"] != settings.deploy.role_arn
    assert entry.inputs["principalArn"].endswith(f":role/trainyard-{stack[0]}-preview")
    assert association.inputs["policyArn"] == "arn:aws:eks::aws:cluster-access-policy/AmazonEKSViewPolicy"
    assert association.inputs["accessScope"] == {"type": "cluster"} and entry.urn in association.depends_on


def test_a_stack_without_previews_has_no_preview_role() -> None:
    fleet = stack_file(FLEET)
    deploy = {k: v for k, v in json.loads(fleet.values["trainyard:deploy"]).items() if k != "preview"}
    rec = render(StackFile(fleet.stack, {**fleet.values, "trainyard:deploy": json.dumps(deploy)}, fleet.secret_keys),
                 cloud_and_karpenter)
    assert not [r for r in rec.resources if r.name.startswith("eks-preview")]
