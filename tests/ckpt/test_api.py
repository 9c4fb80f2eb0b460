"""One-process save/load: every dtype, nested names, values, numpy, Adam, and clear errors."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

import goodput.ckpt as gc
from goodput.ckpt.format.format import CheckpointError

DTYPES = [
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16, torch.uint32,
    torch.uint64, torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64,
    torch.complex128, torch.float8_e4m3fn, torch.float8_e5m2,
]  # fmt: skip


def sample(dt: torch.dtype, shape=(3, 5)) -> torch.Tensor:
    g = torch.Generator().manual_seed(7)
    x = torch.randn(shape, generator=g) * 10
    if dt == torch.bool:
        return x > 0
    if dt.is_complex:
        return torch.complex(x, -x).to(dt)
    if dt.is_floating_point:
        return x.to(dt)
    return x.abs().to(torch.int64).to(dt)


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.element_size() == 1 and a.dtype not in (torch.bool,):
        return torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    return torch.equal(a, b)


@pytest.mark.parametrize("dt", DTYPES, ids=str)
def test_every_dtype_round_trips_bitwise(tmp_path: Path, dt: torch.dtype) -> None:
    x = sample(dt)
    gc.save({"x": x, "scalar": x[0, 0].clone()}, tmp_path)
    y = {"x": torch.zeros_like(x), "scalar": torch.zeros_like(x[0, 0])}
    gc.load(y, tmp_path)
    assert same(y["x"], x) and same(y["scalar"], x[0, 0])
    # and with numpy alone
    arr = gc.open(tmp_path).read("x")
    if dt == torch.bfloat16:
        np.testing.assert_array_equal(arr, x.float().numpy())
    elif str(dt).startswith("torch.float8"):
        np.testing.assert_array_equal(arr, x.view(torch.uint8).numpy())
    else:
        np.testing.assert_array_equal(arr, x.numpy())


def test_nested_names_values_and_numpy(tmp_path: Path) -> None:
    state = {
        "model": {"layers": [{"weight": torch.ones(2, 2)}, {"weight": torch.zeros(3)}]},
        "optim": {
            "state": {0: {"step": torch.tensor(4.0)}},
            "param_groups": [{"lr": 0.1, "betas": (0.9, 0.95), "params": [0]}],
        },
        "rng": np.arange(5, dtype=np.uint32),
        "misc": {"nan": math.nan, "none": None, "name": "run-7", "flag": True, "ints": {1: "a"}},
    }
    gc.save(state, checkpoint_id=tmp_path)  # DCP's keyword works too
    ck = gc.open(tmp_path)
    assert set(ck.keys()) == {"model.layers.0.weight", "model.layers.1.weight", "optim.state.0.step", "rng"}
    assert ck.tensors["rng"].kind == "numpy"
    target = {
        "model": {"layers": [{"weight": torch.empty(2, 2)}, {"weight": torch.empty(3)}]},
        "optim": {
            "state": {0: {"step": torch.tensor(0.0)}},
            "param_groups": [{"lr": 0.0, "betas": (0.0, 0.0), "params": [0]}],
        },
        "rng": np.zeros(5, np.uint32),
        "misc": {"nan": 0.0, "none": 1, "name": "", "flag": False, "ints": {1: ""}},
    }
    gc.load(target, tmp_path)
    assert torch.equal(target["model"]["layers"][0]["weight"], torch.ones(2, 2))
    assert target["optim"]["state"][0]["step"].item() == 4.0
    assert target["optim"]["param_groups"] == [{"lr": 0.1, "betas": (0.9, 0.95), "params": [0]}]
    assert isinstance(target["optim"]["param_groups"][0]["betas"], tuple)
    assert math.isnan(target["misc"]["nan"]) and target["misc"]["none"] is None and target["misc"]["ints"] == {1: "a"}
    np.testing.assert_array_equal(target["rng"], np.arange(5, dtype=np.uint32))


def test_adam_state_round_trips_and_training_continues_identically(tmp_path: Path) -> None:
    torch.manual_seed(0)

    def make() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
        return m, torch.optim.Adam(m.parameters(), lr=1e-2)

    def step(m, opt, seed):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(4, 8, generator=g)
        opt.zero_grad()
        m(x).pow(2).sum().backward()
        opt.step()

    m1, o1 = make()
    for i in range(3):
        step(m1, o1, i)
    gc.save({"model": m1.state_dict(), "optim": o1.state_dict()}, tmp_path)
    m2, o2 = make()
    step(m2, o2, 99)  # materialise Adam's state so it can be loaded in place
    sd = {"model": m2.state_dict(), "optim": o2.state_dict()}
    gc.load(sd, tmp_path)
    o2.load_state_dict(sd["optim"])
    for a, b in zip(m1.parameters(), m2.parameters()):
        assert torch.equal(a, b)
    step(m1, o1, 3)
    step(m2, o2, 3)
    for a, b in zip(m1.parameters(), m2.parameters()):
        assert torch.equal(a, b)


def test_noncontiguous_and_grad_targets(tmp_path: Path) -> None:
    w = torch.randn(6, 4)
    gc.save({"w": w, "p": w.clone()}, tmp_path)
    t = torch.zeros(4, 6).t()  # not contiguous
    p = torch.nn.Parameter(torch.zeros(6, 4))
    gc.load({"w": t, "p": p}, tmp_path)
    assert torch.equal(t, w) and torch.equal(p.detach(), w)


def test_overwrite_in_place_keeps_one_version(tmp_path: Path) -> None:
    gc.save({"w": torch.zeros(3)}, tmp_path, step=1)
    gc.save({"w": torch.ones(3)}, tmp_path, step=2)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert len([n for n in names if n.startswith("data-")]) == 1
    assert len([n for n in names if n.startswith("metadata-")]) == 1
    t = {"w": torch.zeros(3)}
    assert gc.load(t, tmp_path).step == 2
    assert torch.equal(t["w"], torch.ones(3))


def test_latest_picks_the_newest_committed_step(tmp_path: Path) -> None:
    for s in (5, 20, 10):
        gc.save({"w": torch.full((2,), float(s))}, tmp_path / f"step_{s}", step=s)
    (tmp_path / "step_30").mkdir()  # never committed
    (tmp_path / "step_30" / "data-0123456789abcdef-r00000.bin").write_bytes(b"x" * 10)
    assert gc.latest(tmp_path) == tmp_path / "step_20"
    assert [m.step for _, m in gc.list_checkpoints(tmp_path)] == [5, 10, 20]


def test_unsupported_leaf_names_the_key(tmp_path: Path) -> None:
    with pytest.raises(gc.SaveError, match=r"'a\.b'.*set"):
        gc.save({"a": {"b": {1, 2}}}, tmp_path)
    with pytest.raises(gc.SaveError, match=r"'arr'.*object arrays"):
        gc.save({"arr": np.array([object()])}, tmp_path)
    assert gc.latest(tmp_path) is None


def test_load_errors_name_the_key(tmp_path: Path) -> None:
    gc.save({"model": {"weight": torch.zeros(2, 3)}, "lr": 0.1}, tmp_path)
    with pytest.raises(CheckpointError, match=r"'model\.wieght' is not in the checkpoint.*'model\.weight'"):
        gc.load({"model": {"wieght": torch.zeros(2, 3)}}, tmp_path)
    with pytest.raises(
        CheckpointError, match=r"'model\.weight': saved with global shape \(2, 3\), loading into \(3, 2\)"
    ):
        gc.load({"model": {"weight": torch.zeros(3, 2)}}, tmp_path)
    with pytest.raises(CheckpointError, match=r"'model\.weight': saved as float32, loading into float64"):
        gc.load({"model": {"weight": torch.zeros(2, 3, dtype=torch.float64)}}, tmp_path, strict_dtype=True)
    with pytest.raises(CheckpointError, match=r"'lr' was saved as a value"):
        gc.load({"lr": torch.zeros(1)}, tmp_path)
    # non-strict loads what it can
    t = {"model": {"weight": torch.ones(2, 3), "extra": torch.ones(1)}}
    gc.load(t, tmp_path, strict=False)
    assert torch.equal(t["model"]["weight"], torch.zeros(2, 3))
    with pytest.raises(CheckpointError, match="not a committed checkpoint"):
        gc.load({}, tmp_path / "nowhere")


def test_shard_declarations_are_checked() -> None:
    with pytest.raises(ValueError, match="leaves global shape"):
        gc.LocalShard(torch.zeros(3, 3), (4, 4), (2, 0))
    with pytest.raises(ValueError, match="leaves a tensor"):
        gc.FlatShard(torch.zeros(5), (2, 2), 1)


def test_files_per_rank_splits_large_chunks_into_parallel_files(tmp_path: Path) -> None:
    w = torch.randn(1024, 1024)  # 4 MiB: cut into pieces along rows, spread over 3 files
    b = torch.randn(7)
    gc.save({"w": w, "b": b}, tmp_path, files_per_rank=3)
    data = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("data-"))
    assert len(data) == 3 and all(n.endswith(("-0.bin", "-1.bin", "-2.bin")) for n in data)
    ck = gc.open(tmp_path)
    assert len(ck.tensors["w"].chunks) > 1
    t = {"w": torch.zeros(1024, 1024), "b": torch.zeros(7)}
    gc.load(t, tmp_path)
    assert torch.equal(t["w"], w) and torch.equal(t["b"], b)
    gc.verify(tmp_path)


def test_block_bytes_must_be_a_power_of_two(tmp_path: Path) -> None:
    with pytest.raises(gc.SaveError, match="power of two"):
        gc.save({"w": torch.zeros(4)}, tmp_path, block_bytes=1536)
    w = torch.randn(3 << 20)  # 12 MiB: several segments
    for bb in (1024, 65536):
        gc.save({"w": w}, tmp_path / str(bb), block_bytes=bb)
        t = {"w": torch.zeros_like(w)}
        gc.load(t, tmp_path / str(bb))
        assert torch.equal(t["w"], w)
        gc.verify(tmp_path / str(bb))


def test_leftovers_in_the_directory_never_fail_a_commit(tmp_path: Path) -> None:
    gc.save({"w": torch.zeros(3)}, tmp_path, step=1)
    (tmp_path / "data-leftover").mkdir()  # something cleanup cannot unlink
    gc.save({"w": torch.ones(3)}, tmp_path, step=2)
    t = {"w": torch.zeros(3)}
    assert gc.load(t, tmp_path).step == 2 and torch.equal(t["w"], torch.ones(3))
    gc.verify(tmp_path)


def test_shards_that_do_not_tile_the_tensor_fail_the_save(tmp_path: Path) -> None:
    # one process declaring half a tensor: a gap the save must refuse, naming the key
    with pytest.raises(gc.SaveError, match=r"'w'.*do not tile.*8 of the tensor's 16 elements"):
        gc.save({"w": gc.LocalShard(torch.zeros(2, 4), (4, 4), (0, 0))}, tmp_path)
    assert gc.latest(tmp_path) is None


def test_two_files_by_default_for_large_ranks_and_pieces_cut_only_for_balance(tmp_path: Path) -> None:
    from goodput.ckpt.saving.writer import AUTO_FILES_MIN_BYTES, auto_files

    assert auto_files(AUTO_FILES_MIN_BYTES - 1) == 1 and auto_files(AUTO_FILES_MIN_BYTES) == 2
    # four equal tensors over two files: balanced as they are, so no tensor is cut
    state = {f"w{i}": torch.randn(256, 1024) for i in range(4)}
    gc.save(state, tmp_path / "even", files_per_rank=2)
    assert len([p for p in (tmp_path / "even").iterdir() if p.name.startswith("data-")]) == 2
    ck = gc.open(tmp_path / "even")
    assert all(len(ck.tensors[k].chunks) == 1 for k in state)
    # a small state keeps one file by default
    gc.save(state, tmp_path / "small")
    assert len([p for p in (tmp_path / "small").iterdir() if p.name.startswith("data-")]) == 1
    t = {k: torch.zeros_like(v) for k, v in state.items()}
    gc.load(t, tmp_path / "even")
    assert all(torch.equal(t[k], state[k]) for k in state)


def test_lazy_conjugate_and_negative_views_save_their_values(tmp_path: Path) -> None:
    """``z.conj()`` and ``-z`` on complex tensors are lazy views whose bytes are not their
    values: saved as values, and loaded into such views through staging."""
    z = torch.randn(6, dtype=torch.complex64)
    gc.save({"c": z.conj(), "n": torch._neg_view(z)}, tmp_path)
    out = {"c": torch.zeros(6, dtype=torch.complex64), "n": torch.zeros(6, dtype=torch.complex64).conj()}
    gc.load(out, tmp_path)
    assert torch.equal(out["c"], z.conj()) and torch.equal(out["n"], -z) and out["n"].is_conj()
