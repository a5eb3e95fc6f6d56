"""Customer-managed KMS keys: rotated yearly, protected and retained (losing a key loses the data under it)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pulumi
import pulumi_aws as aws


@dataclass(frozen=True)
class KmsKeyArgs:
    description: str
    alias: str
    protect: bool
    tags: dict[str, str] = field(default_factory=dict)


class KmsKey(pulumi.ComponentResource):
    """A symmetric customer-managed key with yearly rotation, protected and retained: losing it loses the data."""

    key: aws.kms.Key

    def __init__(self, name: str, args: KmsKeyArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("trainyard:cloud:KmsKey", name, None, opts)
        self.key = aws.kms.Key(
            f"{name}-key", description=args.description, enable_key_rotation=True, deletion_window_in_days=30,
            tags=args.tags,
            opts=pulumi.ResourceOptions(parent=self, protect=args.protect, retain_on_delete=True))
        aws.kms.Alias(f"{name}-alias", name=f"alias/{args.alias}", target_key_id=self.key.key_id,
                      opts=pulumi.ResourceOptions(parent=self))
        self.register_outputs({"keyArn": self.key.arn})
