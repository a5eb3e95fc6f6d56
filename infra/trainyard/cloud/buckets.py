"""S3 buckets for datasets and checkpoints, each with its own KMS key so read access can be granted per bucket."""

from __future__ import annotations

from dataclasses import dataclass, field

import pulumi
import pulumi_aws as aws

from trainyard.cloud.iam import document
from trainyard.cloud.kms import KmsKey, KmsKeyArgs


def tls_only_policy(bucket_arn: pulumi.Input[str]) -> dict[str, object]:
    return document({
        "Sid": "DenyInsecureTransport",
        "Effect": "Deny",
        "Principal": "*",
        "Action": "s3:*",
        "Resource": [bucket_arn, pulumi.Output.concat(bucket_arn, "/*")],
        "Condition": {"Bool": {"aws:SecureTransport": "false"}},
    })


@dataclass(frozen=True)
class BucketArgs:
    # `trainyard-<stack>-<kind>`: the KMS alias; the bucket adds the account id, as S3 names are global.
    name: str
    account_id: pulumi.Input[str]
    protect: bool
    force_destroy: bool
    # Days a replaced or deleted object version is kept; None keeps them until deleted by hand.
    noncurrent_days: int | None = None
    tags: dict[str, str] = field(default_factory=dict)


# Uploads interrupted by a preempted node leave parts that are billed until aborted.
ABORT_MULTIPART_DAYS = 7


class EncryptedBucket(pulumi.ComponentResource):
    """Versioned, SSE-KMS (bucket key), private, TLS-only bucket with lifecycle rules."""

    bucket: aws.s3.Bucket
    kms: KmsKey

    def __init__(self, name: str, args: BucketArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("trainyard:cloud:EncryptedBucket", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.kms = KmsKey(f"{name}-kms", KmsKeyArgs(description=f"SSE-KMS for the {args.name} bucket",
                                                    alias=args.name, protect=args.protect, tags=args.tags),
                          opts=child)
        self.bucket = aws.s3.Bucket(
            f"{name}-bucket", bucket=pulumi.Output.concat(args.name, "-", args.account_id),
            force_destroy=args.force_destroy, tags=args.tags,
            opts=pulumi.ResourceOptions(parent=self, protect=args.protect, retain_on_delete=True))
        bucket_id = self.bucket.id
        aws.s3.BucketOwnershipControls(
            f"{name}-ownership", bucket=bucket_id,
            rule=aws.s3.BucketOwnershipControlsRuleArgs(object_ownership="BucketOwnerEnforced"), opts=child)
        public_block = aws.s3.BucketPublicAccessBlock(
            f"{name}-public-access", bucket=bucket_id, block_public_acls=True, block_public_policy=True,
            ignore_public_acls=True, restrict_public_buckets=True, opts=child)
        aws.s3.BucketVersioning(
            f"{name}-versioning", bucket=bucket_id,
            versioning_configuration=aws.s3.BucketVersioningVersioningConfigurationArgs(status="Enabled"),
            opts=child)
        aws.s3.BucketServerSideEncryptionConfiguration(
            f"{name}-encryption", bucket=bucket_id,
            rules=[aws.s3.BucketServerSideEncryptionConfigurationRuleArgs(
                apply_server_side_encryption_by_default=aws.s3
                .BucketServerSideEncryptionConfigurationRuleApplyServerSideEncryptionByDefaultArgs(
                    sse_algorithm="aws:kms", kms_master_key_id=self.kms.key.arn),
                # One data key per bucket rather than per object: far fewer KMS calls for many small shards.
                bucket_key_enabled=True)],
            opts=child)
        # After the public access block: S3 evaluates a new policy against it.
        aws.s3.BucketPolicy(f"{name}-tls-only", bucket=bucket_id,
                            policy=pulumi.Output.json_dumps(tls_only_policy(self.bucket.arn)),
                            opts=pulumi.ResourceOptions(parent=self, depends_on=[public_block]))
        rules = [aws.s3.BucketLifecycleConfigurationRuleArgs(
            id="abort-incomplete-multipart", status="Enabled",
            filter=aws.s3.BucketLifecycleConfigurationRuleFilterArgs(prefix=""),
            abort_incomplete_multipart_upload=aws.s3
            .BucketLifecycleConfigurationRuleAbortIncompleteMultipartUploadArgs(
                days_after_initiation=ABORT_MULTIPART_DAYS))]
        if args.noncurrent_days is not None:
            rules.append(aws.s3.BucketLifecycleConfigurationRuleArgs(
                id="expire-noncurrent-versions", status="Enabled",
                filter=aws.s3.BucketLifecycleConfigurationRuleFilterArgs(prefix=""),
                noncurrent_version_expiration=aws.s3
                .BucketLifecycleConfigurationRuleNoncurrentVersionExpirationArgs(
                    noncurrent_days=args.noncurrent_days)))
        aws.s3.BucketLifecycleConfiguration(f"{name}-lifecycle", bucket=bucket_id, rules=rules, opts=child)
        self.register_outputs({"bucket": self.bucket.bucket, "keyArn": self.kms.key.arn})


@dataclass(frozen=True)
class BucketsArgs:
    name_prefix: str
    account_id: pulumi.Input[str]
    protect: bool
    force_destroy: bool
    checkpoint_noncurrent_days: int
    tags: dict[str, str] = field(default_factory=dict)


class Buckets(pulumi.ComponentResource):
    """The dataset bucket (read by Alluxio and trainers) and the checkpoint bucket (written by trainers)."""

    datasets: EncryptedBucket
    checkpoints: EncryptedBucket

    def __init__(self, name: str, args: BucketsArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("trainyard:cloud:Buckets", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        def bucket(kind: str, noncurrent_days: int | None) -> EncryptedBucket:
            return EncryptedBucket(kind, BucketArgs(f"{args.name_prefix}-{kind}", args.account_id,
                                                    protect=args.protect,
                                                    force_destroy=args.force_destroy,
                                                    noncurrent_days=noncurrent_days, tags=args.tags), opts=child)

        # Dataset versions are kept (datasets are rarely rewritten); checkpoint versions expire.
        self.datasets = bucket("datasets", None)
        self.checkpoints = bucket("checkpoints", args.checkpoint_noncurrent_days)
        self.register_outputs({"datasets": self.datasets.bucket.bucket,
                               "checkpoints": self.checkpoints.bucket.bucket})
