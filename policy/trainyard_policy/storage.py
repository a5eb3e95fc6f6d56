"""Stateful things: buckets encrypted, versioned and private; stateful resources protected from deletion."""

from __future__ import annotations

from collections.abc import Sequence

from trainyard_policy.resources import Resource, Violation, kind_of, metadata

BUCKET = "aws:s3/bucket:Bucket"
# Each bucket needs one of each; the value says what the configuration must contain.
_BUCKET_CONFIG = {
    "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration": "encryption",
    "aws:s3/bucketVersioning:BucketVersioning": "versioning",
    "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock": "public access block",
}
_STATEFUL_TYPES = frozenset({BUCKET, "aws:kms/key:Key"})
_STATEFUL_KINDS = frozenset({"CephCluster", "CephFilesystem", "CephObjectStore"})
# Charts whose release owns stateful custom resources (rook-ceph-cluster creates the CephCluster and filesystems).
_STATEFUL_CHARTS = frozenset({"rook-ceph-cluster"})


def _config_ok(config: Resource) -> bool:
    inputs = config.inputs
    if "Versioning" in config.type:
        return (inputs.get("versioningConfiguration") or {}).get("status") == "Enabled"
    if "PublicAccessBlock" in config.type:
        return all(inputs.get(k) is True for k in ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls",
                                                   "restrictPublicBuckets"))
    rules = inputs.get("rules") or []
    return any((rule.get("applyServerSideEncryptionByDefault") or {}).get("sseAlgorithm") for rule in rules)


def _belongs(config: Resource, bucket: Resource) -> bool:
    """A bucket's configuration names the bucket (its ID, which is unknown in a preview) or shares its component."""
    ref = config.inputs.get("bucket")
    return ref in {bucket.inputs.get("bucket"), f"{bucket.name}-id", bucket.urn} or (
        bucket.parent is not None and config.parent == bucket.parent)


def buckets_secure(resources: Sequence[Resource]) -> list[Violation]:
    found = []
    configs = [r for r in resources if r.type in _BUCKET_CONFIG]
    for bucket in (r for r in resources if r.type == BUCKET):
        if bucket.inputs.get("acl") not in (None, "private"):
            found.append(Violation(bucket.urn, f"bucket ACL {bucket.inputs.get('acl')!r} is not private"))
        mine = [c for c in configs if _belongs(c, bucket)]
        for config_type, what in _BUCKET_CONFIG.items():
            present = [c for c in mine if c.type == config_type]
            if not present:
                found.append(Violation(bucket.urn, f"no {what} configuration"))
            found += [Violation(c.urn, f"{what} configuration does not secure the bucket")
                      for c in present if not _config_ok(c)]
    return found


def _is_checkpoint_claim(resource: Resource) -> bool:
    name = str(metadata(resource).get("name", ""))
    return kind_of(resource) == "PersistentVolumeClaim" and "checkpoint" in name


def _is_stateful_release(resource: Resource) -> bool:
    chart = str(resource.inputs.get("chart", "")).rsplit("/", 1)[-1]
    return resource.type == "kubernetes:helm.sh/v3:Release" and chart in _STATEFUL_CHARTS


def stateful_protected(resources: Sequence[Resource]) -> list[Violation]:
    """Data that a replace or a stray `pulumi destroy` would lose is protected."""
    return [Violation(r.urn, "stateful resource is not protected") for r in resources
            if not r.protect and (r.type in _STATEFUL_TYPES or kind_of(r) in _STATEFUL_KINDS
                                  or _is_checkpoint_claim(r) or _is_stateful_release(r))]
