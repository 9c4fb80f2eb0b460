"""The core's plumbing: when a pass runs, quotas, timers, restore, and the pieces the pass is built from.

The rules themselves are worked through in test_scenarios.py and checked at random in
test_stateful.py; here each test pins one mechanism, several of them a bug that was found and fixed.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from goodput.sched.core import preemption
from goodput.sched.core.capacity import Capacity
from goodput.sched.core.eviction import Candidate, choose
from goodput.sched.core.executor import ManualClock, RecordingExecutor
from goodput.sched.core.governance import Governance, Limits
from goodput.sched.core.model import Checkpointing, Health, Job, JobState, Node, Pool, PoolKind, Tenant
from goodput.sched.core.policy import POLICIES, policy
from goodput.sched.core.queue import PendingQueue
from goodput.sched.core.scheduler import Scheduler, SchedulerError
from goodput.sched.live.store import open_store
from goodput.sched.sim.checker import check

N = [f"od-{i:05d}" for i in range(8)]
CKPT = Checkpointing(interval_s=600.0, write_s=10.0, stall_s=1.0, restart_s=30.0, grace_s=60.0)

# the churn guards and time limits off (a reservation reckons with declared limits alone): these
# tests pin other rules; tests/sched/core/test_policy_rules.py tests those
OPEN = Governance(limits=Limits(min_run_s=0.0, max_preemptions=10**6, over_time_limit_s=math.inf))


def make(
    nodes: int = 2, gpn: int = 8, pol: str = "goodput", tenants=(), store=None, gov: Governance = OPEN
) -> tuple[Scheduler, ManualClock]:
    clock = ManualClock(0.0)
    pools = [Pool("od", PoolKind.ON_DEMAND, nodes, gpn, 4.0)]
    s = Scheduler(
        pools,
        clock=clock,
        executor=RecordingExecutor(),
        policy=replace(POLICIES[pol], weigh_wait=False),  # evict whatever it costs: mechanisms here
        tenants=tenants,
        store=store,
        governance=gov,
    )
    return s, clock


def job(jid: str, nodes: int = 1, gpn: int = 8, prio: int = 0, tenant: str = "a", limit: float = 100.0, **kw) -> Job:
    return Job(jid, tenant, prio, nodes, gpn, kw.pop("submit_s", 0.0), duration_s=limit, limit_s=limit, **kw)


def started(s: Scheduler, since: int = 0) -> list[tuple[str, tuple[str, ...]]]:
    return [(r["job"], tuple(r["nodes"])) for r in s.log.records[since:] if r["event"] == "started"]


# ------------------------------------------------------------------------------------------------ passes


def test_a_pass_runs_only_when_something_could_change() -> None:
    s, clock = make(nodes=1)
    assert s.needs_pass and s.tick() == 0 and s.passes == 1  # an empty queue: one pass, nothing to do
    assert not s.needs_pass and s.tick() == 0 and s.passes == 1
    s.submit(job("a", ckpt=CKPT))
    assert s.needs_pass and s.tick() == 1 and s.passes == 2
    s.submit(job("b"))
    s.tick()
    passes = s.passes
    # a commit report changes no pending job's fate: no pass
    clock.t = 10
    assert s.report_commit("a", 1, 5.0)
    assert not s.needs_pass and s.tick() == 0 and s.passes == passes
    # an exit releases GPUs: a pass, and b starts
    s.report_exit("a", 1, "finished")
    assert s.needs_pass and s.tick() == 1
    assert started(s)[-1] == ("b", (N[0],))


def test_cancelling_a_claimant_offers_its_claimed_nodes_again() -> None:
    # found by test_stateful: a cancel left the queue unmarked, so a job that fitted on the
    # nodes the claimant had claimed waited for some unrelated event
    s, clock = make(nodes=2)
    s.submit(job("low", prio=0, limit=1000, ckpt=CKPT))
    s.tick()
    s.submit(job("hi", nodes=2, prio=5))  # claims both nodes: N1 free, N0 once low is gone
    s.tick()
    assert s.jobs["hi"].claim == (N[0], N[1])
    s.submit(job("small", gpn=4, limit=1000))  # N1 is claimed: waits
    s.tick()
    assert s.jobs["small"].state is JobState.PENDING
    s.cancel("hi")
    assert s.needs_pass
    s.tick()
    assert started(s)[-1] == ("small", (N[1],))


def test_cancelling_the_head_lifts_its_reservation() -> None:
    s, clock = make(nodes=2)
    s.submit(job("a", prio=9, limit=1000))
    s.tick()
    s.submit(job("head", nodes=2))  # reserves both nodes for t=1000
    s.submit(job("long", limit=5000))  # would run past t=1000 on the free node: held off
    s.tick()
    assert s.reservation is not None and s.reservation.job == "head"
    assert s.jobs["long"].state is JobState.PENDING
    s.cancel("head")
    assert s.needs_pass
    s.tick()
    assert started(s)[-1] == ("long", (N[1],))


def test_cancelling_a_running_job_replans_the_reservation_waiting_for_it() -> None:
    # its end moves from its declared limit to its deadline (later here): a job the old
    # reservation held off may now finish before the head can start, and should not wait for an event
    s, clock = make(nodes=2)
    s.submit(job("j", prio=9, limit=100, ckpt=Checkpointing(grace_s=300.0)))
    s.tick()
    clock.t = 90
    s.submit(job("head", nodes=2, submit_s=90.0))
    s.submit(job("bf", limit=50, submit_s=90.0))  # 90 + 50 > 100: held off N1
    s.tick()
    assert s.reservation.t == 100.0 and s.jobs["bf"].state is JobState.PENDING
    s.cancel("j")  # leaves by t=390 at the latest
    assert s.needs_pass
    s.tick()
    assert s.reservation.t == 390.0
    assert started(s)[-1] == ("bf", (N[1],))


def test_a_reclaim_notice_replans_the_reservation() -> None:
    # found by test_stateful: the notice took a reserved node away but ran no pass, so the jobs the
    # reservation held off waited though the head could no longer start there
    s, clock = make(nodes=3)
    s.submit(job("a", gpn=2, limit=10, ckpt=CKPT))
    s.tick()  # on N0, 6 GPUs left there
    clock.t = 1
    s.submit(job("head", nodes=3))  # needs every node whole: reserves all three at t=10
    s.submit(job("long", gpn=2, limit=10))  # 1 + 10 > 10: held off the reserved nodes
    s.tick()
    assert s.reservation.nodes == frozenset(N[:3]) and s.jobs["long"].state is JobState.PENDING
    s.reclaim_notice([N[0]], 1.0)  # N0 goes: head cannot get three nodes any more
    assert s.needs_pass
    s.tick()
    assert s.reservation is None
    assert started(s)[-1] == ("long", (N[1],))


def test_the_reservation_moves_when_a_job_it_waits_for_is_asked_to_leave() -> None:
    # found by test_stateful: the reservation was cached across passes while nothing was released,
    # so a cancel that brought a running job's end forward left it at the old, later time, and
    # backfill ran past the head's real earliest start on its nodes
    s, clock = make(nodes=3)
    s.submit(job("a", prio=9, limit=1000))
    s.submit(job("b", prio=9, limit=5000, ckpt=Checkpointing(grace_s=30.0)))
    s.tick()
    clock.t = 1
    s.submit(job("head", nodes=3, prio=5, submit_s=1.0))
    s.tick()
    assert s.reservation.t == 5000.0
    s.cancel("b")  # gone by t=31: head can start when a's limit ends, at t=1000
    s.submit(job("bf", prio=1, limit=2000, submit_s=1.0))  # 1 + 2000 > 1000: may not take N2
    s.tick()
    assert s.reservation.t == 1000.0
    assert s.jobs["bf"].state is JobState.PENDING


def test_a_job_ranked_ahead_of_the_head_in_a_later_pass_is_bound_by_its_reservation() -> None:
    # issue 23: a job ranked ahead of the head (same priority, a tenant with a smaller share) took a
    # reserved node past the reserved time and the reservation slid; it binds every later pass now
    s, clock = make(nodes=3)
    s.node_lost([N[0]])
    s.submit(job("head", nodes=2, tenant="a", limit=10))
    s.submit(job("x", gpn=2, prio=1, tenant="a", limit=10))
    s.tick()  # x on N1 until t=10; head reserves N1 and N2 for t=10
    assert started(s) == [("x", (N[1],))] and s.reservation.t == 10.0
    s.submit(job("y", gpn=2, tenant="b", limit=20))  # b holds nothing: ahead of a's head, but 0 + 20 > 10
    s.tick()
    assert started(s) == [("x", (N[1],))] and s.jobs["y"].state is JobState.PENDING
    assert s.reservation.job == "head" and s.reservation.t == 10.0
    clock.t = 10
    s.report_exit("x", 1, "finished")
    s.tick()
    assert started(s)[1] == ("head", (N[1], N[2]))


def test_preemptions_beyond_a_passs_budget_wait_for_the_next_pass_not_for_an_event() -> None:
    # found here: once a pass had spent its victim searches, the heads beyond waited for some
    # unrelated input (up to the victims' whole run) instead of the next pass
    n = preemption.PREEMPT_SCANS_PER_PASS + 2
    s, clock = make(nodes=n)
    for i in range(n):
        s.submit(job(f"v{i}", limit=10_000, ckpt=CKPT))
    s.tick()
    clock.t = 10
    for i in range(n):
        s.submit(job(f"h{i}", prio=5, submit_s=10.0))
    s.tick()
    decided = [r["victim_of"] for r in s.log.records if r["event"] == "preempt_requested"]
    assert len(decided) == preemption.PREEMPT_SCANS_PER_PASS
    assert s.needs_pass
    s.tick()
    decided = [r["victim_of"] for r in s.log.records if r["event"] == "preempt_requested"]
    assert sorted(decided) == [f"h{i}" for i in range(n)]


def test_a_quota_is_a_guarantee_not_a_cap_idle_gpus_are_borrowed() -> None:
    # Kueue's nominal quota: beyond its 16 GPUs a tenant borrows what nobody else asks for
    s, clock = make(nodes=4, tenants=(Tenant("capped", quota_gpus=16),))
    for i in range(3):
        s.submit(job(f"c{i}", tenant="capped"))
    s.submit(job("free", tenant="other"))
    s.tick()
    assert sorted(j for j, _ in started(s)) == ["c0", "c1", "c2", "free"]
    assert s.tenants["capped"].usage_gpus == 24


def test_next_timer_and_advance() -> None:
    s, clock = make(nodes=1)
    assert s.next_timer() == math.inf
    s.submit(job("late", submit_s=30.0))
    s.submit(job("r", ckpt=CKPT, limit=1000))
    s.tick()
    assert s.next_timer() == 30.0
    s.submit(job("hi", prio=5))
    s.tick()  # r is asked to leave by t=60
    assert s.next_timer() == 30.0
    clock.t = 30
    s.advance()
    assert s.jobs["late"].substate == "queued" and s.next_timer() == 60.0
    # r leaves before its deadline: its timer is dead and dropped
    s.report_exit("r", 1, "preempted")
    assert s.next_timer() == math.inf
    clock.t = 60
    s.advance()
    assert [c for c in s.executor.calls if c[0] == "kill"] == []


def test_summary_counts() -> None:
    s, clock = make(nodes=2)
    s.submit(job("a", limit=1000, ckpt=CKPT))
    s.submit(job("g", nodes=2))
    s.tick()  # a on N0; g waits for both nodes
    s.submit(job("hi", prio=3))
    s.tick()  # hi outranks g: it takes the free N1
    s.node_lost([N[1]])  # hi is killed there, its GPUs bound until its exit is seen
    got = s.summary()
    assert got["jobs"] == {"running": 1, "preempting": 1, "pending": 1}
    assert got["gpus"] == 8 and got["gpus_bound"] == 16 and got["gpus_draining"] == 8 and got["nodes_lost"] == 1
    assert got["queued"] == 1 and got["classes"] == 1 and s.pending() == 1
    # nothing was free after hi started: the pass stopped before g, whose reservation still holds
    assert got["reservation"] == {"job": "g", "pool": "od", "t": 1000.0}


def test_policy_lookup() -> None:
    assert policy("goodput") is POLICIES["goodput"]
    with pytest.raises(ValueError, match="unknown policy 'nope'"):
        policy("nope")
    assert all(p.describe() != p.name for p in POLICIES.values())


@pytest.mark.parametrize(("limit", "where"), [(50.0, N[0]), (5_000.0, N[1]), (20_000.0, N[1])])
def test_a_one_node_job_goes_where_it_keeps_no_node_from_draining(limit: float, where: str) -> None:
    """Two nodes with one GPU free each, best fit cannot tell them apart: od-00000's job is declared
    to end at 100, od-00001's at 10,000. A job that ends before 100 goes to od-00000 (both nodes
    stay busy past it; the long-busy one is kept for a long job); a longer one goes to od-00001,
    which its jobs keep busy anyway (or longest), so od-00000 drains whole at 100 and an 8-GPU job
    starts there then. Index order put every one of them on od-00000, and the 8-GPU job waited
    for the long job's end."""
    s, clock = make(nodes=2)
    s.submit(job("a", gpn=7, limit=100.0))
    s.submit(job("b", gpn=7, limit=10_000.0))
    s.tick()
    assert started(s) == [("a", (N[0],)), ("b", (N[1],))]
    clock.t = 1.0
    s.submit(job("c", gpn=1, limit=limit, submit_s=1.0))
    s.submit(job("whole", gpn=8, limit=100.0, submit_s=1.0))
    s.tick()
    assert started(s)[2:] == [("c", (where,))]
    clock.t = 100.0
    s.report_exit("a", 1, "finished")
    if limit <= 100.0:
        s.report_exit("c", 1, "finished")
    s.tick()
    assert started(s)[3:] == [("whole", (N[0],))]


def fragmented(x_ckpt: Checkpointing | None, x_limit: float, *, pol: str = "goodput") -> tuple[Scheduler, ManualClock]:
    """Three nodes: od-00000 and od-00001 busy with 7 GPUs each until 10,000 and one GPU free,
    od-00002 holding only ``x`` (1 GPU, declared to end at ``x_limit``): 9 GPUs free, no node
    whole. Then an 8-GPU job of the same priority arrives (it can evict nobody)."""
    clock = ManualClock(0.0)
    s = Scheduler(
        [Pool("od", PoolKind.ON_DEMAND, 3, 8, 4.0)],
        clock=clock,
        executor=RecordingExecutor(),
        policy=POLICIES[pol],  # the price rule in force
        governance=OPEN,
    )
    s.submit(job("a", gpn=7, limit=10_000.0))
    s.submit(job("b", gpn=7, limit=10_000.0))
    s.submit(job("c", gpn=1, limit=50.0))
    s.submit(job("d", gpn=1, limit=50.0))
    s.submit(job("x", gpn=1, limit=x_limit, **({"ckpt": x_ckpt} if x_ckpt else {})))
    s.tick()
    assert dict(started(s))["x"] == (N[2],)
    clock.t = 60.0
    s.report_exit("c", 1, "finished")
    s.report_exit("d", 1, "finished")
    s.submit(job("whole", gpn=8, limit=1_000.0, submit_s=60.0))
    s.tick()
    return s, clock


def test_a_lone_small_job_is_moved_so_that_a_whole_node_job_starts() -> None:
    """``x`` can checkpoint within its grace: it is asked to checkpoint and stop (reason ``move``,
    for ``whole``), ``whole`` claims od-00002 and starts when ``x`` is gone, and ``x`` restarts on
    a GPU free elsewhere. Its price (1 GPU x (30 s restart + 11 s drain)) is below ``move_worth``
    (0.01) x 8 GPUs x the 9,940 s ``whole`` would wait for ``x``'s end. Before, ``whole`` waited for
    that end with 9 GPUs idle."""
    s, clock = fragmented(CKPT, 10_000.0)
    asked = [r for r in s.log.records if r["event"] == "preempt_requested"]
    assert [(r["job"], r["reason"], r["preemptor"], r["checkpoint"]) for r in asked] == [("x", "move", "whole", True)]
    assert s.jobs["whole"].claim == (N[2],)
    clock.t = 71.0
    s.report_exit("x", 1, "preempted")
    s.tick()
    assert started(s)[-2:] == [("whole", (N[2],)), ("x", (N[0],))]
    assert s.jobs["x"].evictions == 1  # a move counts against max_preemptions
    assert check(s.log.records, {n: 8 for n in N[:3]}).ok


@pytest.mark.parametrize(
    ("x_ckpt", "x_limit", "pol"),
    [
        (None, 10_000.0, "goodput"),  # no checkpoint: moving it would redo its work
        (CKPT, 100.0, "goodput"),  # it ends 40 s from now: 41 GPU-s > 0.01 x 8 x 40
        (CKPT, 360.0, "goodput"),  # 41 GPU-s > 0.01 x 8 x 300 (a priority preemption's 0.1 would pay)
        (CKPT, 10_000.0, "kueue-victims"),  # asks no checkpoint: it cannot move
    ],
)
def test_no_move_when_it_would_lose_work_or_cost_more_than_the_wait(x_ckpt, x_limit: float, pol: str) -> None:
    s, _ = fragmented(x_ckpt, x_limit, pol=pol)
    assert not [r for r in s.log.records if r["event"] == "preempt_requested"]
    assert s.jobs["whole"].state is JobState.PENDING and not s.jobs["whole"].claim
    assert s.reservation is not None and s.reservation.job == "whole"


def test_no_move_when_the_moved_job_would_fit_nowhere_else() -> None:
    """od-00000 and od-00001 full: ``x`` has nowhere to go, so it stays and ``whole`` waits."""
    s2, clock2 = make(nodes=3)
    s2.submit(job("a", gpn=8, limit=10_000.0))
    s2.submit(job("b", gpn=8, limit=10_000.0))
    s2.submit(job("x", gpn=1, limit=10_000.0, ckpt=CKPT))
    s2.tick()
    clock2.t = 60.0
    s2.submit(job("whole", gpn=8, limit=1_000.0, submit_s=60.0))
    s2.tick()
    assert not [r for r in s2.log.records if r["event"] == "preempt_requested"]
    assert s2.jobs["whole"].state is JobState.PENDING


# ------------------------------------------------------------------------------------------------ restore


def busy_scheduler(store=None) -> tuple[Scheduler, ManualClock]:
    """A scheduler holding one of everything: running, preempting (with a deadline), a claimant,
    a job in backoff, a reservation, a lost node."""
    s, clock = make(nodes=4, store=store)
    if store is not None:
        s.save_all()
    s.submit(job("v", limit=5000, ckpt=CKPT))
    s.submit(job("w", limit=5000, ckpt=CKPT))
    s.submit(job("f", limit=5000, ckpt=CKPT))
    s.submit(job("x", limit=5000))
    s.tick()
    clock.t = 50
    s.report_commit("v", 1, 40.0)
    s.report_exit("f", 1, "failed")  # backoff until 110
    s.submit(job("hi", nodes=2, prio=5, submit_s=50.0))  # claims f's node and v's
    s.submit(job("g", nodes=4, submit_s=50.0))  # the head: a reservation
    s.tick()
    s.node_lost([N[3]])
    return s, clock


def test_restore_rebuilds_every_index_and_decides_the_same(tmp_path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 's.db'}")
    a, clock = busy_scheduler()
    b, clock_b = busy_scheduler(store)
    assert a.log.records == b.log.records
    kinds = {j.id: (j.state.value, j.substate) for j in b.jobs.values()}
    assert kinds["v"] == ("preempting", "checkpointing") and kinds["hi"] == ("pending", "awaiting victims")
    assert kinds["f"] == ("pending", "backoff")
    store.close()
    store = open_store(f"sqlite:///{tmp_path / 's.db'}")
    r = Scheduler.restore(
        store, b.cap.pools.values(), clock=clock_b, executor=RecordingExecutor(), policy=b.policy, governance=OPEN
    )
    assert r.jobs == a.jobs and r.cap.nodes == a.cap.nodes and r.cap.claimed == a.cap.claimed
    assert r.log.records == a.log.records
    assert r.next_timer() == a.next_timer() and r.needs_pass == a.needs_pass
    assert sorted(r.queue.jobs()) == sorted(a.queue.jobs())
    assert r.summary()["gpus_draining"] == a.summary()["gpus_draining"]
    # the same future from here
    for sched, c in ((a, clock), (r, clock_b)):
        c.t = 110
        sched.advance()
        sched.tick()
        c.t = 111
        sched.report_exit("v", 1, "preempted")
        sched.tick()
        sched.node_up([N[3]])
        sched.tick()
    assert r.log.records == a.log.records
    assert r.jobs == a.jobs
    assert check(r.log.records, {n: 8 for n in N[:4]}).ok
    store.close()


def test_restore_keeps_the_persisted_dirty_flag(tmp_path) -> None:
    # found by test_stateful's restart twin: re-queuing the pending jobs on restore marked the queue,
    # so a restarted scheduler ran a pass its twin did not, and could decide differently
    store = open_store(f"sqlite:///{tmp_path / 'd.db'}")
    s, clock = make(nodes=1, store=store)
    s.save_all()
    s.submit(job("a", limit=1000))
    s.submit(job("b"))
    s.tick()
    assert not s.needs_pass
    r = Scheduler.restore(store, s.cap.pools.values(), clock=clock, executor=RecordingExecutor(), governance=OPEN)
    assert not r.needs_pass and r.tick() == 0
    s.submit(job("c"))
    r = Scheduler.restore(store, s.cap.pools.values(), clock=clock, executor=RecordingExecutor(), governance=OPEN)
    assert r.needs_pass
    store.close()


# ------------------------------------------------------------------------------------------------ parts


def test_capacity_best_fit_in_index_order() -> None:
    pools = [Pool("p", PoolKind.ON_DEMAND, 4, 8)]
    nodes = Capacity.build_nodes(pools)
    assert [n.name for n in nodes] == ["p-00000", "p-00001", "p-00002", "p-00003"]
    cap = Capacity(pools, nodes)
    cap.bind("a", ["p-00002"], 6)
    cap.bind("b", ["p-00003"], 4)
    # best fit: the fullest node that still fits
    assert cap.find("p", 1, 2) == ("p-00002",)
    assert cap.find("p", 1, 4) == ("p-00003",)
    assert cap.find("p", 2, 4) == ("p-00003", "p-00000")
    assert cap.find("p", 3, 8) is None and cap.find("p", 1, 9) is None
    assert cap.find("p", 2, 8, exclude={"p-00000"}) is None
    assert cap.count_fitting("p", 4) == 3 and cap.count_fitting("p", 4, {"p-00000"}) == 2
    assert cap.free_gpus("p") == 8 + 8 + 2 + 4
    cap.claim("j", ["p-00000"])
    assert not cap.offerable("p-00000") and cap.unofferable_up("p") and cap.held_back("p") == {"p-00000"}
    assert cap.find("p", 2, 8) is None
    cap.set_health("p-00001", Health.RECLAIMING)
    assert cap.held_back("p") == {"p-00000", "p-00001"} and cap.free_gpus("p") == 6
    cap.unclaim(["p-00000"])
    cap.set_health("p-00001", Health.LOST)
    assert cap.held_back("p") == set() and cap.capacity_gpus() == 24
    assert cap.nodes["p-00001"].free == 0
    cap.set_health("p-00001", Health.UP)
    assert cap.find("p", 2, 8) == ("p-00000", "p-00001")
    cap.unbind("a", ["p-00002"])
    cap.unbind("a", ["p-00002"])  # twice: nothing
    assert cap.nodes["p-00002"].used == 0 and cap.free_gpus("p") == 28
    with pytest.raises(RuntimeError, match="p-00003"):
        cap.bind("c", ["p-00003"], 8)


def test_capacity_rebuilt_from_nodes_with_allocations() -> None:
    pools = [Pool("p", PoolKind.ON_DEMAND, 2, 8)]
    nodes = [Node("p-00000", "p", PoolKind.ON_DEMAND, 8, alloc={"a": 8}), Node("p-00001", "p", PoolKind.ON_DEMAND, 8)]
    cap = Capacity(pools, nodes)
    assert cap.nodes["p-00000"].used == 8 and cap.find("p", 1, 1) == ("p-00001",)
    with pytest.raises(ValueError, match="unknown pool 'q'"):
        Capacity(pools, [Node("q-0", "q", PoolKind.ON_DEMAND, 8)])


def test_queue_orders_by_submit_time_and_finds_the_shortest() -> None:
    q = PendingQueue()
    cls = (1, 8, ("od",))
    q.push("late", 0, "t", cls, submit_s=5.0, seq=0, limit_s=10.0)
    q.push("early", 0, "t", cls, submit_s=1.0, seq=1, limit_s=100.0)
    q.push("tie", 0, "t", cls, submit_s=1.0, seq=2, limit_s=50.0)
    q.push("hi", 3, "u", cls, submit_s=9.0, seq=3, limit_s=1.0)
    assert len(q) == 4 and "tie" in q and q.classes() == 2
    assert q.priorities() == [3, 0] and set(q.tenants(0)) == {"t"}
    assert q.head((0, "t", cls)) == (1.0, 1, "early")
    assert q.shortest((0, "t", cls)) == (10.0, "late")
    assert q.remove("early") and not q.remove("early")
    assert q.head((0, "t", cls)) == (1.0, 2, "tie")
    q.remove("late")
    assert q.shortest((0, "t", cls)) == (50.0, "tie")
    with pytest.raises(RuntimeError, match="twice"):
        q.push("tie", 0, "t", cls, 0.0, 9, 1.0)
    q.remove("tie")
    q.remove("hi")
    assert len(q) == 0 and q.priorities() == [] and q.head((0, "t", cls)) is None and q.classes() == 0


def cand(jid: str, prio: int, node: str, lost: float, started: float = 0.0, gpus: int = 8) -> Candidate:
    return Candidate(jid, prio, started, gpus, ((node, gpus),), lost, 10.0, 30.0, False)


def test_eviction_exact_cheapest_set_within_the_lowest_tier() -> None:
    free = {"a": 0, "b": 0, "c": 0}
    cands = [cand("x", 0, "a", 500.0), cand("y", 0, "b", 10.0), cand("z", 1, "c", 0.0)]
    assert [c.job for c in choose(1, 8, free, cands)] == ["y"]
    assert sorted(c.job for c in choose(2, 8, free, cands)) == ["x", "y"]  # the lowest tier suffices
    assert sorted(c.job for c in choose(3, 8, free, cands)) == ["x", "y", "z"]
    assert choose(4, 8, free, cands) is None
    assert choose(1, 8, free, []) is None
    # Kueue's rule: lowest priority, then the shortest running, whatever it loses
    kueue = [cand("old", 0, "a", 0.0, started=0.0), cand("new", 0, "b", 900.0, started=50.0)]
    assert [c.job for c in choose(1, 8, free, kueue, "oblivious")] == ["new"]
    assert [c.job for c in choose(1, 8, free, kueue)] == ["old"]
    with pytest.raises(ValueError, match="unknown victim rule"):
        choose(1, 8, free, kueue, "random")


def test_eviction_greedy_beyond_the_exact_limit_drops_what_is_not_needed() -> None:
    from goodput.sched.core.eviction import EXACT_MAX

    n = EXACT_MAX + 5
    free = {f"n{i}": 0 for i in range(n)}
    cands = [cand(f"j{i}", 0, f"n{i}", float(i)) for i in range(n)]
    got = choose(3, 8, free, cands)
    assert sorted(c.job for c in got) == ["j0", "j1", "j2"]
    # a node already free counts through base_ok
    assert [c.job for c in choose(2, 8, free, cands, base_ok=1)] == ["j0"]


def test_scheduler_error_is_a_value_error_naming_the_thing() -> None:
    s, clock = make()
    with pytest.raises(ValueError, match="'x'"):
        s.cancel("x")
    with pytest.raises(SchedulerError, match="'n9'"):
        s.node_up(["n9"])
