"""Which pools a gang may go to, and in what order: goodput.plan's spot arithmetic per job.

A gang of N nodes on a spot pool with per-node reclaim rate λ is interrupted at Λ = N·λ (an upper
bound: reclaims come in bursts). Each interruption costs half an interval of work plus the
restart (a job that never checkpoints loses half its run), so its useful fraction on spot is
Daly's exact u(τ) with M = 1/Λ.

A spot pool is offered when u is at least :data:`SPOT_MIN_USEFUL`, and offered spot pools come
before the on-demand ones (those listed at a price no lower than on-demand's, after them). A job
no on-demand pool can hold is offered every spot pool that holds it, whatever its u: a floor that
refused it would leave it nowhere. Pricing spot at price/u against on-demand's list price (the rule this
module had first) leaves spot idle while jobs queue for on-demand: it prices an on-demand GPU as
if nobody else wanted it. In a busy cluster the on-demand GPU a spot-capable job does not take
goes to a job that cannot run anywhere else, so a job on spot at u adds u of useful work where
the alternative adds nothing; the floor bounds what that may waste (docs/SCHED.md, "Spot
placement", has the measurements that chose it).
"""

from __future__ import annotations

import math

from goodput.plan.interval import useful_fraction

from .model import Job, Pool, PoolKind

# the least expected useful fraction a job may be placed at on spot: at most seven GPU-hours in
# ten expected lost (a large or never-checkpointing gang on a reclaim-heavy pool stays off)
SPOT_MIN_USEFUL = 0.3


def useful_on(job: Job, pool: Pool) -> float:
    """Expected useful fraction of ``job`` on ``pool`` (1.0 where nothing reclaims)."""
    if pool.kind is not PoolKind.SPOT or pool.reclaim_per_node_hour <= 0:
        return 1.0
    mtbi = 3600.0 / (job.nodes * pool.reclaim_per_node_hour)
    if not math.isfinite(mtbi):  # a rate so small it rounds to nothing: nothing reclaims
        return 1.0
    c = job.ckpt
    tau = c.interval_s if c.interval_s > 0 else max(job.limit_s, job.duration_s, 1.0)
    return useful_fraction(tau, c.stall_s if c.interval_s > 0 else 0.0, mtbi, c.restart_s)


def cost_per_useful_gpu_hour(job: Job, pool: Pool) -> float:
    u = useful_on(job, pool)
    return pool.price_per_gpu_hour / u if u > 0 else math.inf


def pools_for(job: Job, pools: dict[str, Pool], rule: str = "arithmetic") -> tuple[str, ...]:
    """The pools ``job`` may be placed on, most preferred first (empty: it fits nowhere)."""
    fits = [p for p in pools.values() if p.gpus_per_node >= job.gpus_per_node and p.nodes >= job.nodes]
    on_demand = [p for p in fits if p.kind is PoolKind.ON_DEMAND]
    spot = [p for p in fits if p.kind is PoolKind.SPOT and job.spot]
    if rule == "price":
        ranked = sorted(on_demand + spot, key=lambda p: (p.price_per_gpu_hour, p.name))
        return tuple(p.name for p in ranked)
    if rule != "arithmetic":
        raise ValueError(f"unknown spot rule {rule!r}")
    od = sorted(on_demand, key=lambda p: (p.price_per_gpu_hour, p.name))
    if not od:  # no on-demand pool holds it: spot is all there is, however costly, never a refusal
        return tuple(p.name for p in sorted(spot, key=lambda p: (cost_per_useful_gpu_hour(job, p), p.name)))
    offered = sorted(
        (p for p in spot if useful_on(job, p) >= SPOT_MIN_USEFUL),
        key=lambda p: (cost_per_useful_gpu_hour(job, p), p.name),
    )
    # a spot pool listed dearer than on-demand is no discount to prefer: it comes after
    cheapest = od[0].price_per_gpu_hour
    first = [p for p in offered if p.price_per_gpu_hour < cheapest]
    after = [p for p in offered if p.price_per_gpu_hour >= cheapest]
    return tuple(p.name for p in first + od + after)
