"""The rehearsal's rule on how long `pulumi up` waits for a Job: whether the Job ends (and says why) before the
engine stops waiting for it."""

from __future__ import annotations

import re

from trainyard.plan.pods import lookup
from trainyard.plan.recording import ResourceRecord
from trainyard.plan.resource_types import JOB
from trainyard.plan.rules.base import Moment, of_type, rule

SKIP_AWAIT = "pulumi.com/skipAwait"
# pulumi-kubernetes awaits a Job until it completes, 10 minutes unless customTimeouts.create says otherwise
# (pulumi/pulumi-kubernetes provider/pkg/await/job.go DefaultJobTimeoutMins, v4.32.0, the newest stored).
JOB_AWAIT_SECONDS = 10 * 60
GO_DURATION = re.compile(r"(\d+(?:\.\d+)?)(h|m|s)")
UNIT_SECONDS = {"h": 3600, "m": 60, "s": 1}


def duration_seconds(value: str) -> float | None:
    """A Go duration of h/m/s parts ("10m", "1h30m", "660s") in seconds; None when it is not one."""
    parts = GO_DURATION.findall(value)
    if not parts or "".join(n + u for n, u in parts) != value:
        return None
    return sum(float(n) * UNIT_SECONDS[u] for n, u in parts)


# A Job that may run until its activeDeadlineSeconds outlasts the engine's await: `pulumi up` then fails with the
# provider's generic await timeout while the Job is still running, and the reason its pod reports when it ends
# (what the Job exists to say) comes after `pulumi up` stopped listening.
@rule("job-ends-before-its-await", of_type(JOB),
      "pulumi/pulumi-kubernetes provider/pkg/await/job.go DefaultJobTimeoutMins (v4.32.0)")
def job_ends_before_its_await(record: ResourceRecord, _moment: Moment) -> str | None:
    if str(lookup(record.inputs, f"metadata.annotations.{SKIP_AWAIT}", "")).lower() == "true":
        return None
    deadline = lookup(record.inputs, "spec.activeDeadlineSeconds")
    if deadline is None:
        return None
    timeout = record.custom_timeouts.get("create")
    seconds = duration_seconds(timeout) if timeout else JOB_AWAIT_SECONDS
    if seconds is None or int(deadline) < seconds:
        return None
    said = f"customTimeouts.create {timeout}" if timeout else f"the provider's default {JOB_AWAIT_SECONDS // 60} min"
    return (f"pulumi up stops waiting for the Job after {int(seconds)} s ({said}), before its activeDeadlineSeconds "
            f"{deadline}: it fails with a generic await timeout while the Job still runs, and the Job's own reason "
            "comes too late; set customTimeouts.create above the deadline")
