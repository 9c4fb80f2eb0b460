"""`goodput ckpt import-dcp`: checkpoints written by real torch.distributed.checkpoint, converted
and compared bitwise (via the numpy reader and via goodput.ckpt.load)."""

from __future__ import annotations

import io
import os
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp
from typer.testing import CliRunner

import goodput.ckpt as gc
from goodput.ckpt.compat.dcp_import import (
    DCPImportError,
    DCPImportWarning,
    ImportResult,
    _batches,
    _TensorSpec,
    import_dcp,
)
from goodput.cli.main import app
from tests.distributed import run_ranks


def _bits(t: torch.Tensor) -> bytes:
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _tensors() -> dict[str, torch.Tensor]:
    """Flat fqn -> tensor, as DCP will name them."""
    g = torch.Generator().manual_seed(0)
    special = torch.tensor([0.0, -0.0, float("nan"), float("inf"), -float("inf"), 1e-45])
    return {
        "model.embed.weight": torch.randn(6, 4, generator=g),
        "model.layers.0.weight": torch.randn(4, 4, generator=g).to(torch.bfloat16),
        "model.layers.0.bias": torch.randn(4, generator=g).to(torch.bfloat16),
        "model.layers.1.weight": torch.randn(3, 4, generator=g),
        "model.special": special,
        "ids": torch.randint(-(2**60), 2**60, (7,), generator=g, dtype=torch.int64),
        "scale": torch.tensor(2.5),  # 0-d
        "mask": torch.tensor([True, False, True]),
        "empty": torch.empty(0, 3),
    }


VALUES = {"step": 7, "lr": 0.001, "name": "run-a", "flag": True, "nothing": None}


def _nested(t: dict[str, torch.Tensor], values: dict | None = None) -> dict:
    """The nested state dict that flattens to the names of ``t``."""
    return {
        "model": {
            "embed": {"weight": t["model.embed.weight"]},
            "layers": [
                {"weight": t["model.layers.0.weight"], "bias": t["model.layers.0.bias"]},
                {"weight": t["model.layers.1.weight"]},
            ],
            "special": t["model.special"],
        },
        "ids": t["ids"],
        "scale": t["scale"],
        "mask": t["mask"],
        "empty": t["empty"],
        **(values or {}),
    }


def _dcp_save(state: dict, path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        dcp.save(state, storage_writer=dcp.FileSystemWriter(str(path)), no_dist=True)


@pytest.fixture(scope="module")
def dcp_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("dcp") / "ckpt"
    _dcp_save(_nested(_tensors(), VALUES), path)
    return path


def _check(dest: Path, expected: dict[str, torch.Tensor]) -> None:
    ck = gc.open(dest)
    assert sorted(ck.keys()) == sorted(expected)
    for name, t in expected.items():
        info = ck.tensors[name]
        assert info.shape == tuple(t.shape), name
        assert info.dtype == str(t.dtype).removeprefix("torch."), name
        assert ck.read(name, raw=True).tobytes() == _bits(t), name
    assert gc.verify(dest) == ck.manifest.data_bytes
    # and through goodput.load into zeros of the original nested structure
    zeros = {k: torch.zeros_like(v) for k, v in expected.items()}
    state = _nested(zeros)
    gc.load(state, dest)
    for name, t in expected.items():
        assert _bits(zeros[name]) == _bits(t), name
    assert _bits(state["model"]["layers"][0]["bias"]) == _bits(expected["model.layers.0.bias"])


@pytest.mark.parametrize("budget", [1 << 30, 64], ids=["in-memory", "spilled"])
def test_import_single_process(dcp_dir: Path, tmp_path: Path, budget: int) -> None:
    expected = _tensors()
    events: list[tuple[str, int]] = []
    dest = tmp_path / "gp"
    res = import_dcp(dcp_dir, dest, max_batch_bytes=budget, progress=lambda e, n: events.append((e, n)))
    total = sum(t.numel() * t.element_size() for t in expected.values())
    assert isinstance(res, ImportResult)
    assert (res.path, res.tensors, res.bytes, res.values, res.skipped) == (
        dest,
        len(expected),
        total,
        len(VALUES),
        {},
    )
    assert res.spilled == (budget < total)
    assert res.batches == (1 if budget >= total else len(_batches(_specs(expected), budget)))
    assert res.batches > 1 or budget >= total
    _check(dest, expected)
    ck = gc.open(dest)
    assert ck.values == VALUES
    assert ck.manifest.user == {"imported_from": "dcp", "source": str(dcp_dir)}
    # progress: the total, then every byte once, then the write
    assert events[0] == ("total", total)
    assert sum(n for e, n in events if e == "load") == total
    assert [e for e, _ in events[-2:]] == ["write", "done"]
    # nothing but the checkpoint is left in dest (the scratch file was never visible)
    assert all(p.name.startswith(("data-", "metadata-", "MANIFEST")) for p in dest.iterdir())


def _specs(t: dict[str, torch.Tensor]) -> list[_TensorSpec]:
    return [_TensorSpec(k, tuple(v.shape), v.dtype, v.numel() * v.element_size()) for k, v in t.items()]


def test_batches_respect_budget() -> None:
    sizes = [40, 10, 100, 0, 30, 30, 5]
    specs = [_TensorSpec(str(i), (n,), torch.uint8, n) for i, n in enumerate(sizes)]
    got = [[int(s.fqn) for s in b] for b in _batches(specs, 50)]
    assert got == [[0, 1], [2], [3, 4], [5, 6]]  # 100 > budget goes alone; order kept
    assert all(sum(sizes[i] for i in b) <= 50 for b in got if len(b) > 1)


class Opaque:
    """A picklable class that weights_only loading refuses."""

    def __init__(self, x: int) -> None:
        self.x = x


def test_bytes_and_bytesio_values_are_kept_as_opaque_bytes(tmp_path: Path) -> None:
    src = tmp_path / "dcp"
    pickled = b"\x80\x04\x95 torchtitan's dataloader state"  # bytes, never unpickled by goodput
    _dcp_save({"w": torch.arange(4.0), "loader": pickled, "blob": io.BytesIO(b"raw blob")}, src)
    res = import_dcp(src, tmp_path / "gp")
    assert res.skipped == {} and res.values == 2
    ck = gc.open(tmp_path / "gp")
    assert ck.values == {"loader": pickled}
    target = {"w": torch.zeros(4), "loader": b"", "blob": io.BytesIO()}
    gc.load(target, tmp_path / "gp")
    assert target["loader"] == pickled and target["blob"].getvalue() == b"raw blob"


def test_an_unconvertible_entry_fails_the_import_unless_allowed(tmp_path: Path) -> None:
    src = tmp_path / "dcp"
    _dcp_save({"w": torch.arange(4.0), "ok": {"a": 1, "b": (2, 3)}, "opaque": Opaque(3)}, src)
    with pytest.raises(DCPImportError, match=r"1 DCP entries cannot be converted: 'opaque'.*allow_skipped=True"):
        import_dcp(src, tmp_path / "gp")
    assert not (tmp_path / "gp").exists()  # nothing written
    with pytest.warns(DCPImportWarning, match="opaque"):
        res = import_dcp(src, tmp_path / "gp", allow_skipped=True)
    assert list(res.skipped) == ["opaque"]
    assert "weights_only" in res.skipped["opaque"]
    ck = gc.open(tmp_path / "gp")
    assert ck.values == {"ok.a": 1, "ok.b": (2, 3)}
    assert ck.read("w").tolist() == [0.0, 1.0, 2.0, 3.0]


# ---- a DTensor sharded over 2 real ranks ------------------------------------------------------


def _full(name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(sum(map(ord, name)))
    return torch.randn(shape, generator=g).to(dtype)


SHARDED = {"model.rows": ((5, 3), torch.float32), "model.cols": ((4, 6), torch.bfloat16)}


def _save_dtensor_dcp(rank: int, world: int, path: str) -> str:
    from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh

    mesh = init_device_mesh("cpu", (world,))
    state = {
        "model": {
            "rows": distribute_tensor(_full("model.rows", *SHARDED["model.rows"]), mesh, [Shard(0)]),
            "cols": distribute_tensor(_full("model.cols", *SHARDED["model.cols"]), mesh, [Shard(1)]),
        },
        "rep": torch.arange(5, dtype=torch.int64),  # a plain tensor: a replica on every rank
        "step": 3,
    }
    dcp.save(state, checkpoint_id=path)
    try:  # inside a process group of 2, goodput's save would wait for the other rank: refused
        import_dcp(path, f"{path}-r{rank}")
    except DCPImportError as e:
        return str(e)
    return "imported"


def test_import_two_rank_dtensor(tmp_path: Path) -> None:
    src = tmp_path / "dcp"
    refusals = run_ranks(_save_dtensor_dcp, 2, str(src))
    assert all("process group of 2 ranks" in m for m in refusals), refusals
    assert not list(tmp_path.glob("dcp-r*"))
    md = dcp.FileSystemReader(str(src)).read_metadata()
    chunks = md.state_dict_metadata["model.rows"].chunks
    assert sorted((tuple(c.offsets), tuple(c.sizes)) for c in chunks) == [
        ((0, 0), (3, 3)),
        ((3, 0), (2, 3)),
    ]
    expected = {n: _full(n, *spec) for n, spec in SHARDED.items()}
    expected["rep"] = torch.arange(5, dtype=torch.int64)
    for budget in (1 << 30, 40):
        dest = tmp_path / f"gp-{budget}"
        res = import_dcp(src, dest, max_batch_bytes=budget)
        assert res.tensors == 3 and res.spilled == (budget == 40)
        ck = gc.open(dest)
        assert ck.values == {"step": 3}
        for name, t in expected.items():
            assert ck.read(name, raw=True).tobytes() == _bits(t), name
            assert ck.tensors[name].shape == tuple(t.shape)
        gc.verify(dest)
        zeros = {"model": {"rows": torch.zeros(5, 3), "cols": torch.zeros(4, 6, dtype=torch.bfloat16)}}
        gc.load(zeros, dest, strict=False)
        assert _bits(zeros["model"]["rows"]) == _bits(expected["model.rows"])
        assert _bits(zeros["model"]["cols"]) == _bits(expected["model.cols"])


# ---- the CLI ----------------------------------------------------------------------------------


def _flat(text: str) -> str:
    """CLI output with rich's line wrapping undone."""
    return " ".join(text.split())


def test_cli_import_dcp(dcp_dir: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    dest = tmp_path / "gp"
    r = runner.invoke(app, ["ckpt", "import-dcp", str(dcp_dir), str(dest)])
    assert r.exit_code == 0, r.output
    assert "ok" in r.output and f"{len(_tensors())} tensors" in _flat(r.output)
    _check(dest, _tensors())
    r = runner.invoke(app, ["ckpt", "verify", str(dest)])
    assert r.exit_code == 0, r.output
    # a small budget spills; an occupied destination needs --overwrite
    r = runner.invoke(app, ["ckpt", "import-dcp", str(dcp_dir), str(dest), "--max-batch-bytes", "64B"])
    assert r.exit_code == 1 and "not empty" in _flat(r.output)
    r = runner.invoke(
        app,
        [
            "ckpt",
            "import-dcp",
            str(dcp_dir),
            str(dest),
            "--max-batch-bytes",
            "0.0625KiB",
            "--overwrite",
        ],
    )
    assert r.exit_code == 0, r.output
    assert "scratch file" in _flat(r.output)
    _check(dest, _tensors())
    r = runner.invoke(app, ["ckpt", "import-dcp", str(dcp_dir), str(tmp_path / "x"), "--max-batch-bytes", "lots"])
    assert r.exit_code != 0 and "cannot read 'lots' as a size" in _flat(r.output)


def test_cli_fails_on_skipped_entries_unless_allowed(tmp_path: Path) -> None:
    src = tmp_path / "dcp"
    _dcp_save({"w": torch.ones(2), "opaque": Opaque(1)}, src)
    r = CliRunner().invoke(app, ["ckpt", "import-dcp", str(src), str(tmp_path / "gp")])
    assert r.exit_code == 1 and "'opaque'" in _flat(r.output) and "--allow-skipped" in _flat(r.output), r.output
    assert not (tmp_path / "gp").exists()
    r = CliRunner().invoke(app, ["ckpt", "import-dcp", str(src), str(tmp_path / "gp"), "--allow-skipped"])
    assert r.exit_code == 0, r.output
    assert "skipped" in r.output and "opaque" in r.output


# ---- not a DCP checkpoint ---------------------------------------------------------------------


def test_not_a_dcp_checkpoint(tmp_path: Path, dcp_dir: Path) -> None:
    runner = CliRunner()
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "model.pt").write_bytes(b"not a checkpoint")
    dest = tmp_path / "gp"
    r = runner.invoke(app, ["ckpt", "import-dcp", str(empty), str(dest)])
    assert r.exit_code == 1
    assert "not a DCP checkpoint" in _flat(r.output)
    assert not dest.exists()  # nothing created
    with pytest.raises(DCPImportError, match="does not exist"):
        import_dcp(tmp_path / "missing", dest)
    r = runner.invoke(app, ["ckpt", "import-dcp", str(tmp_path / "missing"), str(dest)])
    assert r.exit_code == 1 and "does not exist" in _flat(r.output)
    # a goodput checkpoint is not a DCP one either, and the message says what it is
    gp = tmp_path / "gp-src"
    gc.save({"w": torch.ones(3)}, gp)
    with pytest.raises(DCPImportError, match="goodput checkpoint"):
        import_dcp(gp, dest)
    # a corrupt .metadata
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / ".metadata").write_bytes(b"\x00garbage")
    r = runner.invoke(app, ["ckpt", "import-dcp", str(bad), str(dest)])
    assert r.exit_code == 1 and "could not be read as DCP metadata" in _flat(r.output)
    # a missing data file fails the import and commits nothing
    broken = tmp_path / "broken"
    _dcp_save({"w": torch.ones(3)}, broken)
    for p in broken.glob("*.distcp"):
        p.unlink()
    with pytest.raises(DCPImportError, match="reading .* with DCP failed"):
        import_dcp(broken, dest)
    assert not dest.exists()
    # the destination cannot be the source
    with pytest.raises(DCPImportError, match="checkpoint itself"):
        import_dcp(dcp_dir, dcp_dir)
    assert sorted(os.listdir(dcp_dir)) == [".metadata", "__0_0.distcp"]
    np.testing.assert_array_equal(gc.open(gp).read("w"), np.ones(3, np.float32))
