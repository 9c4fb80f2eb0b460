"""Code written for DCP runs unchanged: its call shapes, Stateful objects, a collective end of
load, dtype casting and BytesIO values, each as DCP behaves (DCP's behaviour is the spec)."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

import goodput.ckpt as gc
from tests.distributed import run_ranks


class AppState:
    """The DCP tutorial's wrapper: a model and its optimizer behind state_dict/load_state_dict."""

    def __init__(self, model: torch.nn.Module, optim: torch.optim.Optimizer) -> None:
        self.model, self.optim = model, optim
        self.loaded = 0

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "optim": self.optim.state_dict()}

    def load_state_dict(self, sd: dict) -> None:
        self.model.load_state_dict(sd["model"])
        self.optim.load_state_dict(sd["optim"])
        self.loaded += 1


def _trained(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(3):
        optim.zero_grad()
        model(torch.randn(5, 8)).sum().backward()
        optim.step()
    return model, optim


def test_stateful_objects_are_saved_and_restored_through_their_own_methods(tmp_path: Path) -> None:
    model, optim = _trained(0)
    gc.save({"app": AppState(model, optim), "step": 3}, checkpoint_id=tmp_path / "ck")
    fresh_model, fresh_optim = _trained(1)
    fresh_optim.step()  # some state to overwrite
    app = AppState(fresh_model, fresh_optim)
    state = {"app": app, "step": 0}
    gc.load(state, checkpoint_id=tmp_path / "ck")
    assert app.loaded == 1 and state["step"] == 3
    for a, b in zip(model.state_dict().values(), fresh_model.state_dict().values()):
        assert torch.equal(a, b)
    sa, sb = optim.state_dict()["state"], fresh_optim.state_dict()["state"]
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k]["exp_avg_sq"], sb[k]["exp_avg_sq"]) and torch.equal(sa[k]["step"], sb[k]["step"])


def test_a_module_and_an_optimizer_as_values(tmp_path: Path) -> None:
    model, optim = _trained(0)
    gc.save({"model": model, "optim": optim}, tmp_path / "ck")
    m2, o2 = _trained(2)
    o2.step()
    gc.load({"model": m2, "optim": o2}, tmp_path / "ck")
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), m2.parameters()))
    assert torch.equal(optim.state_dict()["state"][0]["exp_avg"], o2.state_dict()["state"][0]["exp_avg"])


@pytest.mark.parametrize("classes", ["goodput", "dcp"])
def test_storage_writer_and_reader_call_shapes(tmp_path: Path, classes: str) -> None:
    W, R = (
        (gc.FileSystemWriter, gc.FileSystemReader)
        if classes == "goodput"
        else (dcp.FileSystemWriter, dcp.FileSystemReader)
    )
    w = torch.randn(4, 4)
    gc.save({"w": w}, storage_writer=W(str(tmp_path / "ck"), thread_count=4, single_file_per_rank=False))
    out = {"w": torch.zeros(4, 4)}
    gc.load(out, storage_reader=R(str(tmp_path / "ck")))
    assert torch.equal(out["w"], w)
    gc.save_state_dict({"w": w * 2}, W(str(tmp_path / "ck2")))
    gc.load_state_dict(out, R(str(tmp_path / "ck2")))
    assert torch.equal(out["w"], w * 2)


def test_overwrite_false_refuses_an_existing_checkpoint(tmp_path: Path) -> None:
    gc.save({"w": torch.zeros(2)}, tmp_path / "ck")
    from torch.distributed.checkpoint.api import CheckpointException

    with pytest.raises(CheckpointException, match=r"Checkpoint already exists.*overwrite=False\) forbids replacing it"):
        gc.save({"w": torch.ones(2)}, storage_writer=gc.FileSystemWriter(tmp_path / "ck", overwrite=False))
    out = {"w": torch.ones(2)}
    gc.load(out, tmp_path / "ck")
    assert torch.equal(out["w"], torch.zeros(2))  # nothing was replaced
    gc.save({"w": torch.ones(2)}, storage_writer=gc.FileSystemWriter(tmp_path / "ck"))  # the default replaces


def test_overwrite_false_never_replaces_even_a_checkpoint_committed_while_it_wrote(tmp_path: Path) -> None:
    """Two refusing saves started together: exactly one checkpoint, whoever came second (refused
    before writing, or losing at the commit, which then creates only if absent)."""
    import threading

    from torch.distributed.checkpoint.api import CheckpointException

    for i in range(10):
        path, results = tmp_path / f"ck{i}", [None, None]
        barrier = threading.Barrier(2)

        def go(k: int, path: Path = path, results: list = results, barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            try:
                gc.save({"w": torch.full((1000,), float(k))}, storage_writer=gc.FileSystemWriter(path, overwrite=False))
                results[k] = "won"
            except (CheckpointException, gc.SaveError) as e:
                results[k] = e

        ts = [threading.Thread(target=go, args=(k,)) for k in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert results.count("won") == 1, results
        out = {"w": torch.zeros(1000)}
        gc.load(out, path)
        assert torch.equal(out["w"], torch.full((1000,), float(results.index("won"))))


def test_planners_default_accepted_custom_refused(tmp_path: Path) -> None:
    from torch.distributed.checkpoint import DefaultLoadPlanner, DefaultSavePlanner

    gc.save({"w": torch.ones(3)}, tmp_path / "ck", planner=DefaultSavePlanner())
    out = {"w": torch.zeros(3), "extra": torch.zeros(1)}
    gc.load(out, tmp_path / "ck", planner=DefaultLoadPlanner(allow_partial_load=True))
    assert torch.equal(out["w"], torch.ones(3))
    with pytest.raises(gc.CheckpointError, match="'extra' is not in the checkpoint"):
        gc.load(out, tmp_path / "ck", planner=DefaultLoadPlanner())
    gc.load(out, tmp_path / "ck", allow_partial_load=True)

    class Mine(DefaultSavePlanner):
        pass

    with pytest.raises(TypeError, match="planner=Mine: goodput makes its own save plan"):
        gc.save({"w": torch.ones(3)}, tmp_path / "ck", planner=Mine())
    with pytest.raises(ValueError, match="storage extensions"):
        gc.FileSystemWriter(tmp_path / "x", _extensions=[object()])
    registry = gc.FileSystemReader(tmp_path / "ck", _extension_registry=object())
    gc.load(out, storage_reader=registry, strict=False)  # nothing to undo: accepted


def test_dtype_is_cast_on_load_unless_strict(tmp_path: Path) -> None:
    w = torch.randn(6, 5)
    gc.save({"w": w, "i": torch.arange(7)}, tmp_path / "ck")
    out = {"w": torch.zeros(6, 5, dtype=torch.bfloat16), "i": torch.zeros(7, dtype=torch.int32)}
    gc.load(out, tmp_path / "ck")
    assert out["w"].dtype == torch.bfloat16 and torch.equal(out["w"], w.to(torch.bfloat16))
    assert out["i"].dtype == torch.int32 and torch.equal(out["i"], torch.arange(7, dtype=torch.int32))
    col = torch.zeros(5, 6, dtype=torch.float64).t()  # a non-contiguous target, cast too
    gc.load({"w": col}, tmp_path / "ck", strict=False)
    assert torch.equal(col, w.double())
    with pytest.raises(gc.CheckpointError, match="saved as float32, loading into bfloat16"):
        gc.load({"w": torch.zeros(6, 5, dtype=torch.bfloat16)}, tmp_path / "ck", strict=False, strict_dtype=True)


def test_bytesio_values_round_trip(tmp_path: Path) -> None:
    blob = io.BytesIO(b"\x00tokenizer state\xff" * 100)
    gc.save({"blob": blob, "w": torch.ones(2)}, tmp_path / "ck")
    out = io.BytesIO(b"old")
    gc.load({"blob": out}, tmp_path / "ck", strict=False)
    assert out.getvalue() == blob.getvalue() and out.tell() == 0
    assert gc.open(tmp_path / "ck").tensors["blob"].kind == "bytes"


def _load_then_delete(rank: int, world: int, root: str) -> str:
    """DCP's test helpers remove the directory right after load returns on rank 0; the load's
    collective end means every rank has finished reading by then."""
    import torch.distributed as dist

    big = 1 << 20
    for i in range(5):
        path = f"{root}/c{i}"
        gc.save({"w": torch.arange(big, dtype=torch.float32) + i}, path)
        out = {"w": torch.zeros(big)} if rank == 1 else {}  # rank 1 has all the reading to do
        gc.load(out, path, strict=False)
        if rank == 0:
            shutil.rmtree(path)
        dist.barrier()
    # a failure on one rank is an error on every rank
    gc.save({"w": torch.zeros(4)}, f"{root}/last")
    try:
        gc.load({"w": torch.zeros(4), **({"missing": torch.zeros(1)} if rank == 1 else {})}, f"{root}/last")
    except gc.CheckpointError as e:
        return str(e)
    return "no error"


def test_load_ends_in_a_collective(tmp_path: Path) -> None:
    msgs = run_ranks(_load_then_delete, 2, str(tmp_path))
    assert "failed on other ranks: rank 1:" in msgs[0] and "'missing'" in msgs[0]
    assert "'missing' is not in the checkpoint" in msgs[1]


def test_meta_device_targets_are_materialized_then_filled(tmp_path: Path) -> None:
    w = torch.randn(3, 4)
    gc.save({"model": {"w": w, "layers": [torch.arange(3.0)]}}, tmp_path / "ck")
    with torch.device("meta"):
        state = {"model": {"w": torch.empty(3, 4), "layers": [torch.empty(3)]}}
    gc.load(state, tmp_path / "ck")
    assert state["model"]["w"].device.type == "cpu" and torch.equal(state["model"]["w"], w)
    assert torch.equal(state["model"]["layers"][0], torch.arange(3.0))


def _sharded(rank: int, world: int, root: str) -> list:
    from torch.distributed._shard import sharded_tensor
    from torch.distributed._shard.sharding_spec import ChunkShardingSpec

    rows = ChunkShardingSpec(dim=0, placements=[f"rank:{r}/cpu" for r in range(world)])
    cols = ChunkShardingSpec(dim=1, placements=[f"rank:{r}/cpu" for r in range(world)])
    full = torch.arange(6 * 8, dtype=torch.float32).reshape(6, 8)
    st = sharded_tensor.empty(rows, 6, 8)
    st.local_shards()[0].tensor.copy_(full[rank * 3 : rank * 3 + 3])
    gc.save({"st": st, "step": 1}, f"{root}/ck")
    back = sharded_tensor.zeros(cols, 6, 8)
    gc.load({"st": back}, f"{root}/ck", strict=False)
    shard = back.local_shards()[0]
    return [shard.metadata.shard_offsets, torch.equal(shard.tensor, full[:, rank * 4 : rank * 4 + 4])]


def test_sharded_tensors_save_and_reshard(tmp_path: Path) -> None:
    out = run_ranks(_sharded, 2, str(tmp_path))
    assert out == [[[0, 0], True], [[0, 4], True]]
    whole = {"st": torch.zeros(6, 8)}
    gc.load(whole, tmp_path / "ck", strict=False)
    assert torch.equal(whole["st"], torch.arange(48.0).reshape(6, 8))


def _ordered(rank: int, world: int, root: str) -> list:
    """Stateful objects whose load_state_dict runs collectives, in a different dict order on each
    rank: loaded in key order (as DCP), they pair up instead of deadlocking."""
    import torch.distributed as dist

    class Gathers:
        def state_dict(self) -> dict:
            return {}

        def load_state_dict(self, sd: dict) -> None:
            out = [torch.zeros(1) for _ in range(world)]
            dist.all_gather(out, torch.ones(1) * rank)
            self.got = [float(x) for x in out]

    class Reduces:
        def state_dict(self) -> dict:
            return {}

        def load_state_dict(self, sd: dict) -> None:
            t = torch.ones(1) * (rank + 1)
            dist.all_reduce(t)
            self.got = float(t)

    a, b = Gathers(), Reduces()
    sd = {"A": a, "B": b} if rank == 0 else {"B": b, "A": a}
    gc.save(sd, f"{root}/ck")
    gc.load(sd, f"{root}/ck")
    return [a.got, b.got]


def test_stateful_loads_run_in_key_order(tmp_path: Path) -> None:
    assert run_ranks(_ordered, 2, str(tmp_path), timeout=120) == [[[0.0, 1.0], 3.0]] * 2


def test_top_level_values_go_back_into_the_callers_dict(tmp_path: Path) -> None:
    class Watched(dict):
        set_called = False

        def __setitem__(self, k: object, v: object) -> None:
            self.set_called = True
            super().__setitem__(k, v)

    sd = Watched()
    sd["foo"] = {"w": torch.ones(3), "n": [1, 2]}
    sd.set_called = False
    gc.save(sd, tmp_path / "ck")
    gc.load(sd, tmp_path / "ck")
    assert sd.set_called


def _several_shards(rank: int, world: int, root: str) -> list:
    """Each rank holds two shards of one ShardedTensor (DCP's test_load_with_different_shard_plan)."""
    from torch.distributed._shard import sharded_tensor
    from torch.distributed._shard.sharding_spec import ChunkShardingSpec

    four = ChunkShardingSpec(dim=0, placements=[f"rank:{r % world}/cpu" for r in range(2 * world)])
    cols = ChunkShardingSpec(dim=1, placements=[f"rank:{(r + 1) % world}/cpu" for r in range(3 * world)])
    full = torch.arange(8 * 6, dtype=torch.float32).reshape(8, 6)
    st = sharded_tensor.empty(four, 8, 6)
    for sh in st.local_shards():
        o = sh.metadata.shard_offsets[0]
        sh.tensor.copy_(full[o : o + sh.tensor.shape[0]])
    gc.save({"st": st}, f"{root}/sync")
    gc.async_save({"st": st}, checkpoint_id=f"{root}/async").committed.result(timeout=60)
    out = []
    for name in ("sync", "async"):
        back = sharded_tensor.zeros(cols, 8, 6)
        gc.load({"st": back}, f"{root}/{name}")
        out.append(
            [
                [sh.metadata.shard_offsets, torch.equal(sh.tensor, full[:, sh.metadata.shard_offsets[1]].unsqueeze(1))]
                for sh in back.local_shards()
            ]
        )
    return out


def test_several_shards_of_one_sharded_tensor_on_a_rank(tmp_path: Path) -> None:
    out = run_ranks(_several_shards, 2, str(tmp_path))
    # 6 columns over 6 shards, rank r holding shards r+1, r+3, r+5 (mod 2): each one column
    assert out[0] == [[[[0, 1], True], [[0, 3], True], [[0, 5], True]]] * 2
    assert out[1] == [[[[0, 0], True], [[0, 2], True], [[0, 4], True]]] * 2
    for name in ("sync", "async"):
        whole = {"st": torch.zeros(8, 6)}
        gc.load(whole, tmp_path / name)
        assert torch.equal(whole["st"], torch.arange(48.0).reshape(8, 6))
        assert gc.Checkpoint(tmp_path / name).verify() > 0


def _wrapped(rank: int, world: int, root: str) -> list:
    """A DTensor over LocalShardsWrapper with uneven shards, two on a rank (torchrec's layout)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor._shards_wrapper import LocalShardsWrapper

    mesh = init_device_mesh("cpu", (world,))
    full = torch.arange(7 * 3, dtype=torch.float32).reshape(7, 3)
    rows = [(0, 2), (5, 7)] if rank == 0 else [(2, 5)]  # rank 0: rows 0-1 and 5-6; rank 1: rows 2-4
    w = LocalShardsWrapper([full[a:b].clone() for a, b in rows], [(a, 0) for a, _ in rows])
    dt = DTensor.from_local(w, mesh, [Shard(0)], run_check=False, shape=full.shape, stride=full.stride())
    gc.save({"t": dt}, f"{root}/ck")
    back = [torch.zeros(b - a, 3) for a, b in rows]
    into = DTensor.from_local(
        LocalShardsWrapper(back, [(a, 0) for a, _ in rows]), mesh, [Shard(0)], run_check=False,
        shape=full.shape, stride=full.stride(),
    )  # fmt: skip
    gc.load({"t": into}, f"{root}/ck")
    return [torch.equal(t, full[a:b]) for t, (a, b) in zip(back, rows)]


def test_dtensor_over_local_shards_wrapper_uneven(tmp_path: Path) -> None:
    assert run_ranks(_wrapped, 2, str(tmp_path)) == [[True, True], [True]]
    whole = {"t": torch.zeros(7, 3)}
    gc.load(whole, tmp_path / "ck")
    assert torch.equal(whole["t"], torch.arange(21.0).reshape(7, 3))


@pytest.mark.parametrize("kind", ["THREAD", "PROCESS"])
def test_async_save_returns_a_future_of_the_commit(tmp_path: Path, kind: str) -> None:
    """DCP's call: ``async_save(sd, storage_writer=..., async_checkpointer_type=...)`` gives a
    ``concurrent.futures.Future``; ``concurrent.futures.wait`` and callbacks work on it."""
    import concurrent.futures as cf

    from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

    model, optim = _trained(3)
    fut = gc.async_save(
        {"app": AppState(model, optim)},
        storage_writer=dcp.FileSystemWriter(str(tmp_path / "ck")),
        async_checkpointer_type=getattr(AsyncCheckpointerType, kind),
    )
    assert isinstance(fut, cf.Future)
    called: list[bool] = []
    fut.add_done_callback(lambda f: called.append(f.exception() is None))
    done, _ = cf.wait([fut], timeout=60)
    assert done == {fut} and fut.result().bytes > 0 and called == [True]
    assert fut.committed is fut and fut.staged.done()
    fresh, fresh_optim = _trained(4)
    dcp_free = {"app": AppState(fresh, fresh_optim)}
    gc.load(dcp_free, checkpoint_id=str(tmp_path / "ck"))
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), fresh.state_dict().values()))
    with pytest.raises(dcp.api.CheckpointException, match="Checkpoint already exists"):
        gc.async_save({"w": torch.zeros(1)}, storage_writer=gc.FileSystemWriter(tmp_path / "ck", overwrite=False))


def test_async_save_with_dcp_zero_overhead_staging_answers_async_save_response(tmp_path: Path) -> None:
    """DCP's ``DefaultStager(StagingOptions(use_async_staging=True))`` asks for staging behind the
    loop: the answer is DCP's AsyncSaveResponse, and the checkpoint holds the state as it was
    when ``staging_completion`` completed (the state may change only after that, as in DCP)."""
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
    from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse

    w = torch.arange(1 << 16, dtype=torch.float32)  # 256 KiB: large enough to be copied lazily
    stager = DefaultStager(StagingOptions(False, False, True, False))
    resp = gc.async_save({"w": w}, checkpoint_id=str(tmp_path / "zoc"), async_stager=stager)
    assert isinstance(resp, AsyncSaveResponse)
    assert resp.staging_completion.result(timeout=60) is None
    w.add_(1)  # after staging_completion: not in the checkpoint
    assert isinstance(resp.upload_completion, gc.AsyncSave) and resp.upload_completion.result(timeout=60)
    out = {"w": torch.zeros(1 << 16)}
    gc.load(out, tmp_path / "zoc")
    assert torch.equal(out["w"], torch.arange(1 << 16, dtype=torch.float32))
    eager = gc.async_save(
        {"w": w},
        checkpoint_id=str(tmp_path / "eager"),
        async_stager=DefaultStager(StagingOptions(False, False, False, False)),
    )
    assert isinstance(eager, gc.AsyncSave) and eager.result(timeout=60)
    stager.close()

    class Mine:
        def stage(self, sd: dict) -> dict:
            return sd

    with pytest.raises(ValueError, match="async_stager=Mine: goodput stages into its own buffer"):
        gc.async_save({"w": w}, checkpoint_id=str(tmp_path / "x"), async_stager=Mine())
    with pytest.raises(TypeError, match="planner=object: goodput makes its own async_save plan"):
        gc.async_save({"w": w}, checkpoint_id=str(tmp_path / "x"), planner=object())
    assert gc.latest(tmp_path) is not None and not (tmp_path / "x").exists()


class WrapperOnly(torch.Tensor):
    """Like torch's test ``CheckpointableDistTensor``: a wrapper subclass that supports no tensor
    operation at all (not even ``detach``), describing its one shard through DCP's protocol."""

    @staticmethod
    def __new__(cls, fqn: str, local: torch.Tensor, offsets: list[int], size: list[int]) -> WrapperOnly:
        r = torch.Tensor._make_wrapper_subclass(cls, size, dtype=local.dtype, device=local.device)
        r._fqn, r._local, r._offsets, r._size = fqn, local, torch.Size(offsets), torch.Size(size)
        return r

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # type: ignore[override]
        raise NotImplementedError(f"{func} is not supported for WrapperOnly")

    def __create_write_items__(self, fqn: str, obj: object) -> list:
        from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex, TensorProperties
        from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType

        chunk = ChunkStorageMetadata(offsets=self._offsets, sizes=self._local.size())
        data = TensorWriteData(
            chunk=chunk, properties=TensorProperties.create_from_tensor(self._local), size=self._size
        )
        return [WriteItem(index=MetadataIndex(self._fqn, self._offsets), type=WriteItemType.SHARD, tensor_data=data)]

    def __create_chunk_list__(self) -> list:
        from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

        return [ChunkStorageMetadata(offsets=self._offsets, sizes=self._local.size())]

    def __get_tensor_shard__(self, index: object) -> torch.Tensor:
        assert index.fqn == self._fqn and index.offset == self._offsets, index
        return self._local


SAVE_PLAN = [(0, 4), (4, 3), (7, 4), (11, 5)]  # (offset, rows): uneven, as in DCP's own test
LOAD_PLAN = [(0, 2), (2, 4), (6, 6), (12, 4)]


def _protocol(rank: int, world: int, root: str) -> bool:
    o, n = SAVE_PLAN[rank]
    w = WrapperOnly("t", torch.arange(o, o + n, dtype=torch.float32).view(n, 1), [o, 0], [16, 1])
    gc.save({"t": w}, root)
    o, n = LOAD_PLAN[rank]
    local = torch.rand(n, 1)
    gc.load({"t": WrapperOnly("t", local, [o, 0], [16, 1])}, root)
    return bool(torch.equal(local, torch.arange(o, o + n, dtype=torch.float32).view(n, 1)))


def test_tensor_subclasses_with_dcps_protocol_save_and_reshard(tmp_path: Path) -> None:
    assert run_ranks(_protocol, 4, str(tmp_path)) == [True] * 4
    ck = gc.open(tmp_path)
    assert ck.tensors["t"].shape == (16, 1) and len(ck.tensors["t"].chunks) == 4
    assert ck.read("t").reshape(-1).tolist() == list(range(16))
    local = torch.zeros(16, 1)  # and into a plain tensor, in one process
    gc.load({"t": local}, tmp_path)
    assert torch.equal(local.view(-1), torch.arange(16, dtype=torch.float32))


def test_every_goodput_error_is_dcps_checkpoint_exception(tmp_path: Path) -> None:
    from torch.distributed.checkpoint.api import CheckpointException

    assert gc.CheckpointException is CheckpointException is dcp.CheckpointException
    assert issubclass(gc.CheckpointError, CheckpointException) and issubclass(gc.SaveError, CheckpointException)
    assert issubclass(gc.CheckpointError, Exception)  # DCP's is a BaseException; goodput's stays an Exception
    with pytest.raises(dcp.CheckpointException, match="is not a committed checkpoint") as e:
        gc.load({"w": torch.zeros(2)}, tmp_path)
    assert isinstance(e.value, gc.CheckpointError) and e.value.failures == {}
    gc.save({"w": torch.zeros(2)}, tmp_path)
    with pytest.raises(CheckpointException, match="Checkpoint already exists"):
        gc.save({"w": torch.zeros(2)}, storage_writer=gc.FileSystemWriter(tmp_path, overwrite=False))
