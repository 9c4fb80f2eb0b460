"""An independent auditor of a scheduler's event log.

It replays the records of :mod:`goodput.sched.events` and counts broken invariants. It is written
from the log schema alone and imports nothing of the scheduler: a checker that shared the
scheduler's code would share its bugs, and then a passing check would prove nothing.

Two ledgers are kept per node because they disagree exactly when the scheduler is wrong: what the
scheduler has *bound* (``started`` to ``released``: its own accounting) and what is *physically
occupied* (``started`` to ``exited``: processes hold their GPUs until they are observed gone). A
scheduler that releases GPUs at the preemption decision rather than at the exit keeps its own books
straight (no ``overcommit``) while two jobs share a GPU (``double_booked``); only the second ledger
sees it.

Records are applied strictly in log order, equal ``t`` included: the scheduler logs the exits and
releases that make room before the starts that use it, so a start that over-subscribes at the moment
it is logged is a violation.

Every record costs O(1) amortized (per-node counters, a small object per job, no scanning), so a log
of a million records checks in a few seconds.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from goodput.sched import events as ev

KINDS: tuple[str, ...] = (
    "overcommit",
    "double_booked",
    "released_before_gone",
    "not_all_or_nothing",
    "start_on_lost_node",
    "resume_not_committed",
    "progress_backwards",
    "stale_commit_accepted",
    "illegal_transition",
    "preemption_counted_as_failure",
    "time_backwards",
    "lost_job",
)

EXIT_STATUSES = frozenset({"finished", "preempted", "failed", "killed", "lost"})
EPS = 1e-6  # progress and resume points are floats written by another program

# job phases (ints: the replay loop compares them a million times)
_PENDING = 0  # submitted or requeued: may start
_ACTIVE = 1  # started, processes not yet observed gone (running or preempting)
_AWAIT = 2  # exited: waits for its disposition (requeued, finished, failed, cancelled)
_TERMINAL = 3
_PHASE_NAMES = ("pending", "running", "exited", "terminal")


@dataclass
class CheckReport:
    """What the replay found; ``violations`` always lists every kind so reports can be diffed."""

    violations: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    examples: list[str] = field(default_factory=list)
    double_booked_gpu_s: float = 0.0  # over-capacity GPUs x seconds: how much physical sharing
    records: int = 0
    jobs: int = 0

    @property
    def total(self) -> int:
        return sum(self.violations.values())

    @property
    def ok(self) -> bool:
        return self.total == 0

    def summary(self) -> str:
        """One line for a CLI or a test failure; the examples say where to look."""
        if self.ok:
            return f"ok: {self.records} records, {self.jobs} jobs, no violations"
        bad = ", ".join(f"{k}={v}" for k, v in self.violations.items() if v)
        extra = f", double_booked_gpu_s={self.double_booked_gpu_s:g}" if self.double_booked_gpu_s else ""
        return f"{self.total} violations in {self.records} records ({bad}{extra})"


class _Job:
    """The auditor's own view of one job, rebuilt from the log alone."""

    __slots__ = (
        "id",
        "nodes",
        "gpn",
        "phase",
        "epoch",
        "live",
        "where",
        "run_gpn",
        "held",
        "bound_epoch",
        "bound",
        "bound_names",
        "committed",
        "preempted",
        "lost_under",
    )

    def __init__(self, jid: str, nodes: int, gpn: int) -> None:
        self.id = jid
        self.nodes = nodes  # submitted gang shape
        self.gpn = gpn
        self.phase = _PENDING
        self.epoch = 0  # epoch of the latest start
        self.live = False  # processes of ``epoch`` not yet observed gone
        self.where: tuple[str, ...] = ()  # known nodes the live processes occupy
        self.run_gpn = 0  # GPUs per node of the latest start (as logged, which may be wrong)
        self.held = False  # the scheduler still holds GPUs for ``bound_epoch``
        self.bound_epoch = 0
        self.bound: tuple[str, ...] = ()  # known nodes of that binding
        self.bound_names: tuple[str, ...] = ()  # every name it was started on, for the release check
        self.committed = 0.0  # progress of the latest accepted commit: where a restart must resume
        self.preempted = False  # a preempt_requested was seen in the current epoch
        self.lost_under = False  # a node it was running on was lost during the current epoch


class _Auditor:
    """The replay state; one instance per check."""

    def __init__(self, capacity: dict[str, int], max_examples: int) -> None:
        self.cap: dict[str, int] = {str(k): int(v) for k, v in capacity.items()}
        self.bound: dict[str, int] = dict.fromkeys(self.cap, 0)
        self.occ: dict[str, int] = dict.fromkeys(self.cap, 0)
        self.on_node: dict[str, set[str]] = {n: set() for n in self.cap}  # live job ids per node
        self.lost: set[str] = set()
        self.jobs: dict[str, _Job] = {}
        self.report = CheckReport()
        self.counts = self.report.violations
        self.max_examples = max_examples
        self.excess = 0  # sum over nodes of max(0, occupied - capacity), kept incrementally
        self.dispatch = {
            ev.SUBMITTED: self.on_submitted,
            ev.STARTED: self.on_started,
            ev.PREEMPT_REQUESTED: self.on_preempt_requested,
            ev.CHECKPOINT_COMMITTED: self.on_checkpoint_committed,
            ev.COMMIT_REJECTED: self.on_commit_rejected,
            ev.EXITED: self.on_exited,
            ev.RELEASED: self.on_released,
            ev.REQUEUED: self.on_requeued,
            ev.FINISHED: self.on_finished,
            ev.FAILED: self.on_failed,
            ev.CANCELLED: self.on_cancelled,
            ev.RESIZED: self.on_resized,
            ev.NODE_LOST: self.on_node_lost,
            ev.NODE_UP: self.on_node_up,
            ev.NODE_RECLAIM_NOTICE: self.on_ignored,
        }

    # -- bookkeeping ---------------------------------------------------------------------------

    def flag(self, kind: str, t: float, who: str, msg: str) -> None:
        self.counts[kind] += 1
        ex = self.report.examples
        if len(ex) < self.max_examples:
            ex.append(f"t={t:g} {who}: {kind}: {msg}")

    def run(self, records: Iterable[dict[str, Any]]) -> CheckReport:
        dispatch = self.dispatch
        last = float("-inf")
        acc = 0.0
        n = 0
        for rec in records:
            n += 1
            try:
                t = float(rec["t"])
                event = rec["event"]
            except (KeyError, TypeError, ValueError) as e:
                self.flag("illegal_transition", last, f"record {n}", f"malformed record ({e!r})")
                continue
            if t < last:
                self.flag("time_backwards", t, _who(rec), f"{event} at t={t:g} after t={last:g}")
            elif t > last:
                if self.excess:
                    acc += self.excess * (t - last)
                last = t
            handler = dispatch.get(event)
            if handler is None:
                continue  # the schema lets writers add events outside tools do not know
            try:
                handler(rec, t)
            except (KeyError, TypeError, ValueError) as e:
                self.flag("illegal_transition", t, _who(rec), f"malformed {event} record ({e!r})")
        self.report.double_booked_gpu_s = acc
        self.report.records = n
        self.report.jobs = len(self.jobs)
        self.finish(last)
        return self.report

    def finish(self, t: float) -> None:
        """A job the scheduler stopped tracking is neither running nor queued: it fell out."""
        for j in self.jobs.values():
            if j.phase == _AWAIT:
                self.flag("lost_job", t, f"job {j.id}", f"exited in epoch {j.epoch} but never requeued or ended")
            elif j.phase == _ACTIVE and not j.held:
                self.flag("lost_job", t, f"job {j.id}", f"released in epoch {j.epoch} but never requeued or ended")

    def job(self, rec: dict[str, Any], t: float, event: str) -> _Job | None:
        """The job a record names, or None (flagged) when no lifecycle event may name it now."""
        jid = rec["job"]
        j = self.jobs.get(jid)
        if j is None:
            self.flag("illegal_transition", t, f"job {jid}", f"{event} for a job never submitted")
            return None
        if j.phase == _TERMINAL:
            self.flag("illegal_transition", t, f"job {jid}", f"{event} after the job ended")
            return None
        return j

    def occupy(self, j: _Job, names: tuple[str, ...], gpn: int) -> bool:
        """Put a run's processes on its nodes; True when that over-subscribes one."""
        occ, cap, on_node = self.occ, self.cap, self.on_node
        over = False
        for n in names:
            c = cap[n]
            before = occ[n]
            after = before + gpn
            occ[n] = after
            if after > c:
                over = True
                self.excess += after - c - (before - c if before > c else 0)
            on_node[n].add(j.id)
        j.where = names
        j.live = True
        return over

    def vacate(self, j: _Job) -> None:
        occ, cap, on_node = self.occ, self.cap, self.on_node
        gpn = j.run_gpn
        for n in j.where:
            c = cap[n]
            before = occ[n]
            after = before - gpn
            occ[n] = after
            if before > c:
                self.excess -= before - c - (after - c if after > c else 0)
            on_node[n].discard(j.id)
        j.where = ()
        j.live = False

    def bind(self, j: _Job, names: tuple[str, ...], gpn: int, epoch: int) -> bool:
        """Charge the scheduler's own books; True when they exceed a node's capacity."""
        bound, cap = self.bound, self.cap
        over = False
        for n in names:
            b = bound[n] + gpn
            bound[n] = b
            if b > cap[n]:
                over = True
        j.bound = names
        j.bound_epoch = epoch
        j.held = True
        return over

    def unbind(self, j: _Job) -> None:
        bound = self.bound
        gpn = j.run_gpn
        for n in j.bound:
            bound[n] -= gpn
        j.bound = ()
        j.bound_names = ()
        j.held = False

    # -- job events ----------------------------------------------------------------------------

    def on_submitted(self, rec: dict[str, Any], t: float) -> None:
        jid = rec["job"]
        if jid in self.jobs:
            self.flag("illegal_transition", t, f"job {jid}", "submitted twice")
            return
        self.jobs[jid] = _Job(jid, int(rec["nodes"]), int(rec["gpus_per_node"]))

    def on_resized(self, rec: dict[str, Any], t: float) -> None:
        """A pending job's shape changes for its next run; its starts are checked against it."""
        j = self.job(rec, t, "resized")
        if j is None:
            return
        if j.phase != _PENDING or j.held:
            self.flag("illegal_transition", t, f"job {j.id}", "resized while not pending")
            return
        j.nodes, j.gpn = int(rec["nodes"]), int(rec["gpus_per_node"])

    def on_started(self, rec: dict[str, Any], t: float) -> None:
        j = self.job(rec, t, "started")
        if j is None:
            return
        epoch = int(rec["epoch"])
        names = tuple(rec["nodes"])
        gpn = int(rec["gpus_per_node"])
        resume = float(rec["resume_from_s"])
        who = f"job {j.id}"
        # at most one illegal_transition per start: the causes below are one mistake seen twice
        if j.phase != _PENDING:
            self.flag("illegal_transition", t, who, f"started while {_PHASE_NAMES[j.phase]} (epoch {j.epoch})")
        elif epoch != j.epoch + 1:
            self.flag("illegal_transition", t, who, f"started epoch {epoch} after epoch {j.epoch}")
        elif j.held:
            self.flag("illegal_transition", t, who, f"started while epoch {j.bound_epoch} was never released")
        # the previous run is replaced so that one mistake does not cascade into every later check
        if j.live:
            self.vacate(j)
        if j.held:
            self.unbind(j)
        cap = self.cap
        if len(names) != j.nodes or len(set(names)) != len(names) or gpn != j.gpn or any(n not in cap for n in names):
            self.flag(
                "not_all_or_nothing",
                t,
                who,
                f"started on {list(names)} x {gpn} GPUs, submitted {j.nodes} nodes x {j.gpn} GPUs",
            )
        lost = self.lost
        if lost and any(n in lost for n in names):
            self.flag("start_on_lost_node", t, who, f"started on lost node(s) {[n for n in names if n in lost]}")
        if abs(resume - j.committed) > EPS:
            self.flag(
                "resume_not_committed", t, who, f"resumes from {resume:g}, last committed progress {j.committed:g}"
            )
        known = names if all(n in cap for n in names) else tuple(n for n in names if n in cap)
        j.run_gpn = gpn
        if self.bind(j, known, gpn, epoch):
            hot = [n for n in known if self.bound[n] > cap[n]]
            self.flag("overcommit", t, who, f"scheduler bound more GPUs than exist on {hot}")
        if self.occupy(j, known, gpn):
            hot = [n for n in known if self.occ[n] > cap[n]]
            self.flag("double_booked", t, who, f"started on {hot} while earlier processes still hold their GPUs")
        j.bound_names = names
        j.phase = _ACTIVE
        j.epoch = epoch
        j.preempted = False
        j.lost_under = False

    def on_preempt_requested(self, rec: dict[str, Any], t: float) -> None:
        j = self.job(rec, t, "preempt_requested")
        if j is None:
            return
        epoch = int(rec["epoch"])
        if j.phase != _ACTIVE or epoch != j.epoch:
            self.flag(
                "illegal_transition",
                t,
                f"job {j.id}",
                f"preempt_requested for epoch {epoch} while {_PHASE_NAMES[j.phase]} in epoch {j.epoch}",
            )
            return
        j.preempted = True

    def on_checkpoint_committed(self, rec: dict[str, Any], t: float) -> None:
        jid = rec["job"]
        j = self.jobs.get(jid)
        if j is None:
            self.flag("illegal_transition", t, f"job {jid}", "checkpoint_committed for a job never submitted")
            return
        epoch = rec.get("epoch")
        progress = float(rec["progress_s"])
        who = f"job {jid}"
        if j.phase != _ACTIVE or epoch != j.epoch:
            self.flag(
                "stale_commit_accepted",
                t,
                who,
                f"accepted a commit of epoch {epoch} while {_PHASE_NAMES[j.phase]} in epoch {j.epoch}",
            )
        if progress < j.committed - EPS:
            self.flag("progress_backwards", t, who, f"committed progress {progress:g} below {j.committed:g}")
        # the scheduler accepted it, so it is where a restart must resume, right or wrong
        j.committed = progress

    def on_commit_rejected(self, rec: dict[str, Any], t: float) -> None:
        """A rejection changes nothing and may name a stale or foreign run, so it is never checked."""

    def on_exited(self, rec: dict[str, Any], t: float) -> None:
        j = self.job(rec, t, "exited")
        if j is None:
            return
        epoch = int(rec["epoch"])
        status = rec["status"]
        who = f"job {j.id}"
        if status not in EXIT_STATUSES:
            self.flag("illegal_transition", t, who, f"exited with unknown status {status!r}")
            return
        if not (j.live and epoch == j.epoch):
            self.flag("illegal_transition", t, who, f"exited epoch {epoch} while not running (epoch {j.epoch})")
            return
        self.vacate(j)
        if j.phase == _ACTIVE:
            j.phase = _AWAIT
        # else a disposition came before the exit; it was flagged when it came

    def on_released(self, rec: dict[str, Any], t: float) -> None:
        j = self.job(rec, t, "released")
        if j is None:
            return
        epoch = int(rec["epoch"])
        who = f"job {j.id}"
        if not j.held or epoch != j.bound_epoch:
            self.flag("illegal_transition", t, who, f"released epoch {epoch} which holds no GPUs")
            return
        if j.live and j.epoch == epoch:
            self.flag("released_before_gone", t, who, f"released epoch {epoch} before its processes exited")
        names = rec["nodes"]
        gpus = int(rec["gpus"])
        if sorted(names) != sorted(j.bound_names) or gpus != len(j.bound_names) * j.run_gpn:
            self.flag(
                "illegal_transition",
                t,
                who,
                f"released {gpus} GPUs on {list(names)}, bound {len(j.bound_names) * j.run_gpn} on {list(j.bound_names)}",
            )
        self.unbind(j)

    def dispose(self, j: _Job, t: float, event: str, failure: bool) -> None:
        """The checks every end of a run shares: the processes must be gone first."""
        who = f"job {j.id}"
        if j.phase != _AWAIT:
            self.flag(
                "illegal_transition", t, who, f"{event} while {_PHASE_NAMES[j.phase]} (no exit of epoch {j.epoch})"
            )
        if failure and (j.preempted or j.lost_under):
            why = "it was asked to leave" if j.preempted else "a node under it was lost"
            self.flag("preemption_counted_as_failure", t, who, f"{event} as a failure though {why}")
        j.preempted = False
        j.lost_under = False

    def on_requeued(self, rec: dict[str, Any], t: float) -> None:
        j = self.job(rec, t, "requeued")
        if j is None:
            return
        reason = rec["reason"]
        who = f"job {j.id}"
        if reason not in ev.REQUEUE_REASONS:
            self.flag("illegal_transition", t, who, f"requeued with unknown reason {reason!r}")
            return
        self.dispose(j, t, f"requeued ({reason})", reason == "failure")
        resume = rec.get("resume_from_s")
        if resume is not None and abs(float(resume) - j.committed) > EPS:
            self.flag(
                "resume_not_committed",
                t,
                who,
                f"requeued to resume from {float(resume):g}, last committed progress {j.committed:g}",
            )
        j.phase = _PENDING

    def end(self, j: _Job, t: float, event: str, flagged: bool) -> None:
        """A terminal job must not hold GPUs: no release may legally follow its end."""
        if j.held and not flagged:
            self.flag("illegal_transition", t, f"job {j.id}", f"{event} while epoch {j.bound_epoch} was never released")
        if j.live:
            self.vacate(j)  # it was flagged; forget it rather than double-book forever
        if j.held:
            self.unbind(j)
        j.phase = _TERMINAL

    def on_finished(self, rec: dict[str, Any], t: float) -> None:
        j = self.job(rec, t, "finished")
        if j is None:
            return
        flagged = j.phase != _AWAIT
        self.dispose(j, t, "finished", False)
        self.end(j, t, "finished", flagged)

    def on_failed(self, rec: dict[str, Any], t: float) -> None:
        j = self.job(rec, t, "failed")
        if j is None:
            return
        flagged = j.phase != _AWAIT
        self.dispose(j, t, "failed", True)
        self.end(j, t, "failed", flagged)

    def on_cancelled(self, rec: dict[str, Any], t: float) -> None:
        """Cancelling a queued or exited job is fine; a running one must leave (and exit) first."""
        j = self.job(rec, t, "cancelled")
        if j is None:
            return
        flagged = j.live or j.phase == _ACTIVE
        if flagged:
            self.flag("illegal_transition", t, f"job {j.id}", f"cancelled while running (epoch {j.epoch} not exited)")
        self.end(j, t, "cancelled", flagged)

    # -- node events ---------------------------------------------------------------------------

    def on_node_lost(self, rec: dict[str, Any], t: float) -> None:
        node = rec["node"]
        self.lost.add(node)
        jobs = self.jobs
        for jid in self.on_node.get(node, ()):
            jobs[jid].lost_under = True

    def on_node_up(self, rec: dict[str, Any], t: float) -> None:
        self.lost.discard(rec["node"])

    def on_ignored(self, rec: dict[str, Any], t: float) -> None:
        """A reclaim notice forbids nothing the log can show: its effect is the preemptions it causes."""


def _who(rec: dict[str, Any]) -> str:
    if "job" in rec:
        return f"job {rec['job']}"
    if "node" in rec:
        return f"node {rec['node']}"
    return "record"


def check(records: Iterable[dict[str, Any]], capacity: dict[str, int], *, max_examples: int = 20) -> CheckReport:
    """Replay ``records`` (log order) against ``capacity`` (node name -> GPUs) and count violations."""
    return _Auditor(capacity, max_examples).run(records)


def check_file(path: str | Path, capacity: dict[str, int], *, max_examples: int = 20) -> CheckReport:
    """Check a JSONL event log as the scheduler or a live service wrote it."""
    return check(ev.read_jsonl(path), capacity, max_examples=max_examples)
