"""Kill the scheduler and restart it from its store: nothing lost, nothing doubled, the same decisions.

Two ways: inside one simulation (``crash_after`` rebuilds the scheduler from the store between two
world events, and the run must equal the one that never crashed, on SQLite and on PostgreSQL), and
for real: a child process running a simulation on an SQLite store is SIGKILLed at a random moment,
and the scheduler rebuilt from what the store holds must be consistent with its own event log.
"""

from __future__ import annotations

import collections
import math
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

import goodput
from goodput.sched.core.executor import ManualClock, RecordingExecutor
from goodput.sched.core.model import JobState
from goodput.sched.core.policy import POLICIES
from goodput.sched.core.scheduler import Scheduler
from goodput.sched.live.store import open_store
from goodput.sched.sim.checker import check
from goodput.sched.sim.formats import ClusterEvent
from goodput.sched.sim.simulator import simulate
from goodput.sched.sim.synthetic import synthetic, synthetic_cluster

CLUSTER = synthetic_cluster(nodes=16)  # od: 12 nodes, spot: 4
JOBS = synthetic(100, nodes=12, seed=1, load=3.0)  # queued deep enough to preempt
EVENTS = [
    ClusterEvent(t=300.0, kind="reclaim", pool="spot", nodes=2, notice_s=120.0, return_s=1800.0),
    ClusterEvent(t=500.0, kind="node_loss", pool="od", nodes=1, return_s=1200.0, seed_key=3),
    ClusterEvent(t=700.0, kind="job_failure", pool="od", nodes=1, seed_key=5),
]


@pytest.fixture(scope="module")
def reference() -> dict[str, Any]:
    """The run that never crashes, and the job records its store ends with."""
    store = open_store("sqlite://:memory:")
    r = simulate(JOBS, CLUSTER, POLICIES["goodput"], extra_events=EVENTS, store=store)
    plain = simulate(JOBS, CLUSTER, POLICIES["goodput"], extra_events=EVENTS)
    assert plain.events == r.events  # persisting changes nothing
    snap = store.load()
    store.close()
    counts = collections.Counter(e["event"] for e in r.events)
    assert counts["preempt_requested"] > 5 and counts["node_lost"] > 0 and counts["requeued"] > 5
    return {"result": r, "jobs": snap.jobs, "nodes": snap.nodes, "events": snap.events}


@pytest.mark.parametrize("seed", [0, 1])
def test_crash_and_restart_changes_nothing(store_url: str, reference: dict[str, Any], seed: int) -> None:
    ref = reference["result"]
    rng = random.Random(seed)
    crashes = sorted(rng.sample(range(1, ref.world_events), 2))
    store = open_store(store_url)
    try:
        r = simulate(JOBS, CLUSTER, POLICIES["goodput"], extra_events=EVENTS, store=store, crash_after=crashes)
        assert r.events == ref.events, f"diverged after crashes at world events {crashes}"
        assert r.jobs == ref.jobs and r.check.ok
        assert r.ledger == ref.ledger  # the world never noticed
        snap = store.load()
        assert snap.events == ref.events
        assert snap.jobs == reference["jobs"]
        assert snap.nodes == reference["nodes"]
    finally:
        store.close()


def test_crash_after_every_world_event_changes_nothing(tmp_path, reference: dict[str, Any]) -> None:
    """The harshest schedule: a restart between any two world events, on a short prefix of the run."""
    jobs = JOBS[:30]
    plain = simulate(jobs, CLUSTER, POLICIES["goodput"], extra_events=EVENTS)
    store = open_store(f"sqlite:///{tmp_path / 'every.db'}")
    try:
        r = simulate(
            jobs,
            CLUSTER,
            POLICIES["goodput"],
            extra_events=EVENTS,
            store=store,
            crash_after=range(1, plain.world_events + 1),
        )
        assert r.events == plain.events
    finally:
        store.close()


def test_simulate_refuses_a_used_store(tmp_path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'used.db'}")
    try:
        simulate(JOBS[:5], CLUSTER, POLICIES["goodput"], store=store)
        with pytest.raises(ValueError, match="empty one"):
            simulate(JOBS[:5], CLUSTER, POLICIES["goodput"], store=store)
    finally:
        store.close()


# ---------------------------------------------------------------------------------------------------
# SIGKILL of a real process

CHILD = textwrap.dedent(
    """
    import sys
    from goodput.sched.core.policy import POLICIES
    from goodput.sched.sim.simulator import simulate
    from goodput.sched.live.store import open_store
    from goodput.sched.sim.formats import ClusterEvent
    from goodput.sched.sim.synthetic import synthetic, synthetic_cluster

    cluster = synthetic_cluster(nodes=16)
    jobs = synthetic(3000, nodes=12, seed=5, load=3.0)
    events = [
        ClusterEvent(t=float(t), kind="reclaim", pool="spot", nodes=2, notice_s=120.0, return_s=600.0)
        for t in range(300, 200000, 900)
    ] + [
        ClusterEvent(t=float(t), kind="node_loss", pool="od", nodes=1, return_s=900.0, seed_key=t % 12)
        for t in range(450, 200000, 700)
    ]

    def progress(t, done, total):
        print(f"{t} {done} {total}", flush=True)

    simulate(jobs, cluster, POLICIES["goodput"], extra_events=events, store=open_store(sys.argv[1]), progress=progress)
    print("done", flush=True)
    """
)


def replay(events: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each job as its own event log describes it, independently of the scheduler's records."""
    jobs: dict[str, dict[str, Any]] = {}
    on_node: dict[str, set[str]] = collections.defaultdict(set)
    for e in events:
        kind = e["event"]
        if kind == "submitted":
            assert e["job"] not in jobs, f"{e['job']} submitted twice"
            jobs[e["job"]] = {"state": "pending", "epoch": 0, "committed": 0.0, "nodes": (), "deadline": math.inf}
            continue
        if kind == "node_reclaim_notice":
            for jid in on_node[e["node"]]:
                j = jobs[jid]
                if j["state"] == "preempting":
                    j["deadline"] = min(j["deadline"], e["deadline_s"])
            continue
        if "job" not in e or e["job"] not in jobs:
            continue
        j = jobs[e["job"]]
        if kind == "started":
            j.update(state="running", epoch=e["epoch"], nodes=tuple(e["nodes"]), deadline=math.inf)
            for n in j["nodes"]:
                on_node[n].add(e["job"])
        elif kind == "preempt_requested":
            j.update(state="preempting", deadline=e["deadline_s"])
        elif kind == "checkpoint_committed":
            j["committed"] = e["progress_s"]
        elif kind == "released":
            for n in e["nodes"]:
                on_node[n].discard(e["job"])
            j["nodes"] = ()
        elif kind == "requeued":
            j.update(state="pending", deadline=math.inf)
        elif kind in ("finished", "failed", "cancelled"):
            j["state"] = kind
    return jobs


@pytest.mark.parametrize("attempt", range(2))
def test_sigkill_at_a_random_moment_loses_and_doubles_nothing(tmp_path, attempt: int) -> None:
    url = f"sqlite:///{tmp_path / 'killed.db'}"
    root = str(Path(goodput.__file__).resolve().parents[1])  # the child imports this checkout's goodput
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        first = child.stdout.readline()  # it is running: some steps are committed
        assert first and first != "done\n", child.stderr.read()
        time.sleep(random.uniform(0.0, 1.0))
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()
        child.stderr.close()
    assert child.returncode == -signal.SIGKILL

    store = open_store(url)
    try:
        snap = store.load()
        assert snap.events, "nothing was committed before the kill"
        last_t = max(e["t"] for e in snap.events)
        ex = RecordingExecutor()
        clock = ManualClock(last_t)
        s = Scheduler.restore(store, CLUSTER.pools, clock=clock, executor=ex, policy=POLICIES["goodput"])
        check_restored(s, snap.events)
        # continuing from here keeps every rule: hard deadlines still kill, passes stay sound
        killed_at = {
            j.id: j.deadline_s for j in s.jobs.values() if j.state is JobState.PREEMPTING and j.substate != "killed"
        }
        if killed_at:
            clock.t = max(killed_at.values())
            s.advance()
            assert {c[1] for c in ex.calls if c[0] == "kill"} == set(killed_at)
        s.tick()
        report = check(s.log.records, CLUSTER.capacity())
        assert report.ok, (report.summary(), report.examples)
    finally:
        store.close()


def check_restored(s: Scheduler, events: list[dict[str, Any]]) -> None:
    # the log of whole steps is a legal log (a torn step would show as a lost or illegal job)
    report = check(events, CLUSTER.capacity())
    assert report.ok, (report.summary(), report.examples)
    # every submitted job is there once, as its log says
    told = replay(events)
    assert set(s.jobs) == set(told)
    assert len(events) == len(s.log.records) and s.log.records == events
    states = collections.Counter(j.state for j in s.jobs.values())
    assert states[JobState.PENDING] + states[JobState.RUNNING] > 0, "the child finished before the kill"
    for jid, j in s.jobs.items():
        want = told[jid]
        assert j.state.value == want["state"], (jid, j.state, want)
        assert j.epoch == want["epoch"] and j.committed_s == want["committed"], jid
        if j.state in (JobState.RUNNING, JobState.PREEMPTING):
            assert j.placement == want["nodes"] and len(j.placement) == j.nodes, jid
        else:
            assert j.placement == (), jid
        if j.state is JobState.PREEMPTING:
            assert j.deadline_s == want["deadline"] and math.isfinite(j.deadline_s), jid
        if j.state is JobState.PENDING:
            assert j.substate in ("queued", "backoff", "awaiting victims"), (jid, j.substate)
            assert (jid in s.queue) == (j.substate == "queued"), jid
            assert bool(j.claim) == (j.substate == "awaiting victims"), jid
        else:
            assert jid not in s.queue and not j.claim, jid
    # the GPUs: bound to exactly the running and leaving jobs, the leaving ones counted as draining
    for name, node in s.cap.nodes.items():
        holders = {
            jid: j.gpus_per_node
            for jid, j in s.jobs.items()
            if j.state in (JobState.RUNNING, JobState.PREEMPTING) and name in j.placement
        }
        assert node.alloc == holders, name
        assert node.used == sum(holders.values()) <= node.gpus, name
        leaving = sum(s.jobs[jid].gpus_per_node for jid in holders if s.jobs[jid].state is JobState.PREEMPTING)
        assert node.draining == leaving, name
    assert s.cap.claimed == {n: j.id for j in s.jobs.values() if j.state is JobState.PENDING for n in j.claim}
    for t in s.tenants.values():
        assert t.usage_gpus == sum(
            j.gpus for j in s.jobs.values() if j.tenant == t.name and j.state in (JobState.RUNNING, JobState.PREEMPTING)
        )
    # the timers: each leaving job's hard deadline and each backoff end is pending again
    due = [j.deadline_s for j in s.jobs.values() if j.state is JobState.PREEMPTING and j.substate != "killed"]
    due += [j.eligible_s for j in s.jobs.values() if j.state is JobState.PENDING and j.substate == "backoff"]
    # and the governance's: time limits, runs reaching min_run_s, kills that never returned
    lim, now = s.gov.limits, s.clock.now()
    running = [j for j in s.jobs.values() if j.state is JobState.RUNNING]
    due += [j.started_s + j.run_limit_s + lim.over_time_limit_s for j in running if j.limit_s > 0]
    due += [
        j.started_s + lim.min_run_s
        for j in running
        if now < j.started_s + lim.min_run_s and j.evictions < lim.max_preemptions
    ]
    due += [
        j.killed_at + lim.unkillable_s
        for j in s.jobs.values()
        if j.state is JobState.PREEMPTING and j.substate == "killed" and j.killed_at >= 0
    ]
    # and a refused preemption's next search
    due += [j.preempt_retry_s for j in s.jobs.values() if j.state is JobState.PENDING and j.preempt_retry_s > now]
    assert s.next_timer() == min(due, default=math.inf)
    assert s.terminal == sum(j.state.value in ("finished", "failed", "cancelled") for j in s.jobs.values())
