"""CephFS snapshot schedules: the stack writes cron, Ceph's snap-schedule module takes an interval.

Only the cron expressions that repeat at a fixed interval map to one (`<N>m`, `<N>h`, `<N>d`, the units
snap-schedule accepts: docs.ceph.com/en/latest/cephfs/snap-schedule/); any other is refused with the forms that work.
"""

from __future__ import annotations

import re

# minute hour day-of-month, then month and weekday left open: `*`, `0` or a step `*/N` (N from 1: a step of 0 is
# no cron at all). Steps stay below the field's range, or the schedule would fire once per hour, day or month.
_FIELD = r"\*|0|\*/[1-9][0-9]?"
_CRON = re.compile(rf"(?P<minute>{_FIELD}) (?P<hour>{_FIELD}) (?P<day>{_FIELD}) \* \*")
_LIMITS = {"minute": 59, "hour": 23, "day": 31}
FORMS = "'*/N * * * *', '0 */N * * *', '0 0 * * *', '0 0 */N * *'"


def snapshot_interval(cron: str) -> str:
    """A Ceph snap-schedule interval for a periodic cron expression; ValueError for any other."""
    match = _CRON.fullmatch(cron)
    fields = match.groupdict() if match else {}
    step = {name: int(value.removeprefix("*/")) for name, value in fields.items() if value.startswith("*/")}
    if any(value > _LIMITS[name] for name, value in step.items()):
        fields = {}
    if fields and set(step) == {"minute"} and fields["hour"] == fields["day"] == "*":
        return f"{step['minute']}m"
    if fields and fields["minute"] == "0" and set(step) == {"hour"} and fields["day"] == "*":
        return f"{step['hour']}h"
    if fields and fields["minute"] == fields["hour"] == "0" and fields["day"] == "*":
        return "1d"
    if fields and fields["minute"] == fields["hour"] == "0" and set(step) == {"day"}:
        return f"{step['day']}d"
    raise ValueError(f"snapshot schedule {cron!r}: only periodic schedules map to Ceph intervals ({FORMS})")
