"""CloudNativePG: the operator that runs the `local` stack's tracking database (a Cluster the MLflow add-on creates).

On AWS the database is RDS (cloud/database.py), outside the cluster so it survives a rebuild, and the operator is not
installed. One chart with its catalogue values, like the generic add-on; it exists as a module for that condition.
"""

from __future__ import annotations

from trainyard.config import Settings
from trainyard.platform.addon import AddonCode
from trainyard.platform.chart_addon import build


def _local_tracking(settings: Settings) -> bool:
    return settings.target == "local" and settings.addons.mlflow.enabled


COMPONENT = AddonCode(build=build, applies=_local_tracking)
