"""EKS control plane, access, add-ons, node groups and the hand-over, checked on the rendered plans."""

from __future__ import annotations

import base64
import json

import pytest
from aws_plan import by_urn, cloud_and_karpenter, of_type, one, plan
from trainyard.cloud.cluster import kubeconfig
from trainyard.cloud.userdata import NodeRole, render_user_data
from trainyard.config.releases import KUBERNETES_RELEASES
from trainyard.plan.placeholders import ACCOUNT
from trainyard.plan.recording import ResourceRecord
from trainyard.plan.runtime import StackFile, read_stack, render, settings_of

RELEASE = KUBERNETES_RELEASES["1.34"]


@pytest.mark.parametrize("stack", ["staging", "prod"])
def test_cluster_for_cilium_with_api_auth_and_encrypted_secrets(stack: str) -> None:
    rec = plan(stack)
    cluster = one(rec, "aws:eks/cluster:Cluster")
    i = cluster.inputs
    assert i["name"] == f"trainyard-{stack}"
    assert i["version"] == "1.34"
    assert i["bootstrapSelfManagedAddons"] is False
    assert i["accessConfig"] == {"authenticationMode": "API", "bootstrapClusterCreatorAdminPermissions": False}
    assert i["vpcConfig"]["endpointPrivateAccess"] is True
    assert i["vpcConfig"]["endpointPublicAccess"] is True
    assert i["vpcConfig"]["publicAccessCidrs"] == ["52.34.18.0/28"]
    assert len(i["vpcConfig"]["subnetIds"]) == 3
    assert i["kubernetesNetworkConfig"]["serviceIpv4Cidr"] == "172.20.0.0/16"
    assert i["encryptionConfig"]["resources"] == ["secrets"]
    key_arn = i["encryptionConfig"]["provider"]["keyArn"]
    key = next(k for k in of_type(rec, "aws:kms/key:Key") if key_arn.endswith(k.name))
    assert key.inputs["enableKeyRotation"] is True and key.protect
    expected_logs = {"staging": ["api", "audit", "authenticator"],
                     "prod": ["api", "audit", "authenticator", "controllerManager", "scheduler"]}[stack]
    assert i["enabledClusterLogTypes"] == expected_logs
    log_group = one(rec, "aws:cloudwatch/logGroup:LogGroup")
    assert log_group.inputs["name"] == f"/aws/eks/trainyard-{stack}/cluster"
    assert log_group.urn in cluster.depends_on


def test_admin_access_entries_and_cluster_admin_policy() -> None:
    rec = plan("prod")
    admins = ["arn:aws:iam::111122223333:role/platform-admins", "arn:aws:iam::111122223333:role/platform-breakglass",
              "arn:aws:iam::111122223333:role/trainyard-deploy-prod"]
    entries = [e for e in of_type(rec, "aws:eks/accessEntry:AccessEntry") if e.inputs["type"] == "STANDARD"
               and e.name != "eks-preview"]
    assert sorted(e.inputs["principalArn"] for e in entries) == admins
    associations = [a for a in of_type(rec, "aws:eks/accessPolicyAssociation:AccessPolicyAssociation")
                    if a.name != "eks-preview"]
    assert sorted(a.inputs["principalArn"] for a in associations) == admins
    for a in associations:
        assert a.inputs["policyArn"] == "arn:aws:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy"
        assert a.inputs["accessScope"] == {"type": "cluster"}
    provider = one(rec, "pulumi:providers:kubernetes")
    # Opt-in only for a documented teardown (PULUMI_K8S_DELETE_UNREACHABLE), never in the program.
    assert "deleteUnreachable" not in provider.inputs
    assert {a.urn for a in associations} <= set(provider.depends_on)


def test_public_endpoint_off_without_cidrs() -> None:
    dev = read_stack("dev")
    network = {**json.loads(dev.values["trainyard:network"]), "publicAccessCidrs": []}
    deploy = {**json.loads(dev.values["trainyard:deploy"]), "apiAccess": "private", "runnerCidrs": ["10.200.0.0/24"],
              "runner": {"labels": ["self-hosted", "trainyard-vpc"]}}
    private = StackFile("dev", {**dev.values, "trainyard:network": json.dumps(network),
                                "trainyard:deploy": json.dumps(deploy)}, dev.secret_keys)
    vpc = one(render(private, cloud_and_karpenter), "aws:eks/cluster:Cluster").inputs["vpcConfig"]
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
    rec = render(read_stack("staging"))
    assert rec.outputs["kubeconfig"] == "[secret]"
    assert rec.outputs["clusterName"] == "trainyard-staging"
    assert rec.outputs["checkpointBucket"] == f"trainyard-staging-checkpoints-{ACCOUNT}"


def test_pod_identity_agent_before_nodes_and_others_left_for_the_platform() -> None:
    rec = plan("prod")
    addons = {a.inputs["addonName"]: a for a in of_type(rec, "aws:eks/addon:Addon")}
    assert set(addons) == {"eks-pod-identity-agent"}
    assert addons["eks-pod-identity-agent"].inputs["addonVersion"] == RELEASE.pod_identity_agent
    # Installed with the control plane, before any node (Cilium needs it, and the nodes need Cilium).
    groups = {g.urn for g in of_type(rec, "aws:eks/nodeGroup:NodeGroup")}
    component = by_urn(rec, addons["eks-pod-identity-agent"].parent or "")
    assert groups and not groups & {*component.depends_on, *addons["eks-pod-identity-agent"].depends_on}


def test_after_cni_addons_are_pinned() -> None:
    from trainyard.cloud.addons import after_cni_addons
    from trainyard.config.load import parse_settings
    values = {k.split(":", 1)[1]: json.loads(v) if v[:1] in "[{" else v
              for k, v in read_stack("prod").values.items()}
    args = after_cni_addons(parse_settings("trainyard", "prod", values), "trainyard-prod")
    assert {p.name: p.version for p in args.addons} == {
        "coredns": RELEASE.coredns, "aws-ebs-csi-driver": RELEASE.ebs_csi_driver,
        "snapshot-controller": RELEASE.snapshot_controller,
        # addons.gpuHealth.repair (default on): the node conditions Karpenter's node repair acts on.
        "eks-node-monitoring-agent": RELEASE.node_monitoring_agent}


@pytest.mark.parametrize(("stack", "system", "storage"), [("staging", (3, 3, 4), (3, 3, 3)),
                                                          ("prod", (3, 3, 6), (3, 3, 6))])
def test_managed_node_groups(stack: str, system: tuple[int, int, int], storage: tuple[int, int, int]) -> None:
    rec = plan(stack)
    groups = {g.name: g for g in of_type(rec, "aws:eks/nodeGroup:NodeGroup")}
    assert set(groups) == {"system-group", "storage-group"}
    for pool, sizes in (("system", system), ("storage", storage)):
        g = groups[f"{pool}-group"].inputs
        assert g["nodeGroupName"] == f"trainyard-{stack}-{pool}"
        assert g["amiType"] == "AL2023_x86_64_STANDARD"
        assert g["releaseVersion"] == RELEASE.node_group_release
        assert g["capacityType"] == "ON_DEMAND"
        assert (g["scalingConfig"]["minSize"], g["scalingConfig"]["desiredSize"],
                g["scalingConfig"]["maxSize"]) == sizes
        assert g["updateConfig"] == {"maxUnavailable": 1}
        assert g["labels"]["trainyard.io/role"] == pool
        assert g["labels"]["trainyard.io/pool"] == pool
        assert len(g["subnetIds"]) == 3  # spread over every zone
    # Cilium's EKS requirements: managed groups tainted agent-not-ready until its agent runs on the node
    # (docs.cilium.io installation/requirements-eks.rst); its operator removes it (removeNodeTaints).
    cilium = {"key": "node.cilium.io/agent-not-ready", "value": "true", "effect": "NO_EXECUTE"}
    assert groups["storage-group"].inputs["taints"] == [
        {"key": "trainyard.io/role", "value": "storage", "effect": "NO_SCHEDULE"}, cilium]
    assert groups["system-group"].inputs["taints"] == [cilium]


@pytest.mark.parametrize("pool", ["system", "storage"])
def test_launch_templates_imdsv2_encrypted_and_user_data(pool: str) -> None:
    rec = plan("prod")
    lt = one(rec, "aws:ec2/launchTemplate:LaunchTemplate", f"{pool}-lt").inputs
    assert lt["metadataOptions"] == {"httpEndpoint": "enabled", "httpTokens": "required",
                                     "httpPutResponseHopLimit": 1}
    (root,) = lt["blockDeviceMappings"]
    assert root["deviceName"] == "/dev/xvda"
    assert root["ebs"]["encrypted"] == "true" and root["ebs"]["volumeType"] == "gp3"
    assert base64.b64decode(lt["userData"]).decode() == render_user_data(NodeRole(pool))
    assert len(lt["vpcSecurityGroupIds"]) == 2
    group = one(rec, "aws:eks/nodeGroup:NodeGroup", f"{pool}-group").inputs
    assert group["launchTemplate"]["version"] == "1"


def test_node_security_group_is_discoverable_and_self_referencing() -> None:
    rec = plan("prod")
    sg = one(rec, "aws:ec2/securityGroup:SecurityGroup", "eks-nodes")
    assert sg.inputs["tags"]["karpenter.sh/discovery"] == "trainyard-prod"
    sg_id = f"{sg.name}-id"
    ingress = of_type(rec, "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule")
    egress = of_type(rec, "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule")
    # EFA needs all-protocol traffic to the same group in both directions.
    for rules in (ingress, egress):
        assert any(r.inputs["securityGroupId"] == sg_id and r.inputs.get("referencedSecurityGroupId") == sg_id
                   and r.inputs["ipProtocol"] == "-1" for r in rules)


@pytest.mark.parametrize("stack", ["dev", "staging", "prod"])
def test_deploy_role_is_a_cluster_admin(stack: str) -> None:
    """Issue 9 item 13: the role CI assumes (deploy.roleArn) gets an access entry with the admin policy."""
    rec = plan(stack)
    role = f"arn:aws:iam::111122223333:role/trainyard-deploy-{stack}"
    entry = one(rec, "aws:eks/accessEntry:AccessEntry", "eks-deploy")
    assert entry.inputs["principalArn"] == role and entry.inputs["type"] == "STANDARD"
    association = one(rec, "aws:eks/accessPolicyAssociation:AccessPolicyAssociation", "eks-deploy")
    assert association.inputs["principalArn"] == role
    assert association.inputs["policyArn"] == "arn:aws:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy"
    assert association.inputs["accessScope"] == {"type": "cluster"}
    assert entry.urn in association.depends_on
    # Nothing in the cluster is created before the deploying role may create it.
    assert association.urn in one(rec, "pulumi:providers:kubernetes").depends_on


def test_private_api_access_opens_https_from_the_runner_only() -> None:
    staging = read_stack("staging")
    network = {**json.loads(staging.values["trainyard:network"]), "publicAccessCidrs": []}
    deploy = {**json.loads(staging.values["trainyard:deploy"]), "apiAccess": "private",
              "runnerCidrs": ["10.200.0.0/24"], "runner": {"labels": ["self-hosted", "trainyard-vpc"]}}
    private = StackFile("staging", {**staging.values, "trainyard:network": json.dumps(network),
                                    "trainyard:deploy": json.dumps(deploy)}, staging.secret_keys)
    rec = render(private, cloud_and_karpenter)
    vpc = one(rec, "aws:eks/cluster:Cluster").inputs["vpcConfig"]
    assert vpc["endpointPublicAccess"] is False
    rule = one(rec, "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule", "eks-api-from-runner-0").inputs
    assert (rule["cidrIpv4"], rule["ipProtocol"], rule["fromPort"], rule["toPort"]) == ("10.200.0.0/24", "tcp", 443,
                                                                                       443)
    assert not [r for r in of_type(plan("staging"), "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule")
                if r.name.startswith("eks-api-from-runner")]


def _preview(stack: str) -> tuple[ResourceRecord, ResourceRecord, ResourceRecord]:
    rec = plan(stack)
    return (one(rec, "aws:iam/role:Role", "eks-preview"), one(rec, "aws:eks/accessEntry:AccessEntry", "eks-preview"),
            one(rec, "aws:eks/accessPolicyAssociation:AccessPolicyAssociation", "eks-preview"))


@pytest.mark.parametrize("stack", ["dev", "staging", "prod"])
def test_previews_get_their_own_read_only_role_trusted_for_pull_requests_only(stack: str) -> None:
    """Issue 18 item 4: pull-request code never holds the deploy role; its role reads, and only pull_request jobs
    of the stack's repository may assume it (docs.github.com, "About security hardening with OpenID Connect":
    subject repo:<owner>/<name>:pull_request; a job in an environment gets ...:environment:<name>)."""
    settings = settings_of(read_stack(stack))
    assert settings.deploy is not None and settings.deploy.preview is not None
    role, entry, association = _preview(stack)
    assert role.inputs["name"] == f"trainyard-{stack}-preview"
    account = settings.deploy.role_arn.split(":")[4]
    (statement,) = json.loads(role.inputs["assumeRolePolicy"])["Statement"]
    assert statement == {
        "Effect": "Allow", "Action": "sts:AssumeRoleWithWebIdentity",
        "Principal": {"Federated": f"arn:aws:iam::{account}:oidc-provider/token.actions.githubusercontent.com"},
        "Condition": {"StringEquals": {
            "token.actions.githubusercontent.com:aud": "sts.amazonaws.com",
            "token.actions.githubusercontent.com:sub": f"repo:{settings.deploy.preview.repository}:pull_request"}}}
    rec = plan(stack)
    grants = [r for r in rec.resources if r.type in ("aws:iam/rolePolicyAttachment:RolePolicyAttachment",
                                                      "aws:iam/rolePolicy:RolePolicy")
              and r.inputs.get("role") == role.inputs["name"]]
    assert [(g.type, g.inputs.get("policyArn")) for g in grants] == [
        ("aws:iam/rolePolicyAttachment:RolePolicyAttachment", "arn:aws:iam::aws:policy/job-function/ViewOnlyAccess")]
    # Its access entry views; the admin policy stays with the deploy role and the admins.
    assert entry.inputs["principalArn"] == association.inputs["principalArn"] != settings.deploy.role_arn
    assert entry.inputs["principalArn"].endswith(f":role/trainyard-{stack}-preview")
    assert association.inputs["policyArn"] == "arn:aws:eks::aws:cluster-access-policy/AmazonEKSViewPolicy"
    assert association.inputs["accessScope"] == {"type": "cluster"} and entry.urn in association.depends_on


def test_a_stack_without_previews_has_no_preview_role() -> None:
    dev = read_stack("dev")
    deploy = {k: v for k, v in json.loads(dev.values["trainyard:deploy"]).items() if k != "preview"}
    rec = render(StackFile("dev", {**dev.values, "trainyard:deploy": json.dumps(deploy)}, dev.secret_keys),
                 cloud_and_karpenter)
    assert not [r for r in rec.resources if r.name.startswith("eks-preview")]
