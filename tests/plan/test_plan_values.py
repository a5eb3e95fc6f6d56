"""The plan refuses a Helm value the chart does not take: most charts ship no values.schema.json, so Helm itself
accepts any key and the setting silently does nothing."""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import trainyard.__main__ as cli
from owned_stacks import OWNED_STACKS
from trainyard.plan import runtime
from trainyard.plan.recording import Recording
from trainyard.plan.rendering import RELEASE, chart_name


def test_a_mistyped_release_value_stops_the_plan_naming_release_and_key(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    def with_typo(stack: runtime.StackFile, recording: Recording | None = None) -> runtime.StackPlan:
        planned = runtime.plan_stack(stack, recording)
        for index, record in enumerate(planned.recording.resources):
            if record.type == RELEASE and chart_name(str(record.inputs["chart"])) == "karpenter":
                inputs: dict[str, Any] = copy.deepcopy(record.inputs)
                inputs["values"]["controler"] = {"typo": True}
                planned.recording.resources[index] = replace(record, inputs=inputs)
        return planned

    monkeypatch.setattr(cli, "plan_stack", with_typo)
    code = cli.main(["plan", "--stack", "fleet", "--stacks-dir", str(OWNED_STACKS), "--out", str(tmp_path / "out")])
    error = capsys.readouterr().err
    assert code == 2
    assert error.startswith("error: Helm release values the charts do not take")
    assert "helm/karpenter:controler: [unknown-key]" in error and "Traceback" not in error
    assert not (tmp_path / "out").exists()
