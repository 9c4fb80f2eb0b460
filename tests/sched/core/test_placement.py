"""The spot rule: a pool is offered on spot at an expected useful fraction of at least the floor,
spot before on-demand, so that on-demand GPUs stay for the jobs that cannot go anywhere else."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from goodput.sched.core.model import Checkpointing, Job, JobState, Pool, PoolKind
from goodput.sched.core.placement import SPOT_MIN_USEFUL, pools_for, useful_on
from tests.sched.core.test_scenarios import CKPT, N0, NO_CKPT, S0, S1, Bench, spot_bench

POOLS = {
    "od": Pool("od", PoolKind.ON_DEMAND, 4, 8, 4.0),
    "spot": Pool("spot", PoolKind.SPOT, 4, 8, 1.6, reclaim_per_node_hour=0.5),
}


def never_checkpoints(limit_s: float) -> Job:
    return Job("m", "t", 0, 1, 8, 0.0, duration_s=limit_s, limit_s=limit_s, spot=True, ckpt=NO_CKPT)


def test_a_job_dearer_per_useful_hour_on_spot_still_goes_there_above_the_floor() -> None:
    # 4 h without a checkpoint at one reclaim per 2 node-hours: u = 0.31, so spot at $1.6 costs
    # $5.1 per useful GPU-hour against on-demand's $4.0. Pricing on-demand as if nobody else wanted
    # it kept this job off spot (the rule before); it now runs there and leaves on-demand free
    mid = never_checkpoints(4 * 3600.0)
    assert SPOT_MIN_USEFUL <= useful_on(mid, POOLS["spot"]) < 1.6 / 4.0
    assert pools_for(mid, POOLS) == ("spot", "od")
    # 5 h: u = 0.22, below the floor: three quarters of its GPU-hours would be lost
    hopeless = never_checkpoints(5 * 3600.0)
    assert useful_on(hopeless, POOLS["spot"]) < SPOT_MIN_USEFUL
    assert pools_for(hopeless, POOLS) == ("od",)
    assert pools_for(hopeless, POOLS, "price") == ("spot", "od")  # the baseline takes it anyway


@settings(max_examples=200, deadline=None)
@given(
    nodes=st.integers(1, 4),
    interval=st.sampled_from([0.0, 300.0, 1800.0, 7200.0]),
    limit=st.floats(60.0, 3 * 86400.0),
    restart=st.floats(0.0, 600.0),
    spot=st.booleans(),
    reclaim=st.floats(0.0, 5.0),
)
def test_spot_is_offered_exactly_above_the_floor_and_first(
    nodes: int, interval: float, limit: float, restart: float, spot: bool, reclaim: float
) -> None:
    pools = {**POOLS, "spot": Pool("spot", PoolKind.SPOT, 4, 8, 1.6, reclaim_per_node_hour=reclaim)}
    ck = Checkpointing(interval_s=interval, write_s=10.0, stall_s=1.0, restart_s=restart, grace_s=60.0)
    job = Job("j", "t", 0, nodes, 8, 0.0, duration_s=limit, limit_s=limit, spot=spot, ckpt=ck)
    offered = pools_for(job, pools)
    assert "od" in offered and offered.index("od") == len(offered) - 1  # on-demand is always there, last
    assert ("spot" in offered) == (spot and useful_on(job, pools["spot"]) >= SPOT_MIN_USEFUL)


def test_the_scheduler_puts_the_mid_job_on_spot_and_the_on_demand_only_job_on_on_demand() -> None:
    b = spot_bench()  # 2 on-demand and 2 spot nodes, one reclaim per 2 node-hours
    b.submit("mid", spot=True, ckpt=NO_CKPT, limit=4 * 3600)
    b.submit("small", spot=True, ckpt=CKPT, limit=3600)
    b.submit("od-only", spot=False, ckpt=CKPT, limit=3600)
    b.tick()
    started = {r[1]: r[2] for r in b.new() if r[0] == "started"}
    assert started["mid"] == (S0,) and started["small"] == (S1,) and started["od-only"] == (N0,)
    assert b.job("od-only").state is JobState.RUNNING
    b.assert_clean()


def test_a_job_no_on_demand_pool_holds_is_offered_spot_below_the_floor() -> None:
    # a spot-only cluster, and a gang larger than the on-demand pool: the floor does not strand them
    spot_only = {"spot": POOLS["spot"]}
    hopeless = never_checkpoints(5 * 3600.0)
    assert useful_on(hopeless, POOLS["spot"]) < SPOT_MIN_USEFUL
    assert pools_for(hopeless, spot_only) == ("spot",)
    small_od = {**POOLS, "od": Pool("od", PoolKind.ON_DEMAND, 1, 8, 4.0)}
    gang = Job("g", "t", 0, 2, 8, 0.0, duration_s=5 * 3600.0, limit_s=5 * 3600.0, spot=True, ckpt=NO_CKPT)
    assert pools_for(gang, small_od) == ("spot",)
    # and the scheduler places it there, not refusing it as fitting no pool
    b = Bench(pools=[Pool("spot", PoolKind.SPOT, 2, 8, 1.6, reclaim_per_node_hour=0.5)])
    b.submit("h", spot=True, ckpt=NO_CKPT, limit=5 * 3600)
    b.tick()
    assert [r for r in b.new() if r[0] == "started"] == [("started", "h", (S0,), 0.0)]


def test_a_rate_too_small_to_count_is_no_reclaim() -> None:
    tiny = Pool("spot", PoolKind.SPOT, 4, 8, 1.6, reclaim_per_node_hour=5e-324)
    assert useful_on(never_checkpoints(3600.0), tiny) == 1.0
    assert pools_for(never_checkpoints(3600.0), {**POOLS, "spot": tiny}) == ("spot", "od")


def test_a_spot_pool_dearer_than_on_demand_comes_after_it() -> None:
    dear = Pool("spot", PoolKind.SPOT, 4, 8, 9.0, reclaim_per_node_hour=0.0)
    assert pools_for(never_checkpoints(3600.0), {**POOLS, "spot": dear}) == ("od", "spot")
