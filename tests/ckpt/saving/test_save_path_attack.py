"""A hostile user's attacks on the save path (issue 25: nothing lost in silence). Real savers,
real writer threads and processes, real files, real gloo ranks."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import goodput.ckpt as gc
from goodput.ckpt.format.format import MANIFEST
from goodput.ckpt.saving.background import SLOW_WRITE_ENV
from tests.ckpt.tmpfs import mounted_tmpfs
from tests.distributed import run_ranks


def elsewhere(fn: Any) -> None:
    """Run ``fn`` to completion on another thread (no copy-first mode there)."""
    t = threading.Thread(target=fn)
    t.start()
    t.join()


def _failed_lazy_save(ck: gc.Checkpointer, step: int, w: torch.Tensor) -> Any:
    """A save that fails behind the loop: its lazy copy is held back while another thread changes
    the tensor in place (detect and fail)."""
    ck.saver._lazy_gate = threading.Event()
    h = ck.save(step, {"w": w})
    elsewhere(lambda: w.add_(1))
    ck.saver._lazy_gate.set()
    ck.saver._lazy_gate = None
    with pytest.raises(gc.SaveError, match="'w'"):
        h.result()
    return h


def test_a_failed_save_before_a_preemption_is_reported_not_swallowed(tmp_path: Path, caplog) -> None:
    """The preemption save goes on after an earlier save failed, but the failure is said: it was
    the only word of that step's loss (its handle may never be read)."""
    ck = gc.Checkpointer(tmp_path, interval=1000, mode="thread", staging="lazy", exit_on_preempt=False)
    w = torch.zeros(1 << 16)  # 256 KiB: copied lazily
    ck.save(1, {"w": w}).result()
    _failed_lazy_save(ck, 2, w)
    with caplog.at_level(logging.WARNING, logger="goodput.ckpt"):
        os.kill(os.getpid(), signal.SIGUSR1)
        deadline = time.monotonic() + 5
        while not ck.preempt_requested and time.monotonic() < deadline:
            time.sleep(0.01)
        assert ck.maybe_save(3, {"w": w}) is None  # preempted: saved step 3, closed
    assert gc.latest(tmp_path).name == "step_000000003"
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("step 2" in m and "'w'" in m for m in said), said


class _BrokenLoader:
    """A data loader whose ``state_dict()`` fails on one rank only."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def state_dict(self) -> dict:
        if self.rank == 1:
            raise RuntimeError("loader state unavailable on rank 1")
        return {"pos": 3}

    def load_state_dict(self, sd: dict) -> None:
        pass


def _save_with_a_broken_loader(rank: int, world: int, root: str) -> str:
    ck = gc.Checkpointer(root, interval=1000, mode="thread", data=_BrokenLoader(rank))
    try:
        ck.save(1, {"w": gc.LocalShard(torch.ones(4), (4 * world,), (4 * rank,))}).result()
        out = "no error"
    except Exception as e:  # noqa: BLE001 - the text is the result
        out = f"{type(e).__name__}: {e}"
    ck.close()
    return out


def test_a_loader_failing_on_one_rank_fails_every_rank_without_hanging(tmp_path: Path) -> None:
    """The Checkpointer gathers the loader's and the RNG's state before the save's planning
    collective: an error there on one rank must reach every rank, not leave the others waiting
    in the collective for the one that raised."""
    msgs = run_ranks(_save_with_a_broken_loader, 2, str(tmp_path), timeout=120)
    for m in msgs:
        assert "rank 1" in m and "loader state unavailable" in m, msgs
    assert gc.latest(tmp_path) is None
    assert not list(tmp_path.glob(f"step_*/{MANIFEST}"))


def _interrupt_soon(delay: float) -> threading.Timer:
    """Ctrl-C (SIGINT to this process: the main thread's KeyboardInterrupt) after ``delay`` s."""
    t = threading.Timer(delay, os.kill, args=(os.getpid(), signal.SIGINT))
    t.start()
    return t


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals reach the main thread")
def test_ctrl_c_while_a_step_waits_for_the_lazy_copy_stops_the_loop(tmp_path: Path) -> None:
    """A protected step (or ``wait_staged``) helps with the lazy copy while it waits; a Ctrl-C
    then must stop the loop, not become a failed copy while training goes on."""
    saver = gc.AsyncSaver(mode="thread", staging="lazy")
    w = torch.ones(1 << 27)  # 512 MiB: the copy lasts long enough for the interrupt to land in it
    h = saver.save({"w": w}, tmp_path / "c", step=1)
    assert h._lazy is not None
    deadline = time.monotonic() + 30
    while h._lazy.job is None and time.monotonic() < deadline:  # the copy has started
        time.sleep(0.001)
    timer = _interrupt_soon(0.02)
    try:
        with pytest.raises(KeyboardInterrupt):
            for _ in range(50):  # the interrupt may land after one wait: wait again, it must come out
                h.wait_staged()
                time.sleep(0.01)
        try:
            h.result()  # committed if the copy ended before the interrupt, else failed, saying why
        except gc.SaveError as e:
            assert "KeyboardInterrupt" in str(e)
            with pytest.raises(gc.SaveError, match="KeyboardInterrupt"):
                saver.save({"w": torch.ones(4)}, tmp_path / "d", step=2)  # the next call says it too
    finally:
        timer.cancel()
        saver.close()


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals reach the main thread")
def test_ctrl_c_during_the_eager_staging_copy_is_a_keyboard_interrupt(tmp_path: Path) -> None:
    """A Ctrl-C during the staging copy stops the loop as a KeyboardInterrupt, not a SaveError a
    loop that retries failed saves would catch and go on from. Nothing is committed."""
    saver = gc.AsyncSaver(mode="thread")
    w = torch.ones(1 << 27)  # 512 MiB
    saver.save({"w": w}, tmp_path / "a", step=1).result()  # the buffer exists: the copy is what is timed
    got: BaseException | None = None
    for _ in range(5):  # the interrupt lands in the copy nearly always; a save it misses is retried
        timer = _interrupt_soon(0.03)
        try:
            saver.save({"w": w}, tmp_path / "b", step=2)
        except BaseException as e:  # noqa: BLE001 - inspected below
            got = e
            break
        finally:
            timer.cancel()
        try:
            saver.wait()
            time.sleep(0.5)  # the interrupt missed the save: it lands here, and the save is tried again
        except KeyboardInterrupt:
            pass
    saver.close()
    assert isinstance(got, KeyboardInterrupt), repr(got)


def test_a_failed_save_whose_handle_nobody_read_is_said_at_close(tmp_path: Path, caplog) -> None:
    """``async_save``'s handles are futures: a loop that never reads the last one (the run ends)
    must still hear that its last save failed when the saver closes (at exit for ``async_save``)."""
    saver = gc.AsyncSaver(mode="thread", staging="lazy")
    w = torch.zeros(1 << 16)
    saver._lazy_gate = threading.Event()
    h = saver.save({"w": w}, tmp_path / "c", step=7)
    elsewhere(lambda: w.add_(1))  # another thread changes it before the copy: the save fails
    saver._lazy_gate.set()
    saver.wait()
    assert h.exception() is not None  # failed; the loop never reads the handle
    with caplog.at_level(logging.WARNING, logger="goodput.ckpt"):
        saver.close()
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("step 7" in m and "'w'" in m for m in said), said
    assert gc.latest(tmp_path / "c") is None


def test_an_exception_of_a_listener_is_said(tmp_path: Path, caplog) -> None:
    """A commit listener that raises (a reporter that cannot reach its scheduler) must not stop
    the other listeners, nor fail silently."""

    def broken(ev: Any) -> None:
        raise RuntimeError("scheduler unreachable")

    ck = gc.Checkpointer(tmp_path, interval=1000, mode="thread")
    seen: list = []
    ck.add_listener(broken)
    ck.add_listener(seen.append)
    with caplog.at_level(logging.WARNING, logger="goodput.ckpt"):
        ck.save(1, {"w": torch.ones(4)}).result()
        ck.close()
    assert [e.step for e in seen] == [1]
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("scheduler unreachable" in m and "step 1" in m for m in said), said


@pytest.fixture
def small_durable(tmp_path: Path):
    """A real 1 MiB file system (tmpfs) for the durable tier, where root may mount one."""
    with mounted_tmpfs(tmp_path / "durable", "1m") as mnt:
        yield mnt


def test_close_with_the_final_step_raises_when_its_drain_fails(tmp_path: Path, small_durable: Path) -> None:
    """Tiered, the final step committed on the fast tier but not drained (the durable tier is
    full) is not kept: the fast tier may go with the job's nodes. close(step, state) says so,
    naming the step and where, instead of a warning."""
    ck = gc.Checkpointer(small_durable / "run", interval=1000, mode="thread", fast=tmp_path / "fast")
    with pytest.raises(gc.SaveError, match=r"final step 5 .*fast tier only.*durable.*No space left"):
        ck.close(5, {"w": torch.ones(1 << 20)})  # 4 MiB: does not fit
    assert gc.latest(small_durable / "run") is None


def test_close_with_the_final_step_drains_it_whatever_drain_every_says(tmp_path: Path) -> None:
    """The last step of a run reaches the durable tier even when ``drain_every`` would not
    drain it: saved by close(step, state), or saved just before it."""
    ck = gc.Checkpointer(tmp_path / "run", interval=1000, mode="thread", fast=tmp_path / "fast", drain_every=10)
    ck.save(10, {"w": torch.full((4,), 10.0)}).result()
    ck.close(13, {"w": torch.full((4,), 13.0)})
    assert gc.latest(tmp_path / "run").name == "step_000000013"
    ck = gc.Checkpointer(tmp_path / "run2", interval=1000, mode="thread", fast=tmp_path / "fast2", drain_every=10)
    ck.save(7, {"w": torch.full((4,), 7.0)}).result()  # not due for the durable tier
    ck.close(7, {"w": torch.full((4,), 7.0)})  # already saved: drained now
    assert gc.latest(tmp_path / "run2").name == "step_000000007"
    t = {"w": torch.zeros(4)}
    gc.load(t, gc.latest(tmp_path / "run2"))
    assert (t["w"] == 7).all()


def test_close_saves_the_final_step_even_after_an_earlier_save_failed(tmp_path: Path) -> None:
    """An earlier save's failure (a transient storage error, a torn lazy copy) must not cost the
    run its final step: close(step, state) saves it, and then raises the earlier failure."""
    ck = gc.Checkpointer(tmp_path, interval=1000, mode="thread", staging="lazy")
    w = torch.zeros(1 << 16)
    ck.save(3, {"w": w}).result()
    _failed_lazy_save(ck, 4, w)
    w.fill_(5)
    with pytest.raises(gc.SaveError, match=r"step 4.*'w'") as got:
        ck.close(5, {"w": w})
    assert "final step 5 was committed" in str(got.value)
    assert gc.latest(tmp_path).name == "step_000000005"
    t = {"w": torch.zeros(1 << 16)}
    gc.load(t, gc.latest(tmp_path))
    assert (t["w"] == 5).all()


def test_a_skip_at_the_end_names_the_newest_commit_not_a_save_that_failed(tmp_path: Path, caplog) -> None:
    """A plain close() after a skipped due save says which checkpoint the run is left with: that
    is the newest *commit*, not the save in flight when the skip happened, which may fail."""
    ck = gc.Checkpointer(tmp_path, interval=1, keep=None, mode="thread", staging="lazy")
    w = torch.zeros(1 << 16)
    ck.save(1, {"w": w}).result()
    ck.saver._lazy_gate = threading.Event()  # step 2's copy is held back: its write is in flight
    with caplog.at_level(logging.WARNING, logger="goodput.ckpt"):
        assert ck.maybe_save(2, {"w": w}) is not None
        assert ck.maybe_save(3, {"w": w}) is None  # skipped, reported, owed
        elsewhere(lambda: w.add_(1))  # step 2's save then fails
        ck.saver._lazy_gate.set()
        ck.saver._lazy_gate = None
        ck.close()
    said = [r.getMessage() for r in caplog.records if "run ended before it was made up" in r.getMessage()]
    assert said and "step 3" in said[0], said
    assert "newest checkpoint is step 1" in said[0], said
    assert gc.latest(tmp_path).name == "step_000000001"


@pytest.mark.slow  # the saver's close waits its timeout + 60 s for the write before giving up
def test_a_save_close_gives_up_on_is_said(tmp_path: Path, monkeypatch, caplog) -> None:
    """``close()`` (``atexit`` for ``async_save``) waits a bounded time for the write in flight,
    then stops the writer: the save it abandons must be said, not dropped with the writer."""
    monkeypatch.setenv(SLOW_WRITE_ENV, "120")  # the writer process reads it: a write of two minutes
    saver = gc.AsyncSaver(mode="process", timeout=0.5)
    h = saver.save({"w": torch.ones(16)}, tmp_path / "c", step=9)
    with caplog.at_level(logging.WARNING, logger="goodput.ckpt"):
        saver.close()
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("step 9" in m and "abandoned" in m for m in said), said
    with pytest.raises(gc.SaveError):
        h.result(timeout=30)
    assert gc.latest(tmp_path / "c") is None


def test_a_commit_listener_that_exits_neither_kills_the_writer_thread_nor_hangs_the_handle(tmp_path: Path) -> None:
    """A listener calling sys.exit() on the saver's thread raised SystemExit, which the thread's
    suppress(Exception) let through: the thread died, the handle never resolved, and result()
    (and every later save) waited for ever. The commit stands, and the failure is said."""
    import sys

    saver = gc.AsyncSaver(mode="thread")
    saver.listeners.append(lambda h: sys.exit(3))
    try:
        h = saver.save({"w": torch.ones(8)}, tmp_path / "a", step=1)
        assert h.result(timeout=60) is not None
        assert gc.open(tmp_path / "a").step == 1
        assert saver.save({"w": torch.ones(8)}, tmp_path / "b", step=2).result(timeout=60) is not None
    finally:
        saver.listeners.clear()
        saver.close()


def test_background_work_that_raises_unexpectedly_fails_its_handle_instead_of_hanging(tmp_path: Path) -> None:
    """The thread's safety net: background work that raises outside its own error handling (here
    a handle without timings, which no real save makes) fails that handle and becomes the saver's
    pending error; before, wait() and the next save waited for ever."""
    from goodput.ckpt.saving.async_saver import AsyncSave

    saver = gc.AsyncSaver(mode="thread")
    try:
        broken = AsyncSave(tmp_path / "x", 7, "0123456789abcdef", timings=None)
        saver._submit(saver._background, (broken, {"rank": 0}, 0, time.perf_counter()))
        with pytest.raises(gc.SaveError, match=r"step 7\) failed in the background"):
            broken.result(timeout=60)
        with pytest.raises(gc.SaveError, match="failed in the background"):
            saver.raise_pending()
        assert saver.save({"w": torch.ones(8)}, tmp_path / "c", step=8).result(timeout=60) is not None
    finally:
        saver.close()


def test_a_writer_killed_mid_write_is_named_with_its_signal(tmp_path: Path, monkeypatch) -> None:
    """The failure said "the writer process exited (status None)": the status was read before the
    exit landed, and a SIGKILL (the OOM killer's) was not named."""
    monkeypatch.setenv(SLOW_WRITE_ENV, "30")  # the writer process reads it: a write that lasts
    saver = gc.AsyncSaver(mode="process")
    try:
        saver.start()
        h = saver.save({"w": torch.ones(1024)}, tmp_path / "a", step=1)
        pid = saver._proc.proc.pid
        time.sleep(0.5)
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(gc.SaveError, match=rf"writer process \(pid {pid}\) was killed by SIGKILL"):
            h.result(timeout=60)
    finally:
        monkeypatch.delenv(SLOW_WRITE_ENV)
        saver.close()
