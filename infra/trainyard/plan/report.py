"""Human-readable views of a recording: a preview tree like `pulumi preview`, and a capacity summary."""

from __future__ import annotations

from collections import Counter, defaultdict

from trainyard.config.model import Settings
from trainyard.plan.capacity import PoolCapacity, price_note
from trainyard.plan.recording import Recording, ResourceRecord

LAYERS = ("cloud", "platform", "workloads")


def layer_of(record: ResourceRecord, by_urn: dict[str, ResourceRecord]) -> str:
    """The layer of the outermost trainyard component above a resource (its own type if it is one)."""
    layer = "other"
    current: ResourceRecord | None = record
    while current is not None:
        parts = current.type.split(":")
        if parts[0] == "trainyard" and len(parts) == 3:
            layer = parts[1]
        current = by_urn.get(current.parent) if current.parent else None
    return layer


def tree(recording: Recording, stack: str) -> str:
    by_urn = recording.by_urn()
    children: dict[str | None, list[ResourceRecord]] = defaultdict(list)
    for record in recording.resources:
        parent = record.parent if record.parent in by_urn else None
        children[parent].append(record)
    rows: list[tuple[str, str]] = [("pulumi:pulumi:Stack", f"trainyard-{stack}")]

    def walk(parent: str | None, prefix: str) -> None:
        kids = sorted(children.get(parent, []), key=lambda r: (r.type, r.name))
        for i, record in enumerate(kids):
            last = i == len(kids) - 1
            rows.append((f"{prefix}{'└─ ' if last else '├─ '}{record.type}", record.name))
            walk(record.urn, prefix + ("   " if last else "│  "))

    walk(None, "")
    width = max(len(t) for t, _ in rows) + 2
    lines = [f" +   {'Type':<{width}}Name"]
    lines += [f" +   {t:<{width}}{n}" for t, n in rows]
    return "\n".join(lines)


def summary(recording: Recording, settings: Settings, pools: list[PoolCapacity]) -> str:
    by_urn = recording.by_urn()
    custom = [r for r in recording.resources if r.custom]
    per_layer = Counter(layer_of(r, by_urn) for r in custom)
    lines = [f"Resources: {len(custom)} to create ({len(recording.resources) - len(custom)} components)"]
    lines += [f"  {layer:<10} {per_layer[layer]:>4}" for layer in (*LAYERS, "other") if per_layer[layer]]
    if pools:
        lines += ["", "Node pools (nodes min/desired/max; GPUs and MIG slices at desired size):",
                  f"  {'pool':<12} {'role':<8} {'type':<15} {'capacity':<15} {'nodes':>9} {'GPUs':>5} "
                  f"{'max':>5} {'MIG layout':<15} {'slices':>6} {'$/h':>9} {'$/month':>11} {'up-front $':>11}"]
        for p in pools:
            lines.append(
                f"  {p.name:<12} {p.role:<8} {p.instance_type:<15} {p.capacity:<15} "
                f"{f'{p.min_nodes}/{p.desired_nodes}/{p.max_nodes}':>9} {p.gpus:>5} {p.max_gpus:>5} "
                f"{p.mig_layout or '-':<15} {p.slices:>6} {p.hourly_usd:>9,.2f} {p.monthly_usd:>11,.0f} "
                f"{p.upfront_usd:>11,.0f}")
        total_h = sum(p.hourly_usd for p in pools)
        lines.append(f"  {'total':<12} {'':<8} {'':<15} {'':<15} "
                     f"{sum(p.desired_nodes for p in pools):>9} {sum(p.gpus for p in pools):>5} "
                     f"{sum(p.max_gpus for p in pools):>5} {'':<15} {sum(p.slices for p in pools):>6} "
                     f"{total_h:>9,.2f} {sum(p.monthly_usd for p in pools):>11,.0f} "
                     f"{sum(p.upfront_usd for p in pools):>11,.0f}")
        lines.append(f"  ({price_note(settings)}; EKS control plane, NAT, storage and traffic not included)")
    if recording.outputs:
        lines += ["", "Outputs:"] + [f"  {k}: {v}" for k, v in sorted(recording.outputs.items())]
    return "\n".join(lines)
