"""The job state machine: every edge, its trigger, and why it exists. Anything else raises.

The edge most schedulers get wrong is ``preempting --gone--> pending``: a victim's GPUs are
released when it is OBSERVED gone (its processes exited, or its requested checkpoint committed and
it stopped, or its hard deadline passed and it was killed), never when the preemption is decided.
Until then the job is ``preempting`` and its GPUs are draining, counted against capacity, so no
node is ever promised twice (Kueue KEP-83 / kueue#10076 release at the decision and double-book).

A node that dies under a running job does not skip the drain: the gang's processes on the other
nodes still hold GPUs, so the job is preempted with a deadline of now (killed) and released when
its exit is observed, requeued as an infrastructure loss.

Guards that choose between edges of one trigger (retry budget left or not) are the caller's;
the table only says which moves are legal and why.
"""

from __future__ import annotations

from dataclasses import dataclass

from .model import Job, JobState

P, R, X = JobState.PENDING, JobState.RUNNING, JobState.PREEMPTING
F, FAIL, C = JobState.FINISHED, JobState.FAILED, JobState.CANCELLED


@dataclass(frozen=True)
class Edge:
    src: JobState
    trigger: str
    dst: JobState
    reason: str


EDGES: tuple[Edge, ...] = (
    Edge(P, "start", R, "a placement for the whole gang was found: every GPU bound at once, all or nothing"),
    Edge(R, "finish", F, "exit 0 observed: the work is done"),
    Edge(
        R,
        "fail_retry",
        P,
        "own non-zero exit with retry budget left: requeued behind a backoff, resumes from the last commit",
    ),
    Edge(R, "fail_final", FAIL, "own non-zero exit and the retry budget is spent"),
    Edge(
        R,
        "preempt",
        X,
        "asked to leave (priority, quota, move, reclaim, drain, node_loss, cancel, time_limit): its GPUs stay bound "
        "and draining until it is gone",
    ),
    Edge(
        R,
        "left",
        P,
        "exited 75 (checkpoint committed) unasked, e.g. a node-level notice reached it first: "
        "requeued as a preemption, the retry budget untouched (a budget of its own, max_unasked_yields)",
    ),
    Edge(
        R,
        "yield_final",
        FAIL,
        "exited 75 unasked with its budget (max_unasked_yields) spent: failed with reason unasked_yields, "
        "its committed checkpoint kept",
    ),
    Edge(
        R,
        "lost",
        P,
        "its processes vanished with no exit status and no kill of ours (their host or container went): "
        "released now that they are gone, requeued as an infrastructure loss behind a backoff (its own budget, "
        "max_infra_losses), the retry budget untouched",
    ),
    Edge(
        X,
        "gone",
        P,
        "observed gone (any exit but 0, or killed at its deadline): only now are its GPUs released; "
        "requeued with its original submit time; a non-zero exit here is the leaving, never a failure "
        "(after a node loss, a drain or a crash while leaving: behind a backoff, on the infrastructure budget)",
    ),
    Edge(
        X,
        "gone_cancelled",
        C,
        "a cancelled job observed gone: its GPUs are released and it never returns",
    ),
    Edge(
        X,
        "finish",
        F,
        "it finished its work while being asked to leave: done, not preempted",
    ),
    Edge(P, "cancel", C, "cancelled while queued: nothing to release"),
    Edge(
        X,
        "timeout",
        FAIL,
        "stopped at its time limit (its hold, restart_s on a rerun + limit_s - committed, + over_time_limit_s, "
        "then its grace) and observed gone: failed "
        "with reason time_limit (Slurm's TIMEOUT), its committed checkpoint kept",
    ),
    Edge(
        X,
        "unkillable",
        P,
        "killed, and no exit arrived within unkillable_s: its nodes are taken out (node_lost), its GPUs released, "
        "requeued as an infrastructure loss behind a backoff",
    ),
    Edge(
        R,
        "infra_final",
        FAIL,
        "vanished (lost) with its infrastructure budget (max_infra_losses) spent: failed with reason infrastructure",
    ),
    Edge(
        X,
        "infra_final",
        FAIL,
        "gone after a node loss, a drain or a crash while leaving, with its infrastructure budget spent: "
        "failed with reason infrastructure",
    ),
)

_TABLE: dict[tuple[JobState, str], Edge] = {(e.src, e.trigger): e for e in EDGES}
assert len(_TABLE) == len(EDGES), "one edge per (state, trigger)"


class IllegalTransition(RuntimeError):
    """A move the table does not hold: a bug in the caller, never something to retry."""


def edge(src: JobState, trigger: str) -> Edge:
    try:
        return _TABLE[(src, trigger)]
    except KeyError:
        raise IllegalTransition(f"no transition from {src.value!r} on {trigger!r}") from None


def apply(job: Job, trigger: str, substate: str = "") -> Edge:
    """Move ``job`` along the edge for ``trigger``; raise naming the job when there is none."""
    try:
        e = edge(job.state, trigger)
    except IllegalTransition as err:
        raise IllegalTransition(f"job {job.id!r}: {err}") from None
    job.state = e.dst
    job.substate = substate or e.dst.value
    return e


def table_markdown() -> str:
    """The table as docs/SCHED.md prints it (a test keeps the two equal)."""
    rows = ["| from | trigger | to | why |", "|---|---|---|---|"]
    rows += [f"| {e.src.value} | {e.trigger} | {e.dst.value} | {e.reason} |" for e in EDGES]
    return "\n".join(rows)
