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
