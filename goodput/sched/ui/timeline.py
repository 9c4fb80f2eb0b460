"""The dashboard's reading of an event log: jobs, runs, nodes, preemptions and where GPU-time went.

The live page and the static report read the same records (docs/SCHED.md's schema), so both are built
from this one replay; a live service feeds it the records its scheduler appended since the last
request. Records of other versions are tolerated: unknown keys are ignored, and keys added later
(``reason`` and ``preemptor`` on ``preempt_requested``, ``reason`` on ``failed``, ``limit_s`` on
``submitted``, the ``reserved`` event, ``trained_s``/``stall_s``/``write_s`` on
``checkpoint_committed``) are used when present and derived or left empty when not.

The replay keeps aggregates, not the log: a run's GPU-time is folded into the ledger's sums and the
series' time grid when it is released (its account is final then), a commit's kept work into the
grid when it arrives; only jobs not yet ended, the newest ``JOBS_ENDED_KEPT`` ended ones, each job's
newest records, runs and checkpoints, and the newest ``PREEMPTIONS_KEPT`` preemptions (per tenant
too) stay, with their totals. So the memory of a service's dashboard does not grow with its log.

The ledger (by cause, in GPU-seconds, summing to the allocation): *useful* is the progress a run's
commits (or its finish) kept, less the checkpoint stalls inside it; *restart* runs from the run's
start to its resume being done (``checkpoint_committed``'s ``trained_s``, which a job's report
carries); *checkpoint stall* is what its saves stalled training (``stall_s``); *draining* runs from
the notice to the exit; *lost* is the rest of a run that ended, charged to preemption when the run
was asked to leave and to failures otherwise; *at risk* is the rest of a run still going. A run whose
reports carry no ``trained_s`` (an older job, or one that ended before its first report) cannot tell
restart from lost work: its time before its first commit, less the progress that commit kept (all of
it when it never committed and ended), is *unattributed*, never useful.

Those timings (and ``progress_s``) are the tenant's own numbers, so each is bounded by what the log
saw (``Run.commit`` says how), and a preemption's realized loss leaves the victim's stalls out: no
tenant moves what another's job is charged.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

# victim_of words that name what asked, not a job (docs/SCHED.md; older records carry only victim_of)
PRIORITY_VICTIM_OF = frozenset({"reclaim", "node_loss", "cancel", "drain", "time_limit"})


# what the replay keeps beyond aggregates (every one a bound on memory however long the log)
JOBS_ENDED_KEPT = 2_000  # ended jobs kept for their pages (jobs not yet ended are all kept)
PREEMPTIONS_KEPT = 1_000  # newest preemptions kept for the log's table, cluster-wide and per tenant
RECORDS_KEPT = 500  # a job's newest records (its page's history)
RUNS_KEPT = 200  # a job's newest runs
CHECKPOINTS_KEPT = 200  # a job's newest committed checkpoints
GRID_SLOTS = 1_024  # the series' time grid: slots double in width as the log's span grows
# what a report's trained_s may exceed the progress, stalls and write it also reports by: the job's clock
# read at different instants (reporter's creation, snapshot, report), not a tenant's allowance
TIMING_SLACK_S = 1.0

CAUSES = (
    "useful",
    "restart",
    "checkpoint_stall",
    "lost_preemption",
    "lost_failure",
    "draining",
    "at_risk",
    "unattributed",
)


@dataclass(slots=True)
class Run:
    """One epoch of a job: from its start to the release of its GPUs (its commits as sums, not a list)."""

    job: str
    tenant: str
    epoch: int
    pool: str
    nodes: tuple[str, ...]
    gpus_per_node: int
    start: float
    resume_from: float
    commits: int = 0
    first_commit: tuple[float, float] | None = None  # (t, progress_s)
    last_commit: tuple[float, float] | None = None
    ready_t: float | None = None  # its resume done (from a report's trained_s), None when never reported
    stall_s: float = 0.0  # the stalls of its reported saves, summed
    last_stall_s: float = 0.0
    useful_added: float = 0.0  # GPU-seconds of useful work already put on the series' grid
    preempt_t: float | None = None
    preemption: Preemption | None = None
    exit_t: float | None = None
    status: str = ""  # the exit's status
    release_t: float | None = None

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * len(self.nodes)

    def committed(self) -> float:
        return self.last_commit[1] if self.last_commit else self.resume_from

    def account(self, now: float, stalls: bool = True) -> dict[str, float]:
        """This run's GPU-seconds by cause, as of ``now`` (the module's docstring says how).
        ``stalls=False``: as if it had reported none, for what a preemption cost another tenant's
        victim, which its own (self-reported, bounded) stalls must not shrink."""
        end = self.release_t if self.release_t is not None else now
        g = self.gpus
        stall_s = self.stall_s if stalls else 0.0
        last_stall_s = self.last_stall_s if stalls else 0.0
        alloc = g * max(0.0, end - self.start)
        left = alloc

        def take(x: float) -> float:
            nonlocal left
            x = min(max(0.0, x), left)
            left -= x
            return x

        drain = 0.0
        if self.preempt_t is not None:
            drain = take(g * ((self.exit_t if self.exit_t is not None else end) - self.preempt_t))
        restart = take(g * (self.ready_t - self.start)) if self.ready_t is not None else 0.0
        unattributed = 0.0
        if self.ready_t is None:
            if self.first_commit is not None:  # before the first commit, less the training it kept
                t1, p1 = self.first_commit
                unattributed = take(g * ((t1 - self.start) - (p1 - self.resume_from)))
            elif self.exit_t is not None:  # ended with no commit: restart or lost work, no one can say
                unattributed = take(left)
        kept = g * max(0.0, self.committed() - self.resume_from)
        stall_inside = g * max(0.0, stall_s - last_stall_s)  # the last save's stall is after its mark
        if self.status == "finished" and self.exit_t is not None:
            stall = take(g * stall_s)
            useful = take(left)
        else:
            useful = take(kept - stall_inside)
            stall = take(g * stall_s)
        out = {
            "allocated": alloc,
            "useful": useful,
            "restart": restart,
            "checkpoint_stall": stall,
            "draining": drain,
            "unattributed": unattributed,
            "lost_preemption": 0.0,
            "lost_failure": 0.0,
            "at_risk": 0.0,
        }
        if self.exit_t is None:
            out["at_risk"] = left
        elif self.preempt_t is not None and self.status in ("preempted", "killed", "failed"):
            out["lost_preemption"] = left
        else:
            out["lost_failure"] = left
        return out

    def commit(
        self, t: float, progress: float, trained_s: float | None, stall_s: float | None, write_s: float = 0.0
    ) -> tuple[float, float, float]:
        """Count a commit; returns the (t0, t1, GPU-seconds) of useful work it kept, for the grid.

        Every duration here is the tenant's own, so each is bounded by what the log saw: a save's stall
        and write by the time since the run's previous commit (or its start), the time trained since
        the resume by the progress kept plus the stalls and the write reported (``progress_s`` counts
        the wall time from the resume to the snapshot, the report comes after the save's stall and
        write) and at least that progress, and the useful work by the run's GPUs over the time since
        its previous commit (the series adds it to every tenant's)."""
        since = self.last_commit[0] if self.last_commit is not None else self.start
        window = max(0.0, t - max(since, self.start))
        stall = min(stall_s or 0.0, window)
        if trained_s is not None and self.ready_t is None:
            done = max(0.0, progress - self.resume_from)
            bound = done + self.stall_s + stall + min(max(0.0, write_s), window) + TIMING_SLACK_S
            trained = min(max(trained_s, done), bound)
            self.ready_t = min(t, max(self.start, t - trained))
        g = self.gpus
        if self.last_commit is None:
            t0, p0 = max(self.start, t - max(0.0, progress - self.resume_from)), self.resume_from
            self.first_commit = (t, progress)
        else:
            t0, p0 = self.last_commit
        gain = min(g * max(0.0, progress - p0 - self.last_stall_s), g * window)
        self.commits += 1
        self.last_commit = (t, max(progress, p0))
        self.last_stall_s = stall
        self.stall_s += stall
        self.useful_added += gain
        return t0, t, gain


@dataclass(slots=True)
class JobInfo:
    id: str
    tenant: str = ""
    priority: int = 0
    nodes: int = 0
    gpus_per_node: int = 0
    submit_s: float = 0.0
    limit_s: float | None = None
    state: str = "pending"
    substate: str = "queued"
    records: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=RECORDS_KEPT))
    records_total: int = 0
    runs: deque[Run] = field(default_factory=lambda: deque(maxlen=RUNS_KEPT))
    runs_total: int = 0
    checkpoints: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=CHECKPOINTS_KEPT))
    checkpoints_total: int = 0
    rejected: int = 0
    failed_reason: str = ""


@dataclass(slots=True)
class Preemption:
    t: float
    job: str
    tenant: str
    epoch: int
    victim_of: str
    reason: str
    preemptor: str  # a job id, or "" when a cluster event asked (reclaim, node loss, drain, cancel)
    lost_s: float
    gpus: int
    checkpoint: bool
    deadline_s: float
    candidates: list[dict[str, Any]]
    realized_gpu_s: float | None = None  # what the run lost in fact, once it ended
    preemptor_tenant: str = ""  # as submitted, kept here: the preemptor's job may be forgotten first


class Grid:
    """Amounts (GPU-seconds) on fixed slots from ``t0``; a slot's width doubles (pairs merged) when an
    amount lands beyond the last, so its size is fixed however long the log."""

    __slots__ = ("t0", "width", "slots")

    def __init__(self, t0: float, width: float = 1.0) -> None:
        self.t0, self.width = t0, width
        self.slots = [0.0] * GRID_SLOTS

    def add(self, a: float, b: float, amount: float) -> None:
        if amount == 0:
            return
        a = max(a, self.t0)
        b = max(b, a)
        while b > self.t0 + self.width * GRID_SLOTS:
            s = self.slots
            self.slots = [s[2 * i] + s[2 * i + 1] for i in range(GRID_SLOTS // 2)] + [0.0] * (GRID_SLOTS // 2)
            self.width *= 2
        w = self.width
        if b <= a:
            self.slots[min(GRID_SLOTS - 1, int((a - self.t0) / w))] += amount
            return
        rate = amount / (b - a)
        i = min(GRID_SLOTS - 1, int((a - self.t0) / w))
        while i < GRID_SLOTS:
            lo, hi = self.t0 + i * w, self.t0 + (i + 1) * w
            ov = min(hi, b) - max(lo, a)
            if ov > 0:
                self.slots[i] += rate * ov
            if hi >= b:
                break
            i += 1

    def copy(self) -> Grid:
        g = Grid(self.t0, self.width)
        g.slots = list(self.slots)
        return g

    def into(self, out: list[float], t0: float, width: float) -> None:
        """Spread every slot (uniformly within it) onto the buckets ``out`` of ``width`` from ``t0``."""
        w = self.width
        end = t0 + len(out) * width  # now: the slot holding it has nothing after it
        for i, amount in enumerate(self.slots):
            if amount == 0:
                continue
            lo, hi = self.t0 + i * w, self.t0 + (i + 1) * w
            _spread(out, t0, width, lo, max(lo, min(hi, end)), amount)


def _spread(arr: list[float], t0: float, width: float, a: float, b: float, amount: float) -> None:
    """Add ``amount`` spread uniformly over [a, b) to the buckets of ``arr`` (``width`` each from ``t0``)."""
    n = len(arr)
    t1 = t0 + n * width
    if amount == 0:
        return
    if b <= a:
        if t0 <= a < t1:
            arr[min(n - 1, int((a - t0) / width))] += amount
        return
    rate = amount / (b - a)
    a2, b2 = max(a, t0), min(b, t1)
    if b2 <= a2:
        return
    i = min(n - 1, int((a2 - t0) / width))
    while i < n:
        lo, hi = t0 + i * width, t0 + (i + 1) * width
        ov = min(hi, b2) - max(lo, a2)
        if ov > 0:
            arr[i] += rate * ov
        if hi >= b2:
            break
        i += 1


def _reason_of(rec: dict[str, Any]) -> tuple[str, str]:
    """(reason, preemptor) of a preempt_requested record, new keys first, else derived from victim_of."""
    victim_of = str(rec.get("victim_of", ""))
    reason = rec.get("reason")
    preemptor = rec.get("preemptor")
    if not isinstance(reason, str) or not reason:
        reason = victim_of if victim_of in PRIORITY_VICTIM_OF else ("priority" if victim_of else "unknown")
    if "preemptor" in rec:  # a newer record says it: a job id, or null when no job asked
        preemptor = preemptor if isinstance(preemptor, str) else ""
    else:  # an older one: victim_of is the job it makes room for, or what asked
        preemptor = "" if victim_of in PRIORITY_VICTIM_OF else victim_of
    return reason, preemptor


def _num(x: Any, default: float = 0.0) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return default
    return v if math.isfinite(v) else default


def _zero() -> dict[str, float]:
    return dict.fromkeys(("allocated", *CAUSES), 0.0)


class Timeline:
    """An incremental replay of one event log (records applied in order, as the checker does), in
    memory bounded however long the log (the module's docstring says what is kept)."""

    def __init__(self, capacity: dict[str, int] | None = None, pool_kinds: dict[str, str] | None = None) -> None:
        self.capacity: dict[str, int] = dict(capacity or {})
        self.inferred = capacity is None  # node sizes guessed from what ran on them
        self.pool_kinds = dict(pool_kinds or {})
        self.jobs: dict[str, JobInfo] = {}
        self.owner: dict[str, str] = {}  # job -> tenant, as submitted (jobs kept only)
        self.ended: OrderedDict[str, None] = OrderedDict()  # kept ended jobs, oldest first
        self.states: dict[str, int] = {}  # jobs by state, every job the log named (forgotten ones too)
        self.active: dict[str, Run] = {}  # job -> its run not yet released
        self.runs_total = 0
        self.closed = _zero()  # released runs' GPU-seconds by cause, summed
        self.closed_untimed = 0.0  # GPU-seconds of released runs that never reported trained_s
        self.closed_tenants: dict[str, dict[str, float]] = {}
        self.preemptions: deque[Preemption] = deque(maxlen=PREEMPTIONS_KEPT)
        self.preemptions_total = 0
        # tenant -> its newest preemptions where its job was the victim or the preemptor, and how many:
        # a tenant's view reads its own, not every preemption of the cluster on every poll
        self.preemptions_of: dict[str, deque[Preemption]] = {}
        self.preemptions_of_total: dict[str, int] = {}
        self.node_health: dict[str, str] = {}  # absent: up
        self.node_notice: dict[str, float] = {}
        self.node_lost_at: dict[str, float] = {}  # nodes down now -> since when
        self.down_gpu_s = 0.0  # GPU-seconds of capacity lost while nodes were down (spans now closed)
        self.alloc: dict[str, dict[str, int]] = {}  # node -> job -> GPUs bound
        self.reservation: dict[str, Any] | None = None
        self.t0 = math.inf
        self.t1 = -math.inf
        self.count = 0
        self.grid_alloc: Grid | None = None  # released runs' allocation over time
        self.grid_useful: Grid | None = None  # kept work over time
        self.grid_down: Grid | None = None  # capacity lost to down nodes (closed spans)

    # ------------------------------------------------------------------ replay

    def feed(self, records: Iterable[dict[str, Any]]) -> None:
        for rec in records:
            try:
                self._apply(rec)
            except (TypeError, ValueError, KeyError, AttributeError, OverflowError):
                # a record of a shape this reader does not know (or ``int(Infinity)``, which Python's JSON
                # reads): skipped, the rest still counts
                continue
            self.count += 1

    def _job(self, jid: str) -> JobInfo:
        j = self.jobs.get(jid)
        if j is None:
            j = self.jobs[jid] = JobInfo(jid)
            self.states[j.state] = self.states.get(j.state, 0) + 1
        return j

    def _state(self, j: JobInfo, state: str, substate: str) -> None:
        if state != j.state:
            self.states[j.state] = self.states.get(j.state, 0) - 1
            self.states[state] = self.states.get(state, 0) + 1
        j.state, j.substate = state, substate
        if state in ("finished", "failed", "cancelled"):
            self.ended[j.id] = None
            self.ended.move_to_end(j.id)
            self._forget()

    def _forget(self) -> None:
        """Drop the oldest ended jobs beyond ``JOBS_ENDED_KEPT`` (a job with a run still holding GPUs stays
        until it is released)."""
        tries = len(self.ended)
        while len(self.ended) > JOBS_ENDED_KEPT and tries > 0:
            tries -= 1
            jid = next(iter(self.ended))
            if jid in self.active:
                self.ended.move_to_end(jid)
                continue
            del self.ended[jid]
            self.jobs.pop(jid, None)
            self.owner.pop(jid, None)

    def _grids(self, t: float) -> tuple[Grid, Grid, Grid]:
        if self.grid_alloc is None or self.grid_useful is None or self.grid_down is None:
            self.grid_alloc, self.grid_useful, self.grid_down = Grid(t), Grid(t), Grid(t)
        return self.grid_alloc, self.grid_useful, self.grid_down

    def _apply(self, rec: dict[str, Any]) -> None:
        t = _num(rec.get("t"))
        self.t0, self.t1 = min(self.t0, t), max(self.t1, t)
        self._grids(t)
        kind = rec.get("event")
        if "node" in rec and "job" not in rec:
            self._node_event(kind, str(rec["node"]), t, rec)
            return
        jid = rec.get("job")
        if not isinstance(jid, str):
            return
        if kind == "reserved":
            self.reservation = {
                "job": jid,
                "t": _num(rec.get("reserved_t"), math.inf),
                "nodes": [str(n) for n in rec.get("nodes") or []],
                "pool": str(rec.get("pool", "")) or None,
                "at": t,
            }
            return
        if kind == "started" and not isinstance(rec.get("nodes"), list):
            raise ValueError(f"job {jid!r}: started without a list of nodes")
        j = self._job(jid)
        j.records.append(rec)
        j.records_total += 1
        if kind == "submitted":
            j.tenant = self.owner[jid] = str(rec.get("tenant", ""))
            j.priority = int(rec.get("priority", 0))
            j.nodes = int(rec.get("nodes", 0))
            j.gpus_per_node = int(rec.get("gpus_per_node", 0))
            j.submit_s = _num(rec.get("submit_s"), t)
            if rec.get("limit_s") is not None:
                j.limit_s = _num(rec.get("limit_s"))
            self._state(j, "pending", "queued")
        elif kind == "started":
            nodes = tuple(str(n) for n in rec["nodes"])
            gpn = int(rec.get("gpus_per_node", j.gpus_per_node or 1))
            run = Run(
                job=jid,
                tenant=j.tenant,
                epoch=int(rec.get("epoch", j.runs_total + 1)),
                pool=str(rec.get("pool", "")),
                nodes=nodes,
                gpus_per_node=gpn,
                start=t,
                resume_from=_num(rec.get("resume_from_s")),
            )
            self._grids(t)
            j.runs.append(run)
            j.runs_total += 1
            self.runs_total += 1
            self.active[jid] = run
            for n in nodes:
                held = self.alloc.setdefault(n, {})
                held[jid] = held.get(jid, 0) + gpn
                if self.inferred:
                    self.capacity[n] = max(self.capacity.get(n, 0), sum(held.values()))
            self._state(j, "running", "running")
            if self.reservation is not None and self.reservation["job"] == jid:
                self.reservation = None
        elif kind == "checkpoint_committed":
            progress = _num(rec.get("progress_s"))
            j.checkpoints.append({"t": rec.get("t"), "epoch": rec.get("epoch"), "progress_s": rec.get("progress_s")})
            j.checkpoints_total += 1
            run = self.active.get(jid)
            if run is not None:
                trained = _num(rec["trained_s"], -1.0) if "trained_s" in rec else -1.0
                stall = _num(rec["stall_s"], 0.0) if "stall_s" in rec else 0.0
                write = _num(rec["write_s"], 0.0) if "write_s" in rec else 0.0
                a, b, gain = run.commit(t, progress, trained if trained >= 0 else None, max(0.0, stall), write)
                self._grids(t)[1].add(a, b, gain)
        elif kind == "commit_rejected":
            j.rejected += 1
        elif kind == "preempt_requested":
            run = self.active.get(jid)
            reason, preemptor = _reason_of(rec)
            p = Preemption(
                t=t,
                job=jid,
                tenant=j.tenant,
                epoch=int(rec.get("epoch", run.epoch if run else 0)),
                victim_of=str(rec.get("victim_of", "")),
                reason=reason,
                preemptor=preemptor,
                lost_s=_num(rec.get("lost_s")),
                gpus=run.gpus if run else j.nodes * j.gpus_per_node,
                checkpoint=bool(rec.get("checkpoint", False)),
                deadline_s=_num(rec.get("deadline_s"), math.inf),
                candidates=[c for c in rec.get("candidates") or [] if isinstance(c, dict)][:64],
                preemptor_tenant=self.owner.get(preemptor, "") if preemptor else "",
            )
            self.preemptions.append(p)
            self.preemptions_total += 1
            for tn in {j.tenant, p.preemptor_tenant} - {""}:
                self.preemptions_of.setdefault(tn, deque(maxlen=PREEMPTIONS_KEPT)).append(p)
                self.preemptions_of_total[tn] = self.preemptions_of_total.get(tn, 0) + 1
            if run is not None and run.preempt_t is None:
                run.preempt_t = t
                run.preemption = p
            self._state(j, "preempting", "checkpointing" if p.checkpoint else "stopping")
        elif kind == "exited":
            run = self.active.get(jid)
            if run is not None:
                run.exit_t, run.status = t, str(rec.get("status", ""))
        elif kind == "released":
            run = self.active.pop(jid, None)
            if run is not None:
                self._close(run, t)
            if j.state in ("running", "preempting"):
                self._state(j, "pending", "released")
            self._forget()
        elif kind == "requeued":
            self._state(j, "pending", "backoff" if rec.get("reason") == "failure" else "queued")
        elif kind == "resized":
            j.nodes = int(rec.get("nodes", j.nodes))
            j.gpus_per_node = int(rec.get("gpus_per_node", j.gpus_per_node))
        elif kind in ("finished", "failed", "cancelled"):
            if kind == "failed":
                j.failed_reason = str(rec.get("reason", ""))
            self._state(j, kind, kind)

    def _close(self, run: Run, t: float) -> None:
        """A run released: its GPUs freed, its account final and folded into the sums and the grid."""
        jid = run.job
        run.release_t = t
        if run.exit_t is None:  # released at the decision (a baseline): its exit comes later, if logged
            run.exit_t = t
        for n in run.nodes:
            held = self.alloc.get(n)
            if held is not None:
                left = held.get(jid, 0) - run.gpus_per_node
                if left > 0:
                    held[jid] = left
                else:
                    held.pop(jid, None)
        acct = run.account(t)
        if run.preemption is not None:
            # what the victim held and did not keep (its notice's draining aside): the part its reports
            # cannot tell from a restart too, since that was lost with it; its own stalls left out, or a
            # victim's report would decide what the preemptor is charged
            bare = run.account(t, stalls=False)
            run.preemption.realized_gpu_s = bare["lost_preemption"] + bare["lost_failure"] + bare["unattributed"]
        if run.ready_t is None:
            self.closed_untimed += acct["allocated"]
        acc = self.closed_tenants.setdefault(run.tenant, _zero())
        for k, v in acct.items():
            self.closed[k] += v
            acc[k] += v
        g_alloc, g_useful, _ = self._grids(run.start)
        g_alloc.add(run.start, t, acct["allocated"])
        more = acct["useful"] - run.useful_added  # a finish keeps the work after the last commit
        if more > 0:
            a = run.last_commit[0] if run.last_commit else (run.ready_t if run.ready_t is not None else run.start)
            g_useful.add(a, run.preempt_t if run.preempt_t is not None else (run.exit_t or t), more)
            run.useful_added += more

    def _node_event(self, kind: Any, node: str, t: float, rec: dict[str, Any]) -> None:
        if kind == "node_lost":
            self.node_health[node] = "lost"
            self.node_notice.pop(node, None)
            self.node_lost_at.setdefault(node, t)
        elif kind == "node_reclaim_notice":
            if self.node_health.get(node) != "lost":
                self.node_health[node] = "reclaiming"
            self.node_notice[node] = _num(rec.get("deadline_s"), t)
        elif kind == "node_up":
            self.node_health.pop(node, None)
            self.node_notice.pop(node, None)
            since = self.node_lost_at.pop(node, None)
            if since is not None and t > since:
                g = self.capacity.get(node, 0)
                self.down_gpu_s += g * (t - since)
                self._grids(since)[2].add(since, t, g * (t - since))

    # ------------------------------------------------------------------ summaries

    def ledger(self, now: float, weights: dict[str, float] | None = None) -> dict[str, Any]:
        """GPU-hours by cause for the cluster and per tenant, with each tenant's entitlement."""
        total = {k: v / 3600.0 for k, v in self.closed.items()}
        tenants = {n: {k: v / 3600.0 for k, v in acc.items()} for n, acc in self.closed_tenants.items()}
        untimed = self.closed_untimed
        for run in self.active.values():
            a = run.account(now)
            acc = tenants.setdefault(run.tenant, dict.fromkeys(("allocated", *CAUSES), 0.0))
            for k, v in a.items():
                total[k] += v / 3600.0
                acc[k] += v / 3600.0
            if run.ready_t is None:
                untimed += a["allocated"]
        capacity = self.capacity_gpu_s(self.t0 if math.isfinite(self.t0) else now, now) / 3600.0
        total["idle"] = max(0.0, capacity - total["allocated"])
        names = set(tenants) | {j.tenant for j in self.jobs.values() if j.tenant}
        w = {n: (weights or {}).get(n, 1.0) for n in names}
        wsum = sum(w.values()) or 1.0
        for n in names:
            tenants.setdefault(n, dict.fromkeys(("allocated", *CAUSES), 0.0))["entitled"] = capacity * w[n] / wsum
        # the GPU-hours of runs that never reported when their resume was done (older jobs, runs that ended
        # before their first commit): their restart is unattributed, their stalls inside their useful work
        return {"capacity_gpu_h": capacity, "total": total, "tenants": tenants, "untimed_gpu_h": untimed / 3600.0}

    def capacity_gpu_s(self, t0: float, t1: float) -> float:
        """Capacity from ``t0`` (the log's start) to ``t1``: every node's GPUs, less the time nodes were down."""
        total = sum(self.capacity.values()) * max(0.0, t1 - t0) - self.down_gpu_s
        for node, since in self.node_lost_at.items():
            total -= self.capacity.get(node, 0) * max(0.0, t1 - max(since, t0))
        return max(0.0, total)

    def series(self, now: float, buckets: int = 240) -> dict[str, Any]:
        """Average GPUs per time bucket: capacity, allocated, useful, and goodput (useful / allocated)."""
        t0 = self.t0 if math.isfinite(self.t0) else now
        t1 = max(now, t0 + 1.0)
        n = max(1, buckets)
        width = (t1 - t0) / n
        cap = [sum(self.capacity.values()) * width] * n
        alloc = [0.0] * n
        useful = [0.0] * n
        down = [0.0] * n
        if self.grid_alloc is not None and self.grid_useful is not None and self.grid_down is not None:
            # what is still going goes on copies of the same grid as what has ended: were it spread exactly
            # while an ended run is spread over its whole slot, a run started in the slot another ended in
            # would show both at once (more GPUs allocated than exist)
            g_alloc, g_down = self.grid_alloc.copy(), self.grid_down.copy()
            for run in self.active.values():
                g_alloc.add(run.start, now, run.gpus * max(0.0, now - run.start))
            for node, since in self.node_lost_at.items():
                g_down.add(since, t1, self.capacity.get(node, 0) * max(0.0, t1 - max(since, t0)))
            g_alloc.into(alloc, t0, width)
            self.grid_useful.into(useful, t0, width)
            g_down.into(down, t0, width)
        ts = [t0 + (i + 0.5) * width for i in range(n)]
        a_g = [x / width for x in alloc]
        u_g = [min(x / width, y) for x, y in zip(useful, a_g)]
        return {
            "t": ts,
            "width_s": width,
            "capacity": [max(0.0, (c - d) / width) for c, d in zip(cap, down)],
            "allocated": a_g,
            "useful": u_g,
            "goodput": [u / a if a > 1e-9 else None for u, a in zip(u_g, a_g)],
        }


__all__ = ["CAUSES", "JobInfo", "Preemption", "Run", "Timeline"]
