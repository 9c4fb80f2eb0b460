"""Lazy staging cannot tear (issue 25, item 2): a lazy save followed at once by an in-place
change of the state — ``add_``, ``copy_``, ``optimizer.step()``, a write through ``.data``, a
write through a numpy view — commits exactly the values at the call, or fails naming the tensor.
Never a mix. Real saves, real optimizer, real files; the copy runs behind the caller as in
training. The fast default runs 25 trials; ``-m slow`` runs the 200 of the issue."""

from __future__ import annotations

import os
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

import goodput.ckpt as gc

N = 2 << 20  # 8 MiB of float32: far above the lazy threshold, a copy that takes a while


def _ops(w: torch.nn.Parameter, opt: torch.optim.Optimizer) -> dict[str, Callable[[], None]]:
    def numpy_view() -> None:
        a = w.detach().numpy()  # taken after the call: the copy-first guard sees .numpy()
        np.add(a, 1.0, out=a)

    return {
        "add_": lambda: _no_grad(lambda: w.add_(1.0)),
        "copy_": lambda: _no_grad(lambda: w.copy_(torch.full_like(w, -3.0))),
        "optimizer.step": opt.step,
        ".data": lambda: w.data.mul_(2.0),
        "numpy view": numpy_view,
    }


def _no_grad(fn: Callable[[], object]) -> None:
    with torch.no_grad():
        fn()


def _torture(trials: int) -> Counter:
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(N))
    w.grad = torch.randn(N)
    opt = torch.optim.SGD([w], lr=0.5, foreach=True)
    ops = _ops(w, opt)
    kinds = list(ops)
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    saver = gc.AsyncSaver(mode="thread", staging="lazy", direct=False)
    out: Counter = Counter()
    try:
        with tempfile.TemporaryDirectory(dir=base) as d:
            for i in range(trials):
                kind = kinds[i % len(kinds)]
                want = w.detach().clone()
                path = Path(d) / f"c{i}"
                h = saver.save({"w": w}, path)
                assert h is not None
                ops[kind]()  # right after the call, while the copy runs behind
                try:
                    h.result(timeout=120)
                except gc.SaveError as e:
                    assert "'w'" in str(e), e  # a refusal names the tensor
                    out["failed"] += 1
                    continue
                got = {"w": torch.empty(N)}
                gc.load(got, path)
                if torch.equal(got["w"], want):
                    out["exact"] += 1
                else:
                    changed = int((got["w"] != want).sum())
                    out["torn" if changed < N else "after"] += 1
                    out[f"bad {kind}"] += 1
                gc.storage.storage_for(path).remove_tree(path)
    finally:
        saver.close()
    return out


def test_lazy_staging_never_tears_fast() -> None:
    out = _torture(25)
    assert out["torn"] == 0 and out["after"] == 0, out
    assert out["exact"] + out["failed"] == 25, out


@pytest.mark.slow
def test_lazy_staging_never_tears_in_200_trials() -> None:
    out = _torture(200)
    assert out["torn"] == 0 and out["after"] == 0, out
    assert out["exact"] + out["failed"] == 200, out


def test_copy_first_waits_only_for_the_state_being_copied(tmp_path: Path) -> None:
    """In-place work on other tensors (activations in a forward pass, small leaves already
    copied) goes on while the copy is held back; a change to the state waits for it."""
    import threading

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
