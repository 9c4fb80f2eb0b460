"""The Checkpointer: cadence, retention, latest pointer, restore across world sizes, RNG and
data state, listeners, and preemption by signal (real processes, real signals)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import goodput.ckpt as gc
from goodput.ckpt.format.format import MANIFEST
from tests.ckpt.tmpfs import mounted_tmpfs
from tests.distributed import run_ranks
from tests.forkserver import REPO, Child, shared


def test_cadence_retention_latest_listeners(tmp_path: Path) -> None:
    ck = gc.Checkpointer(tmp_path, interval=2, keep=2, keep_every=4, mode="thread")
    events: list = []
    ck.add_listener(events.append)
    state = {"w": torch.zeros(8)}
    for step in range(1, 11):
        state["w"].fill_(step)
        h = ck.maybe_save(step, state)
        if h is not None:
            h.result()
    ck.close()
    assert [e.step for e in events] == [2, 4, 6, 8, 10]
    assert all(e.stall_s > 0 and e.write_s > 0 and e.bytes > 0 for e in events)
    dirs = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("step_"))
    assert dirs == ["step_000000004", "step_000000008", "step_000000010"]  # last 2, every 4th
    assert (tmp_path / "latest").read_text() == "step_000000010"
    assert gc.latest(tmp_path) == tmp_path / "step_000000010"
    assert len(ck.timings) == 5 and all(t.stage_s >= 0 and t.commit_s >= 0 for t in ck.timings)


def test_orphans_removed_and_newest_never_deleted(tmp_path: Path) -> None:
    gc.save({"w": torch.ones(2)}, tmp_path / "step_000000005", step=5)
    orphan = tmp_path / "step_000000007"
    orphan.mkdir()
    (orphan / "data-0123456789abcdef-r00000-0.bin").write_bytes(b"x" * 100)
    (tmp_path / "latest").write_text("step_000000007")  # a stale pointer: listing is the fallback
    ck = gc.Checkpointer(tmp_path, interval=1, keep=1, mode="thread")
    assert not orphan.exists()
    t = {"w": torch.zeros(2)}
    assert ck.restore(t) == 5 and torch.equal(t["w"], torch.ones(2))
    ck.close()
    assert (tmp_path / "step_000000005" / MANIFEST).exists()


def test_rng_and_data_state_round_trip(tmp_path: Path) -> None:
    ck = gc.Checkpointer(tmp_path, interval=1, mode="thread")
    random.seed(7)
    np.random.seed(7)
    torch.manual_seed(7)
    ck.save(3, {"w": torch.zeros(2)}, data={"epoch": 1, "index": 640}).result()
    want = (random.random(), np.random.rand(), torch.rand(1).item())
    ck.close()
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    ck2 = gc.Checkpointer(tmp_path, interval=1, mode="thread")
    data = {"epoch": 0, "index": 0}
    assert ck2.restore({"w": torch.zeros(2)}, data=data) == 3
    assert data == {"epoch": 1, "index": 640}
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == want
    ck2.close()


def _ranks_save(rank: int, world: int, root: str) -> None:
    random.seed(100 + rank)
    torch.manual_seed(100 + rank)
    ck = gc.Checkpointer(root, interval=1, mode="process")
    n = 6
    w = gc.LocalShard(torch.arange(n, dtype=torch.float32) + rank * n, (n * world,), (rank * n,))
    ck.save(9, {"w": w}, data={"index": 1000 + rank}).result()
    ck.close()


def test_restore_on_fewer_ranks_and_per_rank_state(tmp_path: Path, caplog) -> None:
    run_ranks(_ranks_save, 2, str(tmp_path))
    random.seed(100)
    torch.manual_seed(100)
    want = (random.random(), torch.rand(1).item())  # rank 0's streams at save time
    ck = gc.Checkpointer(tmp_path, interval=1, mode="thread")
    state, data = {"w": torch.zeros(12)}, {"index": 0}
    assert ck.restore(state, data=data) == 9
    assert torch.equal(state["w"], torch.arange(12, dtype=torch.float32))
    assert data == {"index": 1000}  # the new rank 0 continues old rank 0's position
    assert (random.random(), torch.rand(1).item()) == want
    ck.close()
    # rank 1's RNG and loader state are left by design: not reported as entries the state lacks
    assert not [r for r in caplog.records if "saved entr" in r.getMessage()], caplog.text


def test_auto_interval_uses_the_measured_stall(tmp_path: Path) -> None:
    from goodput.plan.interval import optimal_exact

    ck = gc.Checkpointer(tmp_path, interval="auto", mtbf="3h", mode="thread")
    state = {"w": torch.zeros(1024)}
    assert ck.current_interval_s() == 0.0  # no measurement yet: the first call saves
    ck.maybe_save(1, state).result()
    last = ck.timings[-1]
    assert ck.current_interval_s() == pytest.approx(
        max(optimal_exact(last.stall_s, 3 * 3600), last.write_s + last.commit_s)
    )
    assert ck.maybe_save(2, state) is None  # not due yet (minutes away)
    ck.close()
    with pytest.raises(ValueError, match="auto"):
        gc.Checkpointer(tmp_path, interval="auto")


def _spawn(root: Path, rank: int, world: int, init: str, *extra: str) -> Child:
    # forked from a server that imported torch once, in a session of its own as start_new_session
    return shared().popen(
        "tests.ckpt.trainer_child", [str(root), str(rank), str(world), init, *extra], cwd=REPO, stdout=subprocess.PIPE
    )


def _wait_ready(p: Child) -> int:
    line = p.stdout.readline()
    assert line.startswith("READY"), line
    return int(line.split()[1])


def test_preemption_signal_on_one_rank_saves_and_exits_75(tmp_path: Path) -> None:
    init = tempfile.mktemp(prefix="gp-pg-")
    procs = [
        _spawn(tmp_path, r, 2, init, "--interval", "1000", "--sleep", "0.01", "--elems", "1024", "--mode", "process")
        for r in range(2)
    ]
    for p in procs:
        assert _wait_ready(p) == 0
    time.sleep(1.0)
    os.kill(procs[1].pid, signal.SIGTERM)  # only rank 1 hears it; the flags all-reduce tells rank 0
    codes = [p.wait(timeout=120) for p in procs]
    assert codes == [gc.PREEMPTED_EXIT, gc.PREEMPTED_EXIT]
    path = gc.latest(tmp_path)
    assert path is not None
    ck = gc.open(path)
    step = ck.step
    assert step is not None and step > 1 and ck.values["meta.step"] == step
    w = ck.read("w")
    assert (w[:1024] == step * 10).all() and (w[1024:] == step * 10 + 1).all()
    # and the job resumes from it
    init2 = tempfile.mktemp(prefix="gp-pg-")
    procs = [_spawn(tmp_path, r, 2, init2, "--steps", str(step + 2), "--elems", "1024") for r in range(2)]
    assert [_wait_ready(p) for p in procs] == [step, step]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    assert gc.open(gc.latest(tmp_path)).step == step + 2


def _skip_agreement(rank: int, world: int, root: str) -> list[int]:
    ck = gc.Checkpointer(root, interval=1, keep=None, mode="process", if_busy="skip")
    if rank == 0:
        ck.add_listener(lambda ev: time.sleep(0.3))  # rank 0 finishes its saves later than rank 1
    saved = []
    for step in range(1, 9):
        h = ck.maybe_save(step, {"w": gc.LocalShard(torch.full((4,), float(step)), (4 * world,), (4 * rank,))})
        if h is not None:
            saved.append(step)
        time.sleep(0.05)
    ck.close()
    return saved


def test_skip_policy_is_decided_by_all_ranks_together(tmp_path: Path) -> None:
    saved = run_ranks(_skip_agreement, 2, str(tmp_path), timeout=120)
    assert saved[0] == saved[1] and saved[0]  # no hang, and the same saves on both ranks
    for s in saved[0]:
        ck = gc.open(tmp_path / f"step_{s:09d}")
        assert (ck.read("w") == s).all()


def test_retention_keeps_foreign_checkpoints_and_follows_newer_commits(tmp_path: Path) -> None:
    gc.save({"w": torch.ones(2)}, tmp_path / "best_model", step=5)
    ck = gc.Checkpointer(tmp_path, interval=1, keep=1, mode="thread")
    for s in (10, 20, 30):
        ck.save(s, {"w": torch.full((2,), float(s))}).result()
    ck.close()
    assert (tmp_path / "best_model" / MANIFEST).exists()  # not a step directory: not ours to delete
    (tmp_path / "latest").write_text("step_000000020")  # as if the pointer update was lost
    assert gc.latest(tmp_path) == tmp_path / "step_000000030"


def test_preempted_flag_marks_only_the_signal_save(tmp_path: Path) -> None:
    ck = gc.Checkpointer(tmp_path, interval=1, mode="thread", exit_on_preempt=False)
    events: list = []
    ck.add_listener(events.append)
    state = {"w": torch.zeros(4)}
    ck.maybe_save(1, state)
    ck._on_signal(signal.SIGTERM, None)
    ck.maybe_save(2, state)
    assert [(e.step, e.preempted) for e in events] == [(1, False), (2, True)]


def test_lazy_staging_through_the_checkpointer(tmp_path: Path) -> None:
    """staging="lazy" with protect(): each checkpoint holds exactly its step's state, although
    training went on while it was copied."""
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    ck = gc.Checkpointer(tmp_path, interval=3, keep=None, mode="thread", staging="lazy", if_busy="wait")
    ck.protect(opt)
    snapshots = {}
    for step in range(1, 10):
        opt.zero_grad()
        model(torch.randn(8, 64)).pow(2).mean().backward()
        opt.step()
        state = {"model": model.state_dict()}
        if ck.maybe_save(step, state) is not None:
            snapshots[step] = {k: v.clone() for k, v in model.state_dict().items()}
    ck.close()
    assert sorted(snapshots) == [3, 6, 9]
    for step, want in snapshots.items():
        got = {"model": {k: torch.zeros_like(v) for k, v in want.items()}}
        gc.load(got, tmp_path / f"step_{step:09d}")
        assert all(torch.equal(got["model"][k], v) for k, v in want.items()), step


def test_data_state_with_other_keys_is_what_the_checkpoint_holds(tmp_path: Path, caplog) -> None:
    """A data dict whose keys differ from the saved ones (a loader keyed by rank, after a
    resize) does not fail the resume: the weights load, the dict holds what was saved (its own
    keys the checkpoint lacks are gone, so its owner sees them missing), and a warning says so."""
    ck = gc.Checkpointer(tmp_path, interval=1, mode="thread", save_rng=False)
    saved = {"dp_rank_0": b"\x80pos=7", "epoch": 2, "gen": {"seed": torch.arange(3)}}
    ck.save(4, {"w": torch.full((3,), 4.0)}, data=saved).result()
    ck.close()
    ck2 = gc.Checkpointer(tmp_path, interval=1, mode="thread")
    state, data = {"w": torch.zeros(3)}, {"dp_rank_1": b"", "epoch": 0}
    with caplog.at_level("WARNING", logger="goodput.ckpt"):
        assert ck2.restore(state, data=data) == 4
    ck2.close()
    assert torch.equal(state["w"], torch.full((3,), 4.0))
    assert data.keys() == {"dp_rank_0", "epoch", "gen"} and data["dp_rank_0"] == b"\x80pos=7" and data["epoch"] == 2
    assert torch.equal(data["gen"]["seed"], torch.arange(3))
    (msg,) = [r.getMessage() for r in caplog.records if "data loader" in r.getMessage()]
    assert "lacks 'dp_rank_1'" in msg and "'dp_rank_0'" in msg and "'gen.seed'" in msg


def test_a_save_below_a_committed_step_is_refused_before_retention_deletes_it(tmp_path: Path) -> None:
    """A run started again from step 0 in an old run's directory (or rolled back): with keep=2,
    each new save was the oldest and retention deleted it as it committed, and a restore went back
    to the old run's step 10, both in silence."""
    old = gc.Checkpointer(tmp_path, interval=1, keep=2, mode="thread")
    for step in (9, 10):
        old.save(step, {"w": torch.full((4,), float(step))}).result()
    old.close()
    new = gc.Checkpointer(tmp_path, interval=1, keep=2, mode="thread")
    with pytest.raises(gc.CheckpointError, match=r"save of step 1 refused: step 10 is already committed"):
        new.save(1, {"w": torch.zeros(4)})
    with pytest.raises(gc.CheckpointError, match="move the step directories above 3"):
        new.maybe_save(3, {"w": torch.zeros(4)})
    assert new.save(10, {"w": torch.full((4,), 10.0)}).result()  # the same step again: replaced
    assert new.save(11, {"w": torch.full((4,), 11.0)}).result()
    with pytest.raises(gc.CheckpointError, match="step 11 is already committed"):
        new.save(5, {"w": torch.zeros(4)})  # below this run's own saves too
    new.close()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("step_")) == [
        "step_000000010",
        "step_000000011",
    ]
    fresh = gc.Checkpointer(tmp_path / "elsewhere", interval=1, keep=2, mode="thread")
    assert fresh.save(1, {"w": torch.zeros(4)}).result()  # an empty directory: any step
    fresh.close()


def _save_behind(rank: int, world: int, root: str) -> str:
    ck = gc.Checkpointer(root, interval=1, keep=2, mode="thread")
    try:
        ck.save(2, {"w": gc.LocalShard(torch.zeros(4), (4 * world,), (4 * rank,))})
    except gc.CheckpointError as e:
        return str(e)
    finally:
        ck.close()
    return "saved"


def test_every_rank_refuses_a_save_behind_the_root_together(tmp_path: Path) -> None:
    gc.save({"w": torch.ones(8)}, tmp_path / "step_000000007", step=7)
    said = run_ranks(_save_behind, 2, str(tmp_path), timeout=120)
    assert all("save of step 2 refused: step 7" in s for s in said), said


def test_retention_that_cannot_remove_a_checkpoint_says_so_and_uncommits_it_first(tmp_path: Path, caplog) -> None:
    """A removal that fails (here: a busy mount point inside the step directory, EBUSY) was
    ignored in silence (rmtree(ignore_errors=True)): retention stopped and the disk filled with no
    word. It is logged now, and the manifest goes first, so what is left is never a committed
    checkpoint with data files missing; once removable, the next commit's cleanup takes it."""
    ck = gc.Checkpointer(tmp_path, interval=1, keep=1, mode="thread")
    ck.save(1, {"w": torch.ones(4)}).result()
    try:
        with mounted_tmpfs(tmp_path / "step_000000001" / "busy", "64k"):
            ck.save(2, {"w": torch.full((4,), 2.0)}).result()
            ck.wait()
            said = [r.getMessage() for r in caplog.records]
            assert any("could not remove" in m and "step_000000001" in m for m in said), said
            assert not (tmp_path / "step_000000001" / MANIFEST).exists()  # uncommitted, not torn
            assert gc.latest(tmp_path) == tmp_path / "step_000000002"
    except BaseException:
        ck.close()
        raise
    ck.save(3, {"w": torch.full((4,), 3.0)}).result()
    ck.close()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("step_")) == ["step_000000003"]


def test_a_restore_that_leaves_the_loader_where_it_is_says_so(tmp_path: Path, caplog) -> None:
    """A checkpoint saved without data= restored with a loader (or the other way round): the
    loader silently started over (or its saved place was never read)."""
    ck = gc.Checkpointer(tmp_path / "a", interval=1, mode="thread")
    ck.close(3, {"w": torch.ones(2)})  # no data=
    ck = gc.Checkpointer(tmp_path / "a", interval=1, mode="thread")
    loader = {"pos": 0}
    assert ck.restore({"w": torch.zeros(2)}, data=loader) == 3 and loader == {"pos": 0}
    ck.close()
    assert "holds no data loader state for rank 0 (saved without data=)" in caplog.text
    caplog.clear()
    ck = gc.Checkpointer(tmp_path / "b", interval=1, mode="thread")
    ck.close(4, {"w": torch.ones(2)}, data={"pos": 9})
    ck = gc.Checkpointer(tmp_path / "b", interval=1, mode="thread")
    assert ck.restore({"w": torch.zeros(2)}) == 4
    ck.close()
    assert "holds the data loader's state, but restore was given no data=" in caplog.text
    caplog.clear()
    ck = gc.Checkpointer(tmp_path / "b", interval=1, mode="thread")
    loader = {"pos": 0}
    assert ck.restore({"w": torch.zeros(2)}, data=loader) == 4 and loader == {"pos": 9}
    ck.close()
    assert "data loader" not in caplog.text
