"""Kubernetes resource quantities ("500m", "64", "16Gi", "1.5Ti", "1e3"): the one parser every layer reads them with.

The grammar is Kubernetes' own (k8s.io/apimachinery pkg/api/resource/quantity.go, <quantity> ::= <signedNumber>
<suffix>): an optional sign, a decimal number, then a decimal SI suffix (m, k, M, G, T, P, E), a binary one (Ki ...
Ei) or a decimal exponent `e`/`E` with a signed integer (its suffixHandler.interpret reads it with ParseInt), so
`1e3` is 1000 and `1E` is one exa. Whether a sign makes sense is the reader's call.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal

_FACTORS = {"Ki": Decimal(2**10), "Mi": Decimal(2**20), "Gi": Decimal(2**30), "Ti": Decimal(2**40),
            "Pi": Decimal(2**50), "Ei": Decimal(2**60), "m": Decimal("0.001"), "k": Decimal(10**3),
            "M": Decimal(10**6), "G": Decimal(10**9), "T": Decimal(10**12), "P": Decimal(10**15),
            "E": Decimal(10**18)}
_QUANTITY = re.compile(rf"(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
                       rf"(?:[eE](?P<exponent>[+-]?[0-9]+)|(?P<suffix>{'|'.join(_FACTORS)}))?")


def parse_quantity(text: str) -> Decimal:
    """The exact amount (cores, bytes, devices) `text` stands for; ValueError when it is no quantity."""
    match = _QUANTITY.fullmatch(text)
    if match is None:
        raise ValueError(f"{text!r} is not a Kubernetes quantity such as '500m', '64', '16Gi', '2Ti' or '1e3'")
    if match["exponent"] is not None:
        return Decimal(match["number"]).scaleb(int(match["exponent"]))
    return Decimal(match["number"]) * _FACTORS.get(match["suffix"] or "", Decimal(1))


def quantity_bytes(text: str) -> int:
    """A memory or storage quantity in whole bytes, rounded up."""
    return math.ceil(parse_quantity(text))
