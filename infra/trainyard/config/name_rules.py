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
        if not self.pattern.fullmatch(name):
            return f"{self.what} {name!r} is invalid: {self.allowed}"
        return None


# https://docs.aws.amazon.com/AmazonS3/latest/userguide/bucketnamingrules.html (general purpose buckets).
S3_BUCKET = NameRule("S3 bucket name", 63, re.compile(r"(?!xn--|sthree-|amzn-s3-demo-)(?!.*\.\.)"
                                                       r"[a-z0-9][a-z0-9.-]*[a-z0-9](?<!-s3alias)(?<!--ol-s3)"),
                     "lowercase letters, digits, '.' and '-', starting and ending with a letter or digit",
                     min_length=3)
# Node group name: at most 63 characters, starting with a letter or digit, then letters, digits, '-' and '_'
# (nodeGroupName in https://www.pulumi.com/registry/packages/aws/api-docs/eks/nodegroup/).
EKS_NODE_GROUP = NameRule("EKS node group name", 63, re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*"),
                          "letters, digits, '-' and '_', starting with a letter or digit")
# RoleName: 1-64 of letters, digits and + = , . @ _ - (https://docs.aws.amazon.com/IAM/latest/APIReference/API_CreateRole.html).
IAM_ROLE = NameRule("IAM role name", 64, re.compile(r"[\w+=,.@-]+", re.ASCII), "letters, digits and + = , . @ _ -")
# Name: 1-64 of letters, digits, '.', '-', '_' (https://docs.aws.amazon.com/eventbridge/latest/APIReference/API_PutRule.html).
EVENTBRIDGE_RULE = NameRule("EventBridge rule name", 64, re.compile(r"[.\-_A-Za-z0-9]+"),
                            "letters, digits, '.', '-' and '_'")
# QueueName: up to 80 letters, digits, '-' and '_' (https://docs.aws.amazon.com/AWSSimpleQueueService/latest/APIReference/API_CreateQueue.html).
SQS_QUEUE = NameRule("SQS queue name", 80, re.compile(r"[A-Za-z0-9_-]+"), "letters, digits, '-' and '_'")
# Cluster name: 1-100 characters, starting with a letter or digit, then letters, digits, '-' and '_'
# (https://docs.aws.amazon.com/eks/latest/APIReference/API_CreateCluster.html).
EKS_CLUSTER = NameRule("EKS cluster name", 100, re.compile(r"[0-9A-Za-z][A-Za-z0-9_-]*"),
                       "letters, digits, '-' and '_', starting with a letter or digit")
# DBInstanceIdentifier: 1-63 letters, digits and hyphens, starting with a letter, not ending with a hyphen nor holding
# two in a row (https://docs.aws.amazon.com/AmazonRDS/latest/APIReference/API_CreateDBInstance.html).
RDS_INSTANCE = NameRule("RDS DB instance identifier", 63, re.compile(r"[A-Za-z](?!.*--)([A-Za-z0-9-]*[A-Za-z0-9])?"),
                        "letters, digits and '-', starting with a letter, no '--' and no '-' at the end")
# DNS-1123 label and subdomain (IsDNS1123Label / IsDNS1123Subdomain, k8s.io/apimachinery/pkg/util/validation).
DNS1123_LABEL = NameRule("Kubernetes name", 63, re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"),
                         "lowercase letters, digits and '-', starting and ending with a letter or digit")
DNS1123_SUBDOMAIN = NameRule("Kubernetes name", 253, re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
                                                               r"(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"),
                             "dot-separated DNS-1123 labels")
# IsValidLabelValue (k8s.io/apimachinery/pkg/util/validation/validation.go); an empty value is valid.
LABEL_VALUE = NameRule("label value", 63, re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?"),
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


# IsQualifiedName (k8s.io/apimachinery/pkg/util/validation/validation.go): label keys and taint keys are
# `[prefix/]name`, the prefix a DNS-1123 subdomain of at most 253 characters, the name at most 63.
QUALIFIED_NAME = NameRule("name part", 63, re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"),
                          "letters, digits, '-', '_' and '.', starting and ending with a letter or digit")


def qualified_name_problem(key: str, what: str = "label key") -> str | None:
    """None when `key` is a Kubernetes qualified name ([prefix/]name), else why not."""
    prefix, slash, name = key.rpartition("/")
    if slash and ("/" in prefix or not prefix):
        return f"{what} {key!r} must be [prefix/]name with at most one '/' and a non-empty prefix"
    if slash and (problem := DNS1123_SUBDOMAIN.problem(prefix)):
        return f"{what} {key!r}: its prefix is no DNS subdomain ({problem})"
    if problem := QUALIFIED_NAME.problem(name):
        return f"{what} {key!r}: {problem}"
    return None


def label_domain(key: str) -> str:
    return key.partition("/")[0] if "/" in key else ""


# Labels Karpenter refuses in a NodePool's template (sigs.k8s.io/karpenter pkg/apis/v1/labels.go@v1.14.1
# IsRestrictedLabel, run by NodePool.RuntimeValidate; the AWS provider adds karpenter.k8s.aws): a NodePool that
# carries one never becomes ready, so no node is ever launched for it.
KARPENTER_RESTRICTED_DOMAINS = ("kubernetes.io", "k8s.io", "karpenter.sh", "karpenter.k8s.aws")
KARPENTER_DOMAIN_EXCEPTIONS = ("kops.k8s.io", "node.kubernetes.io", "node-restriction.kubernetes.io")
KARPENTER_WELL_KNOWN = frozenset({"topology.kubernetes.io/zone", "topology.kubernetes.io/region",
                                  "node.kubernetes.io/instance-type", "kubernetes.io/arch", "kubernetes.io/os",
                                  "karpenter.sh/capacity-type", "node.kubernetes.io/windows-build"})
# Karpenter owns these outright: validateLabels refuses karpenter.sh/nodepool, and kubernetes.io/hostname is a
# RestrictedLabel.
KARPENTER_OWNED = frozenset({"karpenter.sh/nodepool", "kubernetes.io/hostname"})


def karpenter_label_problem(key: str) -> str | None:
    if key in KARPENTER_OWNED:
        return f"label {key!r} is set by Karpenter itself; a NodePool may not carry it"
    if key in KARPENTER_WELL_KNOWN:
        return None
    # Karpenter compares label domains by suffix (strings.HasSuffix), so "evilkubernetes.io" is restricted too.
    domain = label_domain(key)
    if domain.endswith(KARPENTER_DOMAIN_EXCEPTIONS):
        return None
    if restricted := next((d for d in KARPENTER_RESTRICTED_DOMAINS if domain.endswith(d)), None):
        return (f"label {key!r} is in the {restricted!r} domain Karpenter reserves; the NodePool would never "
                "become ready: use your own prefix (e.g. example.com/)")
    return None


# What the kubelet accepts in --node-labels, which EKS managed node groups pass their labels through
# (kubernetes cmd/kubelet/app/options/options.go ValidateKubeletFlags with IsKubeletLabel from
# k8s.io/kubelet/pkg/apis/well_known_labels.go): a kubernetes.io or k8s.io key only in kubelet.kubernetes.io or
# node.kubernetes.io, or one of the labels the kubelet sets itself. Any other stops the kubelet from starting.
KUBELET_LABEL_NAMESPACES = ("kubelet.kubernetes.io", "node.kubernetes.io")
KUBELET_LABELS = frozenset({"kubernetes.io/hostname", "failure-domain.beta.kubernetes.io/zone",
                            "failure-domain.beta.kubernetes.io/region", "topology.kubernetes.io/zone",
                            "topology.kubernetes.io/region", "beta.kubernetes.io/instance-type",
                            "node.kubernetes.io/instance-type", "beta.kubernetes.io/os", "beta.kubernetes.io/arch",
                            "kubernetes.io/os", "kubernetes.io/arch"})


def _in_namespace(domain: str, namespace: str) -> bool:
    return domain == namespace or domain.endswith("." + namespace)


def kubelet_label_problem(key: str) -> str | None:
    domain = label_domain(key)
    if not (_in_namespace(domain, "kubernetes.io") or _in_namespace(domain, "k8s.io")):
        return None
    if key in KUBELET_LABELS or any(_in_namespace(domain, ns) for ns in KUBELET_LABEL_NAMESPACES):
        return None
    return (f"label {key!r}: the kubelet refuses --node-labels in the kubernetes.io and k8s.io namespaces except "
            f"under {' or '.join(KUBELET_LABEL_NAMESPACES)} and would not start: use your own prefix")


# An image reference as distribution/reference parses it (reference/regexp.go@v0.6.0):
# [domain[:port]/]path[:tag][@digest]; the name is at most 255 characters (NameTotalLengthMax).
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN_COMPONENT = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_DOMAIN = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[A-Fa-f0-9:]+\])(?::[0-9]+)?"
IMAGE_REFERENCE = re.compile(
    rf"(?P<name>(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*)"
    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?"
    r"(?:@(?P<digest>[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9A-Fa-f]{32,}))?")
SHA256_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def image_pin_problem(reference: str) -> str | None:
    """None when `reference` names one image for good: a tag other than `latest`, or a sha256 digest."""
    match = IMAGE_REFERENCE.fullmatch(reference)
    if match is None or len(match["name"]) > 255:
        return f"{reference!r} is not an image reference ([registry/]repository[:tag][@sha256:digest])"
    if match["digest"] is not None:
        if not SHA256_DIGEST.fullmatch(match["digest"]):
            return f"{reference!r}: a digest is sha256:<64 lowercase hex digits>"
        return None
    if match["tag"] in (None, "latest"):
        return f"{reference!r} must be pinned: 'repo/name:tag' (not 'latest') or 'repo/name@sha256:<digest>'"
    return None


# AWS partitions and the regions each holds (regionRegex in aws-sdk-js-v3
# packages/util-endpoints/src/lib/aws/partitions.json, the table every AWS SDK resolves ARNs with).
PARTITIONS = {
    "aws": re.compile(r"(us|eu|ap|sa|ca|me|af|il|mx)-[a-z]+-[0-9]+"),
    "aws-cn": re.compile(r"cn-[a-z]+-[0-9]+"),
    "aws-us-gov": re.compile(r"us-gov-[a-z]+-[0-9]+"),
    "aws-iso": re.compile(r"us-iso-[a-z]+-[0-9]+"),
    "aws-iso-b": re.compile(r"us-isob-[a-z]+-[0-9]+"),
    "aws-iso-e": re.compile(r"eu-isoe-[a-z]+-[0-9]+"),
    "aws-iso-f": re.compile(r"us-isof-[a-z]+-[0-9]+"),
    "aws-eusc": re.compile(r"eusc-de-[a-z]+-[0-9]+"),
}
# The program writes its own ARNs in the standard partition (cloud/karpenter.py, cloud/cluster.py).
PROGRAM_PARTITION = "aws"


def partition_of(region: str) -> str | None:
    return next((p for p, regions in PARTITIONS.items() if regions.fullmatch(region)), None)


# IAM principal ARNs: arn:<partition>:iam::<12-digit account>:(role|user)/[path/]name, the path 1-512 characters
# of '/'-separated segments, the name 1-64 of letters, digits and + = , . @ _ - (RoleName/UserName/Path in
# https://docs.aws.amazon.com/IAM/latest/APIReference/API_CreateRole.html and API_CreateUser.html).
IAM_PRINCIPAL_ARN = re.compile(r"arn:(?P<partition>[a-z-]+):iam::(?P<account>[0-9]{12}):(?P<kind>role|user)"
                               r"(?P<path>/(?:[\x21-\x2e\x30-\x7e]+/)*)(?P<name>[\w+=,.@-]+)", re.ASCII)
IAM_USER = NameRule("IAM user name", 64, re.compile(r"[\w+=,.@-]+", re.ASCII), "letters, digits and + = , . @ _ -")


def principal_arn_problem(arn: str, kinds: tuple[str, ...] = ("role", "user")) -> str | None:
    """None when `arn` is an IAM role (or user) ARN AWS would accept in the program's partition."""
    match = IAM_PRINCIPAL_ARN.fullmatch(arn)
    if match is None or match["kind"] not in kinds:
        shape = " or ".join(f"arn:aws:iam::<account>:{k}/<name>" for k in kinds)
        return f"{arn!r} is not an IAM {' or '.join(kinds)} ARN ({shape})"
    if match["partition"] not in PARTITIONS:
        return f"{arn!r}: {match['partition']!r} is no AWS partition ({', '.join(PARTITIONS)})"
    if match["partition"] != PROGRAM_PARTITION:
        return (f"{arn!r} is in partition {match['partition']!r}; this program deploys to the "
                f"{PROGRAM_PARTITION!r} partition, whose principals are arn:{PROGRAM_PARTITION}:iam::...")
    if len(match["path"]) > 512:
        return f"{arn!r}: an IAM path has at most 512 characters, this one {len(match['path'])}"
    rule = IAM_ROLE if match["kind"] == "role" else IAM_USER
    return rule.problem(match["name"])
