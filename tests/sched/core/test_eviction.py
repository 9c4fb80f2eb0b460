"""The victim order a search draws from, against pricing every running job and sorting.

A search prices only what it draws, so the order kept as jobs start, commit and leave must be the
order of the prices themselves at every instant: checked here for random mixes of victims that
lose their work since their last commit, victims asked to checkpoint (first run and later runs,
inside and past their restart), and jobs that committed or not.
"""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from goodput.sched.core.eviction import VictimOrder
from goodput.sched.core.executor import ManualClock, RecordingExecutor
from goodput.sched.core.governance import Governance, Limits
from goodput.sched.core.model import Checkpointing, Job, JobState, Pool, PoolKind
from goodput.sched.core.policy import POLICIES
from goodput.sched.core.scheduler import Scheduler

# the churn guards and time limits off (a reservation reckons with declared limits alone): these
# tests pin other rules; tests/sched/core/test_policy_rules.py tests those
OPEN = Governance(limits=Limits(min_run_s=0.0, max_preemptions=10**6, over_time_limit_s=math.inf))

spec = st.fixed_dictionaries(
    {
        "prio": st.integers(0, 2),
        "interval": st.sampled_from([0.0, 60.0, 600.0]),
        "write": st.sampled_from([1.0, 20.0, 90.0]),
        "restart": st.sampled_from([0.0, 30.0, 300.0]),
        "grace": st.sampled_from([5.0, 30.0, 120.0]),
        "gpn": st.sampled_from([1, 2, 4]),
        "start_at": st.floats(0, 500),
        "commit_after": st.one_of(st.none(), st.floats(1, 400)),
        "reruns": st.booleans(),
    }
)


def _check_order(s: Scheduler, pool: str, prios: set[int], now: float) -> None:
    running = [j for j in s.jobs.values() if j.state is JobState.RUNNING and j.pool == pool and j.priority in prios]
    drawn = list(s._order.draw(pool, prios, now))
    assert sorted(drawn) == sorted(j.id for j in running)  # each running job once
    if s.policy.victims == "oblivious":
        assert drawn == [j.id for j in sorted(running, key=lambda j: (j.priority, -j.started_s, j.seq))]  # never by id
        return
    # the price per GPU never decreases along the draw (ties, equal up to rounding, in any order)
    per_gpu = [s._price(s.jobs[j], now).cost / s.jobs[j].gpus for j in drawn]
    assert all(a <= b + 1e-6 for a, b in zip(per_gpu, per_gpu[1:])), per_gpu


@settings(max_examples=60, deadline=None)
@given(st.lists(spec, min_size=1, max_size=14), st.sampled_from(["goodput", "kueue-victims"]), st.floats(0, 3000))
def test_draw_order_is_the_price_order_at_any_instant(specs, policy, later) -> None:
    clock = ManualClock(0.0)
    pools = [Pool("od", PoolKind.ON_DEMAND, 16, 8)]
    s = Scheduler(pools, clock=clock, executor=RecordingExecutor(), policy=POLICIES[policy], governance=OPEN)
    events = sorted(enumerate(specs), key=lambda e: e[1]["start_at"])
    for i, sp in events:
        clock.t = sp["start_at"]
        ck = Checkpointing(interval_s=sp["interval"], write_s=sp["write"], restart_s=sp["restart"], grace_s=sp["grace"])
        s.submit(Job(f"j{i}", "t", sp["prio"], 1, sp["gpn"], submit_s=clock.t, limit_s=1e6, ckpt=ck))
        s.tick()
        job = s.jobs[f"j{i}"]
        if sp["reruns"] and job.state is JobState.RUNNING:
            s.report_exit(job.id, job.epoch, "preempted")  # left once: the next run pays a restart
            s.tick()
    for i, sp in events:
        job = s.jobs[f"j{i}"]
        if sp["commit_after"] is not None and job.state is JobState.RUNNING:
            clock.t = max(clock.t, job.started_s + sp["commit_after"])
            s.report_commit(job.id, job.epoch, job.committed_s + 1.0)
    now = clock.t + later
    for prios in ({0}, {0, 1}, {0, 1, 2}):
        _check_order(s, "od", prios, now)


def test_draw_skips_jobs_that_left_and_moves_a_committing_job() -> None:
    order = VictimOrder("checkpoint-aware")
    order.add("a", "od", 0, 0.0, linear=10.0, const=None)  # price per GPU: t + 10
    order.add("b", "od", 0, 5.0, linear=None, const=50.0)  # price per GPU: 50
    assert list(order.draw("od", [0], 0.0)) == ["a", "b"]
    assert list(order.draw("od", [0], 100.0)) == ["b", "a"]
    order.add("a", "od", 0, 0.0, linear=-90.0, const=None)  # it committed: t - 90
    assert list(order.draw("od", [0], 100.0)) == ["a", "b"]
    order.remove("a")
    assert "a" not in order and list(order.draw("od", [0], 100.0)) == ["b"]
    assert list(order.draw("od", [1], 100.0)) == []
