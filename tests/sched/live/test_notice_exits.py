"""Through the live service: how a run that ends while asked to leave is accounted, and what a
submission's types must be.

A plain job (no checkpointing, no handler) that dies of the SIGTERM the service itself sent as its
preemption notice obeyed the stop: requeued at once as a preemption, no backoff, no leave crash (the
infrastructure budget). A job that dies of a SIGTERM nobody sent is the job's own failure."""

from __future__ import annotations

import signal
import sys
import time

from .test_service import _spec, server  # noqa: F401 - fixture

PY = sys.executable


def test_a_plain_job_dead_of_the_stop_notice_is_requeued_at_once_as_a_preemption(server, tmp_path):  # noqa: F811
    s = server(nodes=1)
    alice, bob = s.token("alice"), s.token("bob")
    s.start()
    body = _spec(tmp_path / "p", 1, name="plain", command=["sleep", "1000"], limit_s=3600, grace_s=30)
    code, plain = s.post("/jobs", {**body, "ckpt_interval_s": 0}, alice)
    assert code == 201, plain
    s.wait_job(plain["id"], alice, lambda j: j["state"] == "running")
    time.sleep(0.5)  # sleep is exec'd
    hi = _spec(tmp_path / "h", 1, name="hi", command=["sleep", "3"], priority=5, limit_s=60)
    code, high = s.post("/jobs", hi, bob)
    assert code == 201, high
    t0 = time.monotonic()
    j = s.wait_job(plain["id"], alice, lambda j: any(h["event"] == "requeued" for h in j["history"]), timeout=20)
    assert time.monotonic() - t0 < 15  # gone at the notice, not at the 30 s deadline
    exited = [h for h in j["history"] if h["event"] == "exited"]
    assert [h["status"] for h in exited] == ["killed"], j["history"]
    assert j["last_exit"]["signal"] == "SIGTERM" and j["last_exit"]["rc"] == -signal.SIGTERM
    assert j["preemptions"] == 1 and j["failures"] == 0 and j["infra_losses"] == 0 and j["leave_crashes"] == 0, j
    req = next(h for h in j["history"] if h["event"] == "requeued")
    assert req["reason"] == "preempted", req
    assert j["substate"] != "backoff", j["substate"]
    # no backoff: it runs again as soon as the 3 s job is done, well before the 60 s infrastructure delay
    s.wait_job(high["id"], bob, lambda j: j["state"] == "finished", timeout=30)
    j = s.wait_job(plain["id"], alice, lambda j: j["state"] == "running" and j["epoch"] == 2, timeout=20)
    assert s.post(f"/jobs/{plain['id']}/cancel", {}, alice)[0] == 200
    j = s.wait_job(plain["id"], alice, lambda j: j["state"] == "cancelled", timeout=20)
    assert [h["status"] for h in j["history"] if h["event"] == "exited"] == ["killed", "killed"]


def test_a_job_dead_of_a_sigterm_nobody_sent_failed(server, tmp_path):  # noqa: F811
    s = server(nodes=1)
    alice = s.token("alice")
    s.start()
    cmd = [PY, "-c", "import os, signal\nos.kill(os.getpid(), signal.SIGTERM)\n"]
    code, ans = s.post("/jobs", _spec(tmp_path / "s", 1, name="selfterm", command=cmd, max_failures=0), alice)
    assert code == 201, ans
    j = s.wait_job(ans["id"], alice, lambda j: j["state"] == "failed", timeout=30)
    assert [h["status"] for h in j["history"] if h["event"] == "exited"] == ["failed"]
    assert j["failures"] == 1 and j["fail_reason"] == "failure" and j["last_exit"]["signal"] == "SIGTERM", j


def test_a_submission_takes_json_numbers_and_booleans_only(server, tmp_path):  # noqa: F811
    """Numbers are JSON numbers (integers for the integer fields; a float field takes an integer),
    flags JSON booleans: ``"3"``, ``true`` or ``3.0`` for a priority is a 422 naming the field."""
    s = server(nodes=2)
    alice = s.token("alice")
    s.start()
    base = _spec(tmp_path / "v", 1, command=["sleep", "1000"])
    for bad, field in (
        ({"priority": "3"}, "priority"),
        ({"priority": True}, "priority"),
        ({"priority": 3.0}, "priority"),
        ({"grace_s": "59"}, "grace_s"),
        ({"grace_s": True}, "grace_s"),
        ({"grace_s": "inf"}, "grace_s"),
        ({"restart_s": "1e9"}, "restart_s"),
        ({"limit_s": "600"}, "limit_s"),
        ({"ckpt_interval_s": False}, "ckpt_interval_s"),
        ({"spot": "yes"}, "spot"),
        ({"spot": 1}, "spot"),
        ({"nodes": "2"}, "nodes"),
        ({"nodes": 2.0}, "nodes"),
        ({"gpus_per_node": True}, "gpus_per_node"),
        ({"max_failures": True}, "max_failures"),
        ({"name": 5}, "name"),
        ({"command": ["sleep", 1000]}, "command"),
        ({"env": {"A": 1}}, "env"),
    ):
        code, err = s.post("/jobs", {**base, **bad}, alice)
        assert code == 422, (bad, err)
        assert any(field in d["loc"] for d in err["detail"]), (bad, err)
    assert s.get("/jobs", alice)[1]["jobs"] == []  # nothing was submitted
    # the proper types: integers where a float is asked too
    good = {**base, "priority": 3, "grace_s": 59, "limit_s": 600, "restart_s": 5, "spot": False, "nodes": 1,
            "max_failures": 2, "ckpt_interval_s": 1.5}  # fmt: skip
    code, ans = s.post("/jobs", good, alice)
    assert code == 201, ans
    j = s.get(f"/jobs/{ans['id']}", alice)[1]
    assert j["priority"] == 3 and j["checkpoint"]["grace_s"] == 59.0
    # resize: the same rule
    for bad in ({"nodes": "1"}, {"nodes": True}, {"nodes": 1.0}, {"nodes": 1, "gpus_per_node": "1"}):
        code, err = s.post(f"/jobs/{ans['id']}/resize", bad, alice)
        assert code == 422, (bad, err)
    assert s.post(f"/jobs/{ans['id']}/cancel", {}, alice)[0] == 200
