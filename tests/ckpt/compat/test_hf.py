"""Hugging Face safetensors both ways: an FSDP2 model's checkpoint exported (consolidated, sharded
like Hugging Face's) equals ``model.state_dict()`` under ``safetensors.torch.load_file``, bit for
bit, and the same files load back into a 2-rank FSDP2 model, each rank reading only the bytes its
shards need (gloo on CPU, real processes)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import goodput.ckpt as gc
from goodput.ckpt.compat.exporter import INDEX, VALUES, plan_shards
from tests.distributed import run_ranks


class Net(torch.nn.Module):
    """Uneven dimensions (FSDP2 pads its shards), a bf16 parameter and a buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(101, 48)
        self.up = torch.nn.Linear(48, 131)
        self.down = torch.nn.Linear(131, 48, bias=False)
        self.gate = torch.nn.Parameter(torch.randn(37, 5).to(torch.bfloat16))
        self.register_buffer("scale", torch.arange(7, dtype=torch.float32))


def _model(seed: int) -> Net:
    torch.manual_seed(seed)
    return Net()


def _fsdp2(seed: int) -> Net:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    m = _model(seed)
    fully_shard(m, mesh=init_device_mesh("cpu", (2,)))
    return m


def _save_fsdp2(rank: int, world: int, path: str) -> dict:
    m = _fsdp2(0)
    sd = m.state_dict()
    kinds = {k: type(v).__name__ for k, v in sd.items()}
    gc.save({"model": sd, "step": 7}, path, step=7)
    return kinds


def _load_fsdp2(rank: int, world: int, hf_dir: str) -> dict:
    m = _fsdp2(1234)  # other values everywhere: the load must replace them
    sd = m.state_dict()
    local = sum(v.to_local().numel() * v.element_size() for v in sd.values() if hasattr(v, "to_local"))
    local += sum(v.numel() * v.element_size() for v in sd.values() if not hasattr(v, "to_local"))
    stats = gc.load(sd, hf_dir).stats
    ref = _model(0).state_dict()
    equal = {}
    for k, v in m.state_dict().items():
        full = v.full_tensor() if hasattr(v, "full_tensor") else v
        equal[k] = bool(torch.equal(full, ref[k]) and full.dtype == ref[k].dtype)
    return {"read": stats.bytes_read, "needed": stats.bytes_needed, "local": local, "equal": equal}


def test_fsdp2_export_equals_state_dict_and_loads_back_reading_only_its_shards(tmp_path: Path) -> None:
    ck, hf = tmp_path / "ck", tmp_path / "hf"
    kinds = run_ranks(_save_fsdp2, 2, str(ck))
    assert kinds[0]["up.weight"] == "DTensor"  # really FSDP2's sharded state dict
    ref = _model(0).state_dict()
    total = sum(t.numel() * t.element_size() for t in ref.values())

    res = gc.export(ck, hf, prefix="model.", max_shard_size=total // 3)
    shards = sorted(os.listdir(hf))
    assert len(res.files) > 2 and res.files[-1] == INDEX and sorted(res.files) == shards
    assert all(
        n == INDEX or n.startswith("model-") and n.endswith(f"-of-{len(shards) - 1:05d}.safetensors") for n in shards
    )
    index = json.loads((hf / INDEX).read_text())
    assert index["metadata"]["total_size"] == total and set(index["weight_map"]) == set(ref)
    assert res.skipped == {}  # "step" lies outside the prefix

    loaded: dict[str, torch.Tensor] = {}
    for f in set(index["weight_map"].values()):
        part = load_file(hf / f)
        assert set(part) == {k for k, v in index["weight_map"].items() if v == f}
        loaded.update(part)
    assert set(loaded) == set(ref)
    for k, v in ref.items():
        assert loaded[k].dtype == v.dtype and torch.equal(loaded[k], v), k

    out = run_ranks(_load_fsdp2, 2, str(hf))
    for r in out:
        assert all(r["equal"].values()), r["equal"]
        # each rank needs its own rows of every sharded tensor plus the replicated buffer, and
        # reads exactly those (the bound is 1.1 x)
        assert r["needed"] == r["local"] and r["read"] <= 1.1 * r["needed"], r
        assert r["needed"] < 0.7 * total  # not the whole checkpoint


def test_export_single_file_dtype_cast_and_torch_format(tmp_path: Path) -> None:
    sd = {"model": {"w": torch.randn(64, 32), "i": torch.arange(10), "h": torch.randn(3).half()}, "opt": {"lr": 0.1}}
    gc.save(sd, tmp_path / "ck")
    res = gc.export(tmp_path / "ck", tmp_path / "hf", dtype="bf16")
    assert res.files == ["model.safetensors", VALUES]
    got = load_file(tmp_path / "hf" / "model.safetensors")
    assert set(got) == {"model.w", "model.i", "model.h"}
    assert got["model.w"].dtype == torch.bfloat16 and torch.equal(got["model.w"], sd["model"]["w"].bfloat16())
    assert got["model.i"].dtype == torch.int64 and torch.equal(got["model.i"], sd["model"]["i"])  # ints uncast
    assert res.skipped == {} and res.carried == ["opt.lr"]  # beside the tensors, not lost

    res = gc.export(tmp_path / "ck", tmp_path / "m.pt", format="torch", prefix="model.")
    t = torch.load(tmp_path / "m.pt", weights_only=True)
    assert set(t) == {"w", "i", "h"} and torch.equal(t["w"], sd["model"]["w"])
    res = gc.export(tmp_path / "ck", tmp_path / "all.pt", format="torch")  # no place for values: each named
    assert res.skipped == {"opt.lr": "a value, not a tensor"} and res.carried == []
    with pytest.raises(gc.CheckpointError, match="builds the file in memory"):
        gc.export(tmp_path / "ck", tmp_path / "m2.pt", format="torch", max_shard_size=100)

    with pytest.raises(gc.CheckpointError, match="is not empty"):
        gc.export(tmp_path / "ck", tmp_path / "hf")
    with pytest.raises(gc.CheckpointError, match="no tensor .* under the prefix 'nope.'"):
        gc.export(tmp_path / "ck", tmp_path / "x", prefix="nope.")
    # overwrite with several shards now: the old single file goes, as would stale shards
    res = gc.export(tmp_path / "ck", tmp_path / "hf", overwrite=True, max_shard_size=1000)
    assert sorted(os.listdir(tmp_path / "hf")) == sorted(res.files) and "model.safetensors" not in res.files


def test_a_prefix_is_a_dotted_path(tmp_path: Path) -> None:
    """``--prefix model`` wrote ``.w`` (and took ``model_ema`` too): it means ``model.``."""
    sd = {"model": {"w": torch.randn(4, 4)}, "model_ema": {"w": torch.randn(4, 4)}}
    gc.save(sd, tmp_path / "ck")
    gc.export(tmp_path / "ck", tmp_path / "hf", prefix="model")
    got = load_file(tmp_path / "hf" / "model.safetensors")
    assert set(got) == {"w"} and torch.equal(got["w"], sd["model"]["w"])


def test_links_are_followed_into_the_hub_cache_blobs_and_nowhere_else(tmp_path: Path) -> None:
    """The Hub's cache is ``snapshots/<rev>/`` links to ``../../blobs/<sha>``: that loads. A
    downloaded directory whose file is a link elsewhere (another user's model, ``/etc/...``) was
    read as this model; it is refused naming the link and its target."""
    w = torch.randn(8, 8)
    repo = tmp_path / "models--org--m"
    (repo / "blobs").mkdir(parents=True)
    save_file({"w": w}, repo / "blobs" / "abc123")
    snap = repo / "snapshots" / "rev1"
    snap.mkdir(parents=True)
    os.symlink("../../blobs/abc123", snap / "model.safetensors")
    got = {"w": torch.zeros(8, 8)}
    gc.load(got, snap)
    assert torch.equal(got["w"], w)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    save_file({"w": torch.randn(8, 8)}, tmp_path / "secret.safetensors")
    os.symlink(tmp_path / "secret.safetensors", elsewhere / "model.safetensors")
    with pytest.raises(gc.CheckpointError, match=r"is a link to .*secret\.safetensors'?, outside the directory"):
        gc.load({"w": torch.zeros(8, 8)}, elsewhere)
    snap2 = repo / "snapshots" / "rev2"
    snap2.mkdir()
    os.symlink("../../../secret.safetensors", snap2 / "model.safetensors")  # out of the snapshot's repo
    with pytest.raises(gc.CheckpointError, match="outside the directory"):
        gc.load({"w": torch.zeros(8, 8)}, snap2)


def test_plan_shards_bounds_each_shard() -> None:
    from goodput.ckpt.compat.exporter import _Item

    items = [_Item(str(i), str(i), "float32", "float32", (n,), n * 4) for i, n in enumerate([10, 10, 30, 5, 5, 1])]
    shards = plan_shards(items, 80)
    assert [[it.name for it in s] for s in shards] == [["0", "1"], ["2"], ["3", "4", "5"]]
    assert all(sum(it.nbytes for it in s) <= 80 or len(s) == 1 for s in shards)


def test_hf_directory_loads_into_local_shards_with_cast(tmp_path: Path) -> None:
    w = torch.randn(40, 12)
    save_file({"w": w[:20].clone(), "b": torch.randn(12)}, tmp_path / "model-00001-of-00002.safetensors")
    save_file({"w2": w[20:].clone().bfloat16()}, tmp_path / "model-00002-of-00002.safetensors")
    wm = {"w": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors"}
    wm["w2"] = "model-00002-of-00002.safetensors"
    (tmp_path / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    cols = gc.LocalShard(torch.zeros(20, 5), (20, 12), (0, 7))  # a column block: 20 runs
    w2 = torch.zeros(20, 12)  # float32 target of a bf16 tensor: read as saved, cast
    st = gc.load({"w": cols, "w2": w2}, tmp_path, strict=False).stats
    assert torch.equal(cols.tensor, w[:20, 7:]) and torch.equal(w2, w[20:].bfloat16().float())
    assert st.bytes_read == st.bytes_needed == 20 * 5 * 4 + 20 * 12 * 2
    with pytest.raises(gc.CheckpointError, match="'nope' is not in the checkpoint"):
        gc.load({"nope": torch.zeros(2)}, tmp_path)
    with pytest.raises(gc.CheckpointError, match="saved with global shape"):
        gc.load({"b": torch.zeros(13)}, tmp_path)


def test_hostile_hf_directories_are_refused(tmp_path: Path) -> None:
    save_file({"w": torch.randn(8, 8)}, tmp_path / "a.safetensors")
    (tmp_path / INDEX).write_text(json.dumps({"weight_map": {"w": "../a.safetensors"}}))
    with pytest.raises(gc.CheckpointError, match="refusing file name"):
        gc.load({"w": torch.zeros(8, 8)}, tmp_path)
    (tmp_path / INDEX).write_text(json.dumps({"weight_map": {"w": "a.safetensors", "v": "a.safetensors"}}))
    with pytest.raises(gc.CheckpointError, match="names 1 tensors no file holds, e.g. 'v'"):
        gc.load({"w": torch.zeros(8, 8)}, tmp_path)
    (tmp_path / INDEX).unlink()
    with open(tmp_path / "a.safetensors", "r+b") as f:  # cut the data short
        f.truncate(os.path.getsize(tmp_path / "a.safetensors") - 4)
    with pytest.raises(gc.CheckpointError, match="a.safetensors"):
        gc.load({"w": torch.zeros(8, 8)}, tmp_path)


def test_load_of_a_dcp_checkpoint_names_import_dcp(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    dcp.save({"w": torch.ones(3)}, checkpoint_id=str(tmp_path), no_dist=True)
    with pytest.raises(gc.CheckpointError, match=r"\(DCP\) checkpoint .*goodput ckpt import-dcp"):
        gc.load({"w": torch.zeros(3)}, tmp_path)
    with pytest.raises(gc.CheckpointError, match="goodput ckpt import-dcp"):
        gc.open(tmp_path)


def test_dcps_hugging_face_reader_and_writer_call_shapes(tmp_path: Path) -> None:
    from torch.distributed.checkpoint import HuggingFaceStorageReader, HuggingFaceStorageWriter

    w = torch.randn(6, 4)
    save_file({"w": w}, tmp_path / "model.safetensors")
    t = {"w": torch.zeros(6, 4)}
    gc.load(t, storage_reader=HuggingFaceStorageReader(str(tmp_path)))
    assert torch.equal(t["w"], w)
    with pytest.raises(TypeError, match="goodput.ckpt.export"):
        gc.save({"w": w}, storage_writer=HuggingFaceStorageWriter(str(tmp_path / "out")))


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux's VmHWM")
def test_export_holds_one_shard_in_memory(tmp_path: Path) -> None:
    """8 tensors of 8 MiB, shards of 16 MiB: the export's peak memory grows by about one shard,
    not by the checkpoint's 64 MiB."""
    import subprocess
    import sys
    import textwrap

    gc.save({f"t{i}": torch.full((2 << 20,), float(i)) for i in range(8)}, tmp_path / "ck")
    gc.save({"small": torch.ones(4)}, tmp_path / "small")
    code = f"""
        import json, torch, safetensors.torch, goodput.ckpt as gc
        def peak():
            with open("/proc/self/status") as f:
                return next(int(x.split()[1]) * 1024 for x in f if x.startswith("VmHWM:"))
        gc.export({str(tmp_path / "small")!r}, {str(tmp_path / "warm")!r})  # imports and first use
        base = peak()
        res = gc.export({str(tmp_path / "ck")!r}, {str(tmp_path / "hf")!r}, max_shard_size=16 << 20)
        print(json.dumps({{"delta": peak() - base, "files": res.files}}))
    """
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert len(r["files"]) == 5  # 4 shards of 2 tensors, and the index
    assert r["delta"] <= 24 << 20, r  # one 16 MiB shard and some slack; the whole is 64 MiB


def _upload(local: Path, bucket: str, prefix: str) -> str:
    """The directory's files under ``s3://bucket/prefix`` (``bucket`` as the fixture gives it)."""
    from goodput.ckpt.storage import s3

    name, _, base = bucket.partition("/")
    c = s3.default_storage().client()
    for f in sorted(os.listdir(local)):
        c.upload_file(str(local / f), name, f"{base}/{prefix}/{f}")
    return f"s3://{bucket}/{prefix}"


def test_hf_directory_loads_from_s3_exactly_as_from_a_local_directory(tmp_path: Path, bucket: str) -> None:
    """The same sharded Hugging Face directory, local and uploaded under an ``s3://`` prefix: the
    load from the object store reads the same values, the same byte figures, and fetches nothing
    beyond the files' headers and the runs its shards need (counted by the store itself)."""
    from goodput.ckpt.storage import s3

    w = torch.randn(40, 12)
    hf = tmp_path / "hf"
    hf.mkdir()
    save_file({"w": w[:20].clone(), "b": torch.randn(12)}, hf / "model-00001-of-00002.safetensors")
    save_file({"w2": w[20:].clone().bfloat16()}, hf / "model-00002-of-00002.safetensors")
    wm = {"w": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors"}
    wm["w2"] = "model-00002-of-00002.safetensors"
    (hf / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    url = _upload(hf, bucket, "hf")

    def targets() -> dict:
        return {"w": gc.LocalShard(torch.zeros(20, 5), (20, 12), (0, 7)), "w2": torch.zeros(20, 12)}

    local, remote = targets(), targets()
    st_local = gc.load(local, hf, strict=False).stats
    store = s3.default_storage()
    before = store.bytes_read
    st_remote = gc.load(remote, url, strict=False).stats
    fetched = store.bytes_read - before
    assert torch.equal(remote["w"].tensor, w[:20, 7:]) and torch.equal(remote["w2"], w[20:].bfloat16().float())
    assert torch.equal(remote["w"].tensor, local["w"].tensor) and torch.equal(remote["w2"], local["w2"])
    assert st_remote.bytes_read == st_local.bytes_read == st_remote.bytes_needed == 20 * 5 * 4 + 20 * 12 * 2
    headers = sum(8 + int.from_bytes((hf / f).read_bytes()[:8], "little") for f in set(wm.values()))
    assert fetched == st_remote.bytes_read + headers, (fetched, st_remote.bytes_read, headers)

    # a single file without an index, found by listing the prefix; read whole
    save_file({"x": torch.arange(10.0)}, tmp_path / "model.safetensors")
    name, _, base = bucket.partition("/")
    store.client().upload_file(str(tmp_path / "model.safetensors"), name, f"{base}/single/model.safetensors")
    x = {"x": torch.zeros(10)}
    gc.load(x, f"s3://{bucket}/single")
    assert torch.equal(x["x"], torch.arange(10.0))

    # an index naming a file the prefix lacks: an error naming the object, as a URL
    store.client().delete_object(Bucket=name, Key=f"{base}/hf/model-00002-of-00002.safetensors")
    with pytest.raises(gc.CheckpointError, match=rf"'s3://{bucket}/hf/model-00002-of-00002.safetensors' is missing"):
        gc.load(targets(), url, strict=False)
    # nothing under the prefix: not a checkpoint (not "an empty Hugging Face directory")
    with pytest.raises(gc.CheckpointError, match=f"'s3://{bucket}/nothing' is not a committed checkpoint"):
        gc.load(targets(), f"s3://{bucket}/nothing")


def test_export_carries_every_non_tensor_value_and_the_hf_load_restores_it(tmp_path: Path) -> None:
    """Values of every kind a save takes and an io.BytesIO blob go to goodput_values.json beside
    the shards (safetensors holds tensors only; Hugging Face's loaders see only the tensors), and
    gc.load of the exported directory gives each back exactly. Nothing under the prefix is lost."""
    import io

    import numpy as np

    sd = {
        "model": {"w": torch.randn(8, 4), "b": torch.randn(4)},
        "optim": {
            "step": 1234,
            "param_groups": [{"lr": 3e-4, "betas": (0.9, 0.95), "params": [0, 1]}],
            "big": 2**80,
            "nan": float("nan"),
            "dtype": torch.bfloat16,
            "size": torch.Size([2, 3]),
            "np": np.float32(1.5),
            "raw": b"\x80opaque",
            "name": "adamw",
            "none": None,
        },
        "loader": io.BytesIO(b"\x80\x04pickled by the user"),
    }
    gc.save(sd, tmp_path / "ck", step=9)
    res = gc.export(tmp_path / "ck", tmp_path / "hf", max_shard_size=100)
    want = sorted(["loader", *(f"optim.{k}" for k in sd["optim"])])
    assert res.carried == want and res.skipped == {}
    assert res.files[-2:] == [VALUES, INDEX]  # beside the shards, before the index
    index = json.loads((tmp_path / "hf" / INDEX).read_text())
    assert set(index["weight_map"]) == {"model.w", "model.b"}  # the index names tensors only
    got = {}
    for f in set(index["weight_map"].values()):
        got.update(load_file(tmp_path / "hf" / f))
    assert set(got) == {"model.w", "model.b"}

    out = {
        "model": {"w": torch.zeros(8, 4), "b": torch.zeros(4)},
        "optim": dict.fromkeys(sd["optim"]),
        "loader": io.BytesIO(),
    }
    gc.load(out, tmp_path / "hf")
    assert torch.equal(out["model"]["w"], sd["model"]["w"]) and torch.equal(out["model"]["b"], sd["model"]["b"])
    for k, v in sd["optim"].items():
        g = out["optim"][k]
        assert type(g) is type(v) and (g == v or (k == "nan" and g != g)), (k, g, v)
    assert out["loader"].getvalue() == sd["loader"].getvalue()

    # with a prefix only what is under it goes: here tensors only, so no values file
    res = gc.export(tmp_path / "ck", tmp_path / "m", prefix="model.")
    assert res.carried == [] and VALUES not in res.files  # the model has no values: no file
    # a damaged values file is refused naming it, never half-read
    (tmp_path / "hf" / VALUES).write_text(
        '{"format": "goodput.values", "version": 2, "values": {"x": {"__int__": "z"}}, "blobs": {}}'
    )
    with pytest.raises(gc.CheckpointError, match="goodput_values.json.*malformed int"):
        gc.load({"model": {"w": torch.zeros(8, 4)}}, tmp_path / "hf", strict=False)


def test_the_export_command_says_which_values_it_carried(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from goodput.cli.main import app

    gc.save({"model": {"w": torch.randn(4, 4)}, "optim": {"step": 3, "lr": 1e-3}}, tmp_path / "ck", step=1)
    r = CliRunner().invoke(app, ["ckpt", "export", str(tmp_path / "ck"), str(tmp_path / "hf")])
    assert r.exit_code == 0, r.output
    assert "2 values beside them in goodput_values.json" in " ".join(r.output.split())


def test_the_export_command_casts_writes_torch_and_counts_its_progress(tmp_path: Path) -> None:
    """The CLI's flags reach the export (--dtype, --format torch, --prefix, --max-shard-size), and
    the progress callback it draws from accounts for every byte read and every file written."""
    from typer.testing import CliRunner

    from goodput.cli.main import app

    sd = {"model": {"a": torch.randn(256, 64), "b": torch.randn(512, 64), "n": torch.arange(7)}}
    gc.save(sd, tmp_path / "ck", step=1)
    src = str(tmp_path / "ck")
    # bf16 sizes decide the shards (cast before the cut): a, b and n are 98,360 bytes in bf16, one
    # shard of 100 KB; in fp32 they would be three
    r = CliRunner().invoke(
        app, ["ckpt", "export", src, str(tmp_path / "one"), "--dtype", "bf16", "--prefix", "model.", "--max-shard-size", "100KB"]
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    assert sorted(os.listdir(tmp_path / "one")) == ["model.safetensors"]
    r = CliRunner().invoke(
        app,
        [
            "ckpt",
            "export",
            src,
            str(tmp_path / "hf"),
            "--dtype",
            "bf16",
            "--prefix",
            "model.",
            "--max-shard-size",
            "60KB",
        ],
    )
    assert r.exit_code == 0, r.output
    files = sorted(os.listdir(tmp_path / "hf"))
    assert INDEX in files and len([f for f in files if f.endswith(".safetensors")]) >= 2, files
    wm = json.loads((tmp_path / "hf" / INDEX).read_text())["weight_map"]
    assert set(wm) == {"a", "b", "n"} and set(wm.values()) == {f for f in files if f.endswith(".safetensors")}
    got: dict = {}
    for f in files:
        if f.endswith(".safetensors"):
            got.update(load_file(tmp_path / "hf" / f))
    assert set(got) == {"a", "b", "n"}
    assert got["a"].dtype == torch.bfloat16 and torch.equal(got["a"], sd["model"]["a"].bfloat16())
    assert got["n"].dtype == torch.int64 and torch.equal(got["n"], sd["model"]["n"])  # ints uncast

    r = CliRunner().invoke(
        app, ["ckpt", "export", src, str(tmp_path / "m.pt"), "--format", "torch", "--prefix", "model."]
    )
    assert r.exit_code == 0, r.output
    t = torch.load(tmp_path / "m.pt", weights_only=True)
    assert set(t) == {"a", "b", "n"} and all(torch.equal(t[k], sd["model"][k]) for k in t)
    r = CliRunner().invoke(app, ["ckpt", "export", src, str(tmp_path / "x"), "--format", "onnx"])
    assert r.exit_code != 0 and "onnx" in r.output

    seen: list[tuple[str, int]] = []
    res = gc.export(
        tmp_path / "ck",
        tmp_path / "p",
        prefix="model.",
        max_shard_size="100KB",
        progress=lambda e, n: seen.append((e, n)),
    )
    assert seen[0] == ("total", sum(v.numel() * v.element_size() for v in sd["model"].values()))
    assert sum(n for e, n in seen if e == "read") == seen[0][1]
    shards = [f for f in res.files if f.endswith(".safetensors")]
    assert [n for e, n in seen if e == "shard"] == list(range(1, len(shards) + 1)) and len(shards) == 3


def test_a_failed_export_leaves_nothing_a_loader_could_take_for_a_model(tmp_path: Path) -> None:
    """A damaged tensor in the second shard: the export fails naming it, and the first shard it
    had written is removed with the directory it created (a lone shard without its index loaded
    partially under ``strict=False``); an existing destination's other files stay."""
    sd = {"model": {k: torch.full((1024, 256), float(i + 1)) for i, k in enumerate("abc")}}
    gc.save(sd, tmp_path / "ck", step=1)
    data = next(p for p in (tmp_path / "ck").iterdir() if p.name.startswith("data-"))
    raw = bytearray(data.read_bytes())
    raw[gc.open(tmp_path / "ck").tensors["model.b"].chunks[0].offset + 5000] ^= 1  # inside tensor b
    data.write_bytes(bytes(raw))
    with pytest.raises(gc.CheckpointError, match="model.b"):
        gc.export(tmp_path / "ck", tmp_path / "hf", prefix="model.", max_shard_size="1MB")
    assert not (tmp_path / "hf").exists()
    keep = tmp_path / "mine"
    keep.mkdir()
    (keep / "README.md").write_text("a user's file")
    with pytest.raises(gc.CheckpointError, match="model.b"):
        gc.export(tmp_path / "ck", keep, prefix="model.", max_shard_size="1MB", overwrite=True)
    assert sorted(p.name for p in keep.iterdir()) == ["README.md"]


def test_every_float8_the_export_writes_loads_back(tmp_path: Path) -> None:
    """The exporter wrote F8_E4M3FNUZ / F8_E5M2FNUZ (AMD's float8s) that the loader did not know."""
    saved = {
        n: torch.arange(8, dtype=torch.float32).to(getattr(torch, n))
        for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
    }
    gc.save(saved, tmp_path / "ck")
    gc.export(tmp_path / "ck", tmp_path / "hf")
    back = {n: torch.zeros(8, dtype=t.dtype) for n, t in saved.items()}
    gc.load(back, tmp_path / "hf")
    for n, t in saved.items():
        assert back[n].view(torch.uint8).tolist() == t.view(torch.uint8).tolist(), n


def test_a_torch_export_removes_what_a_killed_one_left_beside_its_file(tmp_path: Path) -> None:
    """``--format torch`` writes ``.<name>.tmp-<pid>`` beside the file; one a killed export left
    (its process gone) is removed by the next export, one of a live process is not."""
    import subprocess
    import sys

    gc.save({"w": torch.ones(4)}, tmp_path / "ck")
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()  # a pid that was and is no more
    dead = tmp_path / f".m.pt.tmp-{p.pid}"
    live = tmp_path / ".m.pt.tmp-1"  # init: alive
    dead.write_bytes(b"x" * 1024)
    live.write_bytes(b"y")
    gc.export(tmp_path / "ck", tmp_path / "m.pt", format="torch")
    assert not dead.exists() and live.exists()
    assert torch.equal(torch.load(tmp_path / "m.pt")["w"], torch.ones(4))
