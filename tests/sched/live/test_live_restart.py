"""The live service's remaining crash-safety gaps, on real processes: a real ``goodput sched serve``
subprocess (SIGKILLed and restarted on the same store), real job processes, SQLite in the test's
directory and, where the server binaries exist, a throwaway PostgreSQL.

- idempotency keys: a retried POST /jobs with the same ``key`` answers the same job id, before and
  after a SIGKILL of the service (the key is stored in the submission's own transaction);
- the last accepted commit report is stored with the job: a restarted service still shows it;
- cancelling a running multi-worker torchrun job ends in ``cancelled``, never ``failed``.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from .test_service import PY, _restart, _run_record, _spec, db, server  # noqa: F401 - fixtures

REPORT_ONCE = (  # progress within the 1 s every report may run ahead of the run's time (docs/PROTOCOL.md)
    "import os, pathlib, time\n"
    "from goodput.sched.live.client import CommitReporter\n"
    "r = CommitReporter.from_env()\n"
    "root = pathlib.Path(os.environ['GOODPUT_CKPT_ROOT'])\n"
    "ans = r.report(step=7, time_s=1234.5, path=str(root / 'step_000000007'), progress_s=0.75)\n"
    "(root / 'reported').write_text(repr(ans))\n"
    "time.sleep(300)\n"
)


def test_a_retried_submission_with_its_key_answers_the_same_id_across_a_sigkill(server, tmp_path, db):  # noqa: F811
    s = server(db=db)
    alice, bob = s.token("alice"), s.token("bob")
    s.start()
    spec = _spec(tmp_path / "k", 5, name="keyed", key="client-1:0001", priority=-5)
    s.post("/nodes/local-00000/drain?grace_s=0", {}, s.token("ops", "--admin"))  # nothing starts: pure queueing
    code, first = s.post("/jobs", spec, alice)
    assert code == 201, first
    code, again = s.post("/jobs", spec, alice)
    assert code == 200 and again["id"] == first["id"] and again["replayed"] is True, again
    code, err = s.post("/jobs", {**spec, "priority": 3}, alice)  # the same key with another spec: refused
    assert code == 409 and first["id"] in err["detail"], err
    code, bobs = s.post("/jobs", spec, bob)  # keys are per tenant
    assert code == 201 and bobs["id"] != first["id"]
    code, bad = s.post("/jobs", {**spec, "key": "no spaces"}, alice)
    assert code == 422 and any("key" in d["loc"] for d in bad["detail"]), bad
    s.kill9()
    s2 = _restart(server, s)
    code, after = s2.post("/jobs", spec, alice)
    assert code == 200 and after["id"] == first["id"], after  # the stored key, not a second job
    jobs = s2.get("/jobs?name=keyed", alice)[1]["jobs"]
    assert [(j["id"], j["key"]) for j in jobs] == [(first["id"], "client-1:0001")]
    code, fresh = s2.post("/jobs", {**spec, "key": "client-1:0002"}, alice)
    assert code == 201 and fresh["id"] != first["id"]
    events = [json.loads(x) for x in s2.get("/events", alice)[1].splitlines()]
    assert [e["job"] for e in events if e["event"] == "submitted"] == [first["id"], fresh["id"]]


def test_the_last_commit_report_survives_a_service_sigkill(server, tmp_path, db):  # noqa: F811
    s = server(db=db)
    tok = s.token("alice")
    s.start()
    root = tmp_path / "c"
    _, ans = s.post("/jobs", _spec(root, 0, name="rep", command=[PY, "-c", REPORT_ONCE], grace_s=2), tok)
    jid = ans["id"]
    j = s.wait_job(jid, tok, lambda j: (root / "reported").exists() and j["checkpoint"]["last_report"] is not None)
    report = j["checkpoint"]["last_report"]
    want = {"epoch": 1, "step": 7, "time": 1234.5, "path": str(root / "step_000000007"), "progress_s": 0.75}
    want["tier"] = "durable"  # the reporter says which tier committed (an untiered Checkpointer: durable)
    # the reporter's optional timings (ready_time; stall_s, write_s: null from a bare report) ride along
    assert {k: report[k] for k in want} == want and set(report) - set(want) <= {"ready_time", "stall_s", "write_s"}
    assert j["checkpoint"]["committed_s"] == 0.75
    s.kill9()
    s2 = _restart(server, s)
    assert s2.health["adopted"] == {jid: "adopted"}
    j2 = s2.get(f"/jobs/{jid}", tok)[1]
    assert j2["state"] == "running" and j2["checkpoint"]["last_report"] == report  # from the store, not memory
    assert j2["checkpoint"]["committed_s"] == 0.75
    assert s2.post(f"/jobs/{jid}/cancel", {}, tok)[0] == 200
    s2.wait_job(jid, tok, lambda j: j["state"] == "cancelled", timeout=30)


@pytest.mark.skipif(
    importlib.util.find_spec("torch.distributed.run") is None, reason="torchrun (torch.distributed.run) unavailable"
)
def test_cancelling_a_running_torchrun_job_ends_cancelled_not_failed(server, tmp_path):  # noqa: F811
    from goodput.sched.sim.checker import check

    s = server(nodes=2)
    tok = s.token("alice")
    s.start()
    root = tmp_path / "dist"
    cmd = [PY, "-m", "torch.distributed.run", "-m", "goodput.demo.example_dist_job"]
    cmd += ["--steps", "100000", "--step-s", "0.05", "--interval", "4"]
    _, ans = s.post("/jobs", _spec(root, 0, name="dist", command=cmd, nodes=2, grace_s=30), tok)
    jid = ans["id"]
    s.wait_job(jid, tok, lambda j: j["state"] == "running" and j["checkpoint"]["committed_s"] > 0, timeout=120)
    rec = _run_record(tmp_path, jid, 1)
    code, out = s.post(f"/jobs/{jid}/cancel", {}, tok)
    assert code == 200 and out["state"] == "preempting", out
    j = s.wait_job(jid, tok, lambda j: j["state"] in ("cancelled", "failed", "finished", "pending"), timeout=60)
    log = Path(rec["log"]).read_text(errors="replace")[-3000:]
    assert j["state"] == "cancelled", (j["state"], log)
    assert j["failures"] == 0 and j["epoch"] == 1
    ev = [h["event"] for h in j["history"]]
    assert "failed" not in ev and ev.count("cancelled") == 1, ev
    assert ev.index("preempt_requested") < ev.index("exited") < ev.index("released") < ev.index("cancelled")
    exited = [h["status"] for h in j["history"] if h["event"] == "exited"]
    assert exited == ["preempted"], (exited, log)  # the workers checkpointed and left with 75
    recs = [json.loads(x) for x in s.get("/events", tok)[1].splitlines()]
    assert [r["event"] for r in recs if r.get("job") == jid][-1] == "cancelled"
    assert check(recs, {"local-00000": 1, "local-00001": 1}).total == 0
