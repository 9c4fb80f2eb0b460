"""An export that does not finish, and what an export must refuse before it writes anything.

Real ``goodput ckpt export`` processes are SIGKILLed at a point chosen by watching the
destination (the first new shard in place, or the temporary file being written), then the
directory is loaded as a user would: the Hugging Face loader must refuse it, saying why, never
take part of one export or a mix of two for a model. ``--overwrite`` then cleans up after it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import goodput.ckpt as gc
from goodput.ckpt.compat.exporter import INDEX, ExportError

MARKER = ".goodput-export-in-progress"  # goodput.ckpt.loading.hf.EXPORTING, spelled out
N = 16  # tensors, one shard each: a kill after the first leaves the export far from done
E = 1 << 19  # float32 elements a tensor: 2 MiB
SHARD = "2MiB"


def _export_cmd(src: Path | str, dst: Path | str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "goodput.cli.main", "ckpt", "export", str(src), str(dst), *extra]


def _kill_when(cmd: list[str], ready: Callable[[], bool], timeout: float = 120.0) -> int:
    """Run ``cmd``; SIGKILL it the moment ``ready()`` holds. Its return code (-9 when killed)."""
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if ready():
                p.send_signal(signal.SIGKILL)
                break
            if p.poll() is not None:
                break
            time.sleep(0.0005)
        return p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns


def _save(path: Path, base: float) -> None:
    gc.save({"model": {f"t{i:02d}": torch.full((E,), base + i / 100) for i in range(N)}, "step": int(base)}, path)


def _state() -> dict[str, torch.Tensor]:
    return {f"t{i:02d}": torch.full((E,), -1.0) for i in range(N)}


def _first_shard() -> str:
    return f"model-00001-of-{N:05d}.safetensors"


def test_an_overwrite_killed_partway_is_refused_never_loaded_as_a_mix(tmp_path: Path) -> None:
    """Step 1 exported; an ``--overwrite`` export of step 2 killed once its first shard is in
    place. Before: step 1's index was still there, and the load took step 2's first shard and
    step 1's other fifteen without a word. Now the earlier index is gone and the directory is
    refused, naming the unfinished export; exporting again gives a whole step 2."""
    _save(tmp_path / "ck1", 1.0)
    _save(tmp_path / "ck2", 2.0)
    dst = tmp_path / "hf"
    first = dst / _first_shard()
    for _ in range(3):
        gc.export(tmp_path / "ck1", dst, prefix="model.", max_shard_size=SHARD, overwrite=True)
        old_first, old_index = _identity(first), _identity(dst / INDEX)
        assert old_index is not None and not (dst / MARKER).exists()
        cmd = _export_cmd(tmp_path / "ck2", dst, "--prefix", "model.", "--max-shard-size", SHARD, "--overwrite")
        rc = _kill_when(cmd, lambda: _identity(first) not in (None, old_first))  # noqa: B023
        if rc == -signal.SIGKILL:
            break
    else:
        pytest.fail("the export finished every time before it could be killed")
    assert float(load_file(first)["t00"][0]) == 2.0  # step 2's first shard is in place: killed partway
    for strict in (True, False):
        with pytest.raises(
            gc.CheckpointError, match=rf"'{re.escape(str(dst))}' holds {MARKER}: an export into it did not finish"
        ):
            gc.load(_state(), dst, strict=strict)
    assert _identity(dst / INDEX) != old_index  # step 1's index is gone: no reader follows it into the mix
    r = subprocess.run(_export_cmd(tmp_path / "ck2", dst, "--prefix", "model.", "--max-shard-size", SHARD, "--overwrite"),
                       capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert MARKER not in os.listdir(dst)
    s = _state()
    gc.load(s, dst)
    assert [round(float(v[0]), 2) for v in s.values()] == [2.0 + i / 100 for i in range(N)]


def test_a_fresh_export_killed_partway_leaves_shards_the_loader_refuses(tmp_path: Path) -> None:
    """Killed after its first shard: before, the lone ``model-00001-of-00016.safetensors`` was
    taken for a whole model (a state dict of its one tensor loaded, ``strict=False`` filled one
    tensor in sixteen). Now the marker says the export did not finish; and a copy without the
    marker (a tool that skips dot files) is still refused: shards of a set need their index."""
    _save(tmp_path / "ck", 1.0)
    for attempt in range(3):
        dst = tmp_path / f"hf{attempt}"
        first = dst / _first_shard()
        cmd = _export_cmd(tmp_path / "ck", dst, "--prefix", "model.", "--max-shard-size", SHARD)
        if _kill_when(cmd, first.exists) == -signal.SIGKILL:
            break
    else:
        pytest.fail("the export finished every time before it could be killed")
    assert INDEX not in os.listdir(dst)
    one = {"t00": torch.zeros(E)}  # exactly what the first shard holds
    with pytest.raises(gc.CheckpointError, match="an export into it did not finish.*export again"):
        gc.load(one, dst)
    with pytest.raises(gc.CheckpointError, match="did not finish"):
        gc.load(_state(), dst, strict=False)
    with pytest.raises(ExportError, match="an earlier export into it did not finish; pass overwrite=True"):
        gc.export(tmp_path / "ck", dst, prefix="model.", max_shard_size=SHARD)
    (dst / MARKER).unlink()
    with pytest.raises(
        gc.CheckpointError, match=rf"holds '{_first_shard()}', one file of a sharded set, but no {INDEX}"
    ):
        gc.load(one, dst)
    with pytest.raises(gc.CheckpointError, match="needs its index"):
        gc.load(_state(), dst, strict=False)
    # Hugging Face's unsharded layout needs no index: a lone model.safetensors still loads
    single = tmp_path / "single"
    gc.export(tmp_path / "ck", single, prefix="model.")
    assert sorted(os.listdir(single)) == ["model.safetensors"]
    s = _state()
    gc.load(s, single)
    assert float(s["t15"][0]) == pytest.approx(1.15)
    # another stem's set (diffusers' names) with its own index beside it: loaded as before
    other = tmp_path / "other"
    other.mkdir()
    save_file({"a": torch.ones(2)}, other / "unet-00001-of-00002.safetensors")
    save_file({"b": torch.ones(3)}, other / "unet-00002-of-00002.safetensors")
    (other / "unet.safetensors.index.json").write_text("{}")
    ab = {"a": torch.zeros(2), "b": torch.zeros(3)}
    gc.load(ab, other)
    assert float(ab["a"].sum() + ab["b"].sum()) == 5.0
    (other / "unet.safetensors.index.json").unlink()
    with pytest.raises(
        gc.CheckpointError, match="holds 'unet-00001-of-00002.safetensors'.* no unet.safetensors.index.json"
    ):
        gc.load(ab, other)


def test_an_overwrite_removes_the_temporary_file_a_killed_export_left(tmp_path: Path) -> None:
    """Killed while writing its one file: a full-size ``.model.safetensors.tmp-<pid>`` stays.
    Before, a later ``--overwrite`` export left it there for good; now it removes it (and only
    names of the exporter's own temporary pattern: a user's files stay)."""
    gc.save({"model": {"big": torch.zeros(8 << 20)}}, tmp_path / "ck")  # 32 MiB: one shard
    tmp_name = re.compile(r"^\.model\.safetensors\.tmp-\d+$")

    def writing() -> bool:
        try:
            return any(tmp_name.match(n) and os.path.getsize(dst / n) > 0 for n in os.listdir(dst))
        except OSError:
            return False

    for attempt in range(3):
        dst = tmp_path / f"hf{attempt}"
        if _kill_when(_export_cmd(tmp_path / "ck", dst, "--prefix", "model."), writing) == -signal.SIGKILL:
            break
    else:
        pytest.fail("the export finished every time before it could be killed")
    left = [n for n in os.listdir(dst) if tmp_name.match(n)]
    assert left, os.listdir(dst)
    for mine in ("README.md", ".model.safetensors.tmp-mine", ".notes.tmp-12"):
        (dst / mine).write_text("a user's file")
    r = subprocess.run(_export_cmd(tmp_path / "ck", dst, "--prefix", "model.", "--overwrite"),
                       capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(os.listdir(dst)) == sorted(
        ["README.md", ".model.safetensors.tmp-mine", ".notes.tmp-12", "model.safetensors"]
    )


def test_a_tensor_named_like_the_headers_metadata_is_refused(tmp_path: Path) -> None:
    """``__metadata__`` is the safetensors header's reserved key: a tensor written under it made
    a file nothing can read (duplicate JSON key). Refused, naming the tensor as written."""
    gc.save({"__metadata__": torch.full((2,), 5.0), "x": torch.ones(2)}, tmp_path / "ck")
    with pytest.raises(
        ExportError, match=r"tensor '__metadata__': '__metadata__' is the safetensors header's reserved key"
    ):
        gc.export(tmp_path / "ck", tmp_path / "out")
    assert not (tmp_path / "out").exists()
    gc.save({"model": {"__metadata__": torch.ones(2), "w": torch.ones(2)}}, tmp_path / "ck2")
    with pytest.raises(ExportError, match=r"tensor 'model.__metadata__' \(written as '__metadata__'\): .* reserved"):
        gc.export(tmp_path / "ck2", tmp_path / "out2", prefix="model.")
    assert not (tmp_path / "out2").exists()
    gc.export(tmp_path / "ck2", tmp_path / "out3")  # written as 'model.__metadata__': a plain name
    assert set(load_file(tmp_path / "out3" / "model.safetensors")) == {"model.__metadata__", "model.w"}
    gc.export(tmp_path / "ck2", tmp_path / "m.pt", prefix="model.", format="torch")  # torch.save has no such key
    assert set(torch.load(tmp_path / "m.pt", weights_only=True)) == {"__metadata__", "w"}


def test_a_dtype_safetensors_cannot_hold_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    """complex128: before, a bare ``KeyError: torch.complex128`` from inside safetensors (and a
    traceback from the CLI), after an ``--overwrite`` had already replaced files. Now every
    selected tensor's dtype is checked first; the CLI prints one error and exits 1."""
    sd = {"model": {"a": torch.ones(4, dtype=torch.float64), "z": torch.ones(4, dtype=torch.complex128)}}
    gc.save(sd, tmp_path / "ck")
    with pytest.raises(
        ExportError,
        match=r"tensor 'model.z' \(written as 'z'\) is complex128, which safetensors cannot hold \(it holds .*complex64",
    ):
        gc.export(tmp_path / "ck", tmp_path / "out", prefix="model.", max_shard_size=1)
    assert not (tmp_path / "out").exists()
    with pytest.raises(ExportError, match="'model.z'.* complex128"):  # --dtype casts floats, not complex
        gc.export(tmp_path / "ck", tmp_path / "out", prefix="model.", dtype="bf16")
    # an earlier export in the destination is left as it was
    gc.save({"w": torch.arange(6.0)}, tmp_path / "ok")
    gc.export(tmp_path / "ok", tmp_path / "hf")
    before = {n: (tmp_path / "hf" / n).read_bytes() for n in os.listdir(tmp_path / "hf")}
    with pytest.raises(ExportError, match="complex128"):
        gc.export(tmp_path / "ck", tmp_path / "hf", prefix="model.", overwrite=True)
    assert {n: (tmp_path / "hf" / n).read_bytes() for n in os.listdir(tmp_path / "hf")} == before
    gc.export(tmp_path / "ck", tmp_path / "a.pt", prefix="model.", format="torch")  # torch.save holds it
    assert torch.load(tmp_path / "a.pt", weights_only=True)["z"].dtype == torch.complex128
    r = subprocess.run(_export_cmd(tmp_path / "ck", tmp_path / "cli", "--prefix", "model."),
                       capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and r.stderr.strip().startswith("error:"), r.stderr
    assert r.stderr.count("error:") == 1, r.stderr  # one message (Rich wraps it at 80 columns)
    assert "'model.z' (written as 'z') is complex128" in " ".join(r.stderr.split())
    assert not (tmp_path / "cli").exists()


def test_the_destination_is_compared_with_the_checkpoint_by_where_it_resolves(tmp_path: Path) -> None:
    """``other/../ck`` or a link to the checkpoint named it in another spelling: before, the
    export wrote its ``model.safetensors`` into the source checkpoint. Also: ``max_shard_size=True``
    was taken as 1 byte."""
    gc.save({"model": {"w": torch.ones(3)}}, tmp_path / "ck")
    (tmp_path / "other").mkdir()
    os.symlink(tmp_path / "ck", tmp_path / "link")
    held = sorted(os.listdir(tmp_path / "ck"))
    for dst in (tmp_path / "other" / ".." / "ck", tmp_path / "link", f"{tmp_path}/./ck/", tmp_path / "ck"):
        with pytest.raises(ExportError, match="is the checkpoint itself"):
            gc.export(tmp_path / "ck", dst, prefix="model.", overwrite=True)
        with pytest.raises(ExportError, match="is the checkpoint itself"):
            gc.export(tmp_path / "link", dst, prefix="model.", overwrite=True)
    assert sorted(os.listdir(tmp_path / "ck")) == held
    # an object store's keys are compared as bucket and key (refused before any request)
    with pytest.raises(ExportError, match="is the checkpoint itself"):
        gc.export("s3://bucket/run/ck", "s3://bucket/run//ck/", overwrite=True)
    with pytest.raises(ValueError, match="max_shard_size must be a positive number of bytes, got True"):
        gc.export(tmp_path / "ck", tmp_path / "true", prefix="model.", max_shard_size=True)
    assert not (tmp_path / "true").exists()


def test_an_s3_export_killed_partway_is_refused_and_an_overwrite_makes_it_whole(tmp_path: Path, bucket: str) -> None:
    """The same on an object store (no rename there: the marker is an object, each shard one
    upload): an ``--overwrite`` export into ``s3://`` killed once its first shard is uploaded
    leaves the marker and no earlier index; the load refuses it; exporting again completes."""
    from goodput.ckpt.storage import s3
    from tests.ckpt.s3_server import keys

    _save(tmp_path / "ck1", 1.0)
    _save(tmp_path / "ck2", 2.0)
    dst = f"s3://{bucket}/hf"
    name, _, base = bucket.partition("/")
    client = s3.default_storage().client()

    def etag(n: str) -> str | None:
        try:
            return client.head_object(Bucket=name, Key=f"{base}/hf/{n}")["ETag"]
        except Exception:  # noqa: BLE001 - missing
            return None

    for _ in range(3):
        gc.export(tmp_path / "ck1", dst, prefix="model.", max_shard_size=SHARD, overwrite=True)
        assert f"hf/{MARKER}" not in keys(bucket, "hf/")
        old = etag(_first_shard())  # step 1's and step 2's first shards differ: so do their ETags
        cmd = _export_cmd(tmp_path / "ck2", dst, "--prefix", "model.", "--max-shard-size", SHARD, "--overwrite")
        if _kill_when(cmd, lambda: etag(_first_shard()) not in (None, old)) == -signal.SIGKILL:  # noqa: B023
            break
    else:
        pytest.fail("the export finished every time before it could be killed")
    held = keys(bucket, "hf/")
    assert f"hf/{MARKER}" in held and f"hf/{INDEX}" not in held, held
    with pytest.raises(gc.CheckpointError, match=f"'{dst}' holds {MARKER}: an export into it did not finish"):
        gc.load(_state(), dst, strict=False)
    r = subprocess.run(_export_cmd(tmp_path / "ck2", dst, "--prefix", "model.", "--max-shard-size", SHARD, "--overwrite"),
                       capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"hf/{MARKER}" not in keys(bucket, "hf/")
    s = _state()
    gc.load(s, dst)
    assert [round(float(v[0]), 2) for v in s.values()] == [2.0 + i / 100 for i in range(N)]
    assert json.loads(client.get_object(Bucket=name, Key=f"{base}/hf/{INDEX}")["Body"].read())["weight_map"]
