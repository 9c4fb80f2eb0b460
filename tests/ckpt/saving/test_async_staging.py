"""Staging for asynchronous saves: the all-core eager copy is bytewise the state, and a lazy copy
(behind the next step's forward and backward) holds exactly the state of its step, or fails.

Real savers, real writer processes and real gloo ranks; the only seam is ``_lazy_gate``, which
holds a lazy copy back so that a test can change the state before it, deterministically."""

from __future__ import annotations

import copy
import io
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import goodput.ckpt as gc
from goodput.ckpt.format.format import MANIFEST
from goodput.ckpt.saving.staging import CHUNK, LAZY_MIN_BYTES, StagingPool, layout
from goodput.ckpt.state import flatten, host_bytes
from tests.distributed import run_ranks

CUDA = pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"))


def bits(x: torch.Tensor) -> bytes:
    x = x.detach().cpu().resolve_conj().resolve_neg().contiguous()
    return x.reshape(-1).view(torch.uint8).numpy().tobytes()


def same(a: Any, b: Any) -> bool:
    """Bit for bit, through nested dicts and lists (values compared with ==)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and bits(a) == bits(b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def awkward_state() -> dict[str, Any]:
    g = torch.Generator().manual_seed(7)
    c = torch.randn(100, generator=g, dtype=torch.complex64)
    return {
        "odd": torch.randn(2 * CHUNK // 4 + 3, generator=g),  # three chunks, a ragged tail
        "bf16": torch.randn(CHUNK // 2 + 1, generator=g).to(torch.bfloat16),
        "transposed": torch.randn(1024, 2048, generator=g).t(),  # 8 MiB, cut by rows
        "strided": torch.randn(3 * 100_003, generator=g)[::3],
        "permuted": torch.randn(5, 17, 23, generator=g).permute(2, 0, 1),
        "neg": torch._neg_view(torch.randn(1000, generator=g)),
        "conj": c.conj(),
        "np": np.arange(1_000_003, dtype=np.float64),  # two chunks
        "np_strided": np.arange(600 * 700, dtype=np.float32).reshape(600, 700)[::-1, ::2],
        "tiny": torch.tensor([7], dtype=torch.int8),  # one byte, far below a chunk
        "scalar": torch.tensor(2.5),
        "empty": torch.empty(0),
        "mask": torch.rand(999, generator=g) > 0.5,
        "many": {str(i): torch.randn(i % 37 + 1, generator=g) for i in range(300)},
    }


def zeros_like_state(state: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in state.items():
        if isinstance(v, dict):
            out[k] = zeros_like_state(v)
        elif isinstance(v, np.ndarray):
            out[k] = np.zeros(v.shape, v.dtype)
        else:
            out[k] = torch.zeros(v.shape, dtype=v.dtype)
    return out


@pytest.mark.parametrize("shared", [False, True])
def test_parallel_eager_staging_is_bytewise_the_state(shared: bool) -> None:
    state = awkward_state()
    leaves, _ = flatten(state)
    slots, size = layout(leaves)
    pool = StagingPool(shared=shared)
    try:
        buf = pool.ensure(size)
        buf[:] = 0xAB  # every byte of every slot must be written
        pool.stage(leaves, slots)
        for lf in leaves:
            s = slots[lf.ident]
            assert buf[s.offset : s.offset + s.nbytes].tobytes() == host_bytes(lf.local).tobytes(), lf.name
    finally:
        pool.unlink_name()
        pool.release()


@pytest.mark.parametrize("staging", ["eager", "lazy"])
def test_awkward_state_round_trips(tmp_path: Path, staging: str) -> None:
    state = awkward_state()
    saver = gc.AsyncSaver(mode="thread", staging=staging)
    h = saver.save(state, tmp_path, step=3)
    h.wait_staged()
    assert h.staged.done()
    h.result(timeout=120)
    saver.close()
    gc.verify(tmp_path)
    t = zeros_like_state(state)
    gc.load(t, tmp_path)
    for k, v in state.items():
        if isinstance(v, np.ndarray):
            assert t[k].tobytes() == np.ascontiguousarray(v).tobytes(), k
        elif isinstance(v, dict):
            assert same(t[k], v), k
        else:
            assert bits(t[k]) == bits(v), k


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(256, 256)  # 256 KiB of weight: copied behind the loop
        self.norm = torch.nn.BatchNorm1d(256)  # running statistics change in every forward
        self.out = torch.nn.Linear(256, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.norm(self.inp(x))))


def snapshot(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    return copy.deepcopy({"model": model.state_dict(), "optim": opt.state_dict()})


def zeroed(snap: dict[str, Any]) -> dict[str, Any]:
    t = copy.deepcopy(snap)

    def walk(d: Any) -> None:
        for v in d.values() if isinstance(d, dict) else d:
            if isinstance(v, torch.Tensor):
                v.zero_()
            elif isinstance(v, (dict, list)):
                walk(v)

    walk(t)
    return t


def batch(g: torch.Generator, device: str = "cpu") -> torch.Tensor:
    return torch.randn(32, 256, generator=g).to(device)


def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, g: torch.Generator, device: str = "cpu") -> None:
    model(batch(g, device)).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()


@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize("mode", ["process", "thread"])
def test_lazy_checkpoints_of_a_training_loop_hold_their_step(tmp_path: Path, mode: str, device: str) -> None:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    model = Net().to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    saver = gc.AsyncSaver(mode=mode, staging="lazy")
    saver.protect(opt)
    snaps, handles = {}, {}
    for step in range(9):  # saves at steps 1, 3, 5, 7; training goes on after each
        train_step(model, opt, g, device)
        if step % 2:
            state = {"model": model.state_dict(), "optim": opt.state_dict()}
            snaps[step] = snapshot(model, opt)
            gate = step == 5  # this save's copy is held back: the next step's optimizer must wait
            if gate:
                saver._lazy_gate = threading.Event()
            handles[step] = h = saver.save(state, tmp_path / f"s{step}", step=step)
            assert h.timings.lazy_bytes >= 2 * LAZY_MIN_BYTES  # the big weight and its Adam moments
            if gate:
                assert not h.staged.done()
                model(batch(g, device)).pow(2).mean().backward()  # forward and backward overlap the copy
                threading.Timer(0.05, saver._lazy_gate.set).start()
                opt.step()  # protected: waits for the copy, then changes the state
                opt.zero_grad()
                saver._lazy_gate = None
                assert h.staged.done() and h.timings.wait_s > 0
    saver.close()
    final = snapshot(model, opt)
    for step, snap in snaps.items():
        assert handles[step].result().staging == "lazy"
        t = zeroed(snap)
        gc.load(t, tmp_path / f"s{step}")
        assert same(t, snap), step
        assert not same(t["model"], final["model"])  # training went on after this checkpoint
        assert not same(t["optim"]["state"], final["optim"]["state"])


def elsewhere(fn: object) -> None:
    """Run ``fn`` to completion on another thread (no copy-first mode there)."""
    t = threading.Thread(target=fn)  # type: ignore[arg-type]
    t.start()
    t.join()


@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize("mode", ["process", "thread"])
def test_unprotected_change_before_the_copy_fails_the_save_naming_the_tensor(
    tmp_path: Path, mode: str, device: str
) -> None:
    saver = gc.AsyncSaver(mode=mode, staging="lazy")
    w = torch.randn(1 << 16, device=device)
    saver._lazy_gate = threading.Event()
    h = saver.save({"layer": {"w": w}, "b": torch.ones(3)}, tmp_path / "bad", step=1)
    # an "optimizer" on another thread runs before the copy (on the saving thread, copy-first
    # would make it wait: test_lazy_torture.py): the checkpoint would be of no step
    elsewhere(lambda: w.add_(1.0))
    saver._lazy_gate.set()
    saver._lazy_gate = None
    with pytest.raises(gc.SaveError, match=r"'layer\.w' was changed in place"):
        h.result(timeout=120)
    with pytest.raises(gc.SaveError):
        h.staged.result()
    h.wait_staged()  # never raises
    assert not (tmp_path / "bad" / MANIFEST).exists()
    assert not list((tmp_path / "bad").glob("data-*"))
    with pytest.raises(gc.SaveError, match=r"previous asynchronous save failed.*'layer\.w'"):
        saver.save({"layer": {"w": w}}, tmp_path / "next", step=2)
    h2 = saver.save({"layer": {"w": w}}, tmp_path / "again", step=3)  # reported once, then it saves again
    h2.wait_staged()
    h2.result(timeout=120)
    saver.close()
    t = {"layer": {"w": torch.zeros_like(w)}}
    gc.load(t, tmp_path / "again")
    assert bits(t["layer"]["w"]) == bits(w)


def test_leaves_without_a_version_counter_are_copied_before_save_returns(tmp_path: Path) -> None:
    big = torch.randn(1 << 16)
    arr = np.arange(1 << 16, dtype=np.float32)
    small = torch.arange(10.0)  # below LAZY_MIN_BYTES: copied now (BatchNorm statistics change unseen)
    with torch.inference_mode():
        inf = torch.randn(1 << 16)  # inference tensors keep no version counter
    keep = {"arr": arr.copy(), "small": small.clone(), "inf": inf.clone(), "big": big.clone()}
    saver = gc.AsyncSaver(mode="thread", staging="lazy")
    saver._lazy_gate = threading.Event()
    h = saver.save({"big": big, "arr": arr, "small": small, "inf": inf}, tmp_path, step=1)
    assert h.timings.lazy_bytes == big.numel() * 4
    arr += 1  # changes nobody could detect: these were copied before save returned
    small.add_(1)
    with torch.inference_mode():
        inf.add_(1)
    saver._lazy_gate.set()
    saver._lazy_gate = None
    h.result(timeout=120)
    saver.close()
    t = {"big": torch.zeros_like(big), "arr": np.zeros_like(arr), "small": torch.zeros(10), "inf": torch.zeros(1 << 16)}
    gc.load(t, tmp_path)
    assert np.array_equal(t["arr"], keep["arr"])
    for k in ("small", "inf", "big"):
        assert torch.equal(t[k], keep[k]), k


def test_staging_option_and_the_module_function(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="staging"):
        gc.AsyncSaver(staging="sometimes")
    w = torch.randn(1 << 16)
    keep = w.clone()
    h = gc.async_save({"w": w}, tmp_path, step=1, mode="thread", staging="lazy")
    h.wait_staged()
    w.add_(1.0)  # after the copy: legitimate, not in the checkpoint
    h.result(timeout=120)
    t = {"w": torch.zeros_like(w)}
    gc.load(t, tmp_path)
    assert torch.equal(t["w"], keep)
    eager = gc.AsyncSaver(mode="thread")
    opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(3))], lr=0.1)
    hooks = eager.protect(opt)  # harmless: nothing is ever in flight to wait for
    eager.save({"w": w}, tmp_path / "e", step=2).result(timeout=120)
    opt.step()
    eager.close()
    assert len(hooks) == 1


def _lazy_two_ranks(rank: int, world: int, root: str) -> dict:
    from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh

    torch.manual_seed(0)  # the same model on both ranks: its state is replicated
    g = torch.Generator().manual_seed(1)
    model = Net()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    mesh = init_device_mesh("cpu", (world,))
    emb = torch.nn.Parameter(distribute_tensor(torch.randn(256, 256), mesh, [Shard(0)]))  # sharded
    emb_opt = torch.optim.Adam([emb], lr=1e-2)  # updates the DTensor in place: its own version counter
    shard = torch.full((128, 256), float(rank))  # this rank's rows of a (256, 256) tensor
    saver = gc.AsyncSaver(mode="process", staging="lazy")
    saver.protect(opt, emb_opt)
    snaps = {}
    for step in range(3):
        train_step(model, opt, g)
        (emb.to_local() * (rank + 1)).pow(2).sum().backward()
        emb_opt.step()
        emb_opt.zero_grad()
        state = {
            "model": model.state_dict(),
            "optim": opt.state_dict(),
            "table": gc.LocalShard(shard, (256, 256), (128 * rank, 0)),
            "emb": emb,
            "emb_avg": emb_opt.state[emb]["exp_avg"],
        }
        buf = io.BytesIO()
        torch.save(
            {
                **snapshot(model, opt),
                "shard": shard.clone(),
                "emb": emb.to_local().detach().clone(),
                "emb_avg": emb_opt.state[emb]["exp_avg"].to_local().clone(),
            },
            buf,
        )
        snaps[step] = buf.getvalue()  # bytes: tensors of an exiting process do not cross a queue
        h = saver.save(state, f"{root}/s{step}", step=step)
        h.wait_staged()  # the table is changed by hand, not by the optimizer
        shard.add_(10.0)
        h.result(timeout=120)
    saver.close()
    return snaps


def test_lazy_saves_on_two_ranks_commit_the_state_of_their_step(tmp_path: Path) -> None:
    raw = run_ranks(_lazy_two_ranks, 2, str(tmp_path))
    res = [{s: torch.load(io.BytesIO(b), weights_only=False) for s, b in r.items()} for r in raw]
    for step in range(3):
        snap = res[0][step]
        assert same({k: snap[k] for k in ("model", "optim")}, {k: res[1][step][k] for k in ("model", "optim")})
        t = {**zeroed({k: snap[k] for k in ("model", "optim")})}
        t.update({k: torch.zeros(256, 256) for k in ("table", "emb", "emb_avg")})
        gc.load(t, tmp_path / f"s{step}")
        gc.verify(tmp_path / f"s{step}")
        assert same(t["model"], snap["model"]) and same(t["optim"], snap["optim"])
        for k in ("shard", "emb", "emb_avg"):
            want = torch.cat([res[0][step][k], res[1][step][k]])
            assert bits(t["table" if k == "shard" else k]) == bits(want), k


def _lazy_change_on_one_rank(rank: int, world: int, root: str, bad: int) -> str:
    from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh

    mesh = init_device_mesh("cpu", (world,))
    saver = gc.AsyncSaver(mode="process", staging="lazy", timeout=20)  # a hang fails in seconds
    w = torch.full((1 << 16,), 1.0)  # replicated
    d = distribute_tensor(torch.ones(256, 256), mesh, [Shard(0)])
    saver._lazy_gate = threading.Event()
    h = saver.save({"w": w, "d": d}, root, step=1)
    if rank == bad == 0:  # on another thread: the saving thread's changes wait for the copy
        elsewhere(lambda: (w.add_(1.0), w.sub_(1.0)))  # the same values again, yet not the same tensor
    elif rank == bad:
        elsewhere(lambda: d.mul_(2.0))  # a DTensor's in-place change moves the DTensor's counter, not its local's
    saver._lazy_gate.set()
    saver._lazy_gate = None
    try:
        h.result(timeout=90)
        return "committed"
    except gc.SaveError as e:
        msg = str(e)
    try:
        saver.save({"w": w}, root + "-next", step=2)
    except gc.SaveError as e:
        msg += " || next: " + str(e)
    saver.close()
    return msg


@pytest.mark.parametrize("bad", [0, 1])
def test_a_change_on_any_rank_aborts_the_save_everywhere(tmp_path: Path, bad: int) -> None:
    msgs = run_ranks(_lazy_change_on_one_rank, 2, str(tmp_path / "ck"), bad)
    name = "'w'" if bad == 0 else "'d'"
    for m in msgs:
        assert f"{name} was changed in place" in m and "|| next: the previous asynchronous save failed" in m, m
    assert not (tmp_path / "ck" / MANIFEST).exists()
    assert not list((tmp_path / "ck").glob("data-*"))


def _lazy_then_collective(rank: int, world: int, root: str) -> list[float]:
    """A lazy save, then at once an in-place collective on the saved tensor (local SGD's
    parameter average, DDP's buffer broadcast): torch.distributed writes it in C++, with no
    torch function and no version bump. The copy is held back until the collective could have
    run, so without copy-first for collectives the checkpoint would hold the averaged values."""
    import torch.distributed as dist

    n = 1 << 18
    saver = gc.AsyncSaver(mode="thread", staging="lazy")
    w = torch.full((n,), float(rank + 1))
    b = torch.full((n,), float(rank + 1))
    saver._lazy_gate = threading.Event()
    threading.Timer(0.5, saver._lazy_gate.set).start()  # the copy runs after the collectives, unless they wait
    shards = {k: gc.LocalShard(t, (world * n,), (rank * n,)) for k, t in (("w", w), ("b", b))}
    h = saver.save(shards, root, step=1)
    dist.all_reduce(w)
    dist.broadcast(b, src=1)
    h.result(timeout=120)
    saver._lazy_gate = None
    saver.close()
    return [float(w[0]), float(b[0])]


def test_an_in_place_collective_after_a_lazy_save_waits_for_the_copy(tmp_path: Path) -> None:
    after = run_ranks(_lazy_then_collective, 2, str(tmp_path / "ck"))
    assert after == [[3.0, 2.0], [3.0, 2.0]]  # the collectives did run, after the copy
    n = 1 << 18
    got = {"w": torch.zeros(2 * n), "b": torch.zeros(2 * n)}
    gc.load(got, tmp_path / "ck")
    at_the_call = torch.cat([torch.full((n,), 1.0), torch.full((n,), 2.0)])
    assert torch.equal(got["w"], at_the_call) and torch.equal(got["b"], at_the_call)


def test_the_guarded_collectives_still_pickle_by_reference() -> None:
    """After the first lazy save wraps torch.distributed's collectives, ``pickle.dumps(dist.all_reduce)``
    (a partial of it sent to mp.spawn or a pool) raised PicklingError: the wrapper named a module that
    does not hold it (a review of the wrapper)."""
    import functools
    import pickle

    import torch.distributed as dist

    from goodput.ckpt.saving.staging import guard_collectives

    guard_collectives()
    assert getattr(dist.all_reduce, "_goodput_copy_first", False)
    assert pickle.loads(pickle.dumps(dist.all_reduce)) is dist.all_reduce
    p = pickle.loads(pickle.dumps(functools.partial(dist.broadcast, src=0)))
    assert p.func is dist.broadcast
