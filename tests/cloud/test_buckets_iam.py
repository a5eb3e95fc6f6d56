"""Buckets, KMS keys and IAM across every stack: encryption, lifecycle, protection, least privilege."""

from __future__ import annotations

import json
from typing import Any

import pytest
from aws_plan import of_type, one, plan, policy_documents
from owned_stacks import FLEET, Stack, recording, stack_raw, stack_settings, stacks_where
from trainyard.plan.placeholders import ACCOUNT

# The tests' fleet, then every AWS stack of stacks/.
AWS = stacks_where(lambda s: s.is_aws)


@pytest.mark.parametrize("stack", AWS)
def test_every_bucket_and_key_protected_and_retained(stack: Stack) -> None:
    rec = plan(*stack)
    stateful = of_type(rec, "aws:s3/bucket:Bucket") + of_type(rec, "aws:kms/key:Key")
    # Two buckets, their two keys, the EKS secrets key, and the tracking database's key when MLflow is on.
    assert len(stateful) == 5 + stack_settings(stack).addons.mlflow.enabled
    for r in stateful:
        assert r.protect and r.retain_on_delete, r.name


@pytest.mark.parametrize("stack", AWS)
def test_bucket_configuration(stack: Stack) -> None:
    rec = plan(*stack)
    buckets = {b.name: b.inputs for b in of_type(rec, "aws:s3/bucket:Bucket")}
    # S3 names are global: the account id keeps two accounts' stacks from colliding.
    assert {b["bucket"] for b in buckets.values()} == {f"trainyard-{stack[0]}-datasets-{ACCOUNT}",
                                                       f"trainyard-{stack[0]}-checkpoints-{ACCOUNT}"}
    for kind in ("datasets", "checkpoints"):
        bucket_id = f"{kind}-bucket-id"

        def config(type_: str, bid: str = bucket_id) -> dict[str, Any]:
            (found,) = [r.inputs for r in of_type(rec, type_) if r.inputs["bucket"] == bid]
            return found

        sse = config("aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration")
        (rule,) = sse["rules"]
        assert rule["applyServerSideEncryptionByDefault"]["sseAlgorithm"] == "aws:kms"
        assert rule["applyServerSideEncryptionByDefault"]["kmsMasterKeyId"].endswith(f"{kind}-kms-key")
        assert rule["bucketKeyEnabled"] is True
        assert config("aws:s3/bucketVersioning:BucketVersioning")["versioningConfiguration"] == {"status": "Enabled"}
        block = config("aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock")
        assert all(block[k] is True for k in ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls",
                                               "restrictPublicBuckets"))
        assert config("aws:s3/bucketOwnershipControls:BucketOwnershipControls")["rule"] == {
            "objectOwnership": "BucketOwnerEnforced"}
        policy = json.loads(config("aws:s3/bucketPolicy:BucketPolicy")["policy"])
        (deny,) = policy["Statement"]
        assert deny["Effect"] == "Deny" and deny["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
        lifecycle = config("aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration")
        rules = {r["id"]: r for r in lifecycle["rules"]}
        assert rules["abort-incomplete-multipart"]["abortIncompleteMultipartUpload"] == {"daysAfterInitiation": 7}
        if kind == "checkpoints":
            # The stack file's value, else 14 days (BucketSettings in config/model.py).
            days = stack_raw(stack).get("buckets", {}).get("checkpointNoncurrentDays", 14)
            assert rules["expire-noncurrent-versions"]["noncurrentVersionExpiration"] == {"noncurrentDays": days}
        else:
            assert "expire-noncurrent-versions" not in rules


@pytest.mark.parametrize("stack", AWS)
def test_no_wildcard_action_on_wildcard_resource(stack: Stack) -> None:
    documents = list(policy_documents(plan(*stack)))
    assert len(documents) >= 10
    for record, doc in documents:
        for s in doc["Statement"]:
            if s["Effect"] != "Allow":
                continue
            actions = s.get("Action", [])
            actions = [actions] if isinstance(actions, str) else actions
            resources = s.get("Resource", [])
            resources = [resources] if isinstance(resources, str) else resources
            wild_action = any(a == "*" or a.endswith(":*") for a in actions)
            assert not (wild_action and "*" in resources), f"{record.name}: {s}"


@pytest.mark.parametrize("stack", AWS)
def test_pod_identity_associations_use_shared_names(stack: Stack) -> None:
    rec = plan(*stack)
    settings = stack_settings(stack)
    tenant_accounts = ["trainer", *(["workflow"] if settings.addons.argo_workflows.enabled else [])]
    pairs = {(a.inputs["namespace"], a.inputs["serviceAccount"])
             for a in of_type(rec, "aws:eks/podIdentityAssociation:PodIdentityAssociation")}
    assert pairs == {("kube-system", "karpenter"), ("kube-system", "ebs-csi-controller-sa"),
                     ("kube-system", "cilium-operator"), ("kube-system", "pod-identity-check"),
                     *((t.namespace_name, account) for t in settings.tenants for account in tenant_accounts)}
    for role in of_type(rec, "aws:iam/role:Role"):
        trust = json.loads(role.inputs["assumeRolePolicy"])["Statement"][0]
        if trust["Principal"].get("Service") == "pods.eks.amazonaws.com":
            assert trust["Action"] == ["sts:AssumeRole", "sts:TagSession"]


def test_alluxio_gets_its_role_through_irsa_not_pod_identity() -> None:
    """Fluid 1.0.8's Alluxio image bundles an AWS Java SDK v1 older than 1.12.746, the first that reads Pod
    Identity credentials (EKS user guide, pod-id-minimum-sdk): its role is trusted for the dataset namespace's
    default account through the cluster's OIDC provider, audience sts.amazonaws.com."""
    rec = plan(*FLEET)
    provider = one(rec, "aws:iam/openIdConnectProvider:OpenIdConnectProvider")
    assert provider.inputs["clientIdLists"] == ["sts.amazonaws.com"]
    role = one(rec, "aws:iam/role:Role", "alluxio-role")
    (statement,) = json.loads(role.inputs["assumeRolePolicy"])["Statement"]
    assert statement["Action"] == "sts:AssumeRoleWithWebIdentity"
    host = provider.inputs["url"].removeprefix("https://")
    assert statement["Condition"]["StringEquals"] == {f"{host}:sub": "system:serviceaccount:trainyard-data:default",
                                                      f"{host}:aud": "sts.amazonaws.com"}
    associations = of_type(rec, "aws:eks/podIdentityAssociation:PodIdentityAssociation")
    assert not [a for a in associations if a.inputs["namespace"] == "trainyard-data"]


def test_alluxio_reads_only_the_dataset_prefix() -> None:
    rec = plan(*FLEET)
    (policy,) = [json.loads(p.inputs["policy"]) for p in of_type(rec, "aws:iam/rolePolicy:RolePolicy")
                 if p.name == "alluxio-policy"]
    actions = {a for s in policy["Statement"] for a in s["Action"]}
    assert actions == {"s3:ListBucket", "s3:GetBucketLocation", "s3:GetObject", "s3:GetObjectVersion",
                       "kms:Decrypt", "kms:DescribeKey"}
    resources = {json.dumps(s["Resource"]) for s in policy["Statement"]}
    assert not any("checkpoints" in r for r in resources)
    (listing,) = [s for s in policy["Statement"] if s["Action"] == ["s3:ListBucket"]]
    assert listing["Condition"] == {"StringLike": {"s3:prefix": ["datasets/*"]}}


NAMESPACE = "${aws:PrincipalTag/kubernetes-namespace}"


@pytest.mark.parametrize("stack", AWS)
def test_tenants_reach_only_their_own_checkpoint_prefix(stack: Stack) -> None:
    """Issue 9 item 16: one trainer role, scoped per namespace by the Pod Identity session tag."""
    rec = plan(*stack)
    (policy,) = [json.loads(p.inputs["policy"]) for p in of_type(rec, "aws:iam/rolePolicy:RolePolicy")
                 if p.name == "trainer-policy"]
    bucket = f"arn:aws:s3:::trainyard-{stack[0]}-checkpoints-{ACCOUNT}"
    on_checkpoints = [s for s in policy["Statement"] if json.dumps(s["Resource"]).startswith(f'"{bucket}')]
    objects = [s for s in on_checkpoints if s["Resource"] != bucket]
    assert objects and all(s["Resource"] == f"{bucket}/{NAMESPACE}/*" for s in objects)
    assert {"s3:PutObject", "s3:DeleteObject", "s3:GetObject"} <= {a for s in objects for a in s["Action"]}
    (listing,) = [s for s in on_checkpoints if "s3:ListBucket" in s["Action"]]
    assert listing["Condition"] == {"StringLike": {"s3:prefix": [f"{NAMESPACE}/*"]}}
    assert not [s for s in on_checkpoints if "s3:ListBucketMultipartUploads" in s["Action"]]


@pytest.mark.parametrize("stack", AWS)
def test_pod_identity_trust_names_cluster_namespace_and_account(stack: Stack) -> None:
    rec = plan(*stack)
    cluster_arn = ":" + one(rec, "aws:eks/cluster:Cluster").name  # the plan's placeholder ARN ends so
    by_parent: dict[str, set[tuple[str, str]]] = {}
    for a in of_type(rec, "aws:eks/podIdentityAssociation:PodIdentityAssociation"):
        by_parent.setdefault(a.parent or "", set()).add((a.inputs["namespace"], a.inputs["serviceAccount"]))
    roles = [r for r in of_type(rec, "aws:iam/role:Role") if r.parent in by_parent]
    # cilium-operator, ebs-csi, karpenter, trainer (Alluxio's role is IRSA: see its own test).
    assert len(roles) == len(by_parent) >= 4
    for role in roles:
        statements = json.loads(role.inputs["assumeRolePolicy"])["Statement"]
        admitted = set()
        for s in statements:
            assert s["Principal"] == {"Service": "pods.eks.amazonaws.com"}
            assert s["Action"] == ["sts:AssumeRole", "sts:TagSession"]
            tags = s["Condition"]["StringEquals"]
            assert tags["aws:RequestTag/eks-cluster-arn"].endswith(cluster_arn)
            admitted.add((tags["aws:RequestTag/kubernetes-namespace"],
                          tags["aws:RequestTag/kubernetes-service-account"]))
        assert admitted == by_parent[role.parent or ""]


# ---------------------------------------------------------------------- Cilium's ENI rights, per cluster (item 8)


def _allowed(policy: dict[str, Any], action: str, resource_type: str, tags: dict[str, str],
             request_tags: dict[str, str] | None = None, create_action: str | None = None) -> bool:
    """A small IAM evaluator for these documents: Allow statements, `*`-suffixed ARNs, StringEquals on resource
    tags, request tags and ec2:CreateAction (what the Cilium operator's statements use)."""
    context = {**{f"aws:ResourceTag/{k}": v for k, v in tags.items()},
               **{f"aws:RequestTag/{k}": v for k, v in (request_tags or {}).items()}}
    if create_action:
        context["ec2:CreateAction"] = create_action
    for statement in policy["Statement"]:
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        resources = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
        if action not in actions or not any(r == "*" or f":{resource_type}/" in r for r in resources):
            continue
        wanted = (statement.get("Condition") or {}).get("StringEquals", {})
        if all(context.get(key) == value for key, value in wanted.items() if key != "aws:RequestedRegion"):
            return True
    return False


def _cilium_policy(stack: Stack) -> dict[str, Any]:
    role = one(plan(*stack), "aws:iam/rolePolicy:RolePolicy", "cilium-operator-policy")
    policy: dict[str, Any] = json.loads(role.inputs["policy"])
    return policy


MUTATIONS = ("ec2:AttachNetworkInterface", "ec2:DetachNetworkInterface", "ec2:DeleteNetworkInterface",
             "ec2:ModifyNetworkInterfaceAttribute", "ec2:AssignPrivateIpAddresses", "ec2:UnassignPrivateIpAddresses")


@pytest.mark.parametrize("stack", AWS)
def test_the_cilium_operator_changes_only_its_own_clusters_enis(stack: Stack) -> None:
    # Stacks share an account and region (cloud/naming.py): dev's operator must not touch prod's ENIs.
    policy = _cilium_policy(stack)
    own = {f"kubernetes.io/cluster/trainyard-{stack[0]}": "owned"}
    other = {"kubernetes.io/cluster/trainyard-x": "owned"}
    for action in MUTATIONS:
        assert _allowed(policy, action, "network-interface", own), action
        assert not _allowed(policy, action, "network-interface", other), action
        assert not _allowed(policy, action, "network-interface", {}), action
    for action in ("ec2:AttachNetworkInterface", "ec2:DetachNetworkInterface"):
        assert _allowed(policy, action, "instance", own) and not _allowed(policy, action, "instance", other)
    # It creates ENIs only tagged as its cluster's, and tags only while creating.
    assert _allowed(policy, "ec2:CreateNetworkInterface", "network-interface", {}, request_tags=own)
    assert not _allowed(policy, "ec2:CreateNetworkInterface", "network-interface", {}, request_tags=other)
    assert _allowed(policy, "ec2:CreateTags", "network-interface", {}, create_action="CreateNetworkInterface")
    assert not _allowed(policy, "ec2:CreateTags", "network-interface", other)
    # Cilium's "Required Privileges" (eni.rst) include the managed prefix-list reads.
    describe = next(s for s in policy["Statement"] if s.get("Sid") == "DescribeForEniIpam")
    assert {"ec2:DescribeManagedPrefixLists", "ec2:GetManagedPrefixListEntries"} <= set(describe["Action"])


@pytest.mark.parametrize("stack", AWS)
def test_every_eni_the_operator_manages_carries_its_clusters_tag(stack: Stack) -> None:
    """Managed nodes' primary ENIs and instances (launch templates), the ENIs Cilium creates (eniTags); Karpenter
    tags its launches kubernetes.io/cluster/<name>=owned itself (aws/karpenter-provider-aws v1.14.1
    pkg/utils/utils.go GetTags)."""
    tag = (f"kubernetes.io/cluster/trainyard-{stack[0]}", "owned")
    for template in of_type(plan(*stack), "aws:ec2/launchTemplate:LaunchTemplate"):
        specs = {s["resourceType"]: s["tags"] for s in template.inputs["tagSpecifications"]}
        assert tag in specs["network-interface"].items() and tag in specs["instance"].items(), template.name
    cilium = next(r for r in recording(stack).resources if r.type == "kubernetes:helm.sh/v3:Release"
                  and str(r.inputs["chart"]).endswith("cilium"))
    assert cilium.inputs["values"]["eni"]["eniTags"] == dict([tag])
