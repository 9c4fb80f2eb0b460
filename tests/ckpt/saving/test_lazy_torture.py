"""Lazy staging cannot tear (issue 25, item 2): a lazy save followed at once by an in-place
change of the state, by any path torch offers (methods, ``torch.*`` functions, ``out=``,
keyword-only tensors as in ``torch.nn.init``, ``inplace=True``, indexing, foreach and fused
optimizer kernels, ``.data``, a numpy view, aten overloads, a change made inside ``backward``,
a library function the guard does not know), commits exactly the values at the call, or fails
naming the tensor. Never a mix. Real saves, real optimizers, real files; the copy runs behind
the caller as in training. The fast default runs each path once; ``-m slow`` runs 200 trials."""

from __future__ import annotations

import os
import tempfile
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode, handle_torch_function, has_torch_function

import goodput.ckpt as gc
from goodput.ckpt.format.format import MANIFEST

N = 2 << 20  # 8 MiB of float32: far above the lazy threshold, a copy that takes a while


def scale(x: torch.Tensor, a: float) -> torch.Tensor:
    """A library's in-place function that follows no naming convention torch's guard could read:
    the guard cannot know it writes ``x``, only watch ``x``'s version counter across it."""
    if has_torch_function((x,)):
        return handle_torch_function(scale, (x,), x, a)
    with torch.no_grad():
        return x.mul_(a)


def _ops(w: torch.nn.Parameter) -> dict[str, Callable[[], object]]:
    opts = {
        "foreach": torch.optim.AdamW([w], lr=0.1, foreach=True),
        "fused": torch.optim.AdamW([w], lr=0.1, fused=True),
        "for-loop": torch.optim.AdamW([w], lr=0.1, foreach=False),
    }

    def numpy_view() -> None:
        a = w.detach().numpy()  # taken after the call: the copy-first guard sees .numpy()
        np.add(a, 1.0, out=a)

    def in_backward() -> None:  # a step inside backward (optimizer in backward, a hook)
        def hook(p: torch.Tensor) -> None:
            with torch.no_grad():
                p.add_(0.5)

        h = w.register_post_accumulate_grad_hook(hook)
        try:
            (w * 2.0).sum().backward()
        finally:
            h.remove()

    ng = torch.no_grad
    one = torch.ones(())
    return {
        "add_": lambda: ng()(w.add_)(1.0),
        "copy_": lambda: ng()(w.copy_)(torch.full_like(w, -3.0)),
        "AdamW foreach": opts["foreach"].step,
        "AdamW fused": opts["fused"].step,
        "AdamW for-loop": opts["for-loop"].step,
        ".data": lambda: w.data.mul_(2.0),
        "numpy view": numpy_view,
        "init.normal_": lambda: torch.nn.init.normal_(w),
        "init.uniform_": lambda: torch.nn.init.uniform_(w),
        "init.constant_": lambda: torch.nn.init.constant_(w, 2.0),
        "F.relu(inplace)": lambda: ng()(F.relu)(w, inplace=True),
        "nn.ReLU(inplace)": lambda: ng()(torch.nn.ReLU(inplace=True))(w),
        "F.dropout(inplace)": lambda: ng()(F.dropout)(w, 0.5, True, inplace=True),
        "F.leaky_relu(inplace)": lambda: ng()(F.leaky_relu)(w, 0.1, inplace=True),
        "out=": lambda: ng()(torch.add)(torch.ones(N), 1.0, out=w),
        "__setitem__": lambda: ng()(w.__setitem__)(slice(None), 7.0),
        "index_put_": lambda: ng()(w.index_put_)((torch.arange(0, N, 3),), torch.tensor(5.0)),
        "_foreach_add_": lambda: ng()(torch._foreach_add_)([w], 1.0),
        "aten.add_": lambda: ng()(torch.ops.aten.add_.Tensor)(w, one),
        "in backward": in_backward,
        "library fn": lambda: scale(w, 3.0),
    }


def _torture(trials: int) -> tuple[Counter, Counter]:
    """(outcomes, outcomes by path); ``waited``/``watched``: how often the guard had to act,
    which shows that the change came while the copy was still running."""
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(N))
    w.grad = torch.randn(N)
    ops = _ops(w)
    kinds = list(ops)
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    saver = gc.AsyncSaver(mode="thread", staging="lazy", direct=False)
    out: Counter = Counter()
    by: Counter = Counter()
    try:
        with tempfile.TemporaryDirectory(dir=base) as d:
            for i in range(trials):
                kind = kinds[i % len(kinds)]
                want = w.detach().clone()
                path = Path(d) / f"c{i}"
                h = saver.save({"w": w}, path)
                assert h is not None
                (mode,) = saver._modes
                ops[kind]()  # right after the call, while the copy runs behind
                out["waited"] += mode.waited > 0
                out["watched"] += getattr(mode, "watched", 0) > 0
                try:
                    h.result(timeout=120)
                except gc.SaveError as e:
                    assert "'w' was changed in place" in str(e), e  # a refusal names the tensor
                    out["failed"] += 1
                    by[f"{kind}: failed"] += 1
                    with pytest.raises(gc.SaveError, match="previous asynchronous save failed"):
                        saver.raise_pending()  # reported once more, by the next call, then saves go on
                    continue
                got = {"w": torch.empty(N)}
                gc.load(got, path)
                if torch.equal(got["w"], want):
                    out["exact"] += 1
                else:
                    changed = int((got["w"] != want).sum())
                    out["torn" if changed < N else "after"] += 1
                    by[f"{kind}: {'torn' if changed < N else 'after'}"] += 1
                gc.storage.storage_for(path).remove_tree(path)
    finally:
        saver.close()
    return out, by


def _check(out: Counter, by: Counter, trials: int) -> None:
    assert out["torn"] == 0 and out["after"] == 0, (out, by)
    assert out["exact"] + out["failed"] == trials, (out, by)
    assert out["waited"] > 0, out  # the changes did come while the copy ran


def test_lazy_staging_never_tears_fast() -> None:
    trials = len(_ops(torch.nn.Parameter(torch.zeros(1))))  # each path once
    out, by = _torture(trials)
    _check(out, by, trials)


@pytest.mark.slow
def test_lazy_staging_never_tears_in_200_trials() -> None:
    out, by = _torture(200)
    _check(out, by, 200)


def test_copy_first_waits_only_for_the_state_being_copied(tmp_path: Path) -> None:
    """In-place work on other tensors (activations in a forward pass, small leaves already
    copied) goes on while the copy is held back; a change to the state waits for it."""

    w = torch.randn(N)
    small = torch.zeros(4)
    saver = gc.AsyncSaver(mode="thread", staging="lazy", direct=False)
    gate = saver._lazy_gate = threading.Event()
    try:
        h = saver.save({"w": w, "small": small}, tmp_path / "c")
        assert h is not None and not h.staged.done()
        act = torch.ones(1000)
        act.add_(1).relu_()  # not the state: no wait (the held-back copy would block it forever)
        small.add_(1)  # a small leaf: copied before save returned
        (mode,) = saver._modes
        assert mode.waited == 0
        threading.Timer(0.3, gate.set).start()
        want = w.clone()
        w.mul_(2)  # the state: waits for the copy (until the gate opens)
        assert mode.waited == 1 and h.staged.done()
        h.result(timeout=120)
    finally:
        gate.set()
        saver.close()
    got = {"w": torch.empty(N), "small": torch.empty(4)}
    gc.load(got, tmp_path / "c")
    assert torch.equal(got["w"], want) and torch.equal(got["small"], torch.zeros(4))
    assert saver._modes == []  # retired on close: no cost left on the training thread


def test_a_write_the_guard_cannot_classify_fails_the_save_instead_of_tearing(tmp_path: Path) -> None:
    """The race the version counter alone loses: a call writes the state while the copy runs
    and bumps the counter only when it returns, after the copy's own check. The guard cannot
    tell such a call writes (no convention names it), so it watches it; the save fails."""
    w = torch.randn(N)
    saver = gc.AsyncSaver(mode="thread", staging="lazy", direct=False)
    gate = saver._lazy_gate = threading.Event()
    handle: list = []

    def kernel(x: torch.Tensor) -> None:  # what a long in-place kernel does, step by step
        if has_torch_function((x,)):
            return handle_torch_function(kernel, (x,), x)
        x.numpy()[: N // 2] += 1.0  # its first writes, before the copy reads them
        gate.set()
        handle[0].wait_staged()  # the copy runs, checks the counter (unchanged), ends
        x.add_(0.0)  # the kernel returns: the counter moves now
        return None

    try:
        handle.append(saver.save({"w": w}, tmp_path / "c"))
        mode = saver._modes[0]
        kernel(w)
        with pytest.raises(gc.SaveError, match=r"'w' was changed in place"):
            handle[0].result(timeout=120)
        assert mode.watched == 1
        assert saver._modes == []  # result() retired it
    finally:
        gate.set()
        saver.close()
    assert not (tmp_path / "c" / MANIFEST).exists() and not list((tmp_path / "c").glob("data-*"))


class _Log(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        self.calls += 1
        return func(*args, **(kwargs or {}))


def _stack() -> list:
    return [torch._C._get_function_stack_at(i) for i in range(torch._C._len_torch_function_stack())]


def test_a_lazy_save_inside_the_callers_modes_leaves_them_in_place(tmp_path: Path) -> None:
    """The guard goes under the caller's modes: leaving a ``with`` block the save was called in
    pops the caller's mode, not the guard (before, ``with torch.device("meta")`` stayed on for
    good and the guard was popped in its place)."""
    w = torch.randn(N)
    saver = gc.AsyncSaver(mode="thread", staging="lazy", direct=False)
    try:
        with torch.device("meta"):
            h = saver.save({"w": w}, tmp_path / "a")
            assert torch.empty(2).device.type == "meta"
        assert torch.empty(2).device.type == "cpu"  # the user's device mode is gone with its block
        assert [type(m) for m in _stack()] == [type(saver._modes[0])]
        with _Log() as log:
            h.wait_staged()
            saver.retire()  # the guard leaves from under the user's mode
            assert _stack() == [log]
            torch.ones(2).add_(1)
        assert _stack() == [] and log.calls >= 2
        h.result(timeout=120)
        with _Log() as log:
            h = saver.save({"w": w}, tmp_path / "b")
        assert log.calls >= 0 and all(not isinstance(m, _Log) for m in _stack())
        calls = log.calls
        torch.ones(2).add_(1)
        assert log.calls == calls  # popped with its block: it sees nothing after
        torch.set_default_device("cpu")  # torch's global device mode goes to the bottom
        try:
            h.wait_staged()
            h.result(timeout=120)
            h = saver.save({"w": w}, tmp_path / "c")
        finally:
            torch.set_default_device(None)  # checks that it is at the bottom: raised before
        h.wait_staged()
        saver.retire()
        assert _stack() == []
        h.result(timeout=120)
    finally:
        saver.close()
        while torch._C._len_torch_function_stack():  # never leak a mode into other tests
            torch._C._pop_torch_function_stack()
    for n in "abc":
        got = {"w": torch.empty(N)}
        gc.load(got, tmp_path / n)
        assert torch.equal(got["w"], w)


def test_a_protected_optimizer_stepped_inside_backward_commits_the_state_of_the_call(tmp_path: Path) -> None:
    """``backward()`` is watched over every leaf still being copied (its hooks change tensors it
    was not given). An optimizer stepped in backward and protected waits for the copy inside it:
    its change comes after the copy, so the save commits, and exactly the values at the call."""
    w = torch.nn.Parameter(torch.randn(N))
    opt = torch.optim.SGD([w], lr=0.5)
    saver = gc.AsyncSaver(mode="thread", staging="lazy", direct=False)
    saver.protect(opt)
    gate = saver._lazy_gate = threading.Event()
    hook = w.register_post_accumulate_grad_hook(lambda p: opt.step())
    try:
        want = w.detach().clone()
        h = saver.save({"w": w}, tmp_path / "c")
        mode = saver._modes[0]
        threading.Timer(0.3, gate.set).start()  # the copy starts while backward runs
        (w * 2.0).sum().backward()  # the step inside waits for the copy, then changes w
        assert not torch.equal(w.detach(), want)
        h.result(timeout=120)
        assert mode.watched >= 1  # backward was watched: the copy had not started
    finally:
        gate.set()
        hook.remove()
        saver.close()
    got = {"w": torch.empty(N)}
    gc.load(got, tmp_path / "c")
    assert torch.equal(got["w"], want)


def test_the_training_thread_lent_to_the_copy_never_waits_for_itself(tmp_path: Path) -> None:
    """``wait_staged`` lends the training thread to the copy, and that thread is where the save's
    guard is pushed: the copy's own torch calls (slicing a strided leaf, ``copy_`` from it, the
    storage of a copied leaf) must not meet the guard, or the copy waits for itself (a CI run hung
    there for 600 s when the background thread was slow to start)."""
    w = torch.randn(N)
    t = torch.randn(64, N // 64).t()  # strided: copied with torch's copy_, row by row
    saver = gc.AsyncSaver(mode="thread", staging="lazy", direct=False)
    captured: list = []
    saver._submit = lambda fn, args: captured.append(args)  # type: ignore[method-assign]
    try:
        h = saver.save({"w": w, "t": t}, tmp_path / "c")
        _, _, _, _, later, slots, versions, ready, _ = captured[0]
        lz = h._lazy
        guard = saver._modes[0]

        def waits_for_itself() -> None:
            raise AssertionError("the copy waited for itself")

        guard._wait = waits_for_itself
        with torch._C.DisableTorchFunction():  # made where the copy runs: no guard there
            lz.job = saver.pool.job(later, slots, versions, ready, lz.guard)
        lz.job.help()  # on this thread, under the guard
        assert lz.job.host.error is None
        assert guard.waited == 0 and not guard._open  # every leaf's copy ended and was told
        guard.copied()
        lz.done.set()
    finally:
        saver.inflight = None  # never handed to the writer: nothing for close() to wait for
        saver.retire()
        saver.close()


def test_a_lazy_save_where_the_guard_cannot_see_copies_at_the_call(tmp_path: Path, caplog) -> None:  # noqa: ANN001
    """With torch functions disabled on the saving thread the copy-first guard sees nothing that
    follows, so the lazy save copies every leaf before it returns and says why (a log line and
    ``timings.eager_because``): a change made at once, inside the same block, never reaches it."""
    w = torch.randn(N)
    before = w.clone()
    saver = gc.AsyncSaver(mode="thread", staging="lazy", direct=False)
    gate = saver._lazy_gate = threading.Event()  # a lazy copy would be held back until the change
    try:
        with caplog.at_level("WARNING", logger="goodput.ckpt"), torch._C.DisableTorchFunction():
            h = saver.save({"w": w}, tmp_path / "c")
            w.add_(1.0)
        gate.set()
        h.result(timeout=120)
    finally:
        gate.set()
        saver.close()
    assert h.timings.eager_because is not None and "DisableTorchFunction" in h.timings.eager_because
    assert h.timings.lazy_bytes == 0 and saver._modes == []
    assert "copies at the call" in caplog.text
    got = {"w": torch.zeros(N)}
    gc.load(got, tmp_path / "c")
    assert torch.equal(got["w"], before)


@pytest.mark.parametrize("optimizer", [False, True], ids=["compiled in-place update", "compiled protected step"])
def test_a_compiled_step_right_after_a_lazy_save_runs_and_the_save_holds(tmp_path: Path, optimizer: bool) -> None:
    """Dynamo traced the copy-first guard, whose branches follow the copy on another thread: a
    compiled in-place update (an EMA) right after a lazy save died of SpeculationLogDivergence in
    6-8 of 10 trials, and a compiled protected ``opt.step()`` traced goodput's own copy and failed
    the save (hostile review). The guard and the wait are never traced now (graph breaks)."""
    torch._dynamo.reset()
    saver = gc.AsyncSaver(mode="thread", staging="lazy", direct=False)
    if optimizer:
        model = torch.nn.Linear(512, 512)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        saver.protect(opt)
        update = torch.compile(opt.step, backend="eager")
        for p in model.parameters():
            p.grad = torch.randn_like(p)

        def state() -> dict:
            return {"model": model.state_dict()}
    else:
        w, m = torch.randn(2 * N), torch.randn(2 * N)  # 16 MiB each: the copy outlasts a trace

        @torch.compile(backend="eager")
        def update() -> None:
            m.mul_(0.9).add_(w, alpha=0.1)
            w.add_(m, alpha=-1e-3)

        def state() -> dict:
            return {"w": w, "m": m}

    update()
    try:
        for t in range(6):
            before = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in _flat(state()).items()}
            h = saver.save(state(), tmp_path / f"t{t}")
            update()  # must not raise
            h.result(timeout=120)
            got = {k: torch.empty_like(v) for k, v in before.items()}
            gc.load(_unflat(got), tmp_path / f"t{t}")
            assert all(torch.equal(got[k], before[k]) for k in before), t
    finally:
        saver.close()
        torch._dynamo.reset()


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _unflat(flat: dict) -> dict:
    out: dict = {}
    for k, v in flat.items():
        *parts, last = k.split(".")
        d = out
        for p in parts:
            d = d.setdefault(p, {})
        d[last] = v
    return out
