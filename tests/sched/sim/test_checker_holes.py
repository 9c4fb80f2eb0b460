"""Holes a hostile review found in the checker's policy checks: each log breaks a rule (and its twin
does not), and each of the breaking logs passed the checker before the fix.

1. ``"backfill": true`` on a ``started`` record excused any start from ``priority_inversion``.
2. A reservation slid later when the reserved head alternated between two jobs.
3. A non-positive ``nodes`` or ``gpus_per_node`` hid a double booking or crashed the replay.

Logs are written by hand, never by the scheduler (see test_checker.py).
"""

from __future__ import annotations

from typing import Any

import pytest

from goodput.sched.sim.checker import KINDS, CheckReport, check
from tests.sched.sim import test_checker

CAP = {"a": 8, "b": 8, "c": 4}
POOLS = dict.fromkeys(CAP, "p")


def pol(records: list[dict[str, Any]], **kw: Any) -> CheckReport:
    return check(records, CAP, pools=POOLS, **kw)


def only(report: CheckReport, kind: str | None = None, n: int = 1) -> None:
    want = dict.fromkeys(KINDS, 0)
    if kind is not None:
        want[kind] = n
    assert report.violations == want, (report.summary(), report.examples)


class Log(test_checker.Log):
    """test_checker's hand-written log, with the shapes these holes need (any ``nodes``/``gpn``)."""

    def job(self, jid: str, *, nodes: Any = 1, gpn: Any = 8, prio: int = 0, limit: float = 0.0) -> Log:
        extra: dict[str, Any] = {"limit_s": limit} if limit else {}
        return self.e(
            "submitted", job=jid, tenant="t", priority=prio, nodes=nodes, gpus_per_node=gpn, submit_s=self.t, **extra
        )

    def start(self, jid: str, nodes: list[str], gpn: Any = 8, epoch: int = 1, **kw: Any) -> Log:
        return self.e(
            "started", job=jid, epoch=epoch, pool="p", nodes=nodes, gpus_per_node=gpn, resume_from_s=0.0, **kw
        )

    def end(self, jid: str, nodes: list[str], gpn: Any = 8, epoch: int = 1) -> Log:
        self.e("exited", job=jid, epoch=epoch, status="finished")
        gpus = gpn * len(nodes) if isinstance(gpn, int) else gpn
        self.e("released", job=jid, epoch=epoch, nodes=nodes, gpus=gpus)
        return self.e("finished", job=jid)

    def reserved(self, head: str, t: float, nodes: list[str]) -> Log:
        return self.e("reserved", job=head, reserved_t=t, pool="p", nodes=nodes)


# -- 1. "backfill": true is honoured only under a reservation in force -------------------------


def test_backfill_flag_without_a_reservation_is_a_priority_inversion() -> None:
    """The review's case: a priority-0 job starts on free GPUs that a pending priority-9 job fits,
    with no reservation anywhere; its ``backfill: true`` must not excuse it."""
    g = Log().job("hi", prio=9).job("lo", limit=50.0).at(0.5).start("lo", ["a"], backfill=True)
    r = pol(g.records)
    only(r, "priority_inversion")
    assert "job hi" in r.examples[0] and "no reservation in force" in r.examples[0]


def backfill_log(reserve: bool, lo_node: str = "c", lo_limit: float = 50.0) -> Log:
    """x runs on a until 100; head h (priority 9, a+b) cannot start and is reserved a and b at 100;
    mid (priority 5, 8 GPUs, 1000 s) would fit only on b, which is reserved, so it is held off;
    lo (priority 0, 4 GPUs) is backfilled in the same pass, which logs its reservation at its end."""
    g = Log().job("x", limit=100.0).start("x", ["a"])
    g.at(1).job("h", nodes=2, prio=9, limit=1000.0).job("mid", prio=5, limit=1000.0)
    g.job("lo", gpn=4, limit=lo_limit).start("lo", [lo_node], gpn=4, backfill=True)
    if reserve:
        g.reserved("h", 100.0, ["a", "b"])
    return g


def test_backfill_around_a_reservation_in_force_is_not_an_inversion() -> None:
    only(pol(backfill_log(reserve=True).records))


def test_backfill_flag_when_the_pass_logged_no_reservation() -> None:
    """The same pass without its reservation: mid (priority 5) fitted on b while lo started."""
    r = pol(backfill_log(reserve=False).records)
    only(r, "priority_inversion")
    assert "job mid" in r.examples[0]


def test_backfill_onto_the_reserved_nodes_past_the_reserved_time_is_judged_like_any_start() -> None:
    """lo backfilled on the reserved b with a declared end past 100: the reservation was delayed
    (the inversion is judged against the nodes as they were at lo's start: b free, and reserved)."""
    only(pol(backfill_log(reserve=True, lo_node="b", lo_limit=500.0).records), "reservation_delayed")


def test_a_later_start_in_the_same_pass_does_not_hide_what_fitted_at_the_backfilled_start() -> None:
    """hi (priority 8, 4 GPUs) fitted on c, outside the head's reservation (a and b), when lo was
    backfilled on b; a later start of the same pass took c before the reservation was logged. What
    fitted at lo's start counts, so both starts left hi pending on GPUs it fitted."""
    g = Log().job("x", limit=100.0).start("x", ["a"])
    g.at(1).job("h", nodes=2, prio=9, limit=1000.0).job("hi", gpn=4, prio=8, limit=1000.0)
    g.job("lo", limit=50.0).job("other", gpn=4, limit=50.0)
    g.start("lo", ["b"], backfill=True).start("other", ["c"], gpn=4, backfill=True)
    g.reserved("h", 100.0, ["a", "b"])
    r = pol(g.records)
    assert r.violations["priority_inversion"] == 2, r.examples  # lo and other, each with hi fitting c
    assert all("job hi" in e for e in r.examples)


# -- 2. a head's reservation binds until it starts, whatever other head is reserved since ------


def switching_log(k_max: int) -> Log:
    """The review's case 3: nodes a and b; heads h1 and h2 wait; each pass a new arrival is
    backfilled onto the reserved node a and the reservation names the other head."""
    g = Log().job("r", limit=100.0).start("r", ["a"]).job("r2", limit=100.0).start("r2", ["b"])
    g.job("h1", limit=100.0).job("h2", limit=100.0).reserved("h1", 100.0, ["a"])
    for k in range(1, k_max + 1):
        g.at(100.0 * k)
        g.end("r" if k == 1 else f"f{k - 1}", ["a"]).end("r2" if k == 1 else f"g{k - 1}", ["b"])
        g.job(f"f{k}", limit=100.0).job(f"g{k}", limit=100.0)
        g.start(f"f{k}", ["a"], backfill=True).start(f"g{k}", ["b"], backfill=True)
        g.reserved("h2" if k % 2 else "h1", 100.0 * (k + 1), ["a"])
    return g


def test_alternating_heads_cannot_slide_a_reservation() -> None:
    r = pol(switching_log(2).records)
    # t=100: f1 takes a (h1's, reserved at 100) until 200; t=200: h1 reserved at 300, was 100;
    # f2 takes a until 300 (h2's reservation at 200)
    assert r.violations["reservation_delayed"] == 3, (r.summary(), r.examples)
    assert any("reserved start moved later, t=100 -> t=300" in e for e in r.examples)
    assert any("reserved for job h1 (still pending) at t=100" in e for e in r.examples)
    only(r, "reservation_delayed", 3)


def test_heads_that_take_turns_and_keep_their_times_are_fine() -> None:
    """h1 is reserved a at 100 and starts there at 100; then h2 is reserved b at 200 and starts
    there at 200: the head changed, no reservation moved."""
    g = Log().job("r", limit=100.0).start("r", ["a"]).job("r2", limit=200.0).start("r2", ["b"])
    g.job("h1", limit=100.0).job("h2", limit=100.0).reserved("h1", 100.0, ["a"])
    g.at(100).end("r", ["a"]).start("h1", ["a"]).reserved("h2", 200.0, ["b"])
    g.at(200).end("r2", ["b"]).start("h2", ["b"]).end("h1", ["a"]).at(300).end("h2", ["b"])
    only(pol(g.records))


@pytest.mark.parametrize(
    ("between", "bad"),
    [(None, True), ("node_lost", False), ("higher reserved", False), ("same priority reserved", True)],
)
def test_a_heads_reservation_is_remembered_across_other_heads(between: str | None, bad: bool) -> None:
    """h1 reserved at 100 on a; another head is reserved; h1 comes back reserved at 300. Only a
    capacity loss or a head (or start, or preemption) of higher priority in between lets it move."""
    g = Log().job("x", limit=100.0).start("x", ["a"]).job("y", limit=300.0).start("y", ["b"])
    g.job("h1", prio=1, limit=100.0).reserved("h1", 100.0, ["a"])
    g.at(10)
    if between == "node_lost":
        g.e("node_lost", node="c")
    elif between == "higher reserved":
        g.job("vip", prio=5, limit=100.0).reserved("vip", 100.0, ["a"])
    elif between == "same priority reserved":
        g.job("h2", prio=1, limit=100.0).reserved("h2", 300.0, ["b"])
    g.at(20).reserved("h1", 300.0, ["a"])
    r = pol(g.records)
    assert r.violations["reservation_delayed"] == int(bad), (r.summary(), r.examples)
    g2 = Log()
    g2.records = list(g.records[:-1])
    g2.at(20).reserved("h1", 90.0, ["a"])  # earlier is always fine
    assert pol(g2.records).violations["reservation_delayed"] == 0


@pytest.mark.parametrize(("limit", "node", "bad"), [(80.0, "a", False), (500.0, "a", True), (500.0, "c", False)])
def test_a_start_on_a_pending_heads_nodes_after_the_head_switched(limit: float, node: str, bad: bool) -> None:
    """h1 (reserved a at 100) is no longer the head in force (h2 is, on b); a start on a must still
    end by 100, and one elsewhere may run long."""
    g = Log().job("x", limit=100.0).start("x", ["b"])
    g.job("h1", prio=1, limit=100.0).reserved("h1", 100.0, ["a"])
    g.at(10).job("h2", prio=1, limit=100.0).reserved("h2", 100.0, ["b"])
    gpn = 8 if node == "a" else 4
    g.job("s", gpn=gpn, limit=limit).start("s", [node], gpn=gpn, backfill=True)
    r = pol(g.records)
    assert r.violations["reservation_delayed"] == int(bad), (r.summary(), r.examples)


def test_a_reservation_is_forgotten_once_its_head_starts() -> None:
    """h1 started on a at 100: its old reservation binds nobody; a later long start on a is fine."""
    g = Log().job("y", limit=1000.0).start("y", ["b"])
    g.job("x", limit=100.0).start("x", ["a"]).job("h1", limit=100.0).reserved("h1", 100.0, ["a"])
    g.at(100).end("x", ["a"]).start("h1", ["a"]).at(150).end("h1", ["a"])
    g.job("long", limit=5000.0).start("long", ["a"])
    only(pol(g.records))


# -- 3. a non-positive shape is malformed, never hides a booking, never crashes ----------------


def negative_log(gpn: Any) -> Log:
    """a and c both take all 8 GPUs of node a; a job of ``gpn`` GPUs starts in between."""
    g = Log().job("a", limit=100.0).start("a", ["a"])
    g.job("neg", gpn=gpn, limit=100.0).start("neg", ["a"], gpn=gpn)
    g.job("c", limit=100.0).start("c", ["a"])
    return g.at(100).end("a", ["a"]).end("c", ["a"]).end("neg", ["a"], gpn=gpn)


@pytest.mark.parametrize("pools", [None, POOLS])
@pytest.mark.parametrize("gpn", [-8, 0, True])
def test_a_non_positive_gpu_count_is_malformed_and_hides_no_double_booking(gpn: Any, pools: Any) -> None:
    r = check(negative_log(gpn).records, CAP, pools=pools)  # with pools= it once raised IndexError
    v = r.violations
    assert v["overcommit"] == 1 and v["double_booked"] == 1, (r.summary(), r.examples)
    assert v["illegal_transition"] == 2, r.examples  # the submitted and the started record, once each
    bad = [e for e in r.examples if "malformed" in e]
    assert all("job neg" in e and "gpus_per_node" in e for e in bad) and len(bad) == 2
    assert sum(v.values()) == 4


def test_a_positive_gpu_count_in_between_is_the_same_double_booking() -> None:
    """The control: with 0 < gpn the same log books neg too, and only the bookings are flagged."""
    r = pol(negative_log(4).records)
    assert r.violations["illegal_transition"] == 0 and r.violations["overcommit"] == 2, r.examples


@pytest.mark.parametrize("nodes", [-1, 0])
def test_a_non_positive_node_count_is_malformed(nodes: int) -> None:
    g = Log().job("w", nodes=nodes).at(10).job("x").start("x", ["a"]).at(20).end("x", ["a"])
    r = pol(g.records)
    only(r, "illegal_transition")
    assert "job w" in r.examples[0] and "nodes" in r.examples[0]


def test_a_resize_to_a_non_positive_shape_is_malformed() -> None:
    g = Log().job("w", limit=10.0).at(1).e("resized", job="w", nodes=1, gpus_per_node=-4)
    r = pol(g.at(10).e("node_up", node="a").records)
    only(r, "illegal_transition")
    assert "malformed resized record: gpus_per_node -4" in r.examples[0]


def test_a_well_formed_shape_is_not_flagged() -> None:
    g = Log().job("w", gpn=8.0, limit=10.0).start("w", ["a"], gpn=8).at(5).end("w", ["a"])
    only(pol(g.records))
