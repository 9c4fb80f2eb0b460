"""The dashboard's data without a browser: the event-log replay, the per-viewer cut, the static page.

These run where Chromium is absent; tests/sched/ui/test_ui.py drives the page itself in one.
"""

from __future__ import annotations

import json
import math
import time

from goodput.sched.ui.page import static_html, write_report
from goodput.sched.ui.timeline import Timeline
from goodput.sched.ui.views import JobFacts, LiveState, NodeFacts, Viewer, job_page, live_overview, static_report

OLD = [  # the schema as first written: no reason/preemptor, no limit_s, no reserved record
    {"t": 0, "event": "submitted", "job": "lo", "tenant": "a", "priority": 0, "nodes": 1, "gpus_per_node": 4, "submit_s": 0},
    {"t": 0, "event": "started", "job": "lo", "epoch": 1, "pool": "od", "nodes": ["od-00000"], "gpus_per_node": 4, "resume_from_s": 0},
    {"t": 100, "event": "checkpoint_committed", "job": "lo", "epoch": 1, "progress_s": 90},
    {"t": 150, "event": "submitted", "job": "hi", "tenant": "b", "priority": 5, "nodes": 1, "gpus_per_node": 4, "submit_s": 150},
    {"t": 150, "event": "preempt_requested", "job": "lo", "epoch": 1, "victim_of": "hi", "lost_s": 50, "deadline_s": 180,
     "checkpoint": False, "candidates": [{"job": "lo", "lost_gpu_s": 200, "lost_s": 50, "checkpoint": False}]},
    {"t": 160, "event": "exited", "job": "lo", "epoch": 1, "status": "preempted"},
    {"t": 160, "event": "released", "job": "lo", "epoch": 1, "nodes": ["od-00000"], "gpus": 4},
    {"t": 160, "event": "requeued", "job": "lo", "reason": "preempted", "resume_from_s": 90},
    {"t": 160, "event": "started", "job": "hi", "epoch": 1, "pool": "od", "nodes": ["od-00000"], "gpus_per_node": 4, "resume_from_s": 0},
    {"t": 170, "event": "node_reclaim_notice", "node": "od-00001", "deadline_s": 290},
    {"t": 200, "event": "node_lost", "node": "od-00002"},
]  # fmt: skip
NEW = [  # the fields added since, and records this reader does not know
    {"t": 0, "event": "submitted", "job": "x", "tenant": "a", "priority": 0, "nodes": 1, "gpus_per_node": 2, "submit_s": 0,
     "limit_s": 500},
    {"t": 0, "event": "started", "job": "x", "epoch": 1, "pool": "od", "nodes": ["od-00000"], "gpus_per_node": 2, "resume_from_s": 0},
    {"t": 5, "event": "reserved", "job": "y", "reserved_t": 500, "pool": "od", "nodes": ["od-00000"]},
    {"t": 10, "event": "preempt_requested", "job": "x", "epoch": 1, "victim_of": "drain", "reason": "drain", "preemptor": None,
     "lost_s": 10, "deadline_s": 40, "checkpoint": False},
    {"t": 12, "event": "exited", "job": "x", "epoch": 1, "status": "failed"},
    {"t": 12, "event": "released", "job": "x", "epoch": 1, "nodes": ["od-00000"], "gpus": 2},
    {"t": 12, "event": "failed", "job": "x", "failures": 4, "reason": "too many failures"},
    {"t": 13, "event": "something_new", "job": "x", "whatever": [1, 2]},
    {"t": 14, "event": "started", "job": "ghost", "nodes": "not-a-list-of-names", "gpus_per_node": "x"},
]  # fmt: skip


def test_old_records_derive_reason_and_preemptor_and_the_ledger_adds_up():
    tl = Timeline({"od-00000": 4, "od-00001": 4, "od-00002": 4})
    tl.feed(OLD)
    (p,) = tl.preemptions
    assert (p.reason, p.preemptor, p.gpus, p.lost_s) == ("priority", "hi", 4, 50)
    # 160 s held: 90 useful (the commit at 100 kept 90 s of work), 10 draining; the 10 s before that work
    # began are restart or a lost start, and an old record does not say which: unattributed, never useful;
    # the victim lost all it did not keep
    assert p.realized_gpu_s == 4 * (160 - 90 - 10)
    acct = tl.jobs["lo"].runs[0].account(300)
    assert acct["useful"] == 4 * 90 and acct["draining"] == 4 * 10 and acct["lost_preemption"] == 4 * 50
    assert acct["unattributed"] == 4 * 10 and acct["restart"] == 0 and acct["checkpoint_stall"] == 0
    assert math.isclose(acct["allocated"], sum(acct[k] for k in acct if k != "allocated"))
    led = tl.ledger(300)
    total = led["total"]
    assert math.isclose(total["allocated"] * 3600, 4 * 160 + 4 * 140)
    assert math.isclose(total["at_risk"] * 3600, 4 * 140)  # hi runs, nothing committed
    # capacity counts a lost node only until it was lost
    assert math.isclose(led["capacity_gpu_h"] * 3600, 12 * 300 - 4 * 100)
    assert tl.node_health == {"od-00001": "reclaiming", "od-00002": "lost"} and tl.node_notice["od-00001"] == 290
    s = tl.series(300, buckets=10)
    assert len(s["t"]) == 10 and max(s["allocated"]) <= 8 + 1e-9 and s["capacity"][0] == 12


def test_new_records_are_read_and_unknown_ones_skipped():
    tl = Timeline(None)  # sizes inferred from what ran
    tl.feed(NEW)
    (p,) = tl.preemptions
    assert (p.reason, p.preemptor) == ("drain", "")
    assert tl.jobs["x"].limit_s == 500 and tl.jobs["x"].state == "failed"
    assert tl.jobs["x"].failed_reason == "too many failures"
    assert tl.reservation is not None and tl.reservation["t"] == 500
    assert tl.capacity == {"od-00000": 2}
    # a record of a shape it does not know is skipped, counted out, and does not stop the replay
    assert tl.count == len(NEW) - 1
    report = static_report(tl)
    assert report["queue"]["reservation"]["t"] == 500 and report["queue"]["reservation"]["pool"] == "od"
    assert report["job_pages"]["x"]["failed_reason"] == "too many failures"


def _state() -> tuple[LiveState, Timeline]:
    def job(jid: str, tenant: str, state: str, **kw) -> JobFacts:  # noqa: ANN003
        base = dict(
            id=jid, name=jid.split(".")[0], tenant=tenant, state=state, substate=state, priority=0, nodes=1,
            gpus_per_node=4, spot=False, submit_s=0.0, seq=0, eligible_s=0.0, epoch=1, pool="od",
            placement=("od-00000",), started_s=0.0, run_limit_s=3600.0, committed_s=90.0, committed_at=100.0,
            interval_s=60.0, write_s=5.0, deadline_s=math.inf, victim_of="", claim=(), tier="durable",
        )  # fmt: skip
        base.update(kw)
        return JobFacts(**base)

    jobs = [
        job("hi.00000001", "b", "running"),
        job("secret-model.00000002", "a", "pending", epoch=2, placement=(), seq=1),
        job("mine.00000003", "b", "pending", submit_s=10.0, seq=2, epoch=0, placement=()),
    ]
    nodes = [NodeFacts("od-00000", "od", "on-demand", 4, "up", {"hi.00000001": 4}),
             NodeFacts("od-00001", "od", "on-demand", 4, "up", {})]  # fmt: skip
    st = LiveState(300.0, nodes, jobs, {}, None, {"a": (1.0, 0, 0), "b": (1.0, 0, 4)})
    recs = json.loads(json.dumps(OLD).replace('"lo"', '"secret-model.00000002"').replace('"hi"', '"hi.00000001"'))
    tl = Timeline({"od-00000": 4, "od-00001": 4})
    tl.feed(recs)
    return st, tl


def test_a_tenant_gets_the_shape_but_never_another_tenants_names():
    st, tl = _state()
    b = live_overview(st, tl, Viewer("b", False))
    raw = json.dumps(b)
    assert "secret-model" not in raw and '"a"' not in raw
    assert [j["id"] for j in b["queue"]["jobs"]] == ["mine.00000003"] and b["queue"]["others"] == 1
    assert b["queue"]["jobs"][0]["place"] == 2  # its place among every tenant's jobs
    # b's job preempted a's: the row is there, the victim anonymous, the loss shown
    (row,) = b["preemptions"]["items"]
    assert row["job"] is None and row["preemptor"] == "hi.00000001" and row["expected_loss_gpu_s"] == 200
    assert [c["job"] for c in row["candidates"]] == [None]
    assert [t["tenant"] for t in b["ledger"]["tenants"]] == ["b", "other tenants"]
    a = live_overview(st, tl, Viewer("a", False))
    raw_a = json.dumps(a)
    assert "hi.00000001" not in raw_a and "mine.00000003" not in raw_a
    assert a["cluster"]["nodes"][0]["segments"] == [{"job": None, "gpus": 4, "state": "busy"}]
    (row,) = a["preemptions"]["items"]
    assert row["job"] == "secret-model.00000002" and row["preemptor"] == "(another tenant)" and row["victim_of"] is None
    admin = json.dumps(live_overview(st, tl, Viewer("ops", True)))
    assert "secret-model" in admin and "mine.00000003" in admin
    # a's own job page names neither the job that preempted it nor the candidates
    page = job_page(tl.jobs["secret-model.00000002"], tl, 300.0, None, Viewer("a", False))
    assert "hi.00000001" not in json.dumps(page)
    pre = next(r for r in page["history"] if r["event"] == "preempt_requested")
    assert pre["victim_of"] == "(another tenant)" and "candidates" not in pre
    assert "hi.00000001" in json.dumps(job_page(tl.jobs["secret-model.00000002"], tl, 300.0, None, Viewer("x", True)))


def test_why_a_job_waits_and_when_a_running_job_is_overdue():
    st, tl = _state()
    ov = live_overview(st, tl, Viewer("ops", True))
    why = {j["id"]: j["why"] for j in ov["queue"]["jobs"]}
    assert why == {"secret-model.00000002": "next pass", "mine.00000003": "next pass"}  # od-00001 is free
    st.nodes[1].alloc = {"other": 4}
    st.tenants["b"] = (1.0, 4, 4)
    st.jobs[1].substate, st.jobs[1].eligible_s = "backoff", 400.0
    why = {j["id"]: j["why"] for j in live_overview(st, tl, Viewer("ops", True))["queue"]["jobs"]}
    assert why == {"secret-model.00000002": "backoff", "mine.00000003": "quota"}
    st.tenants["b"] = (1.0, 0, 4)
    st.reservation = {"job": "mine.00000003", "pool": "od", "t": 900.0}
    ov = live_overview(st, tl, Viewer("ops", True))
    assert {j["id"]: j["why"] for j in ov["queue"]["jobs"]}["mine.00000003"] == "reservation"
    assert ov["queue"]["reservation"] == {"job": "mine.00000003", "pool": "od", "t": 900.0, "in_s": 600.0}
    (run,) = ov["running"]["jobs"]
    assert run["commit_age_s"] == 200 and run["overdue"] and run["at_risk_gpu_s"] == 800 and run["to_limit_s"] == 3300


def test_the_static_page_cannot_be_broken_out_of_by_a_log():
    evil = "</script><script>alert(1)</script>"
    tl = Timeline(None)
    tl.feed([{"t": 0, "event": "submitted", "job": evil, "tenant": evil, "priority": 0, "nodes": 1, "gpus_per_node": 1,
              "submit_s": 0}])  # fmt: skip
    html = static_html(static_report(tl, title=evil))
    assert evil not in html and "alert(1)" in html  # present as data, never as markup
    assert html.count("<script") == html.count("</script>")


def test_a_live_services_log_is_shown_on_the_wall_clock(tmp_path):
    shifted = [{**r, "t": r["t"] + 1.8e9} for r in OLD]
    out = write_report(shifted, tmp_path / "r.html")
    data = json.loads(
        out.read_text().split('<script id="goodput-data" type="application/json">')[1].split("</script>")[0]
    )
    assert data["clock"] == "wall" and data["preemptions"]["total"] == 1
    sim = write_report(OLD, tmp_path / "s.html").read_text()
    assert '"clock":"sim"' in sim


def test_the_live_feed_reads_a_real_service_and_follows_a_rebuilt_scheduler(tmp_path, monkeypatch):
    import inspect

    from goodput.sched.core.model import Checkpointing, Job
    from goodput.sched.live.service import Service, local_pools
    from goodput.sched.ui import routes
    from goodput.sched.ui.routes import LiveFeed

    monkeypatch.setattr(routes, "SHARED_FOR_S", 0.0)  # every call copies afresh (viewers share it for 1 s)

    kw = {"allow_root_jobs": True} if "allow_root_jobs" in inspect.signature(Service).parameters else {}
    svc = Service(f"sqlite:///{tmp_path / 's.db'}", local_pools(2, 1), state_dir=tmp_path, url="http://x", **kw)
    try:
        feed = LiveFeed(svc)
        with svc.lock:  # queued only: no pass runs, so nothing is started
            now = svc.sched.clock.now()
            svc.sched.submit(Job("big.0000000a", "alice", 0, 2, 1, now, limit_s=60.0, ckpt=Checkpointing()))
        ov = feed.overview(Viewer("ops", True))
        assert [j["id"] for j in ov["queue"]["jobs"]] == ["big.0000000a"] and ov["degraded"] is None
        assert [n["name"] for n in ov["cluster"]["nodes"]] == ["local-00000", "local-00001"]
        first = feed.timeline
        assert first is not None and first.count == 1
        if hasattr(svc, "_rebuild"):  # the service rebuilds its scheduler from the store after a failed write
            with svc.lock:
                svc._rebuild("a test")
            deadline = time.monotonic() + 5  # a copy is shared a while (ten times what it held the lock)
            while (ov := feed.overview(Viewer("ops", True))) and feed.timeline is first:
                assert time.monotonic() < deadline, "the feed never read the rebuilt scheduler"
                time.sleep(0.01)
            assert feed.timeline is not None and feed.timeline.count == 1  # replayed from the new log, once
            assert [j["id"] for j in ov["queue"]["jobs"]] == ["big.0000000a"]
        assert feed.overview(Viewer("bob", False))["queue"] == {"jobs": [], "others": 1, "more": 0, "reservation": None}
    finally:  # never started (no loop thread to stop): its executor and store are closed
        svc.executor.close()
        svc.store.close()


def test_a_tenant_learns_neither_how_many_other_jobs_share_a_node_nor_how_their_ids_sort():
    """Segments were sorted by job id: whether another tenant's GPUs came before or after the viewer's
    own told where its job's name sorts against names the viewer chose (an oracle, letter by letter)."""
    st, tl = _state()

    def seen(others: dict[str, int]) -> list[dict]:
        st.nodes[1].alloc = {"mine.00000003": 1, **others}
        for jid in others:
            tl.owner[jid] = "a"
        return live_overview(st, tl, Viewer("b", False))["cluster"]["nodes"][1]["segments"]

    before = seen({"aaa.00000010": 1, "aab.00000011": 2})  # sort before "mine"
    after = seen({"zzz.00000010": 2, "zzy.00000011": 1})  # sort after it
    assert (
        before
        == after
        == [
            {"job": "mine.00000003", "gpus": 1, "state": "busy"},
            {"job": None, "gpus": 3, "state": "busy"},
        ]
    )
    # an admin still sees each job
    admin = live_overview(st, tl, Viewer("ops", True))["cluster"]["nodes"][1]["segments"]
    assert [s["job"] for s in admin] == ["mine.00000003", "zzy.00000011", "zzz.00000010"]


def test_a_job_reference_whose_owner_is_unknown_is_anonymous():
    """Fail closed: a record naming a job the replay has no owner for (a log cut short, a store
    restored without its early records) shows it to no tenant; reason words still show."""
    st, tl = _state()
    st.jobs[0].victim_of = "stranger.0000beef"  # b's running job, preempted for a job nobody here knows
    b = live_overview(st, tl, Viewer("b", False))
    assert b["running"]["jobs"][0]["victim_of"] == "(another tenant)" and "stranger" not in json.dumps(b)
    st.jobs[0].victim_of = "drain"
    assert live_overview(st, tl, Viewer("b", False))["running"]["jobs"][0]["victim_of"] == "drain"
    tl.feed([{"t": 310, "event": "preempt_requested", "job": "hi.00000001", "epoch": 1, "victim_of": "stranger.0000beef",
              "preemptor": "stranger.0000beef", "reason": "priority", "lost_s": 1, "deadline_s": 400,
              "checkpoint": False}])  # fmt: skip
    page = job_page(tl.jobs["hi.00000001"], tl, 320.0, None, Viewer("b", False))
    assert "stranger" not in json.dumps(page)
    ov = live_overview(st, tl, Viewer("b", False))
    assert "stranger" not in json.dumps(ov)


def test_a_job_page_is_bounded_however_long_the_job_lived():
    from goodput.sched.ui.views import CHECKPOINTS_SHOWN, HISTORY_SHOWN

    recs = [
        {"t": 0, "event": "submitted", "job": "long", "tenant": "a", "priority": 0, "nodes": 1, "gpus_per_node": 1,
         "submit_s": 0},
        {"t": 0, "event": "started", "job": "long", "epoch": 1, "pool": "od", "nodes": ["od-00000"], "gpus_per_node": 1,
         "resume_from_s": 0},
    ]  # fmt: skip
    recs += [
        {"t": i, "event": "checkpoint_committed", "job": "long", "epoch": 1, "progress_s": float(i)}
        for i in range(1, 20_001)
    ]
    recs += [{"t": 20_001, "event": "commit_rejected", "job": "long", "epoch": 1, "progress_s": 1.0, "reason": "x"}]
    tl = Timeline(None)
    tl.feed(recs)
    page = job_page(tl.jobs["long"], tl, 20_002.0, None, Viewer("a", False))
    assert len(page["history"]) == HISTORY_SHOWN and page["history_total"] == len(recs)
    assert page["history"][-1]["event"] == "commit_rejected"  # the newest kept
    assert len(page["checkpoints"]) == CHECKPOINTS_SHOWN and page["checkpoints_total"] == 20_000
    assert page["checkpoints"][-1]["progress_s"] == 20_000.0 and page["commits_rejected"] == 1
    assert len(json.dumps(page)) < 200_000


def test_a_log_tail_is_a_regular_file_never_a_link_or_a_fifo(tmp_path):
    import os

    import pytest

    from goodput.sched.ui.routes import _tail

    (tmp_path / "ok.log").write_bytes(b"x" * 20_000 + b"\nlast line\n")
    assert _tail(tmp_path / "ok.log").endswith("last line\n")
    (tmp_path / "secret").write_text("another tenant's log")
    os.symlink(tmp_path / "secret", tmp_path / "link.log")
    with pytest.raises(OSError):
        _tail(tmp_path / "link.log")
    os.mkfifo(tmp_path / "fifo.log")  # opening a FIFO for reading would wait for a writer for ever
    with pytest.raises(OSError):
        _tail(tmp_path / "fifo.log")


def test_why_the_service_is_degraded_is_for_admins_only(tmp_path):
    import inspect

    from goodput.sched.live.service import Service, local_pools
    from goodput.sched.ui.routes import DEGRADED_FOR_TENANTS, LiveFeed

    kw = {"allow_root_jobs": True} if "allow_root_jobs" in inspect.signature(Service).parameters else {}
    svc = Service(f"sqlite:///{tmp_path / 's.db'}", local_pools(1, 1), state_dir=tmp_path, url="http://x", **kw)
    try:
        feed = LiveFeed(svc)
        assert feed.overview(Viewer("bob", False))["degraded"] is None
        # what a store's error says: a database's host and user, a row's content
        svc.degraded = 'the store cannot be read: connection to "db.internal" as user "goodput" failed'
        feed._base = None  # the next overview copies afresh
        assert feed.overview(Viewer("bob", False))["degraded"] == DEGRADED_FOR_TENANTS
        assert "db.internal" in feed.overview(Viewer("ops", True))["degraded"]
    finally:
        svc.degraded = ""
        svc.executor.close()
        svc.store.close()


TIMED = [  # a job whose reports say when its resume was done and what its saves stalled (docs/PROTOCOL.md)
    {"t": 0, "event": "submitted", "job": "j", "tenant": "a", "priority": 0, "nodes": 1, "gpus_per_node": 2, "submit_s": 0},
    {"t": 100, "event": "started", "job": "j", "epoch": 2, "pool": "od", "nodes": ["od-00000"], "gpus_per_node": 2,
     "resume_from_s": 500},
    # resumed at 130 (30 s of restart), trained 50 s to the snapshot at 180, committed at 182
    {"t": 182, "event": "checkpoint_committed", "job": "j", "epoch": 2, "progress_s": 550, "trained_s": 52, "stall_s": 1.5,
     "write_s": 2},
    {"t": 242, "event": "checkpoint_committed", "job": "j", "epoch": 2, "progress_s": 610, "trained_s": 112, "stall_s": 2.5},
    {"t": 250, "event": "exited", "job": "j", "epoch": 2, "status": "failed"},
    {"t": 250, "event": "released", "job": "j", "epoch": 2, "nodes": ["od-00000"], "gpus": 2},
]  # fmt: skip


def test_a_report_with_timing_splits_restart_and_checkpoint_stall_out_of_the_run():
    tl = Timeline({"od-00000": 2})
    tl.feed(TIMED)
    (run,) = tl.jobs["j"].runs
    assert run.ready_t == 130
    acct = run.account(300)
    # 150 s held on 2 GPUs: 30 restart; the commits kept 110 s of work, 1.5 of it the first save's stall
    # (inside the second commit's window); both stalls are checkpoint stall; the rest is lost
    assert acct["restart"] == 2 * 30 and acct["checkpoint_stall"] == 2 * (1.5 + 2.5)
    assert acct["useful"] == 2 * (110 - 1.5) and acct["unattributed"] == 0
    assert math.isclose(acct["lost_failure"], 2 * (150 - 30 - 4 - 108.5))
    assert math.isclose(acct["allocated"], sum(v for k, v in acct.items() if k != "allocated"))
    led = tl.ledger(300)
    assert math.isclose(led["total"]["restart"] * 3600, 60) and led["untimed_gpu_h"] == 0
    # the same run without the timing fields: its start is unattributed, its stalls inside useful
    plain = Timeline({"od-00000": 2})
    plain.feed([{k: v for k, v in r.items() if k not in ("trained_s", "stall_s", "write_s")} for r in TIMED])
    a2 = plain.jobs["j"].runs[0].account(300)
    assert a2["restart"] == 0 and a2["checkpoint_stall"] == 0 and a2["useful"] == 2 * 110
    assert a2["unattributed"] == 2 * (82 - 50)  # from the start to the commit at 182, less the 50 s it kept
    assert math.isclose(plain.ledger(300)["untimed_gpu_h"] * 3600, 300)


def _deep_count(root: object) -> int:
    """Objects reachable from ``root`` (containers, dataclass slots, deques), each counted once."""
    import gc

    seen: set[int] = set()
    stack = [root]
    while stack:
        o = stack.pop()
        if id(o) in seen or isinstance(o, (type, type(_deep_count))):
            continue
        seen.add(id(o))
        stack.extend(gc.get_referents(o))
    return len(seen)


def _synthetic(n_jobs: int) -> list[dict[str, object]]:
    """A long log: jobs submitted, started, committing, some preempted and resumed, all finished; on 8 nodes."""
    out: list[dict[str, object]] = []
    t = 0.0
    for i in range(n_jobs):
        jid, node, tenant = f"job-{i:07d}", f"od-{i % 8:05d}", f"t{i % 3}"
        out.append({"t": t, "event": "submitted", "job": jid, "tenant": tenant, "priority": i % 4, "nodes": 1,
                    "gpus_per_node": 4, "submit_s": t})  # fmt: skip
        resume = 0.0
        for epoch in (1, 2) if i % 5 == 0 else (1,):
            out.append({"t": t, "event": "started", "job": jid, "epoch": epoch, "pool": "od", "nodes": [node],
                        "gpus_per_node": 4, "resume_from_s": resume})  # fmt: skip
            for k in range(1, 4):
                out.append({"t": t + 10 * k, "event": "checkpoint_committed", "job": jid, "epoch": epoch,
                            "progress_s": resume + 10 * k - 2, "trained_s": 10 * k - 1, "stall_s": 0.5})  # fmt: skip
            resume += 28
            if epoch == 1 and i % 5 == 0:
                out.append({"t": t + 35, "event": "preempt_requested", "job": jid, "epoch": 1, "victim_of": "drain",
                            "reason": "drain", "preemptor": None, "lost_s": 5, "deadline_s": t + 60, "checkpoint": True})  # fmt: skip
                out.append({"t": t + 36, "event": "exited", "job": jid, "epoch": 1, "status": "preempted"})
                out.append({"t": t + 36, "event": "released", "job": jid, "epoch": 1, "nodes": [node], "gpus": 4})
                out.append(
                    {"t": t + 36, "event": "requeued", "job": jid, "reason": "preempted", "resume_from_s": resume}
                )
                t += 40
        out.append({"t": t + 40, "event": "exited", "job": jid, "epoch": epoch, "status": "finished"})
        out.append({"t": t + 40, "event": "released", "job": jid, "epoch": epoch, "nodes": [node], "gpus": 4})
        out.append({"t": t + 40, "event": "finished", "job": jid})
        t += 5
    return out


def test_the_replay_keeps_aggregates_not_the_log():
    """200,000 records: the replay's objects at the end of the log are as many as at three quarters (its
    bounds reached), the totals count every record, and the ledger adds up (a replay that kept the log
    grew by a third)."""
    n = 21_000
    records = _synthetic(n)
    assert len(records) > 200_000
    cut = len(records) * 3 // 4
    tl = Timeline({f"od-{i:05d}": 4 for i in range(8)})
    tl.feed(records[:cut])
    at_cut = _deep_count(tl)
    tl.feed(records[cut:])
    at_end = _deep_count(tl)
    assert at_end <= at_cut * 1.02, (at_cut, at_end)
    assert tl.count == len(records) and tl.states.get("finished") == n and tl.runs_total == n * 6 // 5
    assert tl.preemptions_total == n // 5 and len(tl.preemptions) < n // 5
    assert len(tl.jobs) < n
    led = tl.ledger(tl.t1)["total"]
    parts = sum(led[k] for k in ("useful", "restart", "checkpoint_stall", "lost_preemption", "lost_failure",
                                 "draining", "at_risk", "unattributed"))  # fmt: skip
    assert math.isclose(parts, led["allocated"]) and led["restart"] > 0 and led["checkpoint_stall"] > 0
    # what the views read still works on a replay that forgot most jobs
    report = static_report(tl)
    assert report["counts"]["finished"] == n and report["preemptions"]["total"] == n // 5
    s = tl.series(tl.t1)
    assert len(s["t"]) == 240 and max(s["allocated"]) <= 32 + 1e-6


def test_a_job_the_replay_has_forgotten_still_has_its_page_from_the_service(tmp_path, monkeypatch):
    """Ended jobs beyond the newest JOBS_ENDED_KEPT leave the replay; the service still knows them, so
    their page is the service's facts, marked forgotten (was: every job's records kept for ever)."""
    import inspect

    from goodput.sched.core.model import Checkpointing, Job
    from goodput.sched.live.service import Service, local_pools
    from goodput.sched.ui import routes, timeline
    from goodput.sched.ui.routes import LiveFeed

    monkeypatch.setattr(routes, "SHARED_FOR_S", 0.0)
    monkeypatch.setattr(timeline, "JOBS_ENDED_KEPT", 2)
    kw = {"allow_root_jobs": True} if "allow_root_jobs" in inspect.signature(Service).parameters else {}
    svc = Service(f"sqlite:///{tmp_path / 's.db'}", local_pools(1, 1), state_dir=tmp_path, url="http://x", **kw)
    try:
        feed = LiveFeed(svc)
        ids = [f"j{i}.0000000{i}" for i in range(4)]
        with svc.lock:  # queued, then cancelled: four ended jobs, no pass runs
            now = svc.sched.clock.now()
            for jid in ids:
                svc.sched.submit(Job(jid, "alice", 0, 1, 1, now, limit_s=60.0, ckpt=Checkpointing()))
                svc.sched.cancel(jid)
        feed.overview(Viewer("ops", True))
        tl = feed.timeline
        assert tl is not None and sorted(tl.jobs) == ids[2:] and tl.states["cancelled"] == 4
        old = feed.job(Viewer("alice", False), ids[0], {"tenant": "alice", "state": "cancelled"})
        assert old["forgotten"] and old["history"] == [] and old["state"] == "cancelled" and old["tenant"] == "alice"
        kept = feed.job(Viewer("alice", False), ids[3], {"tenant": "alice"})
        assert "forgotten" not in kept and [r["event"] for r in kept["history"]] == ["submitted", "cancelled"]
    finally:
        svc.executor.close()
        svc.store.close()


def test_a_run_starting_where_another_ended_never_shows_more_gpus_than_exist():
    """An ended run sits on the series' grid, spread over its slots; a running one was spread exactly, so
    one started in the slot another ended in showed both (9 of 8 GPUs on docs/dashboard.png)."""
    tl = Timeline({"n-0": 1})
    tl.feed(
        [
            {"t": 0.0, "event": "submitted", "job": "a", "tenant": "x", "nodes": 1, "gpus_per_node": 1},
            {"t": 0.0, "event": "started", "job": "a", "nodes": ["n-0"], "gpus_per_node": 1},
            {"t": 10.5, "event": "released", "job": "a", "nodes": ["n-0"], "gpus": 1},
            {"t": 10.5, "event": "submitted", "job": "b", "tenant": "x", "nodes": 1, "gpus_per_node": 1},
            {"t": 10.5, "event": "started", "job": "b", "nodes": ["n-0"], "gpus_per_node": 1},
        ]
    )
    for now in (12.0, 20.0, 37.3):
        for buckets in (7, 40, 240):
            s = tl.series(now, buckets=buckets)
            assert max(s["allocated"]) <= 1 + 1e-9, (now, buckets, max(s["allocated"]))
            assert math.isclose(sum(s["allocated"]) * s["width_s"], now)  # every GPU-second, once


def _reported(extra: dict, *, preempt: bool = False, progress: float = 100.0) -> Timeline:
    """alice's 1-GPU run: a true restart of 100 s, then one commit at 200 of 100 s of work, then a
    finish at 400 or bob's preemption at 300; ``extra``: what its report claimed beside that."""
    recs = [
        {"t": 0, "event": "submitted", "job": "a", "tenant": "alice", "nodes": 1, "gpus_per_node": 1},
        {"t": 0, "event": "submitted", "job": "b", "tenant": "bob", "nodes": 1, "gpus_per_node": 1, "priority": 5},
        {
            "t": 0,
            "event": "started",
            "job": "a",
            "epoch": 1,
            "pool": "p",
            "nodes": ["n0"],
            "gpus_per_node": 1,
            "resume_from_s": 0,
        },
        {"t": 200, "event": "checkpoint_committed", "job": "a", "epoch": 1, "progress_s": progress, **extra},
    ]
    if preempt:
        recs += [
            {
                "t": 300,
                "event": "preempt_requested",
                "job": "a",
                "epoch": 1,
                "victim_of": "b",
                "preemptor": "b",
                "reason": "priority",
                "checkpoint": False,
                "lost_s": 100,
            },
            {"t": 310, "event": "exited", "job": "a", "epoch": 1, "status": "preempted"},
            {"t": 310, "event": "released", "job": "a"},
        ]
    else:
        recs += [
            {"t": 400, "event": "exited", "job": "a", "epoch": 1, "status": "finished"},
            {"t": 400, "event": "released", "job": "a"},
            {"t": 400, "event": "finished", "job": "a"},
        ]
    tl = Timeline({"n0": 1, "n1": 1})
    tl.feed(recs)
    return tl


def _gpu_s(tl: Timeline, cause: str) -> float:
    return round(tl.ledger(400)["tenants"]["alice"][cause] * 3600, 6)


def test_a_reports_timing_is_bounded_by_what_the_log_saw():
    honest = {"trained_s": 100, "stall_s": 0, "write_s": 0}
    assert _gpu_s(_reported(honest), "restart") == 100 and _gpu_s(_reported(honest), "useful") == 300
    # trained since the resume: at most the progress kept + stalls + write reported + 1 s (a resume at
    # the run's start turned its restart into useful work)
    lie = _reported({"trained_s": 1e11, "stall_s": 0, "write_s": 0})
    assert _gpu_s(lie, "restart") == 99 and _gpu_s(lie, "useful") == 301
    # and at least the progress kept (0 turned the training into restart)
    assert _gpu_s(_reported({"trained_s": 0, "stall_s": 0}), "restart") == 100
    # a stall: at most the time since the previous commit (the run's start here), not 1e10
    run = _reported({"trained_s": 100, "stall_s": 1e10}).jobs["a"].runs[-1]
    assert run.stall_s == 200
    # a write likewise, so on a run's first report nothing the log saw is tighter than the run's time:
    # the restart a lying write_s can hide is what remains (docs/DASHBOARD.md says so)
    lie = _reported({"trained_s": 1e11, "stall_s": 0, "write_s": 1e10})
    assert _gpu_s(lie, "restart") == 0  # bound 100 + 0 + 200 + 1 s: the run's whole time before the commit


def test_the_victims_own_stall_does_not_decide_a_preemptions_realized_loss():
    honest = _reported({"trained_s": 100, "stall_s": 0}, preempt=True)
    assert [p.realized_gpu_s for p in honest.preemptions] == [100.0]
    assert _gpu_s(honest, "lost_preemption") == 100
    # its stall_s turned the preemption's loss into checkpoint stall: 0 charged to bob's preemption
    lie = _reported({"trained_s": 100, "stall_s": 1e10}, preempt=True)
    assert [p.realized_gpu_s for p in lie.preemptions] == [100.0]
    # trained_s at the run's start doubled the loss charged to the preemptor
    lie = _reported({"trained_s": 1e11, "stall_s": 0}, preempt=True)
    assert [p.realized_gpu_s for p in lie.preemptions] == [101.0]  # the 1 s slack


def test_one_tenants_progress_never_shows_as_the_clusters_useful_work():
    # a log from before the core bounded progress: alice's commit claims 1e10 s; bob's job never commits.
    # The series capped useful per bucket across tenants only, so alice's claim filled bob's GPU too
    tl = _reported({}, progress=1e10)
    tl.feed([{"t": 0, "event": "started", "job": "b", "epoch": 1, "pool": "p", "nodes": ["n1"], "gpus_per_node": 1,
              "resume_from_s": 0}])  # fmt: skip
    s = tl.series(200, buckets=4)
    assert s["allocated"] == [2.0, 2.0, 2.0, 2.0]
    assert max(s["useful"]) <= 1.0 + 1e-9, s["useful"]  # alice's one GPU at most
    assert tl.ledger(200)["tenants"]["bob"]["useful"] == 0
