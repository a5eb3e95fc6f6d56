"""What a stack's node pools add up to: nodes, GPUs, MIG slices and an hourly cost estimate.

Reserved capacity is priced as EC2 bills it. An On-Demand Capacity Reservation costs the on-demand rate of every
instance it reserves, every hour, used or not (EC2 User Guide, capacity-reservations-pricing-billing.html), so it
is part of the pool's $/h whatever the desired size. A Capacity Block for ML is paid in full when it is bought
(capacity-blocks-pricing-billing.html): its fee is reported as an up-front sum, apart from $/h and $/month, and its
instances add nothing per hour. Nodes the pool runs beyond its reservations are priced as unreserved capacity.
"""

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
    hourly_usd_per_node: float  # a node outside the pool's reservations
    # Defaults: a revision older than reservations renders no such fields (plan diff reads its pools back).
    reserved_nodes: int = 0
    reserved_hourly_usd: float = 0.0  # ODCRs: billed whether their instances run or not
    upfront_usd: float = 0.0  # Capacity Blocks: paid once, at purchase

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
        unreserved = max(0, self.desired_nodes - self.reserved_nodes)
        return self.reserved_hourly_usd + unreserved * self.hourly_usd_per_node

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
    odcrs = [r for r in pool.capacity_reservations if r.type == "default"]
    blocks = [r for r in pool.capacity_reservations if r.type == "capacity-block"]
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
        reserved_nodes=sum(r.instance_count for r in pool.capacity_reservations),
        reserved_hourly_usd=round(sum(r.instance_count * INSTANCE_TYPES[r.instance_type].on_demand_hourly_usd
                                      for r in odcrs), 4),
        upfront_usd=round(sum(r.upfront_fee_usd or 0.0 for r in blocks), 2),
    )


def price_note(settings: Settings) -> str:
    note = f"prices: {PRICE_SOURCE}; spot estimated at {settings.cost.spot_discount:.0%} of on-demand"
    if any(p.capacity_reservations for p in settings.node_pools):
        note += ("; ODCRs at the on-demand rate of every reserved instance, used or not; Capacity Blocks as their "
                 "fee, paid once at purchase (up-front, not in $/h)")
    return note
