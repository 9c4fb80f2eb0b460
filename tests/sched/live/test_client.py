"""The commit reporter's arithmetic: progress in seconds of work, never backwards within a tier."""

from __future__ import annotations

from goodput.sched.live.client import CommitReporter


def test_a_late_durable_commit_reports_its_own_snapshot_not_the_newer_fast_one() -> None:
    r = CommitReporter(url="http://127.0.0.1:1", token="t", job_id="j", epoch=1, resume_from_s=100.0, t0=0.0)
    assert r.progress_at(10.0, "fast") == 110.0  # step N on the fast tier
    assert r.progress_at(20.0, "fast") == 120.0  # step N + 1 on the fast tier
    assert r.progress_at(10.0, "durable") == 110.0  # step N drained afterwards: its own progress
    assert r.progress_at(5.0, "durable") == 110.0  # and never backwards
    assert r.progress_at(15.0, "fast") == 120.0
