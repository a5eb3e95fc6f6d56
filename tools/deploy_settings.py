"""Print the deploy role of one stack as a `role-arn=...` line for $GITHUB_OUTPUT.

The deploy workflows assume the role the stack file names (`trainyard:deploy.roleArn`), the same role the
program gives a cluster-admin access entry, so the two cannot drift apart.

Usage: python tools/deploy_settings.py <stack>  >> "$GITHUB_OUTPUT"
"""

from __future__ import annotations

import sys

from trainyard.config.load import ConfigError
from trainyard.plan.runtime import read_stack, settings_of


def deploy_outputs(stack: str) -> dict[str, str]:
    settings = settings_of(read_stack(stack))
    if settings.deploy is None:
        raise ValueError(f"stack {stack!r} has no trainyard:deploy (only AWS stacks are deployed by CI)")
    return {"role-arn": settings.deploy.role_arn}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: tools/deploy_settings.py <stack>", file=sys.stderr)
        return 2
    try:
        outputs = deploy_outputs(argv[0])
    except (ConfigError, ValueError) as exc:  # InputError (unknown stack, bad file) is a ValueError
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(f"{k}={v}" for k, v in outputs.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
