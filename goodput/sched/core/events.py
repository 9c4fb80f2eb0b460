"""The event log: one JSON object per line, the schema docs/SCHED.md fixes for outside tools.

Every record has ``t`` (seconds on the scheduler's clock), ``event``, and ``job`` (or ``node`` for
node events). The simulator and a live service write the same records; the checker
(:mod:`goodput.sched.sim.checker`) reads nothing else.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

SUBMITTED = "submitted"  # + tenant, priority, nodes, gpus_per_node, submit_s, limit_s
STARTED = "started"  # + pool, nodes (names), resume_from_s, epoch, gpus_per_node, backfill (true when backfilled)
# + reason, preemptor (job id or null), victim_of (kept), lost_s, deadline_s, checkpoint (bool), candidates
PREEMPT_REQUESTED = "preempt_requested"
CHECKPOINT_COMMITTED = "checkpoint_committed"  # + progress_s, epoch; trained_s, stall_s, write_s when reported
EXITED = "exited"  # + status ("finished" | "preempted" | "failed" | "killed" | "lost"), epoch
RELEASED = "released"  # + nodes, gpus: the job's GPUs are free for others
REQUEUED = "requeued"  # + reason (preempted | infrastructure | failure), resume_from_s, eligible_s (not before)
FINISHED = "finished"
FAILED = "failed"  # + failures, reason (failure | time_limit | infrastructure | unasked_yields)
NODE_LOST = "node_lost"  # node events carry ``node`` instead of ``job``
# beyond the contract's list, in the same shape (outside tools ignore what they do not know)
CANCELLED = "cancelled"
COMMIT_REJECTED = "commit_rejected"  # + epoch, reason: a stale or foreign report
NODE_RECLAIM_NOTICE = "node_reclaim_notice"  # + deadline_s
NODE_UP = "node_up"
RESIZED = "resized"  # + nodes, gpus_per_node: a pending job's gang shape for its next run
RESERVED = "reserved"  # + reserved_t, pool, nodes: the head's reservation, whenever it is set or moves

CONTRACT = frozenset(
    {
        SUBMITTED,
        STARTED,
        PREEMPT_REQUESTED,
        CHECKPOINT_COMMITTED,
        EXITED,
        RELEASED,
        REQUEUED,
        FINISHED,
        FAILED,
        NODE_LOST,
    }
)
REQUEUE_REASONS = frozenset({"preempted", "infrastructure", "failure"})


class EventLog:
    """An append-only list of records; a store or a file may mirror it."""

    __slots__ = ("records", "_sink")

    def __init__(self, sink: IO[str] | None = None) -> None:
        self.records: list[dict[str, Any]] = []
        self._sink = sink

    def emit(self, t: float, event: str, **fields: Any) -> dict[str, Any]:
        rec = {"t": t, "event": event, **fields}
        self.records.append(rec)
        if self._sink is not None:
            self._sink.write(json.dumps(rec, separators=(",", ":")) + "\n")
        return rec

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.records)


def write_jsonl(records: Iterable[dict[str, Any]], path: str | Path) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for rec in records:
            f.write(json.dumps(rec, separators=(",", ":")) + "\n")


def iter_jsonl(path: str | Path) -> Iterator[dict[str, Any]]:
    """Records of an event log as they are read (a long log is never held whole); a line that is not
    a JSON object is an error naming the line."""
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{i}: not JSON ({e.msg})") from None
            if not isinstance(rec, dict) or "t" not in rec or "event" not in rec:
                raise ValueError(f"{path}:{i}: an event needs an object with 't' and 'event'")
            yield rec


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Records of an event log, all of them."""
    return list(iter_jsonl(path))
