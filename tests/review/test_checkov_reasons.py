"""Every release's Checkov reasons file (platform/<release>/checkov.yaml) maps check ids to a written reason (`why`)
and the rendered objects it is accepted for (`objects`: `<kind>.<name>`, as the rendered files are named). The scan
that reads them is CI's (checkov marker); this runs everywhere, so a file YAML cannot read (a reason with an
unquoted ': ' in it) is caught before landing."""

from __future__ import annotations

import re

import pytest
import yaml
from review_support import REPO_ROOT
from test_checkov_rendered import REASONS_GLOB

PATHS = sorted(REPO_ROOT.glob(REASONS_GLOB))


def test_there_are_reasons_files() -> None:
    assert PATHS


@pytest.mark.parametrize("path", PATHS, ids=[p.parent.name for p in PATHS])
def test_reasons_map_check_ids_to_a_reason_and_its_objects(path) -> None:  # type: ignore[no-untyped-def]
    checks = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert isinstance(checks, dict) and checks, path
    for check, entry in checks.items():
        assert re.fullmatch(r"CKV2?_[A-Z0-9]+_\d+", str(check)), (path, check)
        assert isinstance(entry, dict) and set(entry) == {"why", "objects"}, (path, check)
        assert isinstance(entry["why"], str) and entry["why"].strip(), (path, check)
        objects = entry["objects"]
        assert isinstance(objects, list) and objects, (path, check)
        assert all(re.fullmatch(r"[a-z]+\.[a-z0-9][-a-z0-9.]*", str(o)) for o in objects), (path, check, objects)
