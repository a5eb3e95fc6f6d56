"""Print what the CI workflows need of AWS stacks, as `key=value` lines for $GITHUB_OUTPUT.

    python tools/deploy_settings.py <stack>                 # deploy-stack.yml: region, role-arn, runner
    python tools/deploy_settings.py --previews [<stack>...] # preview.yml: stacks (JSON list), settings (JSON map)

`--previews` without stacks takes every AWS stack the folder holds, so preview.yml follows the stack files.

`--stacks-dir DIR` (first) reads the stack files from DIR instead of stacks/.

The deploy workflow assumes the role the stack file names (`trainyard:deploy.roleArn`), the same role the program
gives a cluster-admin access entry, and runs on the stack's `deploy.runner`; a preview assumes the read-only role
the program creates for `deploy.preview` and runs on its runner. The stack is validated first, runner against
endpoint included (config/rules.py `runner_problem`), so a stack whose runner cannot reach its API server fails
here, before any runner is picked or any credential exists.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from trainyard.cloud.naming import PREVIEW_ROLE, physical
from trainyard.config.load import ConfigError
from trainyard.config.model import RunnerSettings, Settings
from trainyard.paths import STACKS_DIR
from trainyard.plan.runtime import available_stacks, read_stack, settings_of


def runs_on(runner: RunnerSettings) -> list[str] | dict[str, Any]:
    """The value of a job's `runs-on` (labels, or a runner group with labels: docs.github.com, "Choosing the runner
    for a job")."""
    return {"group": runner.group, "labels": list(runner.labels)} if runner.group else list(runner.labels)


def _compact(value: object) -> str:
    """One line of JSON: a $GITHUB_OUTPUT value that fromJSON reads."""
    return json.dumps(value, separators=(",", ":"))


def _deployed(stack: str, stacks_dir: Path) -> Settings:
    settings = settings_of(read_stack(stack, stacks_dir))
    if settings.deploy is None or settings.aws is None:
        raise ValueError(f"stack {stack!r} has no trainyard:deploy (only AWS stacks are deployed by CI)")
    return settings


def deploy_outputs(stack: str, stacks_dir: Path = STACKS_DIR) -> dict[str, str]:
    settings = _deployed(stack, stacks_dir)
    assert settings.deploy is not None and settings.aws is not None
    return {"region": settings.aws.region, "role-arn": settings.deploy.role_arn,
            "runner": _compact(runs_on(settings.deploy.runner))}


def preview_role_arn(settings: Settings) -> str:
    """The role cloud/cluster.py creates for previews, in the deploy role's account (the one the stack deploys to)."""
    assert settings.deploy is not None
    parts = settings.deploy.role_arn.split(":")
    return f"arn:{parts[1]}:iam::{parts[4]}:role/{physical(settings, PREVIEW_ROLE)}"


def aws_stacks(stacks_dir: Path = STACKS_DIR) -> list[str]:
    return [stack for stack in available_stacks(stacks_dir) if settings_of(read_stack(stack, stacks_dir)).is_aws]


def preview_outputs(stacks: list[str], stacks_dir: Path = STACKS_DIR) -> dict[str, str]:
    """Stacks with `deploy.preview` and, per stack, the region, the preview role and the runner."""
    previewed: dict[str, dict[str, Any]] = {}
    for stack in stacks:
        settings = _deployed(stack, stacks_dir)
        assert settings.deploy is not None and settings.aws is not None
        preview = settings.deploy.preview
        if preview is None:
            print(f"stack {stack!r}: no deploy.preview, so no pull-request preview", file=sys.stderr)
            continue
        previewed[stack] = {"region": settings.aws.region, "role-arn": preview_role_arn(settings),
                            "runner": runs_on(preview.runner or settings.deploy.runner)}
    return {"stacks": _compact(list(previewed)), "settings": _compact(previewed)}


def main(argv: list[str]) -> int:
    stacks_dir = STACKS_DIR
    if argv[:1] == ["--stacks-dir"] and len(argv) > 1:
        stacks_dir, argv = Path(argv[1]), argv[2:]
    previews = argv[:1] == ["--previews"]
    stacks = argv[1:] if previews else argv
    if not previews and len(stacks) != 1:
        print("usage: tools/deploy_settings.py [--stacks-dir DIR] <stack> | --previews [<stack>...]", file=sys.stderr)
        return 2
    try:
        if previews:
            outputs = preview_outputs(stacks or aws_stacks(stacks_dir), stacks_dir)
        else:
            outputs = deploy_outputs(stacks[0], stacks_dir)
    except (ConfigError, ValueError) as exc:  # InputError (unknown stack, bad file) is a ValueError
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(f"{k}={v}" for k, v in outputs.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
