"""What AWS and Kubernetes accept as names: each rule as its documentation states it, with the source.

`rules.py` checks the names a stack will generate against these before anything is created; the plan tests check
every name in the rendered plans against them, so a generator that drifts from `rules.py` is caught too.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class NameRule:
    what: str
    max_length: int
    pattern: re.Pattern[str]
    allowed: str  # the pattern in words, for the message
    min_length: int = 1

    def problem(self, name: str) -> str | None:
        """None when `name` is valid, else why not, naming the rule."""
        if not self.min_length <= len(name) <= self.max_length:
            return (f"{self.what} {name!r} has {len(name)} characters; "
                    f"{self.min_length}-{self.max_length} allowed")
        if not self.pattern.match(name):
            return f"{self.what} {name!r} is invalid: {self.allowed}"
        return None


# https://docs.aws.amazon.com/AmazonS3/latest/userguide/bucketnamingrules.html (general purpose buckets).
S3_BUCKET = NameRule("S3 bucket name", 63, re.compile(r"^(?!xn--|sthree-|amzn-s3-demo-)(?!.*\.\.)"
                                                       r"[a-z0-9][a-z0-9.-]*[a-z0-9]$(?<!-s3alias)(?<!--ol-s3)"),
                     "lowercase letters, digits, '.' and '-', starting and ending with a letter or digit",
                     min_length=3)
# Node group name: at most 63 characters, starting with a letter or digit, then letters, digits, '-' and '_'
# (nodeGroupName in https://www.pulumi.com/registry/packages/aws/api-docs/eks/nodegroup/).
EKS_NODE_GROUP = NameRule("EKS node group name", 63, re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$"),
                          "letters, digits, '-' and '_', starting with a letter or digit")
# RoleName: 1-64 of letters, digits and + = , . @ _ - (https://docs.aws.amazon.com/IAM/latest/APIReference/API_CreateRole.html).
IAM_ROLE = NameRule("IAM role name", 64, re.compile(r"^[\w+=,.@-]+$"), "letters, digits and + = , . @ _ -")
# Name: 1-64 of letters, digits, '.', '-', '_' (https://docs.aws.amazon.com/eventbridge/latest/APIReference/API_PutRule.html).
EVENTBRIDGE_RULE = NameRule("EventBridge rule name", 64, re.compile(r"^[.\-_A-Za-z0-9]+$"),
                            "letters, digits, '.', '-' and '_'")
# QueueName: up to 80 letters, digits, '-' and '_' (https://docs.aws.amazon.com/AWSSimpleQueueService/latest/APIReference/API_CreateQueue.html).
SQS_QUEUE = NameRule("SQS queue name", 80, re.compile(r"^[A-Za-z0-9_-]+$"), "letters, digits, '-' and '_'")
# Cluster name: 1-100 characters, starting with a letter or digit, then letters, digits, '-' and '_'
# (https://docs.aws.amazon.com/eks/latest/APIReference/API_CreateCluster.html).
EKS_CLUSTER = NameRule("EKS cluster name", 100, re.compile(r"^[0-9A-Za-z][A-Za-z0-9_-]*$"),
                       "letters, digits, '-' and '_', starting with a letter or digit")
# DNS-1123 label and subdomain (IsDNS1123Label / IsDNS1123Subdomain, k8s.io/apimachinery/pkg/util/validation).
DNS1123_LABEL = NameRule("Kubernetes name", 63, re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"),
                         "lowercase letters, digits and '-', starting and ending with a letter or digit")
DNS1123_SUBDOMAIN = NameRule("Kubernetes name", 253, re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?"
                                                               r"(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"),
                             "dot-separated DNS-1123 labels")
# IsValidLabelValue (k8s.io/apimachinery/pkg/util/validation/validation.go); an empty value is valid.
LABEL_VALUE = NameRule("label value", 63, re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"),
                       "letters, digits, '-', '_' and '.', starting and ending with a letter or digit", min_length=0)


def s3_bucket_problem(name: str) -> str | None:
    """The S3 rules, plus the one a pattern can't say: not formatted as an IP address."""
    try:
        ipaddress.IPv4Address(name)
    except ValueError:
        return S3_BUCKET.problem(name)
    return f"S3 bucket name {name!r} is formatted as an IP address"


def tag_key_problem(key: str) -> str | None:
    # Keys may not start with the reserved `aws:`
    # (https://docs.aws.amazon.com/tag-editor/latest/userguide/tagging.html#tag-conventions).
    if key.lower().startswith("aws:"):
        return f"tag key {key!r} starts with the reserved 'aws:' prefix"
    if not 1 <= len(key) <= 128:
        return f"tag key {key!r} has {len(key)} characters; 1-128 allowed"
    return None
