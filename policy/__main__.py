"""trainyard's CrossGuard policy pack: `pulumi preview --policy-pack policy` runs it against a stack."""

import sys
from pathlib import Path

# The rules read trainyard's instance-type and MIG tables; the pack lives beside the program in one repository.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "infra"))

from pulumi_policy import EnforcementLevel, PolicyPack  # noqa: E402
from trainyard_policy.pack import policies  # noqa: E402

PolicyPack(name="trainyard-guardrails", enforcement_level=EnforcementLevel.MANDATORY, policies=policies())
