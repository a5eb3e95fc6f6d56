"""The policy pack passes on every stack, and each rule catches a broken copy of a real record."""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from review_support import STACKS, rendered
from trainyard.config.instance_types import INSTANCE_TYPES
from trainyard_policy import pinning
from trainyard_policy.resources import Resource, from_record, kind_of, metadata, pod_specs
from trainyard_policy.rules import RULES, evaluate

RULE_NAMES = [rule.name for rule in RULES]


def views(stack: str) -> list[Resource]:
    return [from_record(r) for r in rendered(stack).resources]


@pytest.mark.parametrize("stack", STACKS)
def test_every_rule_passes_on_the_stack(stack: str) -> None:
    violations = {name: [str(v) for v in found] for name, found in evaluate(views(stack)).items() if found}
    assert violations == {}


def find(predicate: Callable[[Resource], bool], what: str) -> tuple[list[Resource], Resource]:
    """The first stack (in name order) with a matching record: its resources and a deep copy of the record."""
    for stack in STACKS:
        resources = views(stack)
        for r in resources:
            if predicate(r):
                return resources, dataclasses.replace(r, inputs=copy.deepcopy(dict(r.inputs)))
    pytest.fail(f"no stack renders {what}: this guardrail cannot be exercised on a real record")


def swap(resources: list[Resource], broken: Resource) -> list[Resource]:
    return [broken if r.urn == broken.urn else r for r in resources]


def flagged(rule: str, resources: list[Resource]) -> set[str]:
    return {v.urn for v in evaluate(resources)[rule]}


def _node_template(r: Resource) -> dict[str, Any]:
    return r.inputs["spec"]["template"]


def _is_gpu_pool(r: Resource) -> bool:
    if kind_of(r) != "NodePool":
        return False
    requirements = _node_template(r)["spec"].get("requirements") or []
    return any(INSTANCE_TYPES.get(v) and INSTANCE_TYPES[v].gpu_count for req in requirements
               for v in req.get("values") or [])


def _has_mig_label(r: Resource) -> bool:
    return _is_gpu_pool(r) and "nvidia.com/mig.config" in (_node_template(r).get("metadata") or {}).get("labels", {})


def _gpu_containers(r: Resource) -> Iterator[dict[str, Any]]:
    for pod in pod_specs(r.inputs.get("spec")):
        for c in pod["containers"]:
            if any(k.startswith("nvidia.com/") for k in ((c.get("resources") or {}).get("limits") or {})):
                yield c


def _is_gpu_job(r: Resource) -> bool:
    return r.type.startswith("kubernetes:batch.volcano.sh/") and any(True for _ in _gpu_containers(r))


def test_mig_layout_that_does_not_fit_is_caught() -> None:
    resources, pool = find(_has_mig_label, "a GPU NodePool with a MIG layout")
    _node_template(pool)["metadata"]["labels"]["nvidia.com/mig.config"] = "no-such-layout"
    assert pool.urn in flagged("mig-layout-fits", swap(resources, pool))


def test_untainted_gpu_pool_is_caught() -> None:
    resources, pool = find(_is_gpu_pool, "a GPU NodePool")
    _node_template(pool)["spec"]["taints"] = []
    assert pool.urn in flagged("gpu-pools-tainted", swap(resources, pool))


def test_gpu_pod_without_toleration_is_caught() -> None:
    resources, job = find(_is_gpu_job, "a Volcano Job requesting GPUs")
    for pod in pod_specs(job.inputs["spec"]):
        assert isinstance(pod, dict)
        pod["tolerations"] = [t for t in pod.get("tolerations") or [] if t.get("key") != "nvidia.com/gpu"
                              and t.get("operator") != "Exists"]
    assert job.urn in flagged("gpu-workloads", swap(resources, job))


def test_gpu_pod_without_gpu_limit_is_caught() -> None:
    resources, job = find(_is_gpu_job, "a Volcano Job requesting GPUs")
    for container in _gpu_containers(job):
        limits = container["resources"]["limits"]
        for key in [k for k in limits if k.startswith("nvidia.com/")]:
            del limits[key]
    assert job.urn in flagged("gpu-workloads", swap(resources, job))


def _bucket_config(kind: str) -> Callable[[Resource], bool]:
    return lambda r: r.type == f"aws:s3/bucket{kind}:Bucket{kind}"


def _owner(resources: list[Resource], config: Resource) -> str:
    return next(r.urn for r in resources if r.type == "aws:s3/bucket:Bucket" and r.parent == config.parent)


def test_unversioned_bucket_is_caught() -> None:
    resources, versioning = find(_bucket_config("Versioning"), "a bucket versioning configuration")
    versioning.inputs["versioningConfiguration"]["status"] = "Suspended"
    assert versioning.urn in flagged("buckets-secure", swap(resources, versioning))
    without = [r for r in resources if r.urn != versioning.urn]
    assert _owner(resources, versioning) in flagged("buckets-secure", without)


def test_public_bucket_is_caught() -> None:
    resources, block = find(_bucket_config("PublicAccessBlock"), "a bucket public access block")
    block.inputs["restrictPublicBuckets"] = False
    assert block.urn in flagged("buckets-secure", swap(resources, block))


def test_unencrypted_bucket_is_caught() -> None:
    resources, sse = find(_bucket_config("ServerSideEncryptionConfiguration"), "a bucket encryption configuration")
    without = [r for r in resources if r.urn != sse.urn]
    assert _owner(resources, sse) in flagged("buckets-secure", without)


def test_imdsv1_launch_template_is_caught() -> None:
    resources, template = find(lambda r: r.type == "aws:ec2/launchTemplate:LaunchTemplate", "a launch template")
    template.inputs["metadataOptions"]["httpTokens"] = "optional"
    assert template.urn in flagged("imdsv2-required", swap(resources, template))


def test_imdsv1_node_class_is_caught() -> None:
    resources, node_class = find(lambda r: kind_of(r) == "EC2NodeClass", "a Karpenter EC2NodeClass")
    node_class.inputs["spec"].setdefault("metadataOptions", {})["httpTokens"] = "optional"
    assert node_class.urn in flagged("imdsv2-required", swap(resources, node_class))


def test_wildcard_iam_statement_is_caught() -> None:
    resources, policy = find(lambda r: r.type == "aws:iam/rolePolicy:RolePolicy", "an IAM role policy")
    document = json.loads(policy.inputs["policy"])
    document["Statement"].append({"Effect": "Allow", "Action": "*", "Resource": ["*"]})
    broken = dataclasses.replace(policy, inputs={**policy.inputs, "policy": json.dumps(document)})
    assert policy.urn in flagged("no-wildcard-iam", swap(resources, broken))


@pytest.mark.parametrize("version", ["", "^1.2.0", "1.x", "latest"])
def test_floating_chart_version_is_caught(version: str) -> None:
    resources, release = find(lambda r: r.type == "kubernetes:helm.sh/v3:Release", "a Helm release")
    release.inputs["version"] = version
    assert release.urn in flagged("charts-pinned", swap(resources, release))


@pytest.mark.parametrize("image", ["ghcr.io/trainyard/trainer:latest", "ghcr.io/trainyard/trainer",
                                   "registry.local:5000/trainer"])
def test_unpinned_pod_image_is_caught(image: str) -> None:
    resources, job = find(_is_gpu_job, "a Volcano Job requesting GPUs")
    next(_gpu_containers(job))["image"] = image
    assert job.urn in flagged("images-pinned", swap(resources, job))


def test_latest_tag_in_chart_values_is_caught() -> None:
    resources, release = find(lambda r: r.type == "kubernetes:helm.sh/v3:Release", "a Helm release")
    release.inputs.setdefault("values", {})["sidecar"] = {"image": {"repository": "x/y", "tag": "latest"}}
    assert release.urn in flagged("images-pinned", swap(resources, release))


@pytest.mark.parametrize(("what", "predicate"), [
    ("an S3 bucket", lambda r: r.type == "aws:s3/bucket:Bucket"),
    ("a KMS key", lambda r: r.type == "aws:kms/key:Key"),
    # The stacks create CephCluster and CephFilesystem through this chart's release.
    ("the rook-ceph-cluster release",
     lambda r: r.type.endswith(":Release") and r.inputs.get("chart") == "rook-ceph-cluster"),
    ("a checkpoint claim",
     lambda r: kind_of(r) == "PersistentVolumeClaim" and "checkpoint" in str(metadata(r).get("name"))),
])
def test_unprotected_stateful_resource_is_caught(what: str, predicate: Callable[[Resource], bool]) -> None:
    resources, record = find(predicate, what)
    assert record.urn not in flagged("stateful-protected", resources)
    assert record.urn in flagged("stateful-protected", swap(resources, dataclasses.replace(record, protect=False)))


def _tenant_namespace(r: Resource) -> bool:
    return kind_of(r) == "Namespace" and "trainyard.io/tenant" in (metadata(r).get("labels") or {})


def test_tenant_without_default_deny_is_caught() -> None:
    resources, namespace = find(_tenant_namespace, "a tenant namespace")
    name = metadata(namespace)["name"]
    kept = [r for r in resources if not (kind_of(r).endswith("NetworkPolicy") and metadata(r).get("namespace") == name)]
    assert namespace.urn in flagged("tenants-isolated", kept)


def test_tenant_without_queue_is_caught() -> None:
    resources, namespace = find(_tenant_namespace, "a tenant namespace")
    tenant = metadata(namespace)["labels"]["trainyard.io/tenant"]
    kept = [r for r in resources if not (kind_of(r) in ("Queue", "QueuePatch")
                                         and (metadata(r).get("labels") or {}).get("trainyard.io/tenant") == tenant)]
    assert namespace.urn in flagged("tenants-isolated", kept)


def _shared_role_policy(r: Resource) -> bool:
    return r.type == "aws:iam/rolePolicy:RolePolicy" and r.name == "trainer-policy"


@pytest.mark.parametrize("resource", ["{bucket}/*", "{bucket}/checkpoints/*", "*"])
def test_tenant_wide_bucket_grant_is_caught(resource: str) -> None:
    resources, policy = find(_shared_role_policy, "the trainer role policy every tenant shares")
    document = json.loads(policy.inputs["policy"])
    scoped = next(s for s in document["Statement"] if "s3:PutObject" in s["Action"])
    bucket = scoped["Resource"].split("/", 1)[0]
    scoped["Resource"] = resource.format(bucket=bucket)
    broken = dataclasses.replace(policy, inputs={**policy.inputs, "policy": json.dumps(document)})
    assert policy.urn in flagged("tenant-objects-scoped", swap(resources, broken))


# --- GPU isolation ---------------------------------------------------------------------------------------------

def _device_plugin_config_map(r: Resource) -> bool:
    return kind_of(r) == "ConfigMap" and metadata(r).get("name") == "trainyard-device-plugin"


@pytest.mark.parametrize(("change", "fragment"), [
    ({"renameByDefault": False}, "renameByDefault"),
    ({"failRequestsGreaterThanOne": False}, "failRequestsGreaterThanOne"),
])
def test_time_slicing_as_plain_gpus_is_caught(change: dict[str, Any], fragment: str) -> None:
    resources, config_map = find(_device_plugin_config_map, "the device plugin's ConfigMap")
    sliced = {"version": "v1", "flags": {"migStrategy": "none"}, "sharing": {"timeSlicing": {
        "renameByDefault": True, "failRequestsGreaterThanOne": True,
        "resources": [{"name": "nvidia.com/gpu", "replicas": 4}], **change}}}
    good = copy.deepcopy(sliced)
    good["sharing"]["timeSlicing"].update(renameByDefault=True, failRequestsGreaterThanOne=True)
    for config, caught in ((good, False), (sliced, True)):
        data = {**config_map.inputs["data"], "time-sliced": json.dumps(config)}
        edited = dataclasses.replace(config_map, inputs={**config_map.inputs, "data": data})
        assert (config_map.urn in flagged("gpu-sharing-renamed", swap(resources, edited))) == caught
    data = {**config_map.inputs["data"], "time-sliced": json.dumps(sliced)}
    broken = dataclasses.replace(config_map, inputs={**config_map.inputs, "data": data})
    messages = [v.message for v in evaluate(swap(resources, broken))["gpu-sharing-renamed"]]
    assert any(fragment in m for m in messages), messages


def test_unmarked_mig_pool_is_caught() -> None:
    resources, pool = find(_has_mig_label, "a MIG NodePool")
    template = _node_template(pool)
    template["metadata"]["labels"].pop("trainyard.io/gpu-sharing")
    template["spec"]["taints"] = [t for t in template["spec"]["taints"] if t["key"] != "trainyard.io/gpu-sharing"]
    assert pool.urn in flagged("shared-gpu-pools-marked", swap(resources, pool))


def test_whole_gpu_job_tolerating_shared_pools_is_caught() -> None:
    resources, job = find(_is_gpu_job, "a Volcano Job requesting GPUs")
    for pod in pod_specs(job.inputs["spec"]):
        pod["tolerations"] = [*(pod.get("tolerations") or []), {"operator": "Exists"}]
    assert job.urn in flagged("whole-gpus-unshared", swap(resources, job))


def test_gpus_by_env_var_are_caught() -> None:
    resources, job = find(_is_gpu_job, "a Volcano Job requesting GPUs")
    container = next(_gpu_containers(job))
    container["env"] = [*(container.get("env") or []), {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    assert job.urn in flagged("gpu-env-closed", swap(resources, job))


def test_node_class_without_the_toolkit_switch_is_caught() -> None:
    resources, node_class = find(lambda r: kind_of(r) == "EC2NodeClass", "an EC2NodeClass")
    spec = node_class.inputs["spec"]
    spec["userData"] = spec["userData"].replace("accept-nvidia-visible-devices-envvar-when-unprivileged=false", "")
    assert node_class.urn in flagged("gpu-env-closed", swap(resources, node_class))


def _is_preview(r: Resource) -> bool:
    return r.name == "eks-preview"


@pytest.mark.parametrize(("type_", "change"), [
    # The deploy role's cluster admin handed to previews, and admin AWS rights on the preview role.
    ("aws:eks/accessPolicyAssociation:AccessPolicyAssociation",
     {"policyArn": "arn:aws:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy"}),
    ("aws:iam/rolePolicyAttachment:RolePolicyAttachment",
     {"policyArn": "arn:aws:iam::aws:policy/AdministratorAccess"}),
])
def test_a_preview_role_that_writes_is_caught(type_: str, change: dict[str, Any]) -> None:
    resources, record = find(lambda r: r.type == type_ and r.name.startswith("eks-preview"), f"a preview {type_}")
    record.inputs.update(change)
    assert record.urn in flagged("preview-read-only", swap(resources, record))


def test_an_admin_role_trusted_for_pull_requests_is_caught() -> None:
    # The deploy role's entry is admin; were its role created with a pull_request-admitting trust (the wildcard
    # `repo:<owner>/<name>:*` admits pull_request subjects too), pull requests would get admin.
    resources, role = find(lambda r: r.type == "aws:iam/role:Role" and _is_preview(r), "a preview role")
    trust = json.loads(role.inputs["assumeRolePolicy"])
    subject = trust["Statement"][0]["Condition"].pop("StringEquals")
    trust["Statement"][0]["Condition"]["StringLike"] = {
        **subject, "token.actions.githubusercontent.com:sub": "repo:your-org/trainyard:*"}
    role.inputs["assumeRolePolicy"] = json.dumps(trust)
    name = role.inputs["name"]
    admin = next(r for r in resources if r.type == "aws:eks/accessPolicyAssociation:AccessPolicyAssociation"
                 and r.name == "eks-deploy")
    widened = dataclasses.replace(admin, inputs={**admin.inputs, "principalArn": f"arn:aws:iam::1:role/{name}"})
    assert widened.urn in flagged("preview-read-only", swap(swap(resources, role), widened))


def test_every_rule_has_a_breaking_test() -> None:
    covered = {"preview-read-only",
               "mig-layout-fits", "gpu-pools-tainted", "gpu-workloads", "buckets-secure", "imdsv2-required",
               "no-wildcard-iam", "tenant-objects-scoped", "charts-pinned", "images-pinned", "stateful-protected",
               "tenants-isolated", "gpu-sharing-renamed", "shared-gpu-pools-marked", "whole-gpus-unshared",
               "gpu-env-closed"}
    assert covered == set(RULE_NAMES)


@pytest.mark.parametrize("reference", ["ghcr.io/trainyard/trainer:latest\n", "ghcr.io/trainyard/trainer:0.1.0\n",
                                       "ghcr.io/trainyard/trainer@sha256:" + "a" * 64 + "\n",
                                       "ghcr.io/trainyard/trainer@sha256:", "ghcr.io/trainyard/trainer",
                                       "ghcr.io/trainyard/trainer:latest", "GHCR.io/Trainer:1"])
def test_the_policy_pack_refuses_what_the_config_refuses(reference: str) -> None:
    assert not pinning.image_pinned(reference)


@pytest.mark.parametrize("reference", ["ghcr.io/trainyard/trainer:0.1.0", "localhost:5000/a/b:v1",
                                       "nvcr.io/nvidia/gpu-operator:v26.7.0",
                                       "ghcr.io/a/b:1.0@sha256:" + "0" * 64])
def test_pinned_references_pass_the_policy(reference: str) -> None:
    assert pinning.image_pinned(reference)
