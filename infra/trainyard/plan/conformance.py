"""Conformance of rendered objects and Helm values against upstream schemas.

Two checks, both pure functions returning a list of `Problem`s (empty = conformant):

* `check_manifest`: built-in kinds against Kubernetes' own OpenAPI-derived schemas (kubernetes-validate,
  strict: unknown fields fail); custom resources against the CRD JSON schemas in
  `<upstream>/crds/<group>/<kind>_<version>.json`. An object with no schema is a problem, never a pass.
* `check_rendered`: every object the Helm releases render, built-ins as above and custom resources against the
  schema of the CRD the stack's own charts install (what the API server validates them with).
* `check_helm_values`: every key path we set must exist in the chart's upstream `values.yaml` (subcharts
  addressed by their dependency key), except inside free-form maps (see `_is_free_form`); values are also
  validated against `values.schema.json` where the chart (or subchart) ships one, after Helm-style merging
  over the defaults. A chart/version without upstream data is reported as MISSING_UPSTREAM, not as key errors.

The upstream data is not part of the repository: `tools/upstream.py sync` fills `upstream_dir()` (`.upstream/`, or
`$TRAINYARD_UPSTREAM`) from the sources and checksums in `tools/upstream.lock.yaml`.
"""

from __future__ import annotations

import importlib.resources
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jsonschema
import kubernetes_validate
import yaml
from referencing import Registry, Resource

from trainyard.catalogue.charts import deep_merge
from trainyard.plan.rendering import RenderedStack, chart_name
from trainyard.plan.upstream import kubernetes_schema_version, upstream_dir

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

# Problem kinds: schema/key violations vs. data we could not check at all.
INVALID = "invalid"
UNKNOWN_KEY = "unknown-key"
MISSING_SCHEMA = "missing-schema"
MISSING_UPSTREAM = "missing-upstream"

# Maps whose keys are data rather than chart options: Kubernetes label/annotation/selector maps, resource
# quantities, and pass-through args/env. Upstream often ships them non-empty (karpenter's nodeSelector is
# {kubernetes.io/os: linux}), so "key exists upstream" would wrongly reject our own entries.
_FREE_FORM_KEYS = frozenset(("resources", "extraArgs", "extraEnv", "env", "global"))
_FREE_FORM_SUFFIXES = ("labels", "annotations", "nodeselector")
# Keys a chart reads but its values.yaml only shows as a commented-out example, so the key-exists rule cannot
# see them. Kept explicit and minimal: chart -> dotted key paths accepted with any sub-keys.
_COMMENTED_UPSTREAM_KEYS: Mapping[str, frozenset[str]] = {
    # values.yaml v26.7.0, dcgmExporter: "config: name / create / data" (custom metrics ConfigMap); operator,
    # validator and nodeStatusExporter: `#version: ""`, read by templates/_helpers.tpl and clusterpolicy.yaml.
    "gpu-operator": frozenset(("dcgmExporter.config", "operator.version", "validator.version",
                               "nodeStatusExporter.version")),
    # values.yaml 1.0.18 controller.pdb: `# minAvailable: 1`, read by
    # templates/controller/workflow-controller-deployment-pdb.yaml (else the PDB renders minAvailable: 0).
    "argo-workflows": frozenset(("controller.pdb.minAvailable",)),
}
# Values a chart copies verbatim into a custom resource's spec: checked against that CRD's `spec` schema (far
# stricter than the example in values.yaml, which omits most optional fields). chart -> top-level key ->
# (CRD schema file under upstream/crds, whether the value is a list of {name, spec, ...} items).
_CRD_PASSTHROUGH: Mapping[str, Mapping[str, tuple[str, bool]]] = {
    "rook-ceph-cluster": {
        "cephClusterSpec": ("ceph.rook.io/cephcluster_v1.json", False),
        "cephBlockPools": ("ceph.rook.io/cephblockpool_v1.json", True),
        "cephFileSystems": ("ceph.rook.io/cephfilesystem_v1.json", True),
        "cephObjectStores": ("ceph.rook.io/cephobjectstore_v1.json", True),
    },
}


@dataclass(frozen=True, slots=True)
class Problem:
    where: str  # file or object, e.g. "Deployment/ns/name" or "helm/cilium"
    path: str  # dotted path inside it ("" for the whole thing)
    message: str
    kind: str = INVALID

    def __str__(self) -> str:
        location = f"{self.where}:{self.path}" if self.path else self.where
        return f"{location}: [{self.kind}] {self.message}"


# --------------------------------------------------------------------------------------------- manifests


def check_manifest(obj: Mapping[str, Any], k8s_version: str, *, upstream: Path | None = None) -> list[Problem]:
    """Validate one full Kubernetes object (built-in or custom resource)."""
    where = _object_name(obj)
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    if not isinstance(api_version, str) or not isinstance(kind, str):
        return [Problem(where, "", "object needs string apiVersion and kind", INVALID)]
    group, _, version = api_version.rpartition("/")
    crd_group_dir = (upstream or upstream_dir()) / "crds" / group
    if group and crd_group_dir.is_dir():
        return _check_custom_resource(obj, where, crd_group_dir / f"{kind.lower()}_{version}.json")
    return _check_builtin(obj, where, k8s_version)


def check_rendered(rendered: RenderedStack, k8s_version: str, *, upstream: Path | None = None) -> list[Problem]:
    """Every rendered object: a custom resource whose CRD a release of the stack renders is validated against that
    CRD's served schema (the API server's validation of a structural schema; unknown fields it prunes), every
    other object as `check_manifest` does."""
    schemas: dict[tuple[str, str], Mapping[str, Any]] = {}
    for _, crd in rendered.objects():
        if crd.get("kind") == "CustomResourceDefinition":
            spec = crd.get("spec") or {}
            kind = str((spec.get("names") or {}).get("kind"))
            for served in spec.get("versions") or ():
                schema = (served.get("schema") or {}).get("openAPIV3Schema")
                if schema is not None:
                    schemas[(f"{spec.get('group')}/{served.get('name')}", kind)] = schema
    problems = []
    for release, obj in rendered.objects():
        schema = schemas.get((str(obj.get("apiVersion")), str(obj.get("kind"))))
        found = ([Problem(_object_name(obj), _dotted(e.absolute_path), e.message, INVALID)
                  for e in _validator_for(schema).iter_errors(obj)] if schema is not None
                 else check_manifest(obj, k8s_version, upstream=upstream))
        problems += [Problem(f"rendered/{release.name}/{p.where}", p.path, p.message, p.kind) for p in found]
    return problems


def _object_name(obj: Mapping[str, Any]) -> str:
    metadata = obj.get("metadata")
    if not isinstance(metadata, Mapping):
        metadata = {}
    parts = [str(obj.get("kind", "?")), str(metadata.get("namespace", "")), str(metadata.get("name", "?"))]
    return "/".join(p for p in parts if p)


def _check_builtin(obj: Mapping[str, Any], where: str, k8s_version: str) -> list[Problem]:
    schema_version = kubernetes_schema_version(k8s_version)
    validator = _builtin_validator(schema_version, obj["apiVersion"], obj["kind"])
    if validator is None:
        return [Problem(where, "", f"no schema for {obj['apiVersion']} {obj['kind']}: neither a Kubernetes "
                        f"{schema_version} kind nor a CRD in the upstream data", MISSING_SCHEMA)]
    # The first error, as kubernetes-validate reports; one per object is enough to fail a plan.
    for err in validator.iter_errors(dict(obj)):
        return [Problem(where, _dotted(err.absolute_path), err.message, INVALID)]
    return []


@cache
def _builtin_validator(schema_version: str, api_version: str, kind: str) -> jsonschema.protocols.Validator | None:
    """The strict schema (unknown fields fail) kubernetes-validate ships for the kind, None where it ships none;
    read and compiled once per process, where its `validate` parses the 1.5 MB of shared definitions for every
    object. Its files are named kind-group-version.json, the group cut to its first label (rbac.authorization.k8s.io/v1
    -> role-rbac-v1.json), beside _definitions.json (kubernetes-validate 1.37.0, kubernetes_validate/utils.py)."""
    group, _, version = api_version.rpartition("/")
    name = f"{kind.lower()}-{group.split('.')[0]}-{version}.json" if group else f"{kind.lower()}-{version}.json"
    folder = _builtin_schemas(schema_version)
    if "/" in name or not (folder / name).is_file():
        return None
    schema = json.loads((folder / name).read_text(encoding="utf-8"))
    registry: Registry[Any] = Resource.from_contents(schema) @ _builtin_definitions(schema_version)
    return jsonschema.Draft202012Validator(schema, registry=registry)


def _builtin_schemas(schema_version: str) -> Traversable:
    return importlib.resources.files(kubernetes_validate) / "kubernetes-json-schema" / f"v{schema_version}-local-strict"


@cache
def _builtin_definitions(schema_version: str) -> Registry[Any]:
    definitions = json.loads((_builtin_schemas(schema_version) / "_definitions.json").read_text(encoding="utf-8"))
    return Resource.from_contents(definitions) @ Registry()


def _check_custom_resource(obj: Mapping[str, Any], where: str, schema_path: Path) -> list[Problem]:
    if not schema_path.is_file():
        return [Problem(where, "", f"no CRD schema {schema_path.parent.name}/{schema_path.name} for "
                        f"{obj['apiVersion']} {obj['kind']}", MISSING_SCHEMA)]
    validator = _validator(schema_path)
    return [Problem(where, _dotted(err.absolute_path), err.message, INVALID)
            for err in sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.absolute_path)))]


@cache
def _validator(schema_path: Path) -> jsonschema.protocols.Validator:
    return _validator_for(_load_json_or_yaml(schema_path))


def _validator_for(schema: Mapping[str, Any]) -> jsonschema.protocols.Validator:
    # The schema's own $schema picks the draft; the kubeconform-style CRD files carry none (draft 7 rules).
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft7Validator)
    return cls(schema)


# ------------------------------------------------------------------------------------------- helm values


def check_helm_values(release: Mapping[str, Any], *, upstream: Path | None = None) -> list[Problem]:
    """Check a rendered release `{name, namespace, chart, repository, version, values}` against upstream."""
    where = f"helm/{release.get('name', '?')}"
    chart, version = str(release.get("chart", "")), str(release.get("version", ""))
    values = release.get("values") or {}
    if not isinstance(values, Mapping):
        return [Problem(where, "values", "values must be a map", INVALID)]
    data = upstream or upstream_dir()
    chart_dir = data / "charts" / chart / version
    if not (chart_dir / "values.yaml").is_file():
        return [Problem(where, "", f"no upstream data for chart {chart} {version} "
                        f"(expected {chart_dir}/values.yaml): cannot verify its values", MISSING_UPSTREAM)]
    chart_data = _upstream_chart(chart_dir)
    documented = _COMMENTED_UPSTREAM_KEYS.get(chart, frozenset())
    passthrough = _CRD_PASSTHROUGH.get(chart, {})
    crds = data / "crds"
    problems: list[Problem] = []
    for key, value in values.items():
        if key in passthrough:
            schema_file, is_list = passthrough[key]
            problems.extend(_check_passthrough(where, key, value, crds / schema_file, is_list))
        elif key in chart_data.subcharts:
            # The parent's block for a subchart only overrides the subchart's defaults: check against those.
            parent_block = chart_data.defaults.get(key) or {}
            problems.extend(_check_subchart(where, key, value, chart_data.subcharts[key], parent_block))
        else:
            problems.extend(_walk(where, (key,), value, chart_data.defaults, chart_data.schema, documented))
    if chart_data.validator is not None:
        merged = deep_merge(chart_data.defaults, values)
        problems.extend(_schema_problems(where, "", chart_data.validator, merged))
    return problems


def release_values_problems(releases: Iterator[Mapping[str, Any]], *, upstream: Path | None = None) -> list[str]:
    """`check_helm_values` over the inputs of a stack's Release records (the values exactly as the Release gets
    them), one line each. Helm accepts any key a chart has no values.schema.json for, so a mistyped key would
    otherwise do nothing, silently."""
    return [str(problem) for inputs in releases for problem in check_helm_values(
        {**inputs, "chart": chart_name(str(inputs.get("chart", "")))}, upstream=upstream)]


@dataclass(frozen=True)
class _UpstreamChart:
    defaults: Mapping[str, Any]
    schema: Mapping[str, Any] | None
    validator: jsonschema.protocols.Validator | None
    # dependency key (alias or name) -> its upstream data, None when the dependency is declared but not stored
    subcharts: Mapping[str, _UpstreamChart | None]


@cache
def _upstream_chart(chart_dir: Path) -> _UpstreamChart:
    defaults = _load_json_or_yaml(chart_dir / "values.yaml") or {}
    schema_path = chart_dir / "values.schema.json"
    schema = _load_json_or_yaml(schema_path) if schema_path.is_file() else None
    validator = None if schema is None else _validator_for(schema)
    subcharts: dict[str, _UpstreamChart | None] = {}
    chart_yaml = chart_dir / "Chart.yaml"
    metadata = _load_json_or_yaml(chart_yaml) if chart_yaml.is_file() else None
    dependencies = (metadata or {}).get("dependencies") or []
    for dependency in dependencies:
        sub_dir = chart_dir / "charts" / dependency["name"]
        key = dependency.get("alias") or dependency["name"]
        subcharts[key] = _upstream_chart(sub_dir) if (sub_dir / "values.yaml").is_file() else None
    return _UpstreamChart(defaults=defaults, schema=schema, validator=validator, subcharts=subcharts)


def _check_passthrough(where: str, key: str, value: Any, schema_path: Path, is_list: bool) -> list[Problem]:
    if not schema_path.is_file():
        return [Problem(where, key, f"no CRD schema {schema_path.name} to check these values against",
                        MISSING_SCHEMA)]
    spec_schema = _load_json_or_yaml(schema_path)["properties"]["spec"]
    validator = _validator_for(spec_schema)
    if not is_list:
        specs = [(key, value)]
    elif isinstance(value, list):
        specs = [(f"{key}.{i}.spec", item.get("spec", {}))
                 for i, item in enumerate(value) if isinstance(item, dict)]
    else:
        return [Problem(where, key, f"expected a list, got {type(value).__name__}", INVALID)]
    return [Problem(where, ".".join(p for p in (prefix, _dotted(err.absolute_path)) if p),
                    f"{schema_path.name}: {err.message}", INVALID)
            for prefix, spec in specs for err in validator.iter_errors(spec)]


def _check_subchart(where: str, key: str, value: Any, sub: _UpstreamChart | None,
                    parent_block: Mapping[str, Any]) -> list[Problem]:
    if sub is None:
        return [Problem(where, key, f"subchart {key!r} has no upstream values stored: cannot verify "
                        "keys set under it", MISSING_UPSTREAM)]
    if not isinstance(value, Mapping):
        return [Problem(where, key, f"subchart values must be a map, got {type(value).__name__}", INVALID)]
    # Keys may come from the subchart's defaults or the parent's block (e.g. a dependency `condition` such as
    # grafana.enabled lives only in the parent's values.yaml).
    known = deep_merge(sub.defaults, parent_block)
    problems = [p for k, v in value.items()
                for p in _walk(where, (key, k), v, known, sub.schema, frozenset(), depth=1)]
    if sub.validator is not None:
        problems.extend(_schema_problems(where, key, sub.validator, deep_merge(known, value)))
    return problems


def _walk(where: str, path: tuple[str, ...], value: Any, upstream_map: Mapping[str, Any],
          schema: Mapping[str, Any] | None, documented: frozenset[str], depth: int = 0) -> Iterator[Problem]:
    """Check the key at path[-1] (a child of upstream_map) and, for maps, everything below it.

    `depth` is how many leading path elements address a subchart (they are not part of its schema paths).
    """
    key = path[-1]
    dotted = ".".join(path)
    if ".".join(path[depth:]) in documented:
        return
    if key not in upstream_map:
        if not _schema_declares(schema, path[depth:]):
            yield Problem(where, dotted, "key not in the chart's upstream values.yaml (nor declared by its "
                          "values.schema.json)", UNKNOWN_KEY)
        return
    default = upstream_map[key]
    if _is_free_form(key, default) or value is None:
        return
    if isinstance(default, Mapping):
        if not isinstance(value, Mapping):
            yield Problem(where, dotted, f"upstream is a map, got {type(value).__name__}", INVALID)
            return
        for child, child_value in value.items():
            yield from _walk(where, (*path, str(child)), child_value, default, schema, documented, depth)
    elif isinstance(value, Mapping):
        yield Problem(where, dotted, f"upstream is a {type(default).__name__}, got a map: its keys would be "
                      "ignored by the chart", INVALID)


def _is_free_form(key: str, default: Any) -> bool:
    """A map accepts any sub-keys when upstream leaves it open (null or {}) or it is a data map by name."""
    if default is None or (isinstance(default, Mapping) and not default):
        return True
    return key in _FREE_FORM_KEYS or key.lower().endswith(_FREE_FORM_SUFFIXES)


def _schema_declares(schema: Mapping[str, Any] | None, path: tuple[str, ...]) -> bool:
    """True when values.schema.json names this exact key path under `properties` (any branch of *Of)."""
    if schema is None:
        return False
    nodes: list[Mapping[str, Any]] = [schema]
    for key in path:
        next_nodes: list[Mapping[str, Any]] = []
        for node in nodes:
            for branch in (node, *node.get("anyOf", ()), *node.get("oneOf", ()), *node.get("allOf", ())):
                child = branch.get("properties", {}).get(key)
                if isinstance(child, Mapping):
                    next_nodes.append(child)
        if not next_nodes:
            return False
        nodes = next_nodes
    return True


def _schema_problems(where: str, prefix: str, validator: jsonschema.protocols.Validator,
                     merged: Any) -> list[Problem]:
    problems = []
    for err in sorted(validator.iter_errors(merged), key=lambda e: list(map(str, e.absolute_path))):
        path = ".".join(p for p in (prefix, _dotted(err.absolute_path)) if p)
        problems.append(Problem(where, path, f"values.schema.json: {err.message}", INVALID))
    return problems


# -------------------------------------------------------------------------------------------------- util


def _dotted(path: Any) -> str:
    return ".".join(str(p) for p in path)


# libyaml (PyYAML's C loader) where PyYAML was built with it: a fifth of the pure loader's time on the charts'
# values.yaml, the same values (tests/conformance/test_checker.py compares both on every pinned chart).
YAML_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _load_json_or_yaml(path: Path) -> Any:
    with path.open(encoding="utf-8") as handle:
        # json is much faster than YAML on the large CRD and cilium schemas.
        return json.load(handle) if path.suffix == ".json" else yaml.load(handle, Loader=YAML_LOADER)  # noqa: S506
