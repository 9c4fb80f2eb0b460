"""A run's commit reports are a tenant's numbers: a real service bounds them before they reach the
scheduler's books or anyone's dashboard (docs/PROTOCOL.md, docs/DASHBOARD.md)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from goodput.sched.core.model import Job
from goodput.sched.live.store import _JOBS, encode_job

from . import test_service
from .test_service import Server, _run_record

server = test_service.server  # the fixture: its servers stopped and their jobs killed after the test

SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]


def _submit(s: Server, tok: str, root: Path, name: str) -> str:
    body = {"name": name, "command": SLEEPER, "nodes": 1, "gpus_per_node": 1, "limit_s": 600}
    code, ans = s.post("/jobs", {**body, "ckpt_root": str(root), "grace_s": 5}, tok)
    assert code == 201, ans
    return ans["id"]


def test_a_jobs_reports_cannot_claim_more_work_than_its_run_had_time_for(server, tmp_path: Path) -> None:
    s: Server = server(nodes=2).start()
    alice, bob = s.token("alice"), s.token("bob")
    ja, jb = _submit(s, alice, tmp_path / "a", "a"), _submit(s, bob, tmp_path / "b", "b")
    for jid, tok in ((ja, alice), (jb, bob)):
        s.wait_job(jid, tok, lambda j: j["state"] == "running")
    run_tok = (Path(_run_record(tmp_path, ja, 1)["workdir"]) / "token").read_text()
    now = time.time()
    # progress beyond its resume point (0) plus the seconds it has run: rejected with a reason, nothing kept
    code, ans = s.post(f"/jobs/{ja}/commits", {"epoch": 1, "progress_s": 1e10, "time": now}, run_tok)
    assert code == 409 and not ans["accepted"] and "beyond the run's resume point" in ans["reason"], ans
    assert s.get(f"/jobs/{ja}", alice)[1]["checkpoint"]["committed_s"] == 0.0
    # a boolean is no time: pydantic's lax mode read true as 1.0
    for field in ("ready_time", "stall_s", "write_s", "progress_s", "time"):
        body = {"epoch": 1, "progress_s": 0.0, "time": now, field: True}
        code, err = s.post(f"/jobs/{ja}/commits", body, run_tok)
        assert code == 422 and any(field in d["loc"] for d in err["detail"]), (field, err)
    # a resume done after the report's own time is no timing (it made training into restart)
    code, ans = s.post(
        f"/jobs/{ja}/commits", {"epoch": 1, "progress_s": 0.0, "time": now, "ready_time": now + 1e6}, run_tok
    )
    assert code == 200 and ans["accepted"], ans
    code, events = s.get("/events", s._admin)
    commits = [r for r in map(json.loads, events.splitlines()) if r["event"] == "checkpoint_committed"]
    assert len(commits) == 1 and "trained_s" not in commits[0], commits
    rejected = [r for r in map(json.loads, events.splitlines()) if r["event"] == "commit_rejected"]
    assert rejected and "beyond" in rejected[0]["reason"], rejected
    # neither tenant's series shows work nobody committed (it read ~1.98 of 2 GPUs useful)
    for tok in (s._admin, alice, bob):
        code, o = s.get("/ui/api/overview", tok)
        assert code == 200, o
        assert max(o["series"]["useful"] or [0.0]) < 0.05, o["series"]["useful"]


def test_a_job_stored_before_resume_from_s_still_loads() -> None:
    """An old store's job row has no ``resume_from_s``: it decodes with -1 (unknown), which the core
    reads as its committed_s (a looser bound, never a rejection of honest work)."""
    body = json.loads(encode_job(Job("j", "alice", 0, 1, 1, 0.0, committed_s=42.0)))
    del body["resume_from_s"]
    job = _JOBS.decode("j", json.dumps(body))
    assert job.resume_from_s == -1.0 and job.committed_s == 42.0
