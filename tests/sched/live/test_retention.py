"""Retention of ended jobs (limits.ended_retention_s, limits.max_ended_per_tenant) and the bound on a
spec's size: a tenant that submits big specs and cancels each, again and again, leaves the service's
memory and its store bounded by the limits (the hostile review's loop, smaller). In-process: the
app's endpoints called directly, scheduling passes run by hand."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import sys
import time

import anyio
import pytest
from fastapi import HTTPException

from goodput.sched.core.governance import Governance, Limits, TenantSpec
from goodput.sched.core.model import JobState
from goodput.sched.live.service import (
    ENDED_COMMAND_BYTES,
    MAX_SPEC_BYTES,
    Caller,
    JobSpec,
    Service,
    create_app,
    local_pools,
)

ALICE = Caller("alice", "tenant", key="alice")
BOB = Caller("bob", "tenant", key="bob")
ADMIN = Caller("ops", "admin", key="ops")
ARG = "A" * 60000
# about 240 KB: under MAX_SPEC_BYTES, most of it in the command, 64 KB in the env
BIG = {"name": "big", "command": ["/bin/true", ARG, ARG, ARG], "env": {f"V{i}": "B" * 8000 for i in range(8)}}


class Api:
    """The service's endpoints, called as FastAPI would (a refusal is the HTTPException it raises)."""

    def __init__(self, svc: Service) -> None:
        self.svc = svc
        self.routes = {(r.path, m): r.endpoint for r in create_app(svc).routes for m in getattr(r, "methods", ())}

    def submit(self, spec: dict, c: Caller = ALICE) -> dict:
        return json.loads(self.routes[("/jobs", "POST")](JobSpec(**spec), c).body)

    def cancel(self, job_id: str, c: Caller = ALICE) -> dict:
        return self.routes[("/jobs/{job_id}/cancel", "POST")](job_id, c)

    def show(self, job_id: str, c: Caller = ALICE) -> dict:
        return anyio.run(self.routes[("/jobs/{job_id}", "GET")], job_id, c)

    def refused(self, fn, *args) -> HTTPException:  # noqa: ANN001
        with pytest.raises(HTTPException) as e:
            fn(*args)
        return e.value


def _service(tmp_path, **limits) -> Service:
    tenants = {t: TenantSpec(t, ckpt_prefix=str(tmp_path)) for t in ("alice", "bob")}
    gov = Governance(tenants=tenants, limits=Limits(min_run_s=0, **limits))
    svc = Service(f"sqlite:///{tmp_path / 's.db'}", local_pools(1, 1), state_dir=tmp_path / "state",
                  url="http://127.0.0.1:9", governance=gov, allow_root_jobs=True, poll_s=0.05)  # fmt: skip
    svc.executor.start_watcher()  # no loop thread: the tests run the passes
    return svc


def _rows(tmp_path, table: str) -> int:
    with contextlib.closing(sqlite3.connect(tmp_path / "s.db")) as db:
        return db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]


def _kill_runs(tmp_path) -> None:
    runs = tmp_path / "state" / "runs"
    for rec in runs.glob("*.json") if runs.exists() else ():
        with contextlib.suppress(Exception):
            os.killpg(json.loads(rec.read_text())["pgid"], signal.SIGKILL)


def _running(svc: Service, api: Api) -> str:
    hold = api.submit({"name": "hold", "command": [sys.executable, "-c", "import time; time.sleep(600)"]})["id"]
    deadline = time.monotonic() + 30
    while svc.sched.jobs[hold].state is not JobState.RUNNING:
        assert time.monotonic() < deadline
        svc.pass_once()
        time.sleep(0.05)
    return hold


@pytest.fixture
def make(tmp_path):
    made: list[Service] = []

    def _make(**limits) -> tuple[Service, Api]:
        svc = _service(tmp_path, **limits)
        made.append(svc)
        return svc, Api(svc)

    yield _make
    for svc in made:
        with contextlib.suppress(Exception):
            svc.close()
    _kill_runs(tmp_path)


def test_the_submit_and_cancel_loop_leaves_memory_and_the_store_bounded(make, tmp_path):
    """The review's loop at a smaller scale: ~240 KB specs submitted and cancelled 150 times while the
    one slot is busy. The scheduler's jobs, the service's envs and the store's rows stay within
    max_ended_per_tenant plus what ended since the last pass; the store file stops growing."""
    svc, api = make(max_queued_per_tenant=10, max_ended_per_tenant=20)
    hold = _running(svc, api)
    sizes = []
    for i in range(1, 151):
        jid = api.submit(BIG)["id"]
        assert api.cancel(jid)["state"] == "cancelled"
        if i % 10 == 0:
            svc.pass_once()
            with svc.lock:
                assert len(svc.sched.jobs) <= 1 + 20, len(svc.sched.jobs)  # the running hold + the kept ended
                assert len(svc.envs) == 0  # ended jobs keep no environment
                ended = [j for j in svc.sched.jobs.values() if j.state is JobState.CANCELLED]
                assert all(sum(len(a) for a in j.command) <= ENDED_COMMAND_BYTES for j in ended)
            assert _rows(tmp_path, "jobs") <= 21 and _rows(tmp_path, "job_envs") == 0
            sizes.append(os.path.getsize(tmp_path / "s.db"))
    # the file's pages are reused once the rows go: no growth past the first few rounds
    assert sizes[-1] <= sizes[4] + (1 << 20), sizes
    assert sum(os.path.getsize(p) for p in tmp_path.glob("s.db*")) < 64 << 20
    assert svc.sched.jobs[hold].state is JobState.RUNNING  # untouched


def test_an_ended_jobs_view_keeps_working_without_its_env_and_long_command(make):
    svc, api = make(max_queued_per_tenant=10)
    _running(svc, api)
    jid = api.submit(BIG)["id"]
    before = api.show(jid)
    assert before["env"] == BIG["env"] and before["command"] == BIG["command"] and not before["command_cut"]
    api.cancel(jid)
    svc.pass_once()
    d = api.show(jid)
    assert d["state"] == "cancelled" and d["name"] == "big" and d["env"] == {} and d["env_dropped"]
    assert d["command_cut"] and d["command"][0] == "/bin/true"
    assert "more bytes of this command were dropped" in d["command"][-1]
    assert len("".join(d["command"]).encode()) <= ENDED_COMMAND_BYTES
    assert [e["event"] for e in d["history"]] == ["submitted", "cancelled"]
    with svc.lock:
        assert jid not in svc.envs
    # a short command is kept whole
    small = api.submit({"name": "small", "command": ["/bin/echo", "hi"], "env": {"A": "1"}})["id"]
    api.cancel(small)
    svc.pass_once()
    d = api.show(small)
    assert d["command"] == ["/bin/echo", "hi"] and not d["command_cut"] and d["env_dropped"]


def test_a_pruned_jobs_get_says_why_and_a_restart_does_not_bring_it_back(make, tmp_path):
    """max_ended_per_tenant 3: the oldest ended jobs are removed (410 naming the limit, to their own
    tenant and the admin; another tenant gets the 404 of an unknown id); pending and running jobs are
    never removed; a restarted service starts without the removed jobs (an unknown id: 404)."""
    svc, api = make(max_queued_per_tenant=10, max_ended_per_tenant=3)
    hold = _running(svc, api)
    pending = api.submit({"name": "wait", "command": ["/bin/true"], "key": "k-wait"})["id"]
    ended = []
    for _ in range(6):
        jid = api.submit({"name": "gone", "command": ["/bin/true"], "env": {"X": "1"}})["id"]
        api.cancel(jid)
        ended.append(jid)
    keyed = api.submit({"name": "gone", "command": ["/bin/true"], "key": "k1"})["id"]
    api.cancel(keyed)
    ended.append(keyed)
    svc.pass_once()
    pruned, kept = ended[:4], ended[4:]
    for jid in pruned:
        e = api.refused(api.show, jid)
        assert e.status_code == 410 and "max_ended_per_tenant" in e.detail, e.detail
        assert api.refused(api.show, jid, ADMIN).status_code == 410
        assert api.refused(api.show, jid, BOB).status_code == 404  # its existence is not disclosed
        assert api.refused(api.cancel, jid).status_code == 410
    for jid in kept:
        assert api.show(jid)["state"] == "cancelled"
    assert api.show(hold)["state"] == "running" and api.show(pending)["state"] == "pending"
    with svc.lock:
        assert set(svc.sched.jobs) == {hold, pending, *kept}
        assert svc.sched.terminal == 3
    assert _rows(tmp_path, "jobs") == 5
    # the idempotency key of a removed job is gone with it (a retry submits anew); a kept one replays
    svc.close()
    _kill_runs(tmp_path)
    svc, api = make(max_queued_per_tenant=10, max_ended_per_tenant=3)
    with svc.lock:
        assert set(svc.sched.jobs) == {hold, pending, *kept}
        assert svc.sched.jobs[pending].state is JobState.PENDING
    e = api.refused(api.show, pruned[0])
    assert e.status_code == 404 and "retention" in e.detail
    assert api.submit({"name": "wait", "command": ["/bin/true"], "key": "k-wait"}) == {
        "id": pending,
        "state": "pending",
        "replayed": True,
    }


def test_ended_jobs_older_than_the_retention_are_removed_and_the_others_kept(make, tmp_path):
    svc, api = make(max_queued_per_tenant=10, ended_retention_s=3600)
    old = api.submit({"name": "old", "command": ["/bin/true"]})["id"]
    api.cancel(old)
    new = api.submit({"name": "new", "command": ["/bin/true"]})["id"]
    api.cancel(new)
    with svc.lock:
        svc.sched.jobs[old].end_s -= 7200  # ended two hours ago
    svc.pass_once()
    e = api.refused(api.show, old)
    assert e.status_code == 410 and "ended_retention_s" in e.detail
    assert api.show(new)["state"] == "cancelled"


def test_a_backlog_is_removed_in_batches_after_a_restart(make, tmp_path, monkeypatch):
    """A store with more ended jobs than the limit (written with a higher one) is trimmed to it over a
    few passes of RETIRE_BATCH each, never all under the lock at once."""
    from goodput.sched.live import service as service_mod

    svc, api = make(max_queued_per_tenant=100)
    for _ in range(30):
        api.cancel(api.submit({"name": "j", "command": ["/bin/true"]})["id"])
    svc.pass_once()
    svc.close()
    monkeypatch.setattr(service_mod, "RETIRE_BATCH", 10)
    svc, api = make(max_queued_per_tenant=100, max_ended_per_tenant=5)
    with svc.lock:
        assert svc.retire_ended() is True  # more left
        assert len(svc.sched.jobs) == 20
        while svc.retire_ended():
            pass
        assert len(svc.sched.jobs) == 5
    assert _rows(tmp_path, "jobs") == 5


def test_a_spec_past_max_spec_bytes_is_a_422_naming_the_field(make):
    svc, api = make()
    big = "x" * 60000
    e = api.refused(api.submit, {"name": "c", "command": ["/bin/true"] + [big] * 5})
    assert e.status_code == 422 and e.detail[0]["loc"] == ["body", "command"]
    assert str(MAX_SPEC_BYTES) in e.detail[0]["msg"]
    spec = {"name": "e", "command": ["/bin/true"] + [big] * 4, "env": {f"V{i}": "y" * 8000 for i in range(8)}}
    e = api.refused(api.submit, spec)
    assert e.status_code == 422 and e.detail[0]["loc"] == ["body", "env"]
    assert api.submit(BIG)["state"] == "pending"  # just under it
