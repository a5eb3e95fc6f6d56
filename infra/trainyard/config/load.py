"""Read the stack's configuration once, validate all of it, and report every problem in one message."""

from __future__ import annotations

import copy
import difflib
import json
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

import pulumi
import pydantic
from pulumi.runtime import config as runtime_config
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from trainyard import names
from trainyard.catalogue.addons import load_addons
from trainyard.catalogue.charts import load_catalogue
from trainyard.config import rules
from trainyard.config.addons import addons_section
from trainyard.config.mig import load_mig_catalog
from trainyard.config.model import Settings
from trainyard.escape import escaped
from trainyard.paths import REPO_ROOT, TRAINER_CONFIGS_DIR

# Keys read as secrets; they never enter Settings, so they can't end up in clear in logs or the plan.
SECRET_KEYS = ("grafanaAdminPassword",)
# Keys outside the project's namespace: Pulumi's own (`pulumi:tags`, `pulumi:disable-default-providers`:
# pulumi.com/docs/iac/concepts/config) and `aws:region`, which the program reads (it must agree with
# trainyard:aws.region). The program's AWS and Kubernetes providers are explicit, and an explicit provider reads no
# stack config (pulumi/pulumi-aws#1307: "by design"), so any other key of their namespaces would reach nothing;
# pulumi-random (its default provider) has no settings at all.
ENGINE_NAMESPACE = "pulumi"
READ_KEYS = ("aws:region",)
PROVIDER_NAMESPACES = ("aws", "kubernetes")
# What a stack sets instead of a provider key, by key and then by namespace.
INSTEAD = {
    "aws:profile": "set AWS_PROFILE where pulumi runs (the deploy workflow's OIDC credentials have no profile)",
    "aws:allowedAccountIds": "set trainyard:aws.allowedAccountIds",
    "aws:defaultTags": "set trainyard:aws.tags (every AWS resource carries them)",
    "aws": "the AWS provider takes its credentials from the environment (AWS_PROFILE, AWS_ROLE_ARN...) and the rest "
           "from trainyard:aws",
    "kubernetes:context": "set trainyard:local.kubeconfigContext (target local)",
    "kubernetes": "the Kubernetes provider is the cluster's (the kubeconfig the program builds) or, on target local, "
                  "trainyard:local.kubeconfigContext's",
}

@dataclass(frozen=True)
class Secrets:
    grafana_admin_password: pulumi.Output[str] | None


class ConfigError(pulumi.RunError):
    """A stack file with problems. `pulumi up` prints a RunError without a Python traceback."""

    def __init__(self, project: str, stack: str, problems: list[rules.Problem]) -> None:
        self.problems = problems
        # Escaped: a key or value with a look-alike or zero-width character must not read as the one it imitates.
        lines = [escaped(f"  - {p.key(project)}: {p.message}") for p in problems]
        noun = "problem" if len(problems) == 1 else "problems"
        super().__init__(f"stack {stack!r} has {len(problems)} configuration {noun}; nothing was created:\n"
                         + "\n".join(lines))


def load_settings() -> tuple[Settings, Secrets]:
    """The current stack's Settings and Secrets, or ConfigError listing every problem.

    What a valid stack asks for that cannot take effect is said as a warning (`pulumi up` shows it with the
    preview; the offline plan on stderr).
    """
    project, stack = pulumi.get_project(), pulumi.get_stack()
    values = _config_values()
    prefix = f"{project}:"
    raw = {k[len(prefix):]: decode_value(v) for k, v in values.items() if k.startswith(prefix)}
    settings = parse_settings(project, stack, raw, aws_region=pulumi.Config("aws").get("region"),
                              other_keys=[k for k in values if not k.startswith(prefix)])
    for notice in rules.notices(settings):
        pulumi.log.warn(escaped(f"{notice.key(project)}: {notice.message}"))
    config = pulumi.Config(project)
    return settings, Secrets(grafana_admin_password=config.get_secret("grafanaAdminPassword"))


@cache
def settings_model() -> type[Settings]:
    """Settings with its `addons` section built from the add-on declarations (platform/addons.yaml)."""
    section = addons_section(load_addons(REPO_ROOT))
    model: type[Settings] = pydantic.create_model("Settings", __base__=Settings, addons=(section, section()))
    return model


def parse_settings(project: str, stack: str, raw: Mapping[str, Any], aws_region: str | None = None,
                   other_keys: Iterable[str] = ()) -> Settings:
    """Validate a stack's `project:*` values (already without the prefix) into Settings.

    `aws_region`: the stack's `aws:region`, if set (it must agree with `aws.region`); `other_keys`: the stack's
    keys outside the project namespace (`aws:region`...), each of a namespace something reads.
    """
    data = {"project": project, "stack": stack, **{k: v for k, v in raw.items() if k not in SECRET_KEYS}}
    model = settings_model()
    namespaced = namespace_problems(project, other_keys)
    try:
        settings = model.model_validate(data)
        problems: list[rules.Problem] = list(namespaced)
    except pydantic.ValidationError as exc:
        errors = exc.errors()
        problems = [*namespaced, *(_problem(e) for e in errors)]
        # Bad values don't hide the rest of the report: when each is an unknown key or a scalar with a default,
        # check the stack again with the default in its place, rules included, and keep what concerns other keys.
        if not all(_recoverable(tuple(e["loc"]), e["type"]) for e in errors):
            raise ConfigError(project, stack, problems) from None
        settings = model.model_validate(_without(data, [tuple(e["loc"]) for e in errors]))
        bad = {p.path for p in problems}
    else:
        bad = set()
    problems += [p for p in rules.check(settings, load_mig_catalog(), TRAINER_CONFIGS_DIR,
                                        platform_namespaces=platform_namespaces(), aws_region=aws_region)
                 if not any(p.path == b or p.path.startswith((f"{b}.", f"{b}[")) for b in bad)]
    if problems:
        raise ConfigError(project, stack, problems)
    return settings


def namespace_problems(project: str, keys: Iterable[str]) -> list[rules.Problem]:
    """Keys outside the project's namespace that nothing reads: a provider key the explicit providers ignore, or a
    namespace nobody reads (a typo such as `trainyrd:buckets`, with the closest one read)."""
    known = (project, "aws", ENGINE_NAMESPACE)
    problems = []
    for key in sorted(keys):
        namespace, _, name = key.partition(":")
        if namespace in (project, ENGINE_NAMESPACE) or key in READ_KEYS:
            continue
        if namespace == "random":
            problems.append(rules.Problem(key, "pulumi-random has no provider settings, so this would reach nothing",
                                          foreign=True))
            continue
        if namespace in PROVIDER_NAMESPACES:
            instead = INSTEAD.get(key, INSTEAD[namespace])
            problems.append(rules.Problem(key, f"the program's {namespace} provider is explicit and reads no stack "
                                               f"config{' but aws:region' if namespace == 'aws' else ''}, so this "
                                               f"would reach nothing; {instead}", foreign=True))
            continue
        close = difflib.get_close_matches(namespace, known, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]}:{name}? " if close else ""
        problems.append(rules.Problem(key, f"unknown config namespace {namespace!r}, so nothing would read it; "
                                           f"{hint}namespaces read: {project}, aws (aws:region only), "
                                           f"{ENGINE_NAMESPACE}", foreign=True))
    return problems


def platform_namespaces() -> frozenset[str]:
    """Namespaces the platform installs into: every release's in the catalogue, the dataset namespace, the GPU
    health check's, the tracking server's and its database's, and the tenants' Grafanas'."""
    catalogue = load_catalogue(REPO_ROOT)
    return frozenset({pin.namespace for pin in catalogue.pins.values()}
                     | {names.DATASET_NAMESPACE, names.GPU_HEALTH_NAMESPACE, names.MLFLOW_NAMESPACE,
                        names.MLFLOW_DATABASE_NAMESPACE, names.TENANT_GRAFANA_NAMESPACE})


def _recoverable(loc: tuple[int | str, ...], error_type: str) -> bool:
    if error_type == "extra_forbidden":
        return True
    annotation, field = _resolve(loc)
    scalar = not (isinstance(annotation, type) and issubclass(annotation, BaseModel | list | dict))
    return field is not None and not field.is_required() and scalar and typing.get_origin(annotation) is None


def _without(data: dict[str, Any], locations: list[tuple[int | str, ...]]) -> dict[str, Any]:
    pruned = copy.deepcopy(data)
    for loc in locations:
        node: Any = pruned
        for part in loc[:-1]:
            node = node[part]
        del node[loc[-1]]
    return pruned


def _config_values() -> dict[str, Any]:
    """Every `namespace:key` value the engine hands the program."""
    return {**runtime_config.get_config_env(), **runtime_config.CONFIG.get()}


def decode_value(value: Any) -> Any:
    """The engine hands objects and lists over as JSON text, scalars as plain strings."""
    if isinstance(value, str) and value[:1] in "[{":
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def key_path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path


def _problem(error: Any) -> rules.Problem:
    loc = tuple(error["loc"])
    if error["type"] == "extra_forbidden":
        allowed = _keys_at(loc[:-1])
        return rules.Problem(key_path(loc), "unknown key (a typo?); allowed here: " + ", ".join(allowed))
    if error["type"] == "missing":
        return rules.Problem(key_path(loc), "is required")
    message = str(error["msg"]).removeprefix("Value error, ")
    value = error.get("input")
    shown = f" (got {json.dumps(value)})" if isinstance(value, str | int | float | bool) else ""
    return rules.Problem(key_path(loc), message + shown)


def _keys_at(loc: tuple[int | str, ...]) -> list[str]:
    """The camelCase keys the model accepts at `loc`, for 'did you mean' style errors."""
    annotation, _ = _resolve(loc)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return sorted(f.alias or n for n, f in annotation.model_fields.items() if n not in ("project", "stack"))
    return []


def _resolve(loc: tuple[int | str, ...]) -> tuple[Any, FieldInfo | None]:
    """The type at `loc` in Settings (Optional/Annotated stripped) and the field declaring it, if a field does."""
    current: Any = settings_model()
    field: FieldInfo | None = None
    for part in loc:
        current = _unwrap(current)
        if isinstance(part, str) and isinstance(current, type) and issubclass(current, BaseModel):
            field = next((f for f in current.model_fields.values() if f.alias == part), None)
            if field is None:
                return None, None
            current = field.annotation
        elif isinstance(part, int):
            current, field = _item_type(current), None
    return _unwrap(current), field


def _unwrap(tp: Any) -> Any:
    """Strip Optional/Annotated so the model class shows through."""
    while True:
        origin = typing.get_origin(tp)
        if origin is typing.Annotated:
            tp = typing.get_args(tp)[0]
        elif origin in (typing.Union, types.UnionType):
            tp = next(a for a in typing.get_args(tp) if a is not type(None))
        else:
            return tp


def _item_type(tp: Any) -> Any:
    args = typing.get_args(_unwrap(tp))
    return args[0] if args else tp
