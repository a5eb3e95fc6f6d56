"""The rules as CrossGuard stack policies: each sees every resource of the stack at once."""

from __future__ import annotations

from pulumi_policy import ReportViolation, StackValidationArgs, StackValidationPolicy

from trainyard_policy.resources import Resource
from trainyard_policy.rules import RULES, Rule


def _view(resource: object) -> Resource:
    """A pulumi_policy.PolicyResource as a rule reads it (props are what the engine has: inputs in a preview)."""
    parent = getattr(resource, "parent", None)
    return Resource(urn=resource.urn, type=resource.resource_type, name=resource.name,  # type: ignore[attr-defined]
                    inputs=dict(resource.props), protect=bool(resource.opts.protect),  # type: ignore[attr-defined]
                    parent=getattr(parent, "urn", None))


def _policy(rule: Rule) -> StackValidationPolicy:
    def validate(args: StackValidationArgs, report_violation: ReportViolation) -> None:
        for violation in rule.check([_view(r) for r in args.resources]):
            report_violation(violation.message, violation.urn)

    return StackValidationPolicy(name=rule.name, description=rule.description, validate=validate)


def policies() -> list[StackValidationPolicy]:
    return [_policy(rule) for rule in RULES]
