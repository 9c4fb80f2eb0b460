"""Hand-worked scenarios, one per scheduling rule, each asserting the exact event sequence.

Every scenario drives the core by hand: a ManualClock that moves only when told, a RecordingExecutor
that only remembers, and exits and commits reported as a live job would. Clusters are a few 8-GPU
nodes, so each expected sequence can be worked out on paper; the comment above it does that.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest

from goodput.sched import native
from goodput.sched.core.executor import ManualClock, RecordingExecutor
from goodput.sched.core.governance import Governance, Limits
from goodput.sched.core.model import Checkpointing, Health, Job, JobState, Pool, PoolKind, RetryPolicy, Tenant
from goodput.sched.core.placement import pools_for
from goodput.sched.core.policy import POLICIES
from goodput.sched.core.scheduler import Scheduler, SchedulerError
from goodput.sched.sim.checker import check

N0, N1, N2, N3 = (f"od-{i:05d}" for i in range(4))
S0, S1 = "spot-00000", "spot-00001"

CKPT = Checkpointing(interval_s=600.0, write_s=10.0, stall_s=1.0, restart_s=30.0, grace_s=60.0)  # fits its grace
NO_CKPT = Checkpointing(interval_s=0.0, restart_s=30.0, grace_s=60.0)  # never checkpoints

# the churn guards and time limits off (a reservation reckons with declared limits alone): these
# tests pin other rules; tests/sched/core/test_policy_rules.py tests those
OPEN = Governance(limits=Limits(min_run_s=0.0, max_preemptions=10**6, over_time_limit_s=math.inf))


def brief(rec: dict[str, Any]) -> tuple:
    """The fields of a record a scenario pins down."""
    e = rec["event"]
    if e == "submitted":
        return (e, rec["job"])
    if e == "started":
        return (e, rec["job"], tuple(rec["nodes"]), rec["resume_from_s"])
    if e == "preempt_requested":
        return (e, rec["job"], rec["victim_of"], rec["checkpoint"])
    if e == "checkpoint_committed":
        return (e, rec["job"], rec["progress_s"])
    if e == "commit_rejected":
        return (e, rec["job"], rec["epoch"])
    if e == "exited":
        return (e, rec["job"], rec["status"])
    if e == "released":
        return (e, rec["job"], tuple(rec["nodes"]))
    if e == "requeued":
        return (e, rec["job"], rec["reason"], rec["resume_from_s"])
    if e == "failed":
        return (e, rec["job"], rec["failures"])
    if e in ("node_lost", "node_up"):
        return (e, rec["node"])
    if e == "node_reclaim_notice":
        return (e, rec["node"], rec["deadline_s"])
    return (e, rec["job"])


class Bench:
    """A scheduler on a tiny cluster, driven by hand."""

    def __init__(
        self,
        nodes: int = 2,
        gpn: int = 8,
        policy: str = "goodput",
        pools: list[Pool] | None = None,
        tenants: tuple[Tenant, ...] = (),
        gov: Governance = OPEN,
    ) -> None:
        self.pools = pools or [Pool("od", PoolKind.ON_DEMAND, nodes, gpn, 4.0)]
        self.clock = ManualClock(0.0)
        self.ex = RecordingExecutor()
        self.s = Scheduler(
            self.pools,
            clock=self.clock,
            executor=self.ex,
            policy=replace(POLICIES[policy], weigh_wait=False),  # evict whatever it costs
            tenants=tenants,
            governance=gov,
        )
        self._seen = 0
        self._calls = 0

    # inputs
    def at(self, t: float) -> Bench:
        self.clock.t = float(t)
        return self

    def submit(
        self,
        jid: str,
        nodes: int = 1,
        gpn: int = 8,
        prio: int = 0,
        tenant: str = "a",
        limit: float = 100.0,
        submit_s: float | None = None,
        **kw: Any,
    ) -> Job:
        job = Job(
            id=jid,
            tenant=tenant,
            priority=prio,
            nodes=nodes,
            gpus_per_node=gpn,
            submit_s=self.clock.t if submit_s is None else submit_s,
            duration_s=limit,
            limit_s=limit,
            **kw,
        )
        return self.s.submit(job)

    def tick(self) -> int:
        return self.s.tick()

    def exit(self, jid: str, status: str = "finished") -> None:
        self.s.report_exit(jid, self.s.jobs[jid].epoch, status)

    def commit(self, jid: str, progress: float, epoch: int | None = None) -> bool:
        return self.s.report_commit(jid, self.s.jobs[jid].epoch if epoch is None else epoch, progress)

    # outputs
    def new(self, reserved: bool = False) -> list[tuple]:
        """Brief records since the last call (``reserved`` records only when asked: the scenarios
        that pin reservations ask)."""
        recs = self.s.log.records[self._seen :]
        self._seen = len(self.s.log.records)
        return [brief(r) for r in recs if reserved or r["event"] != "reserved"]

    def last(self, event: str, job: str) -> dict[str, Any]:
        return next(r for r in reversed(self.s.log.records) if r["event"] == event and r.get("job") == job)

    def calls(self) -> list[tuple]:
        got = self.ex.calls[self._calls :]
        self._calls = len(self.ex.calls)
        return got

    def job(self, jid: str) -> Job:
        return self.s.jobs[jid]

    def capacity(self) -> dict[str, int]:
        return {n.name: n.gpus for n in self.s.cap.nodes.values()}

    def assert_clean(self) -> None:
        report = check(self.s.log.records, self.capacity())
        assert report.ok, (report.summary(), report.examples)


# ------------------------------------------------------------------------------------------------ gangs


def test_gang_waits_for_all_its_nodes() -> None:
    b = Bench(nodes=2)
    b.submit("x", limit=50)
    b.tick()
    b.at(1).submit("g", nodes=2)
    assert b.tick() == 0
    assert b.new() == [("submitted", "x"), ("started", "x", (N0,), 0.0), ("submitted", "g")]
    # one node is free but the gang needs two: nothing is bound for it, nothing started
    assert b.job("g").state is JobState.PENDING and b.job("g").placement == ()
    assert b.s.cap.nodes[N1].used == 0
    assert b.at(5).tick() == 0 and b.new() == []
    b.at(50).exit("x")
    assert b.tick() == 1
    assert b.new() == [
        ("exited", "x", "finished"),
        ("released", "x", (N0,)),
        ("finished", "x"),
        ("started", "g", (N0, N1), 0.0),
    ]
    g = b.job("g")
    assert g.state is JobState.RUNNING and g.placement == (N0, N1)
    assert all(b.s.cap.nodes[n].alloc == {"g": 8} for n in (N0, N1))
    assert b.calls()[-1] == ("start", "g", 1, (N0, N1), 0.0)
    b.assert_clean()


# ------------------------------------------------------------------------------------------------ order


def test_priority_order_then_fifo_by_submit_time() -> None:
    b = Bench(nodes=1)
    b.submit("blocker", prio=9)  # top priority: nothing may preempt it
    b.tick()
    b.at(1).submit("lo", prio=0)
    b.at(2).submit("mid-late", prio=1)
    b.at(3).submit("hi", prio=2)
    # submitted last, but with an earlier original submit time than mid-late: it goes first
    b.at(4).submit("mid-early", prio=1, submit_s=1.5)
    b.tick()
    b.new()
    order = []
    for t in (10, 20, 30, 40, 50):
        running = next(j.id for j in b.s.jobs.values() if j.state is JobState.RUNNING)
        b.at(t).exit(running)
        b.tick()
        order += [r[1] for r in b.new() if r[0] == "started"]
    assert order == ["hi", "mid-early", "mid-late", "lo"]
    b.assert_clean()


def test_requeued_job_keeps_its_original_submit_time() -> None:
    # v (prio 0, t=0) is preempted by p; w (prio 0) arrives at t=20; when p ends v goes before w
    b = Bench(nodes=1)
    b.submit("v", limit=1000)
    b.tick()
    b.at(10).submit("p", prio=5, limit=100)
    b.tick()
    b.at(15).exit("v", "preempted")
    b.at(20).submit("w", limit=100)
    b.tick()
    assert b.new() == [
        ("submitted", "v"),
        ("started", "v", (N0,), 0.0),
        ("submitted", "p"),
        ("preempt_requested", "v", "p", False),
        ("exited", "v", "preempted"),
        ("released", "v", (N0,)),
        ("started", "p", (N0,), 0.0),
        ("requeued", "v", "preempted", 0.0),
        ("submitted", "w"),
    ]
    assert b.job("v").submit_s == 0.0 and b.job("v").preemptions == 1
    b.at(100).exit("p")
    b.tick()
    assert [r for r in b.new() if r[0] == "started"] == [("started", "v", (N0,), 0.0)]
    b.assert_clean()


def test_fair_share_between_tenants_at_one_priority() -> None:
    # tenant A holds two nodes, B none: when a node frees, B's job goes first though A's came first
    b = Bench(nodes=3)
    b.submit("a1", tenant="A", limit=1000)
    b.submit("a2", tenant="A", limit=50)
    b.tick()
    b.at(1).submit("a3", tenant="A")
    b.at(2).submit("b1", tenant="B")
    b.tick()
    assert b.new()[-3:] == [("submitted", "a3"), ("submitted", "b1"), ("started", "b1", (N2,), 0.0)]
    b.at(50).exit("a2")
    b.tick()
    assert b.new() == [
        ("exited", "a2", "finished"),
        ("released", "a2", (N1,)),
        ("finished", "a2"),
        ("started", "a3", (N1,), 0.0),
    ]


def test_fair_share_divides_decayed_usage_by_weight() -> None:
    # A (weight 4) and B (weight 1) each held one node for 100 s: A's usage per weight is a quarter
    # of B's, so when one node frees A's job goes first though B's was submitted first
    b = Bench(nodes=3, tenants=(Tenant("A", weight=4.0), Tenant("B", weight=1.0)))
    b.submit("a1", tenant="A", limit=1000)
    b.submit("b1", tenant="B", limit=1000)
    b.submit("f", tenant="C", limit=100)
    b.tick()
    assert [r[1] for r in b.new() if r[0] == "started"] == ["a1", "b1", "f"]
    b.at(100).submit("b2", tenant="B")
    b.submit("a2", tenant="A")
    b.exit("f")
    b.tick()
    assert [r for r in b.new() if r[0] == "started"] == [("started", "a2", (N2,), 0.0)]
    assert b.s.tenants["A"].usage_gpus == 16 and b.s.tenants["B"].usage_gpus == 8


# ------------------------------------------------------------------------------------------------ backfill


def test_blocked_gang_does_not_block_smaller_classes() -> None:
    # two gangs of 2 nodes cannot fit beside x; the 1-node job behind them still starts (it ends at
    # t=51, before the reserved start at t=100, so it cannot delay the head)
    b = Bench(nodes=2)
    b.submit("x", limit=100)
    b.tick()
    b.at(1).submit("g1", nodes=2)
    b.submit("g2", nodes=2)
    b.submit("small", limit=50)
    assert b.tick() == 1
    assert b.new()[-1] == ("started", "small", (N1,), 0.0)
    r = b.s.reservation
    assert r is not None and r.job == "g1" and r.t == 100.0 and r.nodes == {N0, N1}
    b.assert_clean()


def reservation_bench(policy: str = "goodput") -> Bench:
    """Four nodes: A (limit 100) on N0, B (limit 1000) on N1, C (4 GPUs, limit 1000) on N2; N3 free.

    The head H wants 2 whole nodes: N3 now and N0 when A's limit ends, so it holds a reservation of
    {N0, N3} at t=100. N2's free half is outside it."""
    b = Bench(nodes=4, policy=policy)
    b.submit("A", limit=100)
    b.submit("B", limit=1000)
    b.submit("C", gpn=4, limit=1000)
    b.tick()
    assert [r[2] for r in b.new() if r[0] == "started"] == [(N0,), (N1,), (N2,)]
    return b


def test_backfill_never_delays_the_heads_reservation() -> None:
    b = reservation_bench()
    b.at(1).submit("H", nodes=2)
    b.submit("L", limit=500)  # 1 x 8 GPUs, would hold N3 until t=501: may not start there
    b.submit("L4", gpn=4, limit=500)  # long too, but fits in N2's free half, outside the reservation
    b.submit("S", limit=50)  # 1 x 8 GPUs, done by t=51 < 100: may use a reserved node
    assert b.tick() == 2
    assert b.new()[-2:] == [("started", "S", (N3,), 0.0), ("started", "L4", (N2,), 0.0)]
    r = b.s.reservation
    assert (r.job, r.pool, r.t, r.nodes) == ("H", "od", 100.0, frozenset({N0, N3}))
    assert b.job("L").state is JobState.PENDING
    # S leaves early: N3 is free again, but L would still run past t=100 on it
    b.at(51).exit("S")
    b.tick()
    assert b.new() == [("exited", "S", "finished"), ("released", "S", (N3,)), ("finished", "S")]
    assert b.job("L").state is JobState.PENDING and b.job("H").state is JobState.PENDING
    # at the reserved time the head gets exactly its reserved nodes
    b.at(100).exit("A")
    b.tick()
    assert b.new() == [
        ("exited", "A", "finished"),
        ("released", "A", (N0,)),
        ("finished", "A"),
        ("started", "H", (N0, N3), 0.0),
    ]
    b.assert_clean()


def test_backfill_limit_ending_exactly_at_the_reservation_is_allowed() -> None:
    b = reservation_bench()
    b.at(1).submit("H", nodes=2)
    b.submit("L", limit=100)  # 1 + 100 > 100: would overrun by a second
    b.submit("S", limit=99)  # 1 + 99 == 100: done when the head starts
    b.tick()
    assert [r for r in b.new() if r[0] == "started"] == [("started", "S", (N3,), 0.0)]


def test_every_short_job_of_a_blocked_class_may_backfill() -> None:
    # H (3 nodes) reserves N2, N3 now and N0 at t=100. L is long; S1 and S2 are both short enough
    # for the reserved nodes: both start, before any lower-priority job may take one of them
    b = Bench(nodes=4)
    b.submit("A", prio=9, limit=100)
    b.submit("B", prio=9, limit=1000)
    b.tick()
    b.new()
    b.at(1).submit("H", nodes=3, prio=5)
    b.submit("L", prio=5, limit=500)
    b.submit("S1", prio=5, limit=50)
    b.submit("S2", prio=5, limit=60)
    b.submit("low4", gpn=4, prio=0, limit=50)
    b.tick()
    started = [r for r in b.new() if r[0] == "started"]
    assert started == [("started", "S1", (N2,), 0.0), ("started", "S2", (N3,), 0.0)]
    assert b.job("low4").state is JobState.PENDING
    b.assert_clean()


def test_short_jobs_of_the_blocked_class_in_other_tenants_and_priorities_backfill() -> None:
    # the class (1 node x 8 GPUs) failed for tenant a's long job; tenant b's short one of the same
    # class and a lower-priority short one still fit on the reserved nodes before t=100
    b = Bench(nodes=4)
    b.submit("A", prio=9, tenant="z", limit=100)
    b.submit("B", prio=9, tenant="z", limit=1000)
    b.tick()
    b.new()
    b.at(1).submit("H", nodes=3, prio=5)
    b.submit("L", prio=5, limit=500)
    b.submit("Sb", prio=5, tenant="b", limit=50)
    b.submit("Slow", prio=1, limit=50)
    b.tick()
    started = [r for r in b.new() if r[0] == "started"]
    assert started == [("started", "Sb", (N2,), 0.0), ("started", "Slow", (N3,), 0.0)]


def test_fifo_no_backfill_blocks_everything_behind_the_head() -> None:
    b = reservation_bench("fifo-no-backfill")
    b.at(1).submit("H", nodes=2)
    b.submit("S", limit=10)
    b.submit("S4", gpn=4, limit=10)
    assert b.tick() == 0
    assert b.new() == [("submitted", "H"), ("submitted", "S"), ("submitted", "S4")]
    b.at(100).exit("A")
    b.tick()
    # the head starts; S is the new head and does not fit, so S4 still waits though N2 has room
    assert [r for r in b.new() if r[0] == "started"] == [("started", "H", (N0, N3), 0.0)]
    assert b.job("S").state is JobState.PENDING and b.job("S4").state is JobState.PENDING
    assert b.s.cap.nodes[N2].free == 4
    b.at(1000).exit("B")
    b.tick()
    assert [r for r in b.new() if r[0] == "started"] == [("started", "S", (N1,), 0.0), ("started", "S4", (N2,), 0.0)]


def test_fifo_no_backfill_same_setup_under_goodput_backfills() -> None:
    b = reservation_bench()
    b.at(1).submit("H", nodes=2)
    b.submit("S", limit=10)
    b.submit("S4", gpn=4, limit=10)
    assert b.tick() == 2
    assert [r for r in b.new() if r[0] == "started"] == [("started", "S", (N3,), 0.0), ("started", "S4", (N2,), 0.0)]


# ------------------------------------------------------------------------------------------------ preemption


def preemption_bench(policy: str = "goodput") -> Bench:
    """v1 checkpoints and fits its grace; v2 never checkpoints; both at prio 0 on a 2-node pool."""
    b = Bench(nodes=2, policy=policy)
    b.submit("v1", limit=10_000, ckpt=CKPT)
    b.submit("v2", limit=10_000, ckpt=NO_CKPT)
    b.tick()
    b.at(400)
    assert b.commit("v1", 300.0)
    return b


def test_preemption_picks_the_victim_that_loses_least_and_waits_for_it() -> None:
    b = preemption_bench()
    b.at(1000).submit("hi", prio=5, limit=100)
    assert b.tick() == 0  # decided, not started
    assert b.new()[-2:] == [("submitted", "hi"), ("preempt_requested", "v1", "hi", True)]
    rec = b.last("preempt_requested", "v1")
    # v1 checkpoints within its grace: loses no work, pays its drain (stall + write) and its restart
    assert rec["lost_s"] == 0.0 and rec["deadline_s"] == 1060.0 and rec["epoch"] == 1
    assert rec["candidates"] == [
        {"job": "v1", "lost_gpu_s": 8 * (0 + 30 + 11), "lost_s": 0.0, "checkpoint": True},
        {"job": "v2", "lost_gpu_s": 8 * (1000 + 30 + 10), "lost_s": 1000.0, "checkpoint": False},
    ]
    assert b.calls()[-1] == ("notify", "v1", 1, True, 1060.0)
    v1, hi = b.job("v1"), b.job("hi")
    assert v1.state is JobState.PREEMPTING and v1.victim_of == "hi" and v1.ckpt_requested
    assert hi.state is JobState.PENDING and hi.substate == "awaiting victims" and hi.claim == (N0,)
    # the victim's GPUs stay bound, counted as draining, until it is observed gone
    node = b.s.cap.nodes[N0]
    assert node.alloc == {"v1": 8} and node.draining == 8 and node.used == 8
    assert b.at(1005).tick() == 0 and b.new() == []
    # the checkpoint of its step commits, then it exits: only now is N0 handed to hi
    b.at(1011)
    assert b.commit("v1", 1000.0)
    b.exit("v1", "preempted")
    assert b.new() == [
        ("checkpoint_committed", "v1", 1000.0),
        ("exited", "v1", "preempted"),
        ("released", "v1", (N0,)),
        ("started", "hi", (N0,), 0.0),
        ("requeued", "v1", "preempted", 1000.0),
    ]
    assert node.draining == 0 and node.alloc == {"hi": 8}
    v1 = b.job("v1")
    assert v1.state is JobState.PENDING and v1.submit_s == 0.0
    assert (v1.preemptions, v1.failures, v1.infra_losses) == (1, 0, 0)
    # it comes back from its committed progress
    b.at(1100).exit("hi")
    b.tick()
    assert b.new()[-1] == ("started", "v1", (N0,), 1000.0)
    assert b.last("started", "v1")["epoch"] == 2
    assert b.calls()[-1] == ("start", "v1", 2, (N0,), 1000.0)
    b.assert_clean()


def test_preemptor_waits_for_the_killed_victim_past_its_deadline() -> None:
    b = preemption_bench()
    b.at(1000).submit("hi", prio=5)
    b.tick()
    b.new()
    b.calls()
    b.at(1059).s.advance()
    assert b.calls() == []
    b.at(1060).s.advance()
    assert b.calls() == [("kill", "v1", 1)]
    # killed is not gone: still bound until the exit is observed
    assert b.job("hi").state is JobState.PENDING and b.s.cap.nodes[N0].alloc == {"v1": 8}
    b.tick()
    assert b.new() == []
    b.at(1061).exit("v1", "killed")
    assert b.new() == [
        ("exited", "v1", "killed"),
        ("released", "v1", (N0,)),
        ("started", "hi", (N0,), 0.0),
        ("requeued", "v1", "preempted", 300.0),
    ]
    assert b.job("v1").failures == 0 and b.job("v1").preemptions == 1


def test_release_at_decision_starts_the_preemptor_at_once_and_the_checker_sees_it() -> None:
    b = preemption_bench("release-at-decision")
    b.at(1000).submit("hi", prio=5)
    assert b.tick() == 1
    assert b.new()[-4:] == [
        ("submitted", "hi"),
        ("preempt_requested", "v1", "hi", True),
        ("released", "v1", (N0,)),
        ("started", "hi", (N0,), 0.0),
    ]
    b.at(1011).exit("v1", "preempted")
    report = check(b.s.log.records, b.capacity())
    assert report.violations["released_before_gone"] == 1
    assert report.violations["double_booked"] == 1
    assert report.double_booked_gpu_s == pytest.approx(8 * 11.0)


def test_kueue_victims_lowest_priority_then_shortest_running() -> None:
    # three victims on three nodes; the preemptor needs one node
    for policy, want, ckpt in (("kueue-victims", "c", False), ("goodput", "a", True)):
        b = Bench(nodes=3, policy=policy)
        b.at(0).submit("a", prio=0, limit=10_000, ckpt=CKPT)  # longest running, committed recently
        b.tick()
        b.at(5).submit("bb", prio=1, limit=10_000, ckpt=NO_CKPT)  # higher priority: not a first choice
        b.tick()
        b.at(10).submit("c", prio=0, limit=10_000, ckpt=NO_CKPT)  # shortest running, nothing committed
        b.tick()
        b.at(3000)
        b.commit("a", 2990.0)
        b.new()
        b.submit("hi", prio=5)
        b.tick()
        assert b.new()[-1] == ("preempt_requested", want, "hi", ckpt), policy


def test_checkpoint_aware_prefers_the_lowest_tier_that_suffices() -> None:
    b = Bench(nodes=2)
    b.submit("cheap-but-higher", prio=2, limit=10_000, ckpt=CKPT)
    b.submit("costly-but-lowest", prio=0, limit=10_000, ckpt=NO_CKPT)
    b.tick()
    b.at(3000).submit("hi", prio=5)
    b.tick()
    assert b.new()[-1] == ("preempt_requested", "costly-but-lowest", "hi", False)


def test_no_preemption_of_equal_or_higher_priority() -> None:
    b = Bench(nodes=1)
    b.submit("same", prio=3, limit=1000)
    b.tick()
    b.at(1).submit("p", prio=3)
    b.tick()
    assert b.new()[-1] == ("submitted", "p")
    assert b.job("same").state is JobState.RUNNING


def test_gang_preempts_a_set_of_victims_all_or_nothing() -> None:
    # a 2-node gang evicts both 1-node victims and starts only once both are gone
    b = Bench(nodes=2)
    b.submit("v1", limit=10_000, ckpt=CKPT)
    b.submit("v2", limit=10_000, ckpt=CKPT)
    b.tick()
    b.at(100).submit("g", nodes=2, prio=5)
    b.tick()
    assert b.new()[-2:] == [("preempt_requested", "v1", "g", True), ("preempt_requested", "v2", "g", True)]
    assert b.job("g").claim == (N0, N1)
    b.at(111).exit("v1", "preempted")
    assert b.new() == [("exited", "v1", "preempted"), ("released", "v1", (N0,)), ("requeued", "v1", "preempted", 0.0)]
    b.tick()
    assert b.new() == []  # N0 is free but claimed: v1 does not get it back, and g waits for N1
    assert b.s.cap.offerable(N0) is False
    b.at(112).exit("v2", "preempted")
    assert b.new() == [
        ("exited", "v2", "preempted"),
        ("released", "v2", (N1,)),
        ("started", "g", (N0, N1), 0.0),
        ("requeued", "v2", "preempted", 0.0),
    ]
    b.assert_clean()


# ------------------------------------------------------------------------------------------------ exits


@pytest.mark.parametrize("status", ["failed", "killed", "preempted"])
def test_exit_while_preempting_is_never_a_failure(status: str) -> None:
    b = preemption_bench()
    b.at(1000).submit("hi", prio=5)
    b.tick()
    b.new()
    b.at(1005).exit("v1", status)
    assert b.new() == [
        ("exited", "v1", status),
        ("released", "v1", (N0,)),
        ("started", "hi", (N0,), 0.0),
        ("requeued", "v1", "preempted", 300.0),
    ]
    v1 = b.job("v1")
    assert (v1.preemptions, v1.infra_losses, v1.failures) == (1, 0, 0)
    if status == "failed":  # a crash while leaving: behind a backoff, on the infrastructure budget
        assert v1.leave_crashes == 1 and v1.substate == "backoff" and v1.eligible_s == 1065.0
    else:
        assert v1.substate == "queued" and v1.eligible_s <= 1005.0
    b.assert_clean()


def test_finish_while_preempting_is_a_finish() -> None:
    b = preemption_bench()
    b.at(1000).submit("hi", prio=5)
    b.tick()
    b.new()
    b.at(1001).exit("v1", "finished")
    # the claimant is handed the node as the release happens, before the finish is recorded
    assert b.new() == [
        ("exited", "v1", "finished"),
        ("released", "v1", (N0,)),
        ("started", "hi", (N0,), 0.0),
        ("finished", "v1"),
    ]
    assert b.job("v1").state is JobState.FINISHED and b.job("v1").preemptions == 0


def test_unasked_checkpointed_exit_is_a_preemption() -> None:
    b = Bench(nodes=1)
    b.submit("j", ckpt=CKPT, limit=1000)
    b.tick()
    b.at(50).commit("j", 40.0)
    b.exit("j", "preempted")  # a node-level notice reached it before the scheduler heard of one
    assert b.new()[-3:] == [
        ("exited", "j", "preempted"),
        ("released", "j", (N0,)),
        ("requeued", "j", "preempted", 40.0),
    ]
    j = b.job("j")
    assert (j.preemptions, j.infra_losses, j.failures) == (1, 0, 0)
    b.tick()
    assert b.new() == [("started", "j", (N0,), 40.0)]


def test_own_failures_back_off_then_fail_the_job() -> None:
    retry = RetryPolicy(max_failures=2, backoff_s=60.0, backoff_max_s=3600.0)
    b = Bench(nodes=1)
    b.submit("j", ckpt=CKPT, retry=retry, limit=1000)
    b.tick()
    b.at(100).commit("j", 90.0)
    b.exit("j", "failed")
    assert b.new()[-3:] == [("exited", "j", "failed"), ("released", "j", (N0,)), ("requeued", "j", "failure", 90.0)]
    j = b.job("j")
    assert j.failures == 1 and j.substate == "backoff" and j.eligible_s == 160.0
    assert j.id not in b.s.queue and b.s.next_timer() == 160.0
    # not before its backoff ends
    b.at(159).s.advance()
    b.tick()
    assert b.new() == []
    b.at(160).s.advance()
    b.tick()
    assert b.new() == [("started", "j", (N0,), 90.0)]
    # the second failure doubles the backoff
    b.at(200).exit("j", "killed")  # killed without being asked: its own failure too
    assert b.job("j").failures == 2 and b.job("j").eligible_s == 200.0 + 120.0
    b.at(320).s.advance()
    b.tick()
    b.new()
    b.at(400).exit("j", "failed")
    assert b.new() == [("exited", "j", "failed"), ("released", "j", (N0,)), ("failed", "j", 3)]
    j = b.job("j")
    assert j.state is JobState.FAILED and (j.failures, j.preemptions, j.infra_losses) == (3, 0, 0)
    assert b.s.terminal == 1
    b.assert_clean()


def test_counters_are_kept_apart() -> None:
    b = Bench(nodes=2)
    b.submit("j", ckpt=CKPT, limit=10_000)
    b.tick()
    # one own failure
    b.at(10).exit("j", "failed")
    b.at(70).s.advance()
    b.tick()
    # one preemption
    b.at(80).submit("hi", prio=5, limit=1000)  # takes the free node
    b.submit("hi2", prio=5, limit=10)  # waiting for hi (1000 s) would cost more than evicting j
    b.tick()
    b.at(85).exit("j", "killed")
    b.tick()
    b.at(90).exit("hi")
    b.exit("hi2")
    b.tick()
    # one infrastructure loss
    where = b.job("j").placement
    b.at(100).s.node_lost(where)
    b.exit("j", "killed")
    j = b.job("j")
    assert (j.failures, j.preemptions, j.infra_losses) == (1, 1, 1)
    b.assert_clean()


# ------------------------------------------------------------------------------------------------ commits


def test_stale_and_backwards_commits_are_rejected() -> None:
    b = Bench(nodes=1)
    b.submit("j", ckpt=CKPT, limit=10_000)
    b.tick()
    b.at(100)
    assert b.commit("j", 50.0)
    b.exit("j", "preempted")
    b.tick()
    b.new()
    assert b.job("j").epoch == 2
    # a late report of the first run
    assert not b.commit("j", 99.0, epoch=1)
    assert b.new() == [("commit_rejected", "j", 1)]
    assert "stale epoch 1" in b.last("commit_rejected", "j")["reason"]
    assert b.job("j").committed_s == 50.0
    # progress going backwards
    assert not b.commit("j", 40.0)
    assert b.new() == [("commit_rejected", "j", 2)]
    assert "behind" in b.last("commit_rejected", "j")["reason"]
    assert not b.commit("j", math.nan)
    assert b.job("j").committed_s == 50.0
    # equal progress is fine (a repeated report), then forward (20 s of progress after 20 s of running)
    b.at(120)
    assert b.commit("j", 50.0) and b.commit("j", 70.0)
    # unknown and not-running jobs
    assert not b.s.report_commit("nobody", 1, 10.0)
    assert b.last("commit_rejected", "nobody")["reason"] == "unknown job"
    b.exit("j", "preempted")
    assert not b.commit("j", 80.0)
    assert "pending" in b.last("commit_rejected", "j")["reason"]
    # the restart resumes from the last accepted commit
    b.tick()
    assert b.new()[-1] == ("started", "j", (N0,), 70.0)
    b.assert_clean()


def test_stale_exit_report_is_ignored() -> None:
    b = Bench(nodes=1)
    b.submit("j", ckpt=CKPT, limit=10_000)
    b.tick()
    b.at(10).exit("j", "preempted")
    b.tick()
    b.new()
    b.s.report_exit("j", 1, "failed")  # the first run's exit, seen twice
    b.s.report_exit("nobody", 1, "failed")
    assert b.new() == []
    assert b.job("j").state is JobState.RUNNING and b.job("j").failures == 0
    with pytest.raises(SchedulerError, match="'j'.*'exploded'"):
        b.s.report_exit("j", 2, "exploded")


# ------------------------------------------------------------------------------------------------ nodes


def test_node_loss_kills_the_gang_and_requeues_it_as_infrastructure() -> None:
    b = Bench(nodes=3)
    b.submit("g", nodes=2, ckpt=CKPT, limit=10_000)
    b.tick()
    b.at(100).commit("g", 80.0)
    b.new()
    b.calls()
    b.at(150).s.node_lost([N1])
    assert b.new() == [("node_lost", N1), ("preempt_requested", "g", "node_loss", False)]
    rec = b.last("preempt_requested", "g")
    assert rec["deadline_s"] == 150.0 and rec["lost_s"] == 50.0
    assert b.calls() == [("notify", "g", 1, False, 150.0), ("kill", "g", 1)]
    # the gang's processes on N0 still hold their GPUs until the exit is observed
    assert b.s.cap.nodes[N0].alloc == {"g": 8} and b.s.cap.nodes[N0].draining == 8
    assert b.s.cap.nodes[N1].free == 0 and b.s.cap.capacity_gpus() == 16
    b.tick()
    assert b.new() == []
    b.at(151).exit("g", "killed")
    assert b.new() == [
        ("exited", "g", "killed"),
        ("released", "g", (N0, N1)),
        ("requeued", "g", "infrastructure", 80.0),
    ]
    g = b.job("g")
    assert (g.infra_losses, g.failures, g.preemptions) == (1, 0, 0)
    # an infrastructure loss is retried behind a backoff (limits.infra_backoff_s, 60 s)
    assert g.substate == "backoff" and g.eligible_s == 211.0
    b.tick()
    assert b.new() == []
    b.at(211).s.advance()
    b.tick()
    assert b.new() == [("started", "g", (N0, N2), 80.0)]
    # the node returns
    b.at(212).s.node_up([N1])
    assert b.new() == [("node_up", N1)]
    assert b.s.cap.nodes[N1].health is Health.UP and b.s.cap.offerable(N1)
    b.submit("x")
    b.tick()
    assert b.new()[-1] == ("started", "x", (N1,), 0.0)
    b.assert_clean()


def test_node_loss_under_a_leaving_job_makes_it_an_infrastructure_loss() -> None:
    b = preemption_bench()
    b.at(1000).submit("hi", prio=5)
    b.tick()
    b.new()
    b.calls()
    b.at(1001).s.node_lost([N0])
    assert b.new() == [("node_lost", N0)]  # it was already asked to leave; now it is killed
    assert b.calls() == [("kill", "v1", 1)]
    # hi's claim was on the lost node: dropped, hi is queued again
    hi = b.job("hi")
    assert hi.claim == () and hi.substate == "queued" and "hi" in b.s.queue
    b.at(1002).exit("v1", "killed")
    assert b.new() == [
        ("exited", "v1", "killed"),
        ("released", "v1", (N0,)),
        ("requeued", "v1", "infrastructure", 300.0),
    ]
    v1 = b.job("v1")
    assert (v1.infra_losses, v1.preemptions, v1.failures) == (1, 0, 0)
    b.assert_clean()


def test_node_loss_and_up_of_an_unknown_node_is_an_error() -> None:
    b = Bench(nodes=1)
    with pytest.raises(SchedulerError, match="'nope'"):
        b.s.node_lost(["nope"])
    with pytest.raises(SchedulerError, match="'nope'"):
        b.s.node_up(["nope"])
    with pytest.raises(SchedulerError, match="'nope'"):
        b.s.reclaim_notice(["nope"], 10.0)


def spot_bench() -> Bench:
    pools = [
        Pool("od", PoolKind.ON_DEMAND, 2, 8, 4.0),
        Pool("spot", PoolKind.SPOT, 2, 8, 1.6, reclaim_per_node_hour=0.5),
    ]
    return Bench(pools=pools)


def test_reclaim_notice_asks_for_a_checkpoint_when_the_write_fits() -> None:
    b = spot_bench()
    fits = Checkpointing(interval_s=600.0, write_s=50.0, stall_s=5.0, restart_s=30.0, grace_s=30.0)
    too_slow = Checkpointing(interval_s=600.0, write_s=200.0, stall_s=5.0, restart_s=30.0, grace_s=30.0)
    b.submit("quick", spot=True, ckpt=fits, limit=3600)
    b.submit("slow", spot=True, ckpt=too_slow, limit=3600)
    b.tick()
    assert [r for r in b.new() if r[0] == "started"] == [
        ("started", "quick", (S0,), 0.0),
        ("started", "slow", (S1,), 0.0),
    ]
    b.calls()
    # a 120 s notice: quick's stall + write (55 s) fits it, slow's (205 s) does not; the notice
    # is what counts, not the job's own 30 s grace
    b.at(1000).s.reclaim_notice([S0, S1], 1120.0)
    assert b.new() == [
        ("node_reclaim_notice", S0, 1120.0),
        ("preempt_requested", "quick", "reclaim", True),
        ("node_reclaim_notice", S1, 1120.0),
        ("preempt_requested", "slow", "reclaim", False),
    ]
    assert b.last("preempt_requested", "quick")["deadline_s"] == 1120.0
    assert b.calls() == [("notify", "quick", 1, True, 1120.0), ("notify", "slow", 1, False, 1120.0)]
    assert not b.s.cap.offerable(S0) and b.s.cap.nodes[S0].health is Health.RECLAIMING
    # quick commits and leaves; slow is still there at the deadline and is killed
    b.at(1055)
    assert b.commit("quick", 1000.0)
    b.exit("quick", "preempted")
    b.at(1119).s.advance()
    assert b.calls() == []
    b.at(1120).s.advance()
    assert b.calls() == [("kill", "slow", 1)]
    b.at(1121).exit("slow", "killed")
    b.s.node_lost([S0, S1])
    new = b.new()
    assert new[:4] == [
        ("checkpoint_committed", "quick", 1000.0),
        ("exited", "quick", "preempted"),
        ("released", "quick", (S0,)),
        ("requeued", "quick", "preempted", 1000.0),
    ]
    assert new[4:] == [
        ("exited", "slow", "killed"),
        ("released", "slow", (S1,)),
        ("requeued", "slow", "preempted", 0.0),
        ("node_lost", S0),
        ("node_lost", S1),
    ]
    assert b.job("slow").failures == 0 and b.job("slow").preemptions == 1
    # both come back on on-demand
    b.tick()
    assert [r for r in b.new() if r[0] == "started"] == [
        ("started", "quick", (N0,), 1000.0),
        ("started", "slow", (N1,), 0.0),
    ]
    b.assert_clean()


def test_no_new_placement_on_a_node_under_notice() -> None:
    b = spot_bench()
    b.at(0).s.reclaim_notice([S0], 120.0)
    b.submit("j", spot=True, ckpt=CKPT, limit=3600)
    b.tick()
    assert b.new()[-1] == ("started", "j", (S1,), 0.0)


def test_spot_placement_rule() -> None:
    pools = {
        "od": Pool("od", PoolKind.ON_DEMAND, 128, 8, 4.0),
        "spot": Pool("spot", PoolKind.SPOT, 128, 8, 1.6, reclaim_per_node_hour=0.02),
    }
    small = Job("s", "t", 0, 1, 8, 0.0, duration_s=3600, limit_s=3600, spot=True, ckpt=CKPT)
    assert pools_for(small, pools) == ("spot", "od")
    big = Job("g", "t", 0, 64, 8, 0.0, duration_s=3 * 86400, limit_s=3 * 86400, spot=True, ckpt=NO_CKPT)
    assert pools_for(big, pools) == ("od",)
    assert pools_for(big, pools, "price") == ("spot", "od")  # the baseline ignores the loss
    no_spot = Job("n", "t", 0, 1, 8, 0.0, duration_s=3600, limit_s=3600, spot=False, ckpt=CKPT)
    assert pools_for(no_spot, pools) == ("od",) and pools_for(no_spot, pools, "price") == ("od",)


def test_spot_placement_in_the_scheduler() -> None:
    b = spot_bench()
    b.submit("small", spot=True, ckpt=CKPT, limit=3600)
    b.submit("gang", nodes=2, spot=True, ckpt=NO_CKPT, limit=86400)
    b.submit("od-only", spot=False, ckpt=CKPT, limit=3600)
    b.submit("od-only-2", spot=False, ckpt=CKPT, limit=3600)
    b.tick()
    assert [r for r in b.new() if r[0] == "started"] == [
        ("started", "small", (S0,), 0.0),
        ("started", "gang", (N0, N1), 0.0),
    ]
    # a spot node is free, but neither on-demand-only job may go there
    assert b.s.cap.nodes[S1].used == 0
    assert b.job("od-only").state is JobState.PENDING and b.job("od-only-2").state is JobState.PENDING
    b.assert_clean()


# ------------------------------------------------------------------------------------------------ cancel


def test_cancel_pending_and_running_jobs() -> None:
    b = Bench(nodes=1)
    b.submit("r", ckpt=CKPT, limit=1000)
    b.submit("p")
    b.tick()
    b.new()
    b.calls()
    b.at(5).s.cancel("p")
    assert b.new() == [("cancelled", "p")]
    assert b.job("p").state is JobState.CANCELLED and "p" not in b.s.queue
    b.at(6).s.cancel("r")
    assert b.new() == [("preempt_requested", "r", "cancel", False)]
    assert b.last("preempt_requested", "r")["deadline_s"] == 66.0
    assert b.calls() == [("notify", "r", 1, False, 66.0)]
    assert b.job("r").state is JobState.PREEMPTING
    b.at(66).s.advance()
    assert b.calls() == [("kill", "r", 1)]
    b.at(67).exit("r", "killed")
    assert b.new() == [("exited", "r", "killed"), ("released", "r", (N0,)), ("cancelled", "r")]
    r = b.job("r")
    assert r.state is JobState.CANCELLED and (r.failures, r.preemptions) == (0, 0)
    assert b.s.terminal == 2
    # terminal: a second cancel changes nothing
    b.s.cancel("r")
    assert b.new() == []
    with pytest.raises(SchedulerError, match="'ghost'"):
        b.s.cancel("ghost")
    b.assert_clean()


def test_cancel_a_leaving_job_and_a_claimant() -> None:
    b = preemption_bench()
    b.at(1000).submit("hi", prio=5)
    b.tick()
    b.new()
    b.s.cancel("hi")  # the claimant: its claim goes, its victim still leaves
    assert b.new() == [("cancelled", "hi")]
    assert b.job("hi").claim == () and b.s.cap.offerable(N0) and b.s.cap.nodes[N0].free == 0  # v1 still holds N0
    b.s.cancel("v1")  # the leaving victim: cancelled once gone
    b.at(1011).exit("v1", "preempted")
    assert b.new() == [("exited", "v1", "preempted"), ("released", "v1", (N0,)), ("cancelled", "v1")]
    assert b.s.cap.offerable(N0) and b.s.cap.nodes[N0].alloc == {}
    b.assert_clean()


def test_cancel_in_backoff() -> None:
    b = Bench(nodes=1)
    b.submit("j")
    b.tick()
    b.at(1).exit("j", "failed")
    assert b.job("j").substate == "backoff"
    b.s.cancel("j")
    b.at(1000).s.advance()
    b.tick()
    assert b.new()[-1] == ("cancelled", "j")
    assert b.job("j").state is JobState.CANCELLED and b.s.next_timer() == math.inf


# ------------------------------------------------------------------------------------------------ submit


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"nodes": 0}, "nodes"),
        ({"nodes": -1}, "nodes"),
        ({"gpn": 0}, "gpus_per_node"),
        ({"nodes": 3}, "no pool offers 3 nodes x 8 GPUs"),
        ({"gpn": 16}, "no pool offers 1 nodes x 16 GPUs"),
    ],
)
def test_submit_validation_names_job_and_field(kw: dict, field: str) -> None:
    b = Bench(nodes=2)
    with pytest.raises(SchedulerError) as err:
        b.submit("bad-job", **kw)
    assert "'bad-job'" in str(err.value) and field in str(err.value)
    assert "bad-job" not in b.s.jobs and b.s.log.records == []


def test_a_fractional_gang_is_refused() -> None:
    """Where the model is compiled its fields are typed: a float count cannot even make a Job
    (TypeError, from the constructor's line); as pure Python, submit refuses it naming the field.
    Every outside input (workload CSV, HTTP spec, store row) checks types before building one."""
    b = Bench(nodes=2)
    if "core.model" in native.status().compiled:
        with pytest.raises(TypeError, match="int object expected; got float"):
            b.submit("bad-job", gpn=1.5)
    else:
        with pytest.raises(SchedulerError, match="'bad-job': gpus_per_node must be an integer"):
            b.submit("bad-job", gpn=1.5)
    assert "bad-job" not in b.s.jobs and b.s.log.records == []


@pytest.mark.parametrize(
    ("job_id", "tenant", "why"),
    [
        (" a ", "a", "id: ' a ' has surrounding spaces"),
        ("a b", "a", "id: 'a b': characters ' ' are not allowed"),
        ("-rf", "a", "id: '-rf': wrong length or first character"),
        ("", "a", "id: expected an id"),
        ("x" * 129, "a", "wrong length"),
        ("j", "t\u00e9", "tenant: 't\u00e9': characters '\u00e9' are not allowed"),
        ("j", "a\ud800", "tenant: "),  # a lone surrogate
        ("j", "", "tenant: expected an id"),
    ],
)
def test_submit_refuses_ids_outside_the_one_documented_set(job_id: str, tenant: str, why: str) -> None:
    """The core checks what every reader checks (docs/SCHED.md "Ids"): a caller of Scheduler.submit
    cannot make ' a ' beside 'a' either."""
    b = Bench(nodes=2)
    with pytest.raises(SchedulerError) as err:
        b.s.submit(Job(job_id, tenant, 0, 1, 8, 0.0))
    assert why in str(err.value) and "[A-Za-z0-9._:@-]" in str(err.value)
    assert b.s.jobs == {} and b.s.log.records == []


def test_ids_at_the_edges_of_the_set_are_taken() -> None:
    b = Bench(nodes=2)
    for job_id in ("a", "0" * 128, "user@host:run.7-x_y", "svc.0123abcd"):
        b.s.submit(Job(job_id, "team_a.b@c:d-e", 0, 1, 8, 0.0))
    assert len(b.s.jobs) == 4


def test_submit_refuses_duplicates_and_used_records() -> None:
    b = Bench(nodes=2)
    b.submit("j")
    with pytest.raises(SchedulerError, match="'j' already exists"):
        b.submit("j")
    used = Job("k", "a", 0, 1, 8, 0.0, epoch=2)
    with pytest.raises(SchedulerError, match="'k'.*must be new"):
        b.s.submit(used)
    running = Job("r", "a", 0, 1, 8, 0.0, state=JobState.RUNNING)
    with pytest.raises(SchedulerError, match="'r'.*must be new"):
        b.s.submit(running)


def test_submit_a_spot_only_shape_without_spot_says_so() -> None:
    pools = [Pool("od", PoolKind.ON_DEMAND, 1, 8, 4.0), Pool("spot", PoolKind.SPOT, 4, 8, 1.6, 0.02)]
    b = Bench(pools=pools)
    with pytest.raises(SchedulerError, match=r"'wide'.*2 nodes x 8 GPUs on on-demand \(spot not allowed\)"):
        b.submit("wide", nodes=2, spot=False)
    b.submit("wide-ok", nodes=2, spot=True, ckpt=CKPT, limit=600)
    b.tick()
    assert b.new()[-1] == ("started", "wide-ok", (S0, S1), 0.0)


def test_submit_in_the_future_waits_until_due() -> None:
    b = Bench(nodes=1)
    b.submit("later", submit_s=50.0)
    b.tick()
    assert b.new() == [("submitted", "later")]
    assert b.job("later").substate == "backoff" and b.s.next_timer() == 50.0
    b.at(50).s.advance()
    b.tick()
    assert b.new() == [("started", "later", (N0,), 0.0)]


def test_a_run_lost_without_a_status_is_an_infrastructure_loss_not_a_failure() -> None:
    # v's processes vanish (host gone, no exit status, no kill asked): released, requeued as an
    # infrastructure loss from its last commit, the retry budget untouched
    b = Bench(nodes=1)
    b.submit("v", limit=1000, ckpt=CKPT)
    b.tick()
    b.at(100).commit("v", 90.0)
    b.at(150).exit("v", "lost")
    b.tick()
    assert b.job("v").substate == "backoff"  # infrastructure losses back off (60 s, doubling)
    b.at(210).s.advance()
    b.tick()
    assert b.new() == [
        ("submitted", "v"),
        ("started", "v", (N0,), 0.0),
        ("checkpoint_committed", "v", 90.0),
        ("exited", "v", "lost"),
        ("released", "v", (N0,)),
        ("requeued", "v", "infrastructure", 90.0),
        ("started", "v", (N0,), 90.0),
    ]
    v = b.job("v")
    assert (v.infra_losses, v.failures, v.preemptions, v.epoch) == (1, 0, 0, 2)
    assert b.s.commit_rejection("v", 1, 95.0) == "stale epoch 1 (current 2)"
    assert b.s.commit_rejection("v", 2, 80.0).startswith("progress 80.0 is behind")
    assert b.s.commit_rejection("v", 2, 95.0).startswith("progress 95.0 is beyond")  # 5 s of work at its start
    assert b.at(215).s.commit_rejection("v", 2, 95.0) == "" and b.job("v").committed_s == 90.0  # it changes nothing
    b.assert_clean()


def test_a_pending_job_resized_starts_with_its_new_shape_and_keeps_its_place() -> None:
    # v runs on both nodes and is preempted by p (one node); requeued, v is resized to one node:
    # it starts on the other node at once, from its committed progress, before the later w
    b = Bench(nodes=2)
    b.submit("v", nodes=2, limit=1000, ckpt=CKPT)
    b.tick()
    b.at(50).commit("v", 40.0)
    b.at(60).exit("v", "preempted")
    b.at(61).submit("p", prio=5, limit=100)
    b.at(62).submit("w", nodes=1, limit=100)
    b.tick()  # p starts on one node; v (2 nodes) cannot; w goes around it
    b.new()
    with pytest.raises(SchedulerError, match="only a pending job"):
        b.s.resize("p", 1)
    with pytest.raises(SchedulerError, match="nodes must be an integer >= 1"):
        b.s.resize("v", 0)
    with pytest.raises(SchedulerError, match="no pool offers 3 nodes"):
        b.s.resize("v", 3)
    assert (b.job("v").nodes, b.job("v").gpus_per_node) == (2, 8)  # a refused resize changes nothing
    b.at(100).exit("w")
    b.s.resize("v", 1)
    b.tick()
    assert b.new() == [
        ("exited", "w", "finished"),
        ("released", "w", (N1,)),
        ("finished", "w"),
        ("resized", "v"),
        ("started", "v", (N1,), 40.0),
    ]
    assert b.last("resized", "v")["nodes"] == 1 and b.job("v").epoch == 2
    b.assert_clean()
