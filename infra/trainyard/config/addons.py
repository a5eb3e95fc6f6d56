"""The stack's `addons` section, derived from the add-on declarations (platform/addons.yaml): one key per add-on
with a stack switch, typed by `AddonSettings` where it declares settings beyond `enabled`."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pydantic

from trainyard.catalogue.addons import AddonSpec
from trainyard.catalogue.charts import CatalogueError
from trainyard.config.model import AddonSettings, AddonSwitch

MODEL_FILE = "infra/trainyard/config/model.py"


def addon_settings(addons: Iterable[AddonSpec]) -> dict[str, type[AddonSwitch]]:
    """`Settings.addons` field -> its settings type, for every add-on with a stack switch, in registry order."""
    switchable = [addon.field for addon in addons if addon.switch]
    declared: dict[str, type[AddonSwitch]] = {}
    for name, info in AddonSettings.model_fields.items():
        if name not in switchable:
            raise CatalogueError(f"{MODEL_FILE}: AddonSettings.{name} is no add-on of platform/addons.yaml with a "
                                 "stack switch")
        kind = info.annotation
        if not (isinstance(kind, type) and issubclass(kind, AddonSwitch)):
            raise CatalogueError(f"{MODEL_FILE}: AddonSettings.{name} is typed {kind}, not an AddonSwitch")
        declared[name] = kind
    return {name: declared.get(name, AddonSwitch) for name in switchable}


def addons_section(addons: Iterable[AddonSpec]) -> type[AddonSettings]:
    """The `addons` model stacks are validated against."""
    fields: dict[str, Any] = {name: (kind, kind()) for name, kind in addon_settings(addons).items()}
    section: type[AddonSettings] = pydantic.create_model("AddonSettings", __base__=AddonSettings, **fields)
    return section
