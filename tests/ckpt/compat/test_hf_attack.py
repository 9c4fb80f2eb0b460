"""Hostile Hugging Face directories and exports: what a crafted directory or an awkward
checkpoint did to the safetensors loader and the exporter, each found by trying it (real files,
written by the ``safetensors`` library or by hand where the library would refuse to write them),
and a 2-rank round trip of every dtype an FSDP2 model holds."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import goodput.ckpt as gc
from goodput.ckpt.compat.exporter import INDEX, VALUES
from tests.distributed import run_ranks


def test_an_index_with_a_duplicate_key_is_refused_not_read_from_the_last_file(tmp_path: Path) -> None:
    """``{"w": "a.safetensors", "w": "b.safetensors"}``: ``json`` kept the last, so ``w`` was
    loaded from ``b`` in silence (another writer's file, a stale one). Refused, naming the key."""
    save_file({"w": torch.ones(2)}, tmp_path / "a.safetensors")
    save_file({"w": torch.full((2,), 9.0)}, tmp_path / "b.safetensors")
    (tmp_path / INDEX).write_text('{"weight_map": {"w": "a.safetensors", "w": "b.safetensors"}}')
    with pytest.raises(gc.CheckpointError, match=r"model\.safetensors\.index\.json.*duplicate key 'w'"):
        gc.load({"w": torch.zeros(2)}, tmp_path)


def test_carried_values_with_a_duplicate_key_are_refused(tmp_path: Path) -> None:
    save_file({"w": torch.ones(2)}, tmp_path / "model.safetensors")
    (tmp_path / VALUES).write_text(
        '{"format": "goodput.values", "version": 2, "values": {"step": 1, "step": 2}, "blobs": {}}'
    )
    with pytest.raises(gc.CheckpointError, match=r"goodput_values\.json.*duplicate key 'step'"):
        gc.load({"w": torch.zeros(2), "step": 0}, tmp_path)


def test_a_tensor_the_index_does_not_list_is_named_as_such(tmp_path: Path) -> None:
    """It said "which model.safetensors.index.json places in None"."""
    save_file({"w": torch.ones(2), "extra": torch.ones(3)}, tmp_path / "a.safetensors")
    (tmp_path / INDEX).write_text(json.dumps({"weight_map": {"w": "a.safetensors"}}))
    with pytest.raises(
        gc.CheckpointError, match=r"holds tensor 'extra', which model\.safetensors\.index\.json does not list"
    ):
        gc.load({"w": torch.zeros(2)}, tmp_path)


def test_dtype_casts_no_optimizer_step_counter(tmp_path: Path) -> None:
    """``torch.optim`` keeps ``step`` as a float32 scalar: ``--dtype bf16`` wrote step 1001 as
    1000.0. Scalars are written as saved; weights and moments are cast, integers never."""
    m = torch.nn.Linear(4, 3)
    opt = torch.optim.Adam(m.parameters())
    m(torch.randn(2, 4)).sum().backward()
    opt.step()
    for s in opt.state.values():
        s["step"] = torch.tensor(1001.0)
    sd = {"model": m.state_dict(), "optim": opt.state_dict(), "ids": torch.arange(5)}
    gc.save(sd, tmp_path / "ck")
    gc.export(tmp_path / "ck", tmp_path / "hf", dtype="bf16")
    got = load_file(tmp_path / "hf" / "model.safetensors")
    assert got["optim.state.0.step"].dtype == torch.float32 and got["optim.state.0.step"].item() == 1001.0
    assert got["model.weight"].dtype == torch.bfloat16 and got["optim.state.0.exp_avg"].dtype == torch.bfloat16
    assert got["ids"].dtype == torch.int64 and torch.equal(got["ids"], torch.arange(5))


def test_a_torch_export_onto_a_directory_is_refused_before_anything_is_read(tmp_path: Path) -> None:
    """It said "exists (pass --overwrite)"; with --overwrite the whole model was read into memory,
    then os.replace failed with a raw IsADirectoryError about a temporary name."""
    gc.save({"w": torch.ones(4)}, tmp_path / "ck")
    (tmp_path / "out").mkdir()
    for overwrite in (False, True):
        with pytest.raises(gc.CheckpointError, match=r"'.*/out' is a directory; --format torch writes one file"):
            gc.export(tmp_path / "ck", tmp_path / "out", format="torch", overwrite=overwrite)
    assert list((tmp_path / "out").iterdir()) == []


def _raw(path: Path, header: bytes, data: bytes) -> None:
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)


@pytest.mark.parametrize(
    ("header", "data", "why"),
    [
        (b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}', bytes(12), "invalid offset"),  # overlap
        (b'{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}', bytes(8), "not fully covered"),  # past the end
        (b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}}', bytes(8), "invalid offset"),  # reversed
        (b'{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}', bytes(8), "invalid shape"),  # size != shape x dtype
        (b"{not json", bytes(8), "invalid JSON"),
        (b'{"\\ud800":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', bytes(8), "invalid JSON"),  # lone surrogate
        (b'{"a":{"dtype":"F4","shape":[2],"data_offsets":[0,1]}}', bytes(1), "dtype F4, which goodput cannot load"),
    ],
)  # fmt: skip
def test_malformed_headers_are_refused_naming_the_file(tmp_path: Path, header: bytes, data: bytes, why: str) -> None:
    _raw(tmp_path / "model.safetensors", header, data)
    with pytest.raises(gc.CheckpointError, match=rf"model\.safetensors.*{why}"):
        gc.load({"a": torch.zeros(2)}, tmp_path)


def test_a_header_length_of_2_60_is_refused_without_reading_it(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", 1 << 60) + b"{}")
    with pytest.raises(gc.CheckpointError, match="a header of 1152921504606846976 bytes in a file of 10"):
        gc.load({"a": torch.zeros(2)}, tmp_path)


def _save_mixed(rank: int, world: int, path: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    full = _mixed()
    sd = {
        k: distribute_tensor(v, mesh, [Shard(1) if k == "cols" else Replicate() if v.dim() == 0 else Shard(0)])
        for k, v in full.items()
    }
    gc.save({"model": sd}, path)


def _mixed() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "bf16": torch.randn(7, 5, generator=g).bfloat16(),
        "fp16": torch.randn(9, 3, generator=g).half(),
        "fp32": torch.randn(11, generator=g),
        "int64": torch.randint(-(1 << 62), 1 << 62, (5, 2), generator=g),
        "cols": torch.randn(6, 9, generator=g),  # column shards: not contiguous in the file
        "scalar": torch.tensor(3.25),
    }


def _load_mixed(rank: int, world: int, hf: str) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    ref = _mixed()
    sd = {
        k: distribute_tensor(torch.zeros_like(v), mesh, [Shard(1) if k == "cols" else Replicate() if v.dim() == 0 else Shard(0)])
        for k, v in ref.items()
    }  # fmt: skip
    st = gc.load(sd, hf).stats
    local = sum(v.to_local().numel() * v.element_size() for v in sd.values())
    equal = {k: bool(torch.equal(v.full_tensor(), ref[k]) and v.dtype == ref[k].dtype) for k, v in sd.items()}
    return {"read": st.bytes_read, "needed": st.bytes_needed, "local": local, "equal": equal}


def test_a_sharded_save_of_every_dtype_exports_bitwise_and_loads_back_reading_its_shards(tmp_path: Path) -> None:
    """bf16, fp16, fp32, int64, column shards and a scalar: saved as DTensors by 2 gloo ranks,
    exported, equal under ``safetensors.torch.load_file``; loaded back by 2 ranks, each reading
    only its own bytes."""
    run_ranks(_save_mixed, 2, str(tmp_path / "ck"))
    gc.export(tmp_path / "ck", tmp_path / "hf", prefix="model.", max_shard_size=200)
    index = json.loads((tmp_path / "hf" / INDEX).read_text())
    got: dict[str, torch.Tensor] = {}
    for f in sorted(set(index["weight_map"].values())):
        got.update(load_file(tmp_path / "hf" / f))
    ref = _mixed()
    assert set(got) == set(ref)
    for k, v in ref.items():
        assert got[k].dtype == v.dtype and torch.equal(
            got[k].reshape(-1).view(torch.uint8), v.reshape(-1).view(torch.uint8)
        ), k
    for r in run_ranks(_load_mixed, 2, str(tmp_path / "hf")):
        assert all(r["equal"].values()), r["equal"]
        assert r["needed"] == r["local"] and r["read"] <= 1.1 * r["needed"], r


def test_without_an_index_model_safetensors_is_read_alone_and_other_files_are_not_merged(tmp_path: Path) -> None:
    """Hugging Face reads model.safetensors alone when there is no index; goodput merged every
    *.safetensors of the directory, so a PEFT adapter or a leftover copy beside the model was read
    as part of it (here the leftover holds the same name: the load failed as a tensor in two
    files). Several files with neither an index nor model.safetensors are refused, named."""
    d = tmp_path / "hf"
    d.mkdir()
    w = torch.randn(4, 4)
    save_file({"w": w}, d / "model.safetensors")
    save_file({"w": torch.zeros(4, 4), "lora_A": torch.ones(2, 4)}, d / "adapter_model.safetensors")
    got = {"w": torch.empty(4, 4)}
    gc.load(got, d)
    assert torch.equal(got["w"], w)
    (d / "model.safetensors").rename(d / "weights.safetensors")
    with pytest.raises(gc.CheckpointError, match=r"holds 2 \.safetensors files \(adapter_model\.safetensors, weights"):
        gc.load({"w": torch.empty(4, 4)}, d)
    (d / "adapter_model.safetensors").unlink()
    gc.load(got, d)  # one file, whatever its name: the model
    assert torch.equal(got["w"], w)


def test_exported_files_are_readable_as_the_umask_says(tmp_path: Path) -> None:
    """safetensors' writer creates its file 0600: shards came out readable by their owner alone
    (the index beside them 0644), so a model exported for a team could not be read by it."""
    import os
    import stat

    gc.save({"model": {"a": torch.ones(300), "b": torch.ones(300)}}, tmp_path / "ck")
    old = os.umask(0o022)
    try:
        gc.export(tmp_path / "ck", tmp_path / "hf", prefix="model.", max_shard_size="2KB")
        gc.export(tmp_path / "ck", tmp_path / "pt" / "model.pt", format="torch")
    finally:
        os.umask(old)
    files = [*sorted((tmp_path / "hf").iterdir()), tmp_path / "pt" / "model.pt"]
    assert len(files) == 4 and {oct(stat.S_IMODE(p.stat().st_mode)) for p in files} == {"0o644"}, files
