"""One Kubernetes quantity parser: what the stack model accepts, every layer reads alike, and nothing else passes."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from owned_stacks import FLEET, stack_file
from trainyard.config import ConfigError
from trainyard.config.load import decode_value, parse_settings
from trainyard.config.quantity import parse_quantity, quantity_bytes
from trainyard.plan.cluster_model import quantity
from trainyard.plan.runtime import PROJECT
from trainyard.platform.monitoring import retention_size


@pytest.mark.parametrize(("text", "amount"), [
    ("500m", Decimal("0.5")), ("64", Decimal(64)), ("1.5", Decimal("1.5")), (".5", Decimal("0.5")),
    ("16Gi", Decimal(16 * 2**30)), ("2Ti", Decimal(2 * 2**40)), ("500M", Decimal(500 * 10**6)),
    ("3k", Decimal(3000)), ("1Pi", Decimal(2**50)), ("1E", Decimal(10**18)), ("104857600Ki", Decimal(100 * 2**30)),
    # apimachinery's <signedNumber> and <decimalExponent> (pkg/api/resource/quantity.go): the API server takes these.
    ("1e3", Decimal(1000)), ("2E3", Decimal(2000)), ("+1", Decimal(1)), ("-1", Decimal(-1)), ("1e-3", Decimal("0.001")),
    ("1.5e+2", Decimal(150)), ("5.", Decimal(5)), ("-500m", Decimal("-0.5")),
])
def test_a_quantity_is_its_exact_amount(text: str, amount: Decimal) -> None:
    assert parse_quantity(text) == amount


# The exponent is an integer (its suffixHandler.interpret reads it with strconv.ParseInt); one sign, in front.
@pytest.mark.parametrize("text", ["", "Gi", "16gi", "16GB", "16 Gi", "1.2.3", "16Gi\n", "ki", "0x10", "e3", "1e",
                                  "1e1.5", "1e+", "+", "--1", "1-", "1Ki3", "1e3Ki", "1Ei3", "."])
def test_what_is_no_quantity_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="is not a Kubernetes quantity"):
        parse_quantity(text)


# Sizes of 100 GiB in the forms the stack model accepts: config, workloads, plan and platform read them alike.
SAME_SIZE = ["100Gi", "107374182400", "104857600Ki", "0.09765625Ti"]


@pytest.mark.parametrize("text", SAME_SIZE)
def test_every_layer_reads_an_accepted_size_alike(text: str) -> None:
    assert quantity_bytes(text) == 100 * 2**30
    assert quantity(text) == 100 * 2**30
    assert retention_size(text) == retention_size("100Gi") == "85GB"


def _fleet() -> dict[str, Any]:
    return {k.split(":", 1)[1]: decode_value(v) for k, v in stack_file(FLEET).values.items()}


@pytest.mark.parametrize("text", SAME_SIZE)
def test_the_stack_model_accepts_what_the_layers_read(text: str) -> None:
    raw = _fleet()
    raw.setdefault("addons", {}).setdefault("monitoring", {})["storageSize"] = text
    assert parse_settings(PROJECT, "fleet", raw).addons.monitoring.storage_size == text


def test_a_negative_amount_is_refused_by_key() -> None:
    raw = _fleet()
    raw.setdefault("addons", {}).setdefault("alluxio", {})["memoryCache"] = "-1Gi"
    with pytest.raises(ConfigError, match=r"trainyard:addons\.alluxio\.memoryCache: .*'-1Gi' is negative"):
        parse_settings(PROJECT, "fleet", raw)


def test_a_quantity_with_a_trailing_newline_is_refused_by_key() -> None:
    raw = _fleet()
    raw.setdefault("addons", {}).setdefault("alluxio", {})["memoryCache"] = "16Gi\n"
    with pytest.raises(ConfigError, match=r"trainyard:addons\.alluxio\.memoryCache: .*not a Kubernetes quantity"):
        parse_settings(PROJECT, "fleet", raw)
