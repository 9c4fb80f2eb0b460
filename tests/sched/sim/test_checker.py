"""The auditor must pass every legal log and name each kind of bug exactly once.

Logs are written by hand (or by a tiny generator of legal lifecycles below), never by the
scheduler: a checker tested against the scheduler's own output could only learn its bugs.
"""

from __future__ import annotations

import math
import random
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from goodput.sched.core.events import write_jsonl
from goodput.sched.sim.checker import KINDS, POLICY_KINDS, SAFETY_KINDS, CheckReport, Rules, check, check_file

CAP = {"a": 8, "b": 8, "c": 4}


class Log:
    """A hand-written log: ``at`` moves the clock, each call appends one record."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self.t = 0.0

    def at(self, t: float) -> Log:
        self.t = t
        return self

    def e(self, event: str, **kw: Any) -> Log:
        self.records.append({"t": self.t, "event": event, **kw})
        return self

    # the common shapes, legal by construction
    def submit(self, job: str, nodes: int = 1, gpn: int = 8) -> Log:
        return self.e("submitted", job=job, tenant="t", priority=0, nodes=nodes, gpus_per_node=gpn, submit_s=self.t)

    def start(self, job: str, epoch: int, nodes: list[str], gpn: int = 8, resume: float = 0.0) -> Log:
        return self.e("started", job=job, epoch=epoch, pool="p", nodes=nodes, gpus_per_node=gpn, resume_from_s=resume)

    def preempt(self, job: str, epoch: int, by: str = "reclaim") -> Log:
        return self.e(
            "preempt_requested", job=job, epoch=epoch, victim_of=by, lost_s=0.0, deadline_s=self.t + 30, checkpoint=True
        )

    def commit(self, job: str, epoch: int, progress: float) -> Log:
        return self.e("checkpoint_committed", job=job, epoch=epoch, progress_s=progress)

    def exit(self, job: str, epoch: int, status: str = "finished") -> Log:
        return self.e("exited", job=job, epoch=epoch, status=status)

    def release(self, job: str, epoch: int, nodes: list[str], gpn: int = 8) -> Log:
        return self.e("released", job=job, epoch=epoch, nodes=nodes, gpus=gpn * len(nodes))

    def requeue(self, job: str, reason: str = "preempted", resume: float = 0.0) -> Log:
        return self.e("requeued", job=job, reason=reason, resume_from_s=resume)

    def run_to_end(self, job: str, epoch: int, nodes: list[str], gpn: int = 8, status: str = "finished") -> Log:
        self.exit(job, epoch, status).release(job, epoch, nodes, gpn)
        return self.e("finished" if status == "finished" else "failed", job=job)


def only(report: CheckReport, kind: str | None = None, n: int = 1) -> None:
    want = dict.fromkeys(KINDS, 0)
    if kind is not None:
        want[kind] = n
    assert report.violations == want, (report.summary(), report.examples)


def clean_log() -> Log:
    g = Log()
    g.submit("j1", nodes=2).submit("j2", nodes=1, gpn=4)
    g.at(1).start("j1", 1, ["a", "b"]).start("j2", 1, ["c"], gpn=4)
    g.at(5).commit("j1", 1, 4.0)
    g.at(6).submit("j3").preempt("j1", 1, by="j3")
    g.at(7).commit("j1", 1, 5.5)
    g.at(8).exit("j1", 1, "preempted").release("j1", 1, ["a", "b"]).requeue("j1", "preempted", 5.5)
    g.start("j3", 1, ["a"])
    g.at(9).e("commit_rejected", job="j1", epoch=1, reason="stale epoch")
    g.at(10).run_to_end("j2", 1, ["c"], gpn=4)
    g.at(12).e("node_lost", node="b").at(13).e("node_up", node="b")
    g.at(13).e("node_reclaim_notice", node="a", deadline_s=43.0)
    g.at(14).run_to_end("j3", 1, ["a"]).e("node_up", node="a")  # the drain is called off
    g.at(15).start("j1", 2, ["a", "b"], resume=5.5)
    g.at(20).e("node_lost", node="b").exit("j1", 2, "lost").release("j1", 2, ["a", "b"])
    g.requeue("j1", "infrastructure", 5.5)
    g.at(21).e("node_up", node="b").at(22).start("j1", 3, ["a", "b"], resume=5.5)
    g.at(30).run_to_end("j1", 3, ["a", "b"])
    g.submit("j4").at(31).e("cancelled", job="j4")
    # an own failure burns a retry, then fails for good
    g.submit("j5", gpn=4).start("j5", 1, ["c"], gpn=4)
    g.at(32).exit("j5", 1, "failed").release("j5", 1, ["c"], gpn=4).requeue("j5", "failure")
    g.at(33).start("j5", 2, ["c"], gpn=4).at(34).run_to_end("j5", 2, ["c"], gpn=4, status="failed")
    # a cancel of a running job goes through a preemption and an exit
    g.submit("j6").start("j6", 1, ["b"]).at(35).preempt("j6", 1, by="cancel")
    g.exit("j6", 1, "killed").release("j6", 1, ["b"]).e("cancelled", job="j6")
    # still queued and still running at the end: both fine
    g.submit("j7", nodes=3)
    g.submit("j8").start("j8", 1, ["a"])
    g.submit("j9").start("j9", 1, ["b"]).at(36).preempt("j9", 1, by="j7")
    return g


def test_clean_log_is_ok() -> None:
    r = check(clean_log().records, CAP)
    only(r)
    assert r.ok and r.total == 0 and r.examples == [] and r.double_booked_gpu_s == 0.0
    assert r.records == len(clean_log().records) and r.jobs == 9
    assert "ok" in r.summary()


def test_check_file_reads_jsonl(tmp_path) -> None:
    path = tmp_path / "events.jsonl"
    write_jsonl(clean_log().records, path)
    assert check_file(path, CAP).ok
    bad = clean_log()
    bad.at(40).start("j8", 2, ["a"])
    write_jsonl(bad.records, path)
    only(check_file(path, CAP), "illegal_transition")


def test_overcommit_when_scheduler_books_a_node_twice() -> None:
    g = Log().submit("j1").submit("j2").start("j1", 1, ["a"])
    g.at(5).exit("j1", 1).start("j2", 1, ["a"])  # j1's GPUs are still bound: not released yet
    g.at(6).release("j1", 1, ["a"]).e("finished", job="j1")
    r = check(g.records, CAP)
    only(r, "overcommit")
    assert r.double_booked_gpu_s == 0.0  # j1's processes were gone: nothing physically shared
    assert "overcommit" in r.examples[0] and "job j2" in r.examples[0] and "t=5" in r.examples[0]


def test_release_before_exit_double_books_the_preemptors_gpus() -> None:
    g = Log().submit("v").start("v", 1, ["a"])
    g.at(2).submit("p")
    g.at(10).preempt("v", 1, by="p").release("v", 1, ["a"])  # wrong: released at the decision
    g.start("p", 1, ["a"])
    g.at(25).exit("v", 1, "preempted").requeue("v", "preempted")
    r = check(g.records, CAP)
    assert r.violations["released_before_gone"] == 1
    assert r.violations["double_booked"] == 1
    assert r.total == 2, r.examples
    assert r.double_booked_gpu_s == pytest.approx(8 * 15.0)


def test_double_booked_gpu_s_counts_only_the_excess() -> None:
    g = Log().submit("v", gpn=6).submit("p", gpn=4).submit("q", gpn=4).start("v", 1, ["a"], gpn=6)
    g.at(10).preempt("v", 1, by="p").release("v", 1, ["a"], gpn=6).start("p", 1, ["a"], gpn=4)
    g.at(14).start("q", 1, ["b"], gpn=4)  # elsewhere: adds nothing
    g.at(20).exit("v", 1, "preempted").requeue("v")
    g.at(30).exit("p", 1).release("p", 1, ["a"], gpn=4).e("finished", job="p")
    r = check(g.records, CAP)
    assert r.violations["double_booked"] == 1 and r.violations["released_before_gone"] == 1 and r.total == 2
    assert r.double_booked_gpu_s == pytest.approx(2 * 10.0)  # 6 + 4 on 8 GPUs for 10 s


def test_released_before_gone_alone() -> None:
    g = Log().submit("v").start("v", 1, ["a"]).at(3).preempt("v", 1).release("v", 1, ["a"])
    g.at(4).exit("v", 1, "preempted").requeue("v")
    only(check(g.records, CAP), "released_before_gone")


@pytest.mark.parametrize(
    ("nodes", "gpn"),
    [(["a"], 8), (["a", "a"], 8), (["a", "zz"], 8), (["a", "b"], 4), (["a", "b", "c"], 4)],
    ids=["too-few", "repeated", "unknown-node", "wrong-gpus", "too-many"],
)
def test_not_all_or_nothing(nodes: list[str], gpn: int) -> None:
    g = Log().submit("j", nodes=2).start("j", 1, nodes, gpn=gpn)
    only(check(g.records, {"a": 16, "b": 16, "c": 16}), "not_all_or_nothing")


def test_start_on_lost_node() -> None:
    g = Log().submit("j").at(1).e("node_lost", node="b").at(2).start("j", 1, ["b"])
    only(check(g.records, CAP), "start_on_lost_node")
    g = Log().submit("j").e("node_lost", node="b").e("node_up", node="b").start("j", 1, ["b"])
    only(check(g.records, CAP))


def preempted_once(progress: float = 5.0) -> Log:
    g = Log().submit("j").start("j", 1, ["a"]).at(5).commit("j", 1, progress).at(6).preempt("j", 1)
    return g.at(7).exit("j", 1, "preempted").release("j", 1, ["a"])


@pytest.mark.parametrize("resume", [7.0, 3.0, 0.0])
def test_resume_not_committed_on_start(resume: float) -> None:
    g = preempted_once().requeue("j", "preempted", 5.0).at(8).start("j", 2, ["a"], resume=resume)
    only(check(g.records, CAP), "resume_not_committed")


def test_resume_not_committed_on_requeue() -> None:
    g = preempted_once().requeue("j", "preempted", 3.0).at(8).start("j", 2, ["a"], resume=5.0)
    only(check(g.records, CAP), "resume_not_committed")


def test_resume_from_zero_without_a_commit() -> None:
    g = Log().submit("j").start("j", 1, ["a"], resume=2.0)
    only(check(g.records, CAP), "resume_not_committed")


def test_progress_backwards() -> None:
    g = Log().submit("j").start("j", 1, ["a"]).at(5).commit("j", 1, 5.0).at(6).commit("j", 1, 3.0)
    g.at(7).exit("j", 1, "failed").release("j", 1, ["a"]).requeue("j", "failure", 3.0)
    g.at(8).start("j", 2, ["a"], resume=3.0)  # resumes from the latest accepted: consistent
    only(check(g.records, CAP), "progress_backwards")


def test_stale_commit_accepted_and_rejected() -> None:
    base = preempted_once().requeue("j", "preempted", 5.0).at(8).start("j", 2, ["a"], resume=5.0)
    late = Log()
    late.records = list(base.records)
    late.at(9).commit("j", 1, 6.0)  # epoch 1 is dead: accepting its report is the bug
    only(check(late.records, CAP), "stale_commit_accepted")
    rejected = Log()
    rejected.records = list(base.records)
    rejected.at(9).e("commit_rejected", job="j", epoch=1, reason="stale epoch")
    only(check(rejected.records, CAP))
    # a commit while queued has no run to belong to either
    g = preempted_once().requeue("j", "preempted", 5.0).commit("j", 1, 6.0)
    only(check(g.records, CAP), "stale_commit_accepted")
    # a rejection never counts, whatever it names
    g = Log().e("commit_rejected", job="ghost", epoch=3, reason="foreign")
    g.submit("j").start("j", 1, ["a"]).run_to_end("j", 1, ["a"]).e("commit_rejected", job="j", epoch=1, reason="late")
    only(check(g.records, CAP))


def _illegal_logs() -> dict[str, Log]:
    out = {
        "never-submitted": Log().start("ghost", 1, ["a"]),
        "submitted-twice": Log().submit("j").submit("j"),
        "started-while-running": Log().submit("j").start("j", 1, ["a"]).start("j", 2, ["a"]),
        "epoch-skips": Log().submit("j").start("j", 2, ["a"]),
        "first-epoch-zero": Log().submit("j").start("j", 0, ["a"]),
        "exited-when-pending": Log().submit("j").exit("j", 1),
        "exited-wrong-epoch": Log().submit("j").start("j", 1, ["a"]).exit("j", 2),
        "exited-unknown-status": Log().submit("j").start("j", 1, ["a"]).exit("j", 1, "vanished"),
        "preempt-when-pending": Log().submit("j").preempt("j", 1),
        "requeued-before-exit": Log().submit("j").start("j", 1, ["a"]).requeue("j"),
        "requeued-twice": Log().submit("j").start("j", 1, ["a"]).exit("j", 1, "failed"),
        "finished-before-exit": Log().submit("j").start("j", 1, ["a"]).e("finished", job="j"),
        "failed-before-exit": Log().submit("j").start("j", 1, ["a"]).e("failed", job="j"),
        "after-terminal": Log().submit("j").e("cancelled", job="j").start("j", 1, ["a"]),
        "cancelled-while-running": Log().submit("j").start("j", 1, ["a"]).e("cancelled", job="j"),
        "released-twice": Log().submit("j").start("j", 1, ["a"]).exit("j", 1, "failed"),
        "released-other-nodes": Log().submit("j").start("j", 1, ["a"]).exit("j", 1, "failed"),
        "finished-still-bound": Log().submit("j").start("j", 1, ["a"]).exit("j", 1),
        "restart-still-bound": Log().submit("j").start("j", 1, ["a"]).exit("j", 1, "failed"),
        "unknown-requeue-reason": Log().submit("j").start("j", 1, ["a"]).exit("j", 1, "failed"),
        "malformed-record": Log().submit("j").e("started", job="j"),
    }
    out["requeued-twice"].release("j", 1, ["a"]).requeue("j", "failure").requeue("j", "failure")
    out["released-twice"].release("j", 1, ["a"]).release("j", 1, ["a"]).requeue("j", "failure")
    out["released-other-nodes"].release("j", 1, ["b"]).requeue("j", "failure")
    out["finished-still-bound"].e("finished", job="j")
    out["restart-still-bound"].requeue("j", "failure").start("j", 2, ["b"])
    out["unknown-requeue-reason"].release("j", 1, ["a"]).requeue("j", "bored").requeue("j", "failure")
    return out


@pytest.mark.parametrize(("name", "log"), list(_illegal_logs().items()), ids=list(_illegal_logs()))
def test_illegal_transition(name: str, log: Log) -> None:
    only(check(log.records, CAP), "illegal_transition")


@pytest.mark.parametrize(
    "log",
    [
        preempted_once().requeue("j", "failure", 5.0),  # exit while preempting requeued as a failure
        preempted_once().e("failed", job="j"),  # or failed for good
        Log()
        .submit("j")
        .start("j", 1, ["a"])
        .preempt("j", 1)
        .exit("j", 1, "failed")
        .release("j", 1, ["a"])
        .e("failed", job="j"),
        Log()
        .submit("j", nodes=2)
        .start("j", 1, ["a", "b"])
        .e("node_lost", node="b")
        .exit("j", 1, "failed")
        .release("j", 1, ["a", "b"])
        .requeue("j", "failure"),
    ],
    ids=["requeued-failure", "failed", "exit-status-failed", "node-lost"],
)
def test_preemption_counted_as_failure(log: Log) -> None:
    only(check(log.records, CAP), "preemption_counted_as_failure")


def stopped(reason: str, failed_reason: str | None, *, lost: bool = False) -> Log:
    g = Log().submit("j").start("j", 1, ["a"])
    if lost:
        g.e("node_lost", node="a")
    else:
        g.e("preempt_requested", job="j", epoch=1, victim_of=reason, reason=reason, preemptor=None, lost_s=0.0,
            deadline_s=30.0, checkpoint=False)  # fmt: skip
    g.exit("j", 1, "killed").release("j", 1, ["a"])
    return g.e("failed", job="j", **({"reason": failed_reason} if failed_reason else {}))


@pytest.mark.parametrize(
    ("reason", "failed_reason", "lost", "bad"),
    [
        ("time_limit", "time_limit", False, False),  # Slurm's TIMEOUT: the documented end
        ("reclaim", "infrastructure", False, False),  # its infrastructure budget spent
        ("", "infrastructure", True, False),
        ("priority", "time_limit", False, True),  # a priority preemption read as a time limit
        ("time_limit", "failure", False, True),
        ("time_limit", None, False, True),  # an old log cannot say why: a failure after a notice
    ],
)
def test_failed_for_a_time_limit_or_the_infrastructure(
    reason: str, failed_reason: str | None, lost: bool, bad: bool
) -> None:
    only(pol(stopped(reason, failed_reason, lost=lost).records), "preemption_counted_as_failure" if bad else None)


def test_failure_before_a_node_loss_is_a_failure() -> None:
    g = Log().submit("j").start("j", 1, ["a"]).exit("j", 1, "failed").e("node_lost", node="a")
    g.release("j", 1, ["a"]).requeue("j", "failure")
    only(check(g.records, CAP))


def test_time_backwards() -> None:
    g = Log().submit("j").at(5).start("j", 1, ["a"]).at(4).commit("j", 1, 1.0).at(6).exit("j", 1)
    g.release("j", 1, ["a"]).e("finished", job="j")
    r = check(g.records, CAP)
    only(r, "time_backwards")
    assert "t=4" in r.examples[0]


@pytest.mark.parametrize("released", [False, True])
def test_lost_job(released: bool) -> None:
    g = Log().submit("j").start("j", 1, ["a"]).exit("j", 1, "failed")
    if released:
        g.release("j", 1, ["a"])
    r = check(g.records, CAP)
    only(r, "lost_job")
    assert "job j" in r.examples[0]


def test_examples_are_capped_and_counts_are_not() -> None:
    g = Log()
    for i in range(50):
        g.start(f"ghost{i}", 1, ["a"])
    r = check(g.records, CAP, max_examples=5)
    assert r.violations["illegal_transition"] == 50 and len(r.examples) == 5 and not r.ok
    assert "50 violations" in r.summary()


# -- random legal lifecycles ------------------------------------------------------------------

# -- the policy's promises: each with a log that breaks it and the nearest one that does not ----

POOLS = dict.fromkeys(CAP, "p")


def pol(records: list[dict[str, Any]], **kw: Any) -> CheckReport:
    return check(records, CAP, pools=POOLS, **kw)


def job(g: Log, jid: str, *, nodes: int = 1, gpn: int = 8, prio: int = 0, limit: float = 0.0) -> Log:
    extra: dict[str, Any] = {"limit_s": limit} if limit else {}
    return g.e("submitted", job=jid, tenant="t", priority=prio, nodes=nodes, gpus_per_node=gpn, submit_s=g.t, **extra)


def start_under_notice(cleared: str | None) -> Log:
    g = Log().at(1).e("node_reclaim_notice", node="a", deadline_s=121.0)
    if cleared == "up":
        g.at(2).e("node_up", node="a")
    elif cleared == "lost and back":
        g.at(2).e("node_lost", node="a").at(3).e("node_up", node="a")
    return job(g.at(4), "j").start("j", 1, ["a"])


def test_start_under_notice() -> None:
    r = pol(start_under_notice(None).records)
    only(r, "start_under_notice")
    assert "reclaim or drain notice" in r.examples[0]


@pytest.mark.parametrize("cleared", ["up", "lost and back"])
def test_start_after_the_notice_is_over(cleared: str) -> None:
    only(pol(start_under_notice(cleared).records))


@pytest.mark.parametrize(("t", "progress", "bad"), [(1.0, 5000.0, True), (1.0, 0.5, False), (2000.0, 1999.0, False)])
def test_progress_faster_than_time(t: float, progress: float, bad: bool) -> None:
    g = job(Log(), "j").start("j", 1, ["a"]).at(t).commit("j", 1, progress)
    only(pol(g.records), "progress_faster_than_time" if bad else None)


def test_progress_counts_from_the_runs_resume_point() -> None:
    g = job(Log(), "j").start("j", 1, ["a"]).at(100).commit("j", 1, 100.0)
    g.at(101).preempt("j", 1).exit("j", 1, "preempted").release("j", 1, ["a"]).requeue("j", resume=100.0)
    g.at(101.5).start("j", 2, ["a"], resume=100.0).at(106.5).commit("j", 2, 104.0)
    only(pol(g.records))
    g.at(107.5).commit("j", 2, 180.0)  # 80 s of work in 6 s of running
    only(pol(g.records), "progress_faster_than_time")


@pytest.mark.parametrize(("ran", "bad"), [(589.0, False), (592.0, True)])
def test_over_limit(ran: float, bad: bool) -> None:
    """limit_s 500 + over_time_limit_s 60 + grace 30 (the job's, when logged), 1 s of clock slack."""
    g = Log()
    g.e("submitted", job="j", tenant="t", priority=0, nodes=1, gpus_per_node=8, submit_s=0.0, limit_s=500.0,
        grace_s=30.0)  # fmt: skip
    g.start("j", 1, ["a"]).at(ran).run_to_end("j", 1, ["a"])
    only(pol(g.records), "over_limit" if bad else None)
    only(pol(g.records, rules=Rules(over_time_limit_s=math.inf)))  # limits not enforced: nothing to check
    old = [{k: v for k, v in rec.items() if k not in ("limit_s", "grace_s")} for rec in g.records]
    only(pol(old))  # a log without declared limits cannot show it


def test_over_limit_without_a_logged_grace_allows_the_clusters_cap() -> None:
    g = job(Log(), "j", limit=500.0).start("j", 1, ["a"]).at(1100.0).run_to_end("j", 1, ["a"])
    only(pol(g.records))  # 500 + 60 + max_grace_s 600
    only(pol(g.records, rules=Rules(max_grace_s=300.0)), "over_limit")


def test_over_limit_of_a_run_still_going_when_the_log_ends() -> None:
    g = job(Log(), "j", limit=10.0).start("j", 1, ["a"]).at(1000).commit("j", 1, 5.0)
    only(pol(g.records), "over_limit")


def reserved(g: Log, head: str, t: float, nodes: list[str]) -> Log:
    return g.e("reserved", job=head, reserved_t=t, pool="p", nodes=nodes)


def reservation_log() -> Log:
    """Head h (priority 1, 2 nodes) reserved a and b at t=100; b is free, a runs x until then."""
    g = job(Log(), "x", limit=90.0).start("x", 1, ["a"])
    g.at(10)
    job(g, "h", nodes=2, prio=1, limit=1000.0)
    return reserved(g, "h", 100.0, ["a", "b"])


@pytest.mark.parametrize(
    ("who", "prio", "limit", "node", "bad"),
    [
        ("short", 0, 80.0, "b", False),  # ends at 90, before the reserved start
        ("long", 0, 500.0, "b", True),  # ends at 510 on a reserved node
        ("elsewhere", 0, 500.0, "c", False),  # not on the reserved nodes
        ("higher", 2, 500.0, "b", False),  # a higher priority goes before the head
    ],
)
def test_reservation_delayed_by_a_start(who: str, prio: int, limit: float, node: str, bad: bool) -> None:
    g = reservation_log().at(10)
    job(g, who, prio=prio, limit=limit, gpn=4)
    g.e("started", job=who, epoch=1, pool="p", nodes=[node], gpus_per_node=4, resume_from_s=0.0, backfill=True)
    only(pol(g.records), "reservation_delayed" if bad else None)


def test_a_backfilled_start_is_judged_by_the_reservation_its_pass_made() -> None:
    """A pass logs its reservation after its starts: the starts are checked against it."""
    g = job(Log(), "x", limit=90.0).start("x", 1, ["a"]).at(10)
    job(g, "h", nodes=2, prio=1, limit=1000.0)
    job(g, "long", gpn=4, limit=500.0)
    g.e("started", job="long", epoch=1, pool="p", nodes=["b"], gpus_per_node=4, resume_from_s=0.0, backfill=True)
    reserved(g, "h", 100.0, ["a", "b"])
    only(pol(g.records), "reservation_delayed")


@pytest.mark.parametrize(("between", "bad"), [(None, True), ("node_lost", False), ("higher start", False)])
def test_reservation_moved_later(between: str | None, bad: bool) -> None:
    g = reservation_log().at(20)
    if between == "node_lost":
        g.e("node_lost", node="c")
    elif between == "higher start":
        job(g, "vip", gpn=4, prio=5, limit=500.0).start("vip", 1, ["c"], gpn=4)
    reserved(g, "h", 150.0, ["a", "b"])
    only(pol(g.records), "reservation_delayed" if bad else None)
    earlier = reservation_log().at(20)
    only(pol(reserved(earlier, "h", 50.0, ["a", "b"]).records))  # earlier is always fine


def inversion_log(high_nodes: int, **start: Any) -> Log:
    g = job(Log(), "hi", nodes=high_nodes, prio=9)
    job(g, "lo", prio=0).at(0.5)
    g.e("started", job="lo", epoch=1, pool="p", nodes=["a"], gpus_per_node=8, resume_from_s=0.0, **start)
    return g


def test_priority_inversion() -> None:
    r = pol(inversion_log(1).records)
    assert r.violations["priority_inversion"] == 1 and "job hi" in r.examples[0]


@pytest.mark.parametrize("case", ["too big", "backoff", "claimant"])
def test_no_priority_inversion(case: str) -> None:
    """(A ``backfill`` start: tests/sched/sim/test_checker_holes.py.)"""
    if case == "too big":  # 3 nodes of 8 GPUs: never fits, so lo takes nothing from it
        g = inversion_log(3)
    elif case == "backoff":  # requeued after a failure: it may sit out a backoff
        g = job(Log(), "hi", prio=9).start("hi", 1, ["b"]).at(0.2).exit("hi", 1, "failed")
        g.release("hi", 1, ["b"]).requeue("hi", "failure")
        job(g, "lo", prio=0).at(0.5).start("lo", 1, ["a"])
    else:  # hi preempted x and waits for it; its gang is held back
        g = job(Log(), "x").start("x", 1, ["b"])
        job(g, "hi", nodes=2, prio=9).preempt("x", 1, by="hi")
        job(g, "lo").at(0.5).start("lo", 1, ["a"])
    r = pol(g.records)
    assert r.violations["priority_inversion"] == 0, r.examples


def idle_log(started_after: float | None) -> Log:
    g = job(Log(), "x").start("x", 1, ["a"])
    job(g, "w", gpn=4)  # waits: fits on b
    if started_after is not None:
        g.at(started_after).start("w", 1, ["b"], gpn=4)
    return g.at(10).commit("x", 1, 5.0)  # a later record: the time went by


@pytest.mark.parametrize(("after", "bad"), [(None, True), (1.0, False), (2.5, True)])
def test_not_work_conserving(after: float | None, bad: bool) -> None:
    only(pol(idle_log(after).records), "not_work_conserving" if bad else None)


def test_work_conserving_allows_what_does_not_fit_and_the_reservation() -> None:
    g = job(Log(), "x").start("x", 1, ["a"])
    job(g, "big", nodes=3)  # needs three 8-GPU nodes: there are two
    only(pol(g.at(10).commit("x", 1, 5.0).records))
    g = reservation_log().at(11)
    job(g, "long", gpn=8, limit=5000.0)  # would fit on b, but b is reserved for h
    only(pol(g.at(30).commit("x", 1, 5.0).records))
    job(g, "small", gpn=4, limit=5000.0)  # fits on c, outside the reservation: must start
    r = pol(g.at(60).commit("x", 1, 6.0).records)
    assert r.violations["not_work_conserving"] == 1 and "job small" in r.examples[0]


def test_rules_from_the_cluster_limits() -> None:
    r = Rules.from_limits({"over_time_limit_s": 5, "max_grace_s": 10, "min_run_s": 600})
    assert (r.over_time_limit_s, r.max_grace_s) == (5.0, 10.0)
    assert Rules.from_limits(None) == Rules()
    with pytest.raises(ValueError, match="limits.max_grace_s"):
        Rules.from_limits({"max_grace_s": -1})


def test_every_kind_is_documented() -> None:
    doc = (Path(__file__).resolve().parents[3] / "docs" / "SCHED.md").read_text()
    for kind in KINDS:
        assert f"`{kind}`" in doc, kind
    assert set(SAFETY_KINDS) | set(POLICY_KINDS) == set(KINDS)


GEN_CAP = {"n0": 4, "n1": 4, "n2": 8, "n3": 2}


def legal_log(rng: random.Random, steps: int) -> list[dict[str, Any]]:
    """A tiny scheduler that only ever does legal things, on a four-node cluster."""
    out: list[dict[str, Any]] = []
    t = 0.0
    jobs: dict[str, dict[str, Any]] = {}
    bound = dict.fromkeys(GEN_CAP, 0)
    lost: set[str] = set()
    on_node: dict[str, set[str]] = {n: set() for n in GEN_CAP}

    def emit(event: str, **kw: Any) -> None:
        out.append({"t": t, "event": event, **kw})

    def vacate(j: dict[str, Any]) -> None:
        for n in j["where"]:
            on_node[n].discard(j["id"])

    def dispose(j: dict[str, Any]) -> None:
        if j["cause"] == "lost":
            emit("requeued", job=j["id"], reason="infrastructure", resume_from_s=j["committed"])
            j["state"] = "pending"
        elif j["victim_of"] == "cancel":
            emit("cancelled", job=j["id"])
            j["state"] = "done"
        elif j["victim_of"] is not None:
            emit("requeued", job=j["id"], reason="preempted", resume_from_s=j["committed"])
            j["state"] = "pending"
        elif j["status"] == "finished":
            emit("finished", job=j["id"])
            j["state"] = "done"
        else:
            j["failures"] += 1
            if j["failures"] >= 3:
                emit("failed", job=j["id"])
                j["state"] = "done"
            else:
                emit("requeued", job=j["id"], reason="failure", resume_from_s=j["committed"])
                j["state"] = "pending"

    def release(j: dict[str, Any]) -> None:
        emit("released", job=j["id"], epoch=j["epoch"], nodes=list(j["where"]), gpus=j["gpn"] * len(j["where"]))
        for n in j["where"]:
            bound[n] -= j["gpn"]
        j["state"] = "released"

    for _ in range(steps):
        t += rng.choice((0.0, 0.0, 0.5, 3.0))
        action = rng.randrange(13)

        def pick(*states: str) -> dict[str, Any] | None:
            c = [j for j in jobs.values() if j["state"] in states]
            return rng.choice(c) if c else None

        if action == 0:
            gpn = rng.choice((1, 2, 4, 8))
            nodes = 1 if gpn == 8 else rng.choice((1, 2))
            jid = f"j{len(jobs)}"
            jobs[jid] = {"id": jid, "nodes": nodes, "gpn": gpn, "state": "pending", "epoch": 0, "committed": 0.0}
            jobs[jid]["failures"] = 0
            emit(
                "submitted", job=jid, tenant="t", priority=rng.randrange(3), nodes=nodes, gpus_per_node=gpn, submit_s=t
            )
        elif action in (1, 2):
            j = pick("pending")
            if j is None:
                continue
            free = [n for n in GEN_CAP if n not in lost and GEN_CAP[n] - bound[n] >= j["gpn"]]
            if len(free) < j["nodes"]:
                continue
            where = rng.sample(free, j["nodes"])
            j.update(epoch=j["epoch"] + 1, state="running", where=where, victim_of=None, cause=None, status=None)
            for n in where:
                bound[n] += j["gpn"]
                on_node[n].add(j["id"])
            emit("started", job=j["id"], epoch=j["epoch"], pool="p", nodes=where, gpus_per_node=j["gpn"],
                 resume_from_s=j["committed"])  # fmt: skip
        elif action == 3:
            j = pick("running", "preempting")
            if j is not None:
                j["committed"] += rng.choice((0.0, 1.0, 2.5))
                emit("checkpoint_committed", job=j["id"], epoch=j["epoch"], progress_s=j["committed"])
        elif action == 4:
            j = pick("pending", "running", "preempting", "exited", "released", "done")
            if j is not None:
                emit("commit_rejected", job=j["id"], epoch=j["epoch"] - rng.randrange(2), reason="stale")
        elif action == 5:
            j = pick("running")
            if j is not None:
                others = [k for k in jobs if k != j["id"]]
                j["victim_of"] = rng.choice(["reclaim", "cancel", *others[:3]])
                j["state"] = "preempting"
                emit("preempt_requested", job=j["id"], epoch=j["epoch"], victim_of=j["victim_of"], lost_s=1.0,
                     deadline_s=t + 30, checkpoint=rng.random() < 0.5)  # fmt: skip
        elif action in (6, 7):
            j = pick("running", "preempting")
            if j is not None:
                if j["state"] == "preempting":
                    j["status"] = rng.choice(("preempted", "killed", "failed"))
                else:
                    j["status"] = rng.choice(("finished", "failed"))
                emit("exited", job=j["id"], epoch=j["epoch"], status=j["status"])
                vacate(j)
                j["state"] = "exited"
        elif action == 8:
            j = pick("exited")
            if j is not None:
                release(j)
        elif action == 9:
            j = pick("released")
            if j is not None:
                dispose(j)
        elif action == 10:
            j = pick("pending")
            if j is not None and rng.random() < 0.3:
                emit("cancelled", job=j["id"])
                j["state"] = "done"
        elif action == 11:
            up = [n for n in GEN_CAP if n not in lost]
            if up and rng.random() < 0.5:
                emit("node_reclaim_notice", node=rng.choice(up), deadline_s=t + 120)
            elif up:
                n = rng.choice(up)
                lost.add(n)
                emit("node_lost", node=n)
                for jid in sorted(on_node[n]):
                    j = jobs[jid]
                    j["status"], j["cause"] = "lost", "lost"
                    emit("exited", job=jid, epoch=j["epoch"], status="lost")
                    vacate(j)
                    j["state"] = "exited"
        else:
            if lost:
                n = rng.choice(sorted(lost))
                lost.discard(n)
                emit("node_up", node=n)
    t += 1.0
    for j in jobs.values():  # nothing may fall out: what exited is disposed of
        if j["state"] == "exited":
            release(j)
        if j["state"] == "released":
            dispose(j)
    return out


@settings(max_examples=60, deadline=None)
@given(st.randoms(use_true_random=False), st.integers(0, 300))
def test_random_legal_logs_are_ok(rng: random.Random, steps: int) -> None:
    """Safe, not a policy: the generator places at random, so only the safety kinds must stay 0."""
    records = legal_log(rng, steps)
    r = check(records, GEN_CAP)
    assert not any(r.violations[k] for k in SAFETY_KINDS), (r.summary(), r.examples)


@settings(max_examples=40, deadline=None)
@given(st.randoms(use_true_random=False), st.integers(20, 300))
def test_dropping_an_exit_is_always_caught(rng: random.Random, steps: int) -> None:
    records = legal_log(rng, steps)
    exits = [i for i, rec in enumerate(records) if rec["event"] == "exited"]
    if not exits:
        return
    del records[rng.choice(exits)]
    r = check(records, GEN_CAP)
    assert r.violations["released_before_gone"] >= 1, r.summary()


@settings(max_examples=40, deadline=None)
@given(st.randoms(use_true_random=False), st.integers(20, 300))
def test_resuming_past_the_commit_is_always_caught(rng: random.Random, steps: int) -> None:
    records = legal_log(rng, steps)
    starts = [i for i, rec in enumerate(records) if rec["event"] == "started"]
    if not starts:
        return
    i = rng.choice(starts)
    records[i] = {**records[i], "resume_from_s": records[i]["resume_from_s"] + 1.0}
    r = check(records, GEN_CAP)
    assert {k: r.violations[k] for k in SAFETY_KINDS} == {k: int(k == "resume_not_committed") for k in SAFETY_KINDS}


# -- speed ------------------------------------------------------------------------------------


def busy_log(n_records: int, n_nodes: int = 512) -> list[dict[str, Any]]:
    """A full cluster that turns over one job per node at a time, with preemptions and commits."""
    out: list[dict[str, Any]] = []
    live: dict[int, tuple[str, int]] = {}
    t = 0.0
    i = 0
    while len(out) < n_records:
        t += 0.01
        node = i % n_nodes
        name = f"n{node}"
        if node in live:
            jid, ep = live.pop(node)
            if i % 3 == 0:
                out.append({"t": t, "event": "preempt_requested", "job": jid, "epoch": ep, "victim_of": f"j{i}",
                            "lost_s": 0.0, "deadline_s": t + 30, "checkpoint": True})  # fmt: skip
            out.append({"t": t, "event": "exited", "job": jid, "epoch": ep, "status": "finished"})
            out.append({"t": t, "event": "released", "job": jid, "epoch": ep, "nodes": [name], "gpus": 8})
            out.append({"t": t, "event": "requeued" if i % 3 == 0 else "finished", "job": jid,
                        "reason": "preempted", "resume_from_s": 1.0})  # fmt: skip
        jid = f"j{i}"
        out.append({"t": t, "event": "submitted", "job": jid, "tenant": "t", "priority": 0, "nodes": 1,
                    "gpus_per_node": 8, "submit_s": t})  # fmt: skip
        out.append({"t": t, "event": "started", "job": jid, "epoch": 1, "pool": "p", "nodes": [name],
                    "gpus_per_node": 8, "resume_from_s": 0.0})  # fmt: skip
        out.append({"t": t, "event": "checkpoint_committed", "job": jid, "epoch": 1, "progress_s": 1.0})
        live[node] = (jid, 1)
        i += 1
    return out


def test_medium_log_is_fast_and_clean() -> None:
    records = busy_log(100_000)
    t0 = time.perf_counter()
    r = check(records, {f"n{k}": 8 for k in range(512)})
    dt = time.perf_counter() - t0
    assert r.ok, r.examples
    assert dt < 5.0  # ~0.3 s on a laptop; the bound only catches an accidental O(n^2)


@pytest.mark.slow
def test_million_records_under_ten_seconds() -> None:
    records = busy_log(1_000_000)
    t0 = time.perf_counter()
    r = check(records, {f"n{k}": 8 for k in range(512)})
    dt = time.perf_counter() - t0
    assert r.ok, r.examples
    assert dt < 10.0, dt


# -- a requeued job's eligibility, and a claim honoured --------------------------------------


def backoff_log(start_at: float, logged: bool) -> Log:
    """j fails at 10 and is requeued behind a backoff to 70 (``eligible_s``, when the log says it)."""
    g = job(Log(), "j").start("j", 1, ["a"]).at(10).exit("j", 1, "failed").release("j", 1, ["a"])
    g.e("requeued", job="j", reason="failure", resume_from_s=0.0, **({"eligible_s": 70.0} if logged else {}))
    return g.at(start_at).start("j", 2, ["a"])


@pytest.mark.parametrize(
    ("start_at", "logged", "bad"),
    [
        (40.0, True, True),  # inside its backoff
        (70.0, True, False),  # at its end
        (40.0, False, False),  # a log that does not say when cannot show it
    ],
)
def test_start_before_eligible(start_at: float, logged: bool, bad: bool) -> None:
    r = pol(backoff_log(start_at, logged).records)
    only(r, "start_before_eligible" if bad else None)
    if bad:
        assert "job j" in r.examples[0] and "t=70" in r.examples[0]
    only(check(backoff_log(start_at, logged).records, CAP), "start_before_eligible" if bad else None)  # safety


def claim_log(after: str | None) -> Log:
    """hi (2 x 8, priority 9) evicts v (2 x 8 on a and b) at 1; v is gone at 5. Then ``after``."""
    g = job(Log(), "v", nodes=2).start("v", 1, ["a", "b"])
    job(g.at(1), "hi", nodes=2, prio=9)
    g.e("preempt_requested", job="v", epoch=1, reason="priority", preemptor="hi", victim_of="hi", lost_s=0.0,
        deadline_s=31.0, checkpoint=True)  # fmt: skip
    g.at(5).exit("v", 1, "preempted").release("v", 1, ["a", "b"]).requeue("v")
    if after == "starts":
        g.start("hi", 1, ["a", "b"])
    elif after == "starts within a pass":
        g.at(6).start("hi", 1, ["a", "b"])
    elif after == "starts late":
        g.at(9).start("hi", 1, ["a", "b"])
    elif after == "cancelled":  # the claim goes with it (and v, which would fit now, is cancelled too)
        g.at(6).e("cancelled", job="hi").e("cancelled", job="v")
    elif after == "node lost":  # its claim is dropped with its node, no record says so
        g.at(6).e("node_lost", node="a")
    return job(g.at(20), "later", gpn=4)  # a later record: the time went by


@pytest.mark.parametrize(
    ("after", "bad"),
    [
        (None, True),
        ("starts late", True),
        ("starts", False),
        ("starts within a pass", False),
        ("cancelled", False),
        ("node lost", False),
    ],
)
def test_claim_dropped(after: str | None, bad: bool) -> None:
    r = pol(claim_log(after).records)
    only(r, "claim_dropped" if bad else None)
    if bad:
        assert "job hi" in r.examples[0]


def test_a_claim_is_due_only_once_every_victim_is_gone() -> None:
    """Two victims: the first gone at 5 frees half the claim; the claimant starts when the second is."""
    g = job(Log(), "v1").start("v1", 1, ["a"])
    job(g, "v2").start("v2", 1, ["b"])
    job(g.at(1), "hi", nodes=2, prio=9)
    for v in ("v1", "v2"):
        g.e("preempt_requested", job=v, epoch=1, reason="priority", preemptor="hi", victim_of="hi", lost_s=0.0,
            deadline_s=31.0, checkpoint=True)  # fmt: skip
    g.at(5).exit("v1", 1, "preempted").release("v1", 1, ["a"]).requeue("v1")
    g.at(20).exit("v2", 1, "preempted").release("v2", 1, ["b"]).requeue("v2")
    g.start("hi", 1, ["a", "b"])
    assert pol(g.records).violations["claim_dropped"] == 0
    g.at(30).e("cancelled", job="v1").e("cancelled", job="v2")
    only(pol(g.records))


def rerun_log(ran: float) -> Log:
    """j (limit_s 500, grace 30) commits 100 s, yields at 150 and reruns from 100 for ``ran`` s."""
    g = Log()
    g.e("submitted", job="j", tenant="t", priority=0, nodes=1, gpus_per_node=8, submit_s=0.0, limit_s=500.0,
        grace_s=30.0)  # fmt: skip
    g.start("j", 1, ["a"]).at(150).commit("j", 1, 100.0).exit("j", 1, "preempted").release("j", 1, ["a"])
    g.requeue("j", resume=100.0).start("j", 2, ["a"], resume=100.0)
    return g.at(150 + ran).run_to_end("j", 2, ["a"])


@pytest.mark.parametrize(
    ("ran", "rules", "bad"),
    [
        # the scheduler's own bound for a rerun: restart_s (600 here) + 500 - 100 + 60 + 30
        (1090.0, Rules(), False),
        (2291.0, Rules(), False),  # restart_s is not logged: the cluster's max_restart_s (1800) stands in
        (2292.0, Rules(), True),
        (491.0, Rules(max_restart_s=0.0), False),
        (492.0, Rules(max_restart_s=0.0), True),
    ],
)
def test_over_limit_of_a_rerun_counts_its_restart(ran: float, rules: Rules, bad: bool) -> None:
    only(pol(rerun_log(ran).records, rules=rules), "over_limit" if bad else None)


def test_rules_take_max_restart_s_from_the_cluster_limits() -> None:
    assert Rules.from_limits({"max_restart_s": 120}).max_restart_s == 120.0
    assert Rules().max_restart_s == 1800.0


@pytest.mark.parametrize(("exit_at", "bad"), [(None, False), (25.0, True)])
def test_a_reservation_may_move_later_while_a_leaving_run_outlives_its_deadline(
    exit_at: float | None, bad: bool
) -> None:
    """x was asked to leave by 30 (a reclaim: capacity excused then); at 40 its exit has not come,
    so the head's plan, made at 35, moves later with the clock. Had x left at 25, as its deadline
    said, nothing would excuse the move."""
    g = job(Log(), "x").start("x", 1, ["a"])
    job(g, "h", nodes=2, prio=1, limit=1000.0)
    g.at(1).preempt("x", 1)  # deadline 31
    if exit_at is not None:
        g.at(exit_at).exit("x", 1, "preempted").release("x", 1, ["a"]).requeue("x")
    reserved(g.at(35), "h", 100.0, ["a", "b"])
    reserved(g.at(40), "h", 105.0, ["a", "b"])
    r = pol(g.records)
    assert r.violations["reservation_delayed"] == int(bad), (r.summary(), r.examples)


def test_the_comparisons_audit_takes_max_restart_s_from_the_cluster() -> None:
    """`goodput sched sim`'s audit (rules_of) passed over_time_limit_s and max_grace_s but not
    max_restart_s: a cluster capping restarts below 1,800 s had its reruns judged by 1,800 s."""
    from goodput.sched.core.governance import Governance
    from goodput.sched.sim.compare import rules_of
    from goodput.sched.sim.formats import Cluster

    cl = Cluster(pools=[], governance=Governance.from_obj(None, {"max_restart_s": 120, "max_grace_s": 30}))
    r = rules_of(cl)
    assert (r.max_restart_s, r.max_grace_s) == (120.0, 30.0)
