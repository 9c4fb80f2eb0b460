"""Whose drain is it: goodput's own (``POST /nodes/X/drain``) or Slurm's (``scontrol update
nodename=X state=DRAIN``). Slurm's RESUME returns only the nodes the core drained because Slurm had;
a node Slurm holds drained or down is never offered, whatever made the core see it up, and goodput's
``/up`` refuses it while Slurm holds it.

The executor's node logic runs on the real scheduler core and the real ``slurm_runs`` table, fed
``sinfo`` records (``SlurmExecutor.apply_nodes``); the last test runs the whole service over a real
Slurm (skipped, with the reason, without Slurm's binaries or root)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from goodput.sched.core.executor import ManualClock, RecordingExecutor
from goodput.sched.core.model import Health, Node, Pool, PoolKind
from goodput.sched.core.scheduler import Scheduler
from goodput.sched.live.slurm import SlurmExecutor, SlurmNode, node_changes
from goodput.sched.live.store import open_store

from .slurm_cluster import slurm  # noqa: F401 - fixture

NAMES = ("n1", "n2")


def _core() -> Scheduler:
    pools = [Pool("p", PoolKind.ON_DEMAND, len(NAMES), 2)]
    nodes = [Node(n, "p", PoolKind.ON_DEMAND, 2) for n in NAMES]
    return Scheduler(pools, clock=ManualClock(0.0), executor=RecordingExecutor(), nodes=nodes)


def _executor(tmp: Path, s: Scheduler, store) -> SlurmExecutor:  # noqa: ANN001
    ex = SlurmExecutor(tmp / "state", store=store, partition="p")
    ex.on_nodes = lambda d, u, dr, r: node_changes(s, d, u, dr, r).took
    return ex


def _sinfo(drained: tuple[str, ...] = (), down: tuple[str, ...] = ()) -> list[SlurmNode]:
    out = []
    for n in NAMES:
        state = "down" if n in down else "idle"
        out.append(SlurmNode(n, 2, n, state, ("DRAIN",) if n in drained else ()))
    return out


def health(s: Scheduler, n: str) -> Health:
    return s.cap.nodes[n].health


def test_slurm_s_resume_never_undoes_goodput_s_own_drain(tmp_path):
    """goodput drains n1 (the API's ``reclaim_notice``), Slurm drains it too, Slurm resumes it: n1 stays
    drained (the old executor brought it back up). A drain goodput is asked for while the drain is
    Slurm's becomes goodput's own: Slurm's RESUME leaves it too. Slurm's drain alone is still undone by
    Slurm's RESUME."""
    s = _core()
    store = open_store(f"sqlite:///{tmp_path / 's.db'}")
    ex = _executor(tmp_path, s, store)
    ex.apply_nodes(_sinfo())
    # goodput's own drain first (POST /nodes/n1/drain), then Slurm's
    assert ex.node_request("n1", "drain") is None
    s.reclaim_notice(["n1"], 30.0, why="node_loss")
    ex.apply_nodes(_sinfo(drained=("n1",)))
    assert health(s, "n1") is Health.RECLAIMING and ex.drained == set()
    ex.apply_nodes(_sinfo())  # Slurm's RESUME
    assert health(s, "n1") is Health.RECLAIMING
    # Slurm's drain first (the core's drain is Slurm's), then goodput's asked for on top
    ex.apply_nodes(_sinfo(drained=("n2",)))
    assert health(s, "n2") is Health.RECLAIMING and ex.drained == {"n2"}
    assert ex.node_request("n2", "drain") is None
    ex.apply_nodes(_sinfo())
    assert health(s, "n2") is Health.RECLAIMING and ex.drained == set()
    # Slurm's drain alone: its RESUME returns the node
    s.node_up(["n1", "n2"])
    ex.apply_nodes(_sinfo(drained=("n1",)))
    assert health(s, "n1") is Health.RECLAIMING
    ex.apply_nodes(_sinfo())
    assert health(s, "n1") is Health.UP and ex.drained == set()
    store.close()


def test_a_node_slurm_holds_drained_or_down_is_never_offered_and_up_is_refused(tmp_path):
    """The core made to see n1 up while Slurm still has it drained (what ``/up`` did): the next pass
    drains it again, on Slurm's word (the old executor read drains as edges only and left it up, so
    every start placed there sat pending until cancelled as lost). Likewise a node Slurm holds down.
    ``/up`` is refused while Slurm holds the node, naming Slurm's state and the way out."""
    s = _core()
    store = open_store(f"sqlite:///{tmp_path / 's.db'}")
    ex = _executor(tmp_path, s, store)
    ex.apply_nodes(_sinfo(drained=("n1",), down=("n2",)))
    assert health(s, "n1") is Health.RECLAIMING and health(s, "n2") is Health.LOST
    why = ex.node_request("n1", "up")
    assert why is not None and "drained in Slurm" in why and "state=RESUME" in why
    assert "down in Slurm" in (ex.node_request("n2", "up") or "")
    s.node_up(["n1", "n2"])  # however it happened
    ex.apply_nodes(_sinfo(drained=("n1",), down=("n2",)))
    assert health(s, "n1") is Health.RECLAIMING and health(s, "n2") is Health.LOST
    assert ex.drained == {"n1"}  # still Slurm's drain: its RESUME returns it
    ex.apply_nodes(_sinfo())
    assert health(s, "n1") is Health.UP and health(s, "n2") is Health.UP
    assert ex.node_request("n1", "up") is None
    store.close()


def test_whose_drain_it_is_survives_a_restart(tmp_path):
    """The nodes drained on Slurm's word are kept in the store: a RESUME while goodput was down returns
    them at the next service's first pass; a node goodput drained itself stays drained."""
    s = _core()
    db = f"sqlite:///{tmp_path / 's.db'}"
    store = open_store(db)
    ex = _executor(tmp_path, s, store)
    s.reclaim_notice(["n1"], 30.0, why="node_loss")  # goodput's own
    ex.apply_nodes(_sinfo(drained=("n1", "n2")))
    assert ex.drained == {"n2"}
    store.close()
    store = open_store(db)
    ex2 = _executor(tmp_path, s, store)  # the same core, as the store would give it back
    assert ex2.drained == {"n2"}
    ex2.apply_nodes(_sinfo())  # both resumed in Slurm while goodput was away
    assert health(s, "n1") is Health.RECLAIMING and health(s, "n2") is Health.UP
    store.close()


def test_over_a_real_slurm_resume_keeps_goodput_s_drain_and_up_waits_for_slurm(slurm):  # noqa: F811
    """The service over a real Slurm: ``POST /nodes/X/drain``, then Slurm's DRAIN of X: ``POST
    /nodes/X/up`` answers 409 naming Slurm's drain; Slurm's RESUME of X leaves X ``reclaiming`` (the
    old service returned it), while Y, drained and resumed in Slurm alone, comes back; then ``/up``
    returns X."""
    from goodput.demo.slurm import Runtime, SlurmService, get
    from goodput.sched.live.client import post_json

    base = Path(slurm.root) / "goodput"
    base.mkdir()
    os.chmod(base, 0o755)
    rt = Runtime(sys.executable, str(Path(__file__).resolve().parents[3]))
    svc = SlurmService(base, slurm, rt, allow_root_jobs=True)
    admin = svc.token("admin", admin=True)
    svc.start()
    x, y = slurm.node_names[0], slurm.node_names[1]
    try:

        def health_of(name: str) -> str:
            nodes = get(f"{svc.url}/cluster", admin)["nodes"]
            return next(n for n in nodes if n["name"] == name)["health"]

        def wait(cond, what: str, timeout_s: float = 60.0) -> None:  # noqa: ANN001
            end = time.monotonic() + timeout_s
            while time.monotonic() < end:
                if cond():
                    return
                time.sleep(0.2)
            pytest.fail(f"{what}: not within {timeout_s:.0f} s\n{svc.log_tail()}")

        code, ans = post_json(f"{svc.url}/nodes/{x}/drain", {}, admin)
        assert code == 200 and ans["health"] == "reclaiming", ans
        slurm.run(["scontrol", "update", f"nodename={x},{y}", "state=DRAIN", "reason=goodput-test"])
        wait(lambda: health_of(y) == "reclaiming", "Slurm's drain of Y seen")
        code, ans = post_json(f"{svc.url}/nodes/{x}/up", {}, admin)
        assert code == 409 and "drained in Slurm" in str(ans), (code, ans)
        assert health_of(x) == "reclaiming"
        # RESUME both at once: the pass that returns Y has read X resumed too
        slurm.run(["scontrol", "update", f"nodename={x},{y}", "state=RESUME"])
        wait(lambda: health_of(y) == "up", "Y back after Slurm's RESUME")
        assert health_of(x) == "reclaiming"  # goodput's own drain: not Slurm's to undo
        code, ans = post_json(f"{svc.url}/nodes/{x}/up", {}, admin)
        assert code == 200 and health_of(x) == "up", (code, ans)
    finally:
        svc.stop()


def test_a_drain_asked_while_a_pass_applies_slurm_s_is_goodput_s_own(tmp_path):
    """``POST /nodes/n1/drain`` landing while a pass is applying Slurm's drain of n1 (after the core
    took it, before the executor noted it as Slurm's): the drain is goodput's own, and Slurm's RESUME
    leaves n1 drained."""
    s = _core()
    store = open_store(f"sqlite:///{tmp_path / 's.db'}")
    ex = _executor(tmp_path, s, store)

    def on_nodes(d, u, dr, r):  # noqa: ANN001, ANN202
        took = node_changes(s, d, u, dr, r).took
        if "n1" in took:  # the API's request, between the core's change and the executor's note
            assert ex.node_request("n1", "drain") is None
            s.reclaim_notice(["n1"], 30.0, why="node_loss")
        return took

    ex.on_nodes = on_nodes
    ex.apply_nodes(_sinfo(drained=("n1",)))
    assert health(s, "n1") is Health.RECLAIMING and ex.drained == set()
    ex.apply_nodes(_sinfo())
    assert health(s, "n1") is Health.RECLAIMING
    store.close()
