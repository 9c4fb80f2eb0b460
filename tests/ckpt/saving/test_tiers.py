"""A tiered Checkpointer: commit on a fast tier, drain to a durable one, restore from the fastest.

Nodes are simulated by giving each rank its own fast directory (a node-local NVMe or /dev/shm is
a different directory on every node); the durable tier is one directory every rank sees.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import warnings
from pathlib import Path

import pytest
import torch

import goodput.ckpt as gc
from goodput.ckpt.format.format import MANIFEST
from goodput.ckpt.loading.reader import DamagedCheckpointWarning
from goodput.ckpt.saving.tiers import drained_name, durable_state, fast_committed
from tests.distributed import run_ranks
from tests.forkserver import REPO, shared


def _tiered(tmp: Path, **kw) -> gc.Checkpointer:
    kw.setdefault("mode", "thread")
    kw.setdefault("interval", 1)
    return gc.Checkpointer(tmp / "durable", fast=tmp / "fast", **kw)


def _steps(root: Path) -> list[int]:
    return sorted(int(p.name.split("_")[1]) for p in root.glob("step_*") if (p / MANIFEST).exists())


def test_fast_commit_then_drain_each_tier_with_its_own_retention(tmp_path: Path) -> None:
    events: list[gc.CommitEvent] = []
    ck = _tiered(tmp_path, fast_keep=2, keep=None, keep_every=2)
    ck.add_listener(events.append)
    state = {"w": torch.zeros(1000)}
    for step in range(1, 6):
        state["w"].fill_(step)
        ck.save(step, state).result()
    assert ck.wait_drained(60)
    ck.close()
    fast = [(e.step, e.tier) for e in events if e.tier == "fast"]
    durable = [(e.step, e.tier) for e in events if e.tier == "durable"]
    assert fast == [(s, "fast") for s in range(1, 6)]
    assert sorted(durable) == [(s, "durable") for s in range(1, 6)]
    # every fast event comes before its step's durable one, and names the tier's directory
    for e in events:
        assert Path(e.path).parent == tmp_path / ("fast" if e.tier == "fast" else "durable")
    assert _steps(tmp_path / "fast") == [4, 5]  # fast_keep=2
    assert _steps(tmp_path / "durable") == [2, 4, 5]  # keep_every=2, and the newest
    assert (tmp_path / "durable" / "latest").read_text().strip() == "step_000000005"
    # nothing of the protocol is left behind on the durable tier
    leftovers = [p.name for p in (tmp_path / "durable").rglob(".goodput-*")]
    assert leftovers == []


def test_restore_prefers_the_fast_tier_and_falls_back_when_it_is_wiped(tmp_path: Path) -> None:
    ck = _tiered(tmp_path)
    for step in (1, 2):
        ck.save(step, {"w": torch.full((256,), float(step))}).result()
    ck.close()
    state = {"w": torch.zeros(256)}
    ck = _tiered(tmp_path)
    assert ck.restore(state) == 2 and ck.restored_tier == "fast"
    assert torch.equal(state["w"], torch.full((256,), 2.0))
    ck.close()
    shutil.rmtree(tmp_path / "fast")
    state = {"w": torch.zeros(256)}
    ck = _tiered(tmp_path)
    assert ck.restore(state) == 2 and ck.restored_tier == "durable"
    assert torch.equal(state["w"], torch.full((256,), 2.0))
    ck.close()


def test_losing_the_fast_tier_costs_only_what_was_not_drained(tmp_path: Path) -> None:
    """drain_every=2: steps 1 and 3 are on the fast tier only, so a lost fast tier falls back to 2."""
    ck = _tiered(tmp_path, drain_every=2, fast_keep=3)
    for step in (1, 2, 3):
        ck.save(step, {"w": torch.full((64,), float(step))}).result()
    ck.close()
    assert _steps(tmp_path / "durable") == [2]
    assert _steps(tmp_path / "fast") == [1, 2, 3]
    state = {"w": torch.zeros(64)}
    ck = _tiered(tmp_path, drain_every=2)
    assert ck.restore(state) == 3 and ck.restored_tier == "fast"
    ck.close()
    shutil.rmtree(tmp_path / "fast")
    state = {"w": torch.zeros(64)}
    ck = _tiered(tmp_path, drain_every=2)
    assert ck.restore(state) == 2 and ck.restored_tier == "durable"
    assert torch.equal(state["w"], torch.full((64,), 2.0))
    ck.close()


def test_a_damaged_fast_copy_is_caught_by_its_checksum_and_the_durable_one_is_read(tmp_path: Path) -> None:
    ck = _tiered(tmp_path)
    ck.save(1, {"w": torch.arange(4096.0)}).result()
    ck.close()
    (data,) = (tmp_path / "fast" / "step_000000001").glob("data-*.bin")
    raw = bytearray(data.read_bytes())
    raw[100] ^= 0xFF
    data.write_bytes(bytes(raw))
    state = {"w": torch.zeros(4096)}
    ck = _tiered(tmp_path)
    assert ck.restore(state) == 1 and ck.restored_tier == "durable"
    assert torch.equal(state["w"], torch.arange(4096.0))
    ck.close()


def test_bad_tier_settings_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="fast_keep"):
        gc.Checkpointer(tmp_path / "d", fast=tmp_path / "f", fast_keep=0)
    with pytest.raises(ValueError, match="drain_every"):
        gc.Checkpointer(tmp_path / "d", fast=tmp_path / "f", drain_every=0)
    with pytest.raises(ValueError, match="local directory"):
        gc.Checkpointer(tmp_path / "d", fast="s3://bucket/fast")


# ---------------------------------------------------------------- two ranks, two "nodes"


def _node_ck(rank: int, tmp: Path, **kw) -> gc.Checkpointer:
    return gc.Checkpointer(tmp / "durable", fast=tmp / f"node{rank}", interval=1, mode="thread", **kw)


def _shard(rank: int, step: int) -> dict:
    t = torch.full((512,), float(step * 10 + rank))
    return {"w": gc.LocalShard(t, (1024,), (512 * rank,))}


def _save_two(rank: int, world: int, tmp: str, steps: list[int], drain_every: int | None) -> None:
    ck = _node_ck(rank, Path(tmp), drain_every=drain_every, fast_keep=5)
    for s in steps:
        ck.save(s, _shard(rank, s)).result()
    assert ck.wait_drained(60)
    ck.close()


def _restore_two(rank: int, world: int, tmp: str, drain_every: int | None) -> tuple:
    ck = _node_ck(rank, Path(tmp), drain_every=drain_every)
    state = {"w": gc.LocalShard(torch.zeros(512), (1024,), (512 * rank,))}
    step = ck.restore(state)
    tier = ck.restored_tier
    ck.close()
    return step, tier, float(state["w"].tensor[0])


def test_two_nodes_one_replaced_mixes_tiers_per_file_or_falls_back(tmp_path: Path) -> None:
    run_ranks(_save_two, 2, str(tmp_path), [1, 2, 3], 2)  # 2 drained; 1 and 3 on the nodes only
    assert _steps(tmp_path / "durable") == [2]
    assert _steps(tmp_path / "node0") == _steps(tmp_path / "node1") == [1, 2, 3]
    # the same nodes: the newest, from the fast tier alone
    assert run_ranks(_restore_two, 2, str(tmp_path), 2) == [(3, "fast", 30.0), (3, "fast", 31.0)]
    # node 1 replaced (its fast tier is empty): step 3 cannot be read whole anywhere (rank 1's
    # file of it was never drained), so step 2 it is, rank 0's file from its node, rank 1's from
    # the durable tier
    shutil.rmtree(tmp_path / "node1")
    got = run_ranks(_restore_two, 2, str(tmp_path), 2)
    assert got == [(2, "fast+durable", 20.0), (2, "fast+durable", 21.0)]


def test_an_undrained_step_is_restored_on_new_nodes_from_what_each_tier_holds(tmp_path: Path) -> None:
    """Step 3 is not drained, but rank 0 reshards onto a world of one: it needs both ranks' files,
    and finds rank 0's on its node; rank 1's node is gone, so the step falls back to 2."""
    run_ranks(_save_two, 2, str(tmp_path), [2, 3], 2)
    shutil.rmtree(tmp_path / "node1")
    ck = gc.Checkpointer(tmp_path / "durable", fast=tmp_path / "node0", mode="thread", drain_every=2)
    state = {"w": torch.zeros(1024)}
    assert ck.restore(state) == 2 and ck.restored_tier == "fast+durable"
    assert state["w"][0] == 20.0 and state["w"][-1] == 21.0
    ck.close()
    # both halves of the durable directory of step 3 are what a restore on new nodes reads
    assert 3 in durable_state(tmp_path / "durable") and not durable_state(tmp_path / "durable")[3][2]


# ---------------------------------------------------------------- a crash during the drain


def test_sigkill_during_the_drain_loses_nothing_committed(tmp_path: Path) -> None:
    fast, durable = tmp_path / "fast", tmp_path / "durable"
    n = 1 << 18
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # 1 MiB per save at 256 KiB/s: each drain takes about 4 s, so the kill lands inside one;
    # the trainer is forked from a server that imported torch once, in this process's group
    log = tmp_path / "trainer.log"
    with open(log, "w") as err:
        p = shared().popen(
            "tests.ckpt.trainer_child",
            [str(durable), "0", "1", "-", "--steps", "100000", "--interval", "20", "--elems", str(n),
             "--sleep", "0.05", "--fast", str(fast), "--drain-rate", "256KiB/s"],
            env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=err, new_session=False,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            st = durable_state(durable)
            drained = [s for s, (_, _, c) in st.items() if c]
            undrained = [s for s, (sid, _, c) in st.items() if not c and _draining(durable, s, sid)]
            if drained and undrained and max(undrained) > max(drained):
                break
            assert p.poll() is None, log.read_text()[-3000:]
            time.sleep(0.05)
        else:
            pytest.fail("no drain in progress after a first durable commit")
        os.kill(p.pid, signal.SIGKILL)
        p.wait(30)
    finally:
        if p.poll() is None:
            p.kill()
    committed_durable = _steps(durable)
    newest_fast = max(fast_committed(fast))
    assert committed_durable and newest_fast > max(committed_durable)
    # the restart restores the newest from the fast tier, and finishes the drain the kill cut short
    ck = gc.Checkpointer(durable, fast=fast, mode="thread", interval=1)
    state = {"w": gc.LocalShard(torch.zeros(n), (n,), (0,)), "meta": {"step": 0}}
    assert ck.restore(state) == newest_fast and ck.restored_tier == "fast"
    assert state["meta"]["step"] == newest_fast and float(state["w"].tensor[0]) == newest_fast * 10.0
    assert ck.wait_drained(60)
    ck.close()
    assert newest_fast in _steps(durable)
    # and what the durable tier held at the kill is loadable on its own
    shutil.rmtree(fast)
    for s in committed_durable:
        if s in _steps(durable):
            gc.load({"w": torch.zeros(n), "meta": {"step": 0}}, durable / f"step_{s:09d}")


def _draining(durable: Path, step: int, save_id: str) -> bool:
    d = durable / f"step_{step:09d}"
    return any(d.glob("data-*.bin")) and not (d / drained_name(save_id, 0)).exists()


def test_the_drain_is_bounded_by_its_rate(tmp_path: Path) -> None:
    """Not a speed goal: the limiter's own account (bytes over seconds) stays under the rate."""
    ck = _tiered(tmp_path, drain_rate="2MiB/s")
    ck.save(1, {"w": torch.zeros(1 << 20)}).result()  # 4 MiB
    assert ck.wait_drained(60)
    (out,) = ck.drainer.history
    ck.close()
    assert out.ok and out.bytes >= 4 << 20
    assert out.bytes / out.drain_s <= 2 * (1 << 20) * 1.05


def test_untiered_commit_events_say_durable(tmp_path: Path) -> None:
    events: list[gc.CommitEvent] = []
    ck = gc.Checkpointer(tmp_path, interval=1, mode="thread")
    ck.add_listener(events.append)
    ck.save(1, {"w": torch.zeros(4)}).result()
    ck.close()
    assert [e.tier for e in events] == ["durable"]


def _shared_node(rank: int, world: int, tmp: str) -> tuple:
    """Both ranks on one node: one fast directory, each rank draining only its own files."""

    def ck() -> gc.Checkpointer:
        return gc.Checkpointer(Path(tmp) / "durable", fast=Path(tmp) / "node", interval=1, mode="thread", fast_keep=1)

    c = ck()
    for s in (1, 2, 3):
        c.save(s, _shard(rank, s)).result()
    assert c.wait_drained(60)
    c.close()
    c = ck()
    state = {"w": gc.LocalShard(torch.zeros(512), (1024,), (512 * rank,))}
    step = c.restore(state)
    c.close()
    return step, c.restored_tier, float(state["w"].tensor[0])


def test_ranks_sharing_a_node_share_its_fast_directory(tmp_path: Path) -> None:
    assert run_ranks(_shared_node, 2, str(tmp_path)) == [(3, "fast", 30.0), (3, "fast", 31.0)]
    assert _steps(tmp_path / "node") == [3] and _steps(tmp_path / "durable") == [1, 2, 3]
    (fast_dir,) = (tmp_path / "node").glob("step_*")
    assert len(list(fast_dir.glob("data-*.bin"))) == 2  # both ranks' files, one manifest


def test_a_state_no_checkpoint_fits_fails_the_restore_instead_of_starting_afresh(tmp_path: Path) -> None:
    ck = _tiered(tmp_path)
    ck.save(1, {"w": torch.zeros(64)}).result()
    ck.close()
    ck = _tiered(tmp_path)
    with pytest.raises(
        gc.CheckpointError,
        match=r"could be restored.*step 1 \(each file from the fastest tier holding it\).*global shape",
    ):
        ck.restore({"w": torch.zeros(65)})
    ck.close()


def test_a_step_saved_again_after_a_fallback_replaces_the_abandoned_one(tmp_path: Path) -> None:
    ck = _tiered(tmp_path, fast_keep=3)
    for step in (1, 2):
        ck.save(step, {"w": torch.full((4096,), float(step))}).result()
    assert ck.wait_drained(60)
    ck.close()
    for tier in ("fast", "durable"):  # step 2 damaged on both tiers
        (f,) = (tmp_path / tier / "step_000000002").glob("data-*.bin")
        raw = bytearray(f.read_bytes())
        raw[10] ^= 1
        f.write_bytes(bytes(raw))
    ck = _tiered(tmp_path, fast_keep=3)
    state = {"w": torch.zeros(4096)}
    assert ck.restore(state) == 1 and ck.restored_tier == "fast"
    assert _steps(tmp_path / "fast") == [1]  # the abandoned step 2 is gone from the fast tier
    ck.save(2, {"w": torch.full((4096,), 22.0)}).result()
    assert ck.wait_drained(60)
    ck.close()
    # the durable step 2 is the new save, and the old save's files went with its manifest
    (data,) = (tmp_path / "durable" / "step_000000002").glob("data-*.bin")
    assert len(list((tmp_path / "durable" / "step_000000002").glob("metadata-*.bin"))) == 1
    shutil.rmtree(tmp_path / "fast")
    state = {"w": torch.zeros(4096)}
    ck = _tiered(tmp_path)
    assert ck.restore(state) == 2 and torch.equal(state["w"], torch.full((4096,), 22.0))
    ck.close()
    assert data.exists()


def test_a_preemption_drains_its_own_step_first_and_unbounded(tmp_path: Path) -> None:
    """Three saves queued behind a drain bounded to 64 KiB/s (1 MiB each: 16 s apiece); the
    preemption's save skips the queue and drains at once."""
    ck = _tiered(tmp_path, drain_rate="64KiB/s", exit_on_preempt=False, fast_keep=1)
    state = {"w": torch.zeros(1 << 18)}
    for step in (1, 2, 3):
        ck.save(step, state).result()
    ck.preempt_now(4, state)  # saves step 4, waits for its fast commit, hurries the drain, closes
    assert 4 in _steps(tmp_path / "durable")
    skipped = [o for o in ck.drainer.history if not o.ok]
    assert skipped and all("preemption" in (o.error or "") for o in skipped)
    assert {o.drain.step for o in ck.drainer.history if o.ok} >= {4}


@pytest.mark.parametrize("saved_before", [False, True])
def test_a_preemption_at_a_step_not_due_for_the_drain_drains_it(tmp_path: Path, saved_before: bool) -> None:
    ck = _tiered(tmp_path, drain_every=1000, exit_on_preempt=False)
    state = {"w": torch.ones(64)}
    if saved_before:  # the notice came right after a save of this very step
        ck.save(7, state).result()
    ck.preempt_now(7, state)
    assert _steps(tmp_path / "durable") == [7]


# ---------------------------------------------------------------- a damaged durable manifest


def _flip_manifest(d: Path) -> None:  # one sealed byte changed: the seal no longer matches
    raw = (d / MANIFEST).read_bytes()
    (d / MANIFEST).write_bytes(raw.replace(b'"world_size":1', b'"world_size":2'))


def _three_drained(tmp: Path) -> None:
    ck = _tiered(tmp, keep=None, fast_keep=3)
    for step in (1, 2, 3):
        ck.save(step, {"w": torch.full((64,), float(step))}).result()
    assert ck.wait_drained(60)
    ck.close()


def test_durable_state_says_which_manifest_it_cannot_read(tmp_path: Path) -> None:
    """As latest(): a damaged durable step is left out with a DamagedCheckpointWarning naming it
    and why, never silently (it is not a step that was never saved)."""
    _three_drained(tmp_path)
    _flip_manifest(tmp_path / "durable" / "step_000000003")
    with pytest.warns(DamagedCheckpointWarning, match="step_000000003.*checksum does not match"):
        st = durable_state(tmp_path / "durable")
    assert sorted(st) == [1, 2] and all(c for _, _, c in st.values())
    damaged: list = []  # and the tiered restore is told which
    with pytest.warns(DamagedCheckpointWarning):
        durable_state(tmp_path / "durable", damaged)
    assert [(d.path.name, "checksum does not match" in d.reason) for d in damaged] == [("step_000000003", True)]


def test_tiered_restore_refuses_to_resume_before_a_damaged_durable_step(tmp_path: Path) -> None:
    """The fast tier lost (new nodes), durable step 3 damaged: resuming from step 2 would save
    step 3 over it, so the restore refuses, naming it, as an untiered one does; moved away, the
    restore goes on from step 2. A damaged step older than one that loads stops nothing."""
    _three_drained(tmp_path)
    shutil.rmtree(tmp_path / "fast")
    durable = tmp_path / "durable"
    _flip_manifest(durable / "step_000000003")
    state = {"w": torch.zeros(64)}
    ck = _tiered(tmp_path)
    with (
        pytest.warns(DamagedCheckpointWarning, match="step_000000003"),
        pytest.raises(gc.CheckpointError, match="step_000000003.*would save over it"),
    ):
        ck.restore(state)
    ck.close()
    assert state["w"][0].item() == 0.0 and (durable / "step_000000003" / MANIFEST).exists()
    (durable / "step_000000003").rename(tmp_path / "kept-aside")
    _flip_manifest(durable / "step_000000001")
    ck = _tiered(tmp_path)
    with pytest.warns(DamagedCheckpointWarning, match="step_000000001"):
        assert ck.restore(state) == 2 and ck.restored_tier == "durable"
    ck.close()
    assert state["w"][0].item() == 2.0


def _restore_refused(rank: int, world: int, tmp: str) -> str:
    ck = _node_ck(rank, Path(tmp), drain_every=None)
    try:
        ck.restore({"w": gc.LocalShard(torch.zeros(512), (1024,), (512 * rank,))})
    except gc.CheckpointError as e:
        return f"{type(e).__name__}: {e}"
    finally:
        ck.close()
    return "restored"


def test_every_rank_hears_the_refusal(tmp_path: Path) -> None:
    """Rank 0 alone lists the durable tier; the others raise its refusal with it, none hangs."""
    run_ranks(_save_two, 2, str(tmp_path), [1, 2], None)
    for node in ("node0", "node1"):
        shutil.rmtree(tmp_path / node)
    (tmp_path / "durable" / "step_000000002" / MANIFEST).write_bytes(b"{")
    said = run_ranks(_restore_refused, 2, str(tmp_path), timeout=120)
    assert all("step_000000002" in s and "would save over it" in s for s in said), said
    assert said[0].startswith("CheckpointError") and "refused on rank 0" in said[1]


def test_a_fast_manifest_that_cannot_be_read_is_said_and_the_durable_copy_restores(tmp_path: Path) -> None:
    """The fast tier is a copy, but its damage is never silent: the step is left to the durable
    tier with a DamagedCheckpointWarning naming the fast directory and why."""
    _three_drained(tmp_path)
    _flip_manifest(tmp_path / "fast" / "step_000000003")
    with pytest.warns(DamagedCheckpointWarning, match=r"fast.*step_000000003.*left to the durable tier"):
        assert sorted(fast_committed(tmp_path / "fast")) == [1, 2]
    state = {"w": torch.zeros(64)}
    ck = _tiered(tmp_path, keep=None, fast_keep=3)
    with pytest.warns(DamagedCheckpointWarning, match="step_000000003"):
        assert ck.restore(state) == 3
    assert torch.equal(state["w"], torch.full((64,), 3.0))  # the durable manifest; files checked per tier
    with warnings.catch_warnings():  # the fast tier's retention at close says it once more
        warnings.simplefilter("ignore", DamagedCheckpointWarning)
        ck.close()


def test_start_up_keeps_every_fast_commit_a_crash_left_undrained(tmp_path: Path) -> None:
    """A run killed with drains queued leaves fast commits not yet drained. Start-up retention
    kept only the newest ``fast_keep`` of them (nothing is pending in a new process), so when that
    newest was damaged the restore found the older ones gone and fell back to the durable tier:
    three steps lost. Now start-up keeps every fast commit; the restore takes the newest that
    loads, and the first commit after it applies ``fast_keep``."""
    import sys
    import textwrap

    fast, durable = tmp_path / "fast", tmp_path / "durable"
    n = 1 << 16  # 256 KiB a save, drained at 16 KiB/s: 16 s each, so steps 3-5 are still queued
    ck = gc.Checkpointer(durable, fast=fast, mode="thread", interval=1, fast_keep=1)
    ck.save(1, {"w": torch.full((n,), 1.0)}).result()
    assert ck.wait_drained(60)
    ck.close()
    child = textwrap.dedent(f"""
        import os, signal, torch, goodput.ckpt as gc
        ck = gc.Checkpointer({str(durable)!r}, fast={str(fast)!r}, mode="thread", interval=1, fast_keep=1,
                             drain_rate="16KiB/s")
        st = {{"w": torch.zeros({n})}}
        assert ck.restore(st) == 1
        for s in range(2, 6):
            st["w"].fill_(s)
            ck.save(s, st).result()
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    r = subprocess.run([sys.executable, "-c", child], env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert r.returncode == -signal.SIGKILL
    assert sorted(fast_committed(fast)) == [2, 3, 4, 5]
    assert _steps(durable) == [1]
    (data,) = (fast / "step_000000005").glob("data-*.bin")
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))
    ck = gc.Checkpointer(durable, fast=fast, mode="thread", interval=1, fast_keep=1)
    assert sorted(fast_committed(fast)) == [2, 3, 4, 5]  # start-up removed none of them
    state = {"w": torch.zeros(n)}
    assert ck.restore(state) == 4 and ck.restored_tier == "fast"
    assert torch.equal(state["w"], torch.full((n,), 4.0))
    state["w"].fill_(5.0)
    ck.save(5, state).result()
    assert ck.wait_drained(60)
    ck.close()
    assert _steps(fast) == [5]  # fast_keep=1 again from the first commit on


def test_a_durable_commit_of_an_older_step_is_not_reported_as_the_newest(tmp_path: Path) -> None:
    """A skipped save reports the newest commit's step and age: a drain finishing step 1 after
    step 5 committed on the fast tier made the report say step 1."""
    ck = _tiered(tmp_path, if_busy="skip", drain_rate="4MiB/s")
    events: list[gc.CommitEvent] = []
    ck.add_listener(events.append, skipped=True)
    small = {"w": torch.zeros(1 << 18)}  # 1 MiB: a quarter of a second to drain each
    for s in range(1, 6):
        ck.save(s, small).result()
    deadline = time.monotonic() + 60
    while not any(e.tier == "durable" and e.kind == "commit" for e in events):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    big = {"w": torch.zeros(1 << 18), "big": torch.zeros(1 << 22)}  # 16 MiB: still being written at the next
    ck.maybe_save(6, big)
    assert ck.maybe_save(7, big) is None
    skips = [e for e in events if e.kind == "skipped"]
    assert [(e.step, e.newest_step) for e in skips] == [(7, 5)]
    assert ck.wait_drained(120)
    ck.close()
