"""What a stack's node pools add up to: nodes, GPUs, MIG slices and an hourly cost estimate."""

from __future__ import annotations

from dataclasses import dataclass

from trainyard.config.instance_types import INSTANCE_TYPES, PRICE_SOURCE
from trainyard.config.mig import MigCatalog
from trainyard.config.model import NodePool, Settings

HOURS_PER_MONTH = 730


@dataclass(frozen=True, slots=True)
class PoolCapacity:
    name: str
    role: str
    instance_type: str  # the first listed type: what the estimate prices
    capacity: str
    min_nodes: int
    desired_nodes: int
    max_nodes: int
    gpus_per_node: int
    mig_layout: str | None
    slices_per_node: int
    hourly_usd_per_node: float

    @property
    def gpus(self) -> int:
        return self.desired_nodes * self.gpus_per_node

    @property
    def max_gpus(self) -> int:
        return self.max_nodes * self.gpus_per_node

    @property
    def slices(self) -> int:
        return self.desired_nodes * self.slices_per_node

    @property
    def hourly_usd(self) -> float:
        return self.desired_nodes * self.hourly_usd_per_node

    @property
    def monthly_usd(self) -> float:
        return self.hourly_usd * HOURS_PER_MONTH


def pool_capacity(settings: Settings, mig: MigCatalog) -> list[PoolCapacity]:
    """One row per pool. Cost is at desired size; a spot-capable pool is priced at the spot discount."""
    return [_pool(pool, settings.cost.spot_discount, mig) for pool in settings.node_pools]


def _pool(pool: NodePool, spot_discount: float, mig: MigCatalog) -> PoolCapacity:
    itype = INSTANCE_TYPES[pool.instance_types[0]]
    # Karpenter prefers spot when both are allowed, so spot is the planning price.
    spot = "spot" in pool.capacity_types
    price = itype.on_demand_hourly_usd * (spot_discount if spot else 1.0)
    slices = 0
    if pool.mig_layout and itype.gpu is not None and mig.supports(pool.mig_layout, itype.gpu):
        slices = sum(mig.slices(pool.mig_layout, itype.gpu).values()) * itype.gpu_count
    return PoolCapacity(
        name=pool.name,
        role=pool.role,
        instance_type=itype.name,
        capacity="+".join(pool.capacity_types),
        min_nodes=pool.min_size,
        desired_nodes=pool.desired_size,
        max_nodes=pool.max_size,
        gpus_per_node=itype.gpu_count,
        mig_layout=pool.mig_layout,
        slices_per_node=slices,
        hourly_usd_per_node=round(price, 4),
    )


def price_note(settings: Settings) -> str:
    return f"prices: {PRICE_SOURCE}; spot estimated at {settings.cost.spot_discount:.0%} of on-demand"
