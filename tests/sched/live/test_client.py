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


def test_a_commit_reports_its_timing_and_a_skipped_save_reports_nothing() -> None:
    """The report carries ready_time (the reporter's creation, after restore), stall_s and write_s for
    the dashboard's ledger (docs/PROTOCOL.md); a CommitEvent of kind "skipped" committed nothing and was
    once posted as a commit, moving the job's resume point to a checkpoint that does not exist."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from goodput.ckpt.checkpointer import CommitEvent

    bodies: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"accepted": true}')

        def log_message(self, *args: object) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        r = CommitReporter(url=f"http://127.0.0.1:{srv.server_port}", token="t", job_id="j", epoch=2, t0=1000.0)
        common = dict(path="/ckpt/step_000000010", bytes=1, total_s=3.0, rank=0, preempted=False)
        r(CommitEvent(step=10, time=1010.0, stall_s=0.0, write_s=0.0, kind="skipped", **common))
        assert bodies == []
        r(CommitEvent(step=10, time=1060.0, stall_s=0.25, write_s=2.5, **common))
        (body,) = bodies
        assert body["ready_time"] == 1000.0 and body["stall_s"] == 0.25 and body["write_s"] == 2.5
        assert body["progress_s"] == 57.0 and body["epoch"] == 2
    finally:
        srv.shutdown()
        srv.server_close()
