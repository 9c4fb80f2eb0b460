"""The job side of the protocol: report each committed checkpoint to the service.

::

    ck = Checkpointer(os.environ["GOODPUT_CKPT_ROOT"], interval=50)
    step = ck.restore(state) or 0
    reporter = CommitReporter.from_env()      # None when not run by goodput.sched
    if reporter is not None:
        ck.add_listener(reporter)

Only the standard library is used (urllib), and goodput.ckpt never imports this module: the
dependency runs from the scheduler to the checkpointer, never back.

What ``progress_s`` means for a live job: **seconds of training work the committed checkpoint
holds**, i.e. the progress the run resumed from (``GOODPUT_RESUME_FROM_S``) plus the wall seconds
from this reporter's creation (make it right after ``restore``) to the moment the committed step
was snapshotted (``event.time - event.total_s``). Seconds, not steps, because the core compares
``committed_s`` with a job's declared ``limit_s`` (backfill trusts the remaining time) and prices a
victim's loss as seconds since its last commit: a step count would mix units. The step itself is
sent too and shown by the service. An estimate that is off costs only pricing, never correctness:
a job always resumes from what is on disk (``goodput.ckpt.latest(root)``).
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from .local import ENV_EPOCH, ENV_JOB_ID, ENV_RESUME, ENV_TOKEN, ENV_TOKEN_FILE, ENV_URL


class ReportError(RuntimeError):
    pass


def post_json(url: str, body: dict[str, Any], token: str, *, timeout_s: float = 10.0) -> tuple[int, Any]:
    """POST JSON with a bearer token; (status, decoded body) for any HTTP answer."""
    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw or b"null")
        except ValueError:
            return e.code, raw.decode(errors="replace")


@dataclass
class CommitReporter:
    """A Checkpointer listener that POSTs each commit (rank 0 only) to ``/jobs/{id}/commits``.

    A report that cannot reach the service is retried for ``retry_s`` (a service being restarted)
    and then dropped: the listener runs before the save's future resolves, so it must not hold a
    preemption exit for long, and nothing is lost on disk by dropping it.
    """

    url: str
    token: str
    job_id: str
    epoch: int
    resume_from_s: float = 0.0
    retry_s: float = 5.0
    timeout_s: float = 5.0
    t0: float = field(default_factory=time.time)
    last_progress_s: float = 0.0
    last_fast_progress_s: float = 0.0
    answers: list[tuple[int, Any]] = field(default_factory=list)

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, **kw: Any) -> CommitReporter | None:
        e = os.environ if env is None else env
        if not e.get(ENV_URL) or not e.get(ENV_JOB_ID):
            return None
        try:
            epoch = int(e.get(ENV_EPOCH, ""))
            resume = float(e.get(ENV_RESUME, "0") or 0)
        except ValueError as err:
            raise ReportError(f"{ENV_EPOCH}/{ENV_RESUME} are not numbers: {err}") from None
        token = e.get(ENV_TOKEN, "")
        if not token and e.get(ENV_TOKEN_FILE):
            # the run's token is a file only its user can read (never in the environment, where
            # /proc/PID/environ and every child process would see it)
            try:
                with open(e[ENV_TOKEN_FILE], encoding="ascii") as f:
                    token = f.read(512).strip()
            except (OSError, ValueError) as err:
                raise ReportError(f"cannot read the job token from {e[ENV_TOKEN_FILE]!r}: {err}") from None
        return cls(
            url=e[ENV_URL].rstrip("/"),
            token=token,
            job_id=e[ENV_JOB_ID],
            epoch=epoch,
            resume_from_s=resume,
            last_progress_s=resume,
            last_fast_progress_s=resume,
            **kw,
        )

    def progress_at(self, snapshot_time: float, tier: str = "durable") -> float:
        """Never backwards within a tier (the core rejects that). Per tier, because a tiered
        Checkpointer's durable commit of step N may come after its fast commit of step N + 1."""
        p = self.resume_from_s + max(0.0, snapshot_time - self.t0)
        if tier == "fast":
            self.last_fast_progress_s = max(self.last_fast_progress_s, p)
            return self.last_fast_progress_s
        self.last_progress_s = max(self.last_progress_s, p)
        return self.last_progress_s

    def __call__(self, event: Any) -> None:
        if getattr(event, "rank", 0) != 0:
            return
        if getattr(event, "kind", "commit") != "commit":
            return  # a due save skipped (a write in flight): nothing committed, nothing to report
        tier = getattr(event, "tier", "durable")
        self.report(
            step=event.step,
            time_s=event.time,
            path=str(event.path),
            progress_s=self.progress_at(event.time - getattr(event, "total_s", 0.0), tier),
            tier=tier,
            stall_s=getattr(event, "stall_s", None),
            write_s=getattr(event, "write_s", None),
        )

    def report(
        self,
        *,
        step: int | None,
        time_s: float,
        path: str,
        progress_s: float,
        tier: str = "durable",
        stall_s: float | None = None,
        write_s: float | None = None,
    ) -> tuple[int, Any]:
        # ready_time (this reporter's creation: right after restore, when training began), stall_s and
        # write_s let the service's ledger tell restart and checkpoint stall from work; a service that
        # predates them ignores them (its report model ignores unknown keys)
        body: dict[str, Any] = {
            "epoch": self.epoch,
            "step": step,
            "time": time_s,
            "path": path,
            "progress_s": progress_s,
            "tier": tier,
            "ready_time": self.t0,
        }
        if stall_s is not None:
            body["stall_s"] = stall_s
        if write_s is not None:
            body["write_s"] = write_s
        end = time.monotonic() + self.retry_s
        while True:
            try:
                ans = post_json(f"{self.url}/jobs/{self.job_id}/commits", body, self.token, timeout_s=self.timeout_s)
            except (urllib.error.URLError, OSError):
                if time.monotonic() >= end:
                    ans = (0, "service unreachable")
                    break
                time.sleep(0.2)
                continue
            break
        self.answers.append(ans)
        return ans
