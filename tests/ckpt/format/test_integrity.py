"""Corruption and hostile metadata: an error naming the file and tensor, never a wrong tensor."""

from __future__ import annotations

import shutil
from pathlib import Path

import crc32c
import msgspec
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import goodput.ckpt as gc
from goodput.ckpt.format.format import (
    MANIFEST,
    CheckpointError,
    Manifest,
    decode_metadata,
    encode_manifest,
    encode_metadata,
)


def make(path: Path, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    state = {"a": torch.randn(64, 256, generator=g), "b": torch.randn(1000, generator=g).to(torch.bfloat16)}
    gc.save(state, path, step=seed)
    return state


def data_file(path: Path) -> Path:
    (f,) = [p for p in path.iterdir() if p.name.startswith("data-")]
    return f


def targets() -> dict[str, torch.Tensor]:
    return {"a": torch.zeros(64, 256), "b": torch.zeros(1000, dtype=torch.bfloat16)}


@pytest.mark.parametrize("where", [0, 4096 * 3 + 17, "b"])
def test_flipped_byte_is_caught_on_load_read_and_verify(tmp_path: Path, where) -> None:
    make(tmp_path)
    f = data_file(tmp_path)
    ck = gc.open(tmp_path)
    if where == "b":
        where = ck.tensors["b"].chunks[0].offset + 100
        tensor = "b"
    else:
        tensor = "a"
    raw = bytearray(f.read_bytes())
    raw[where] ^= 0x40
    f.write_bytes(raw)
    with pytest.raises(CheckpointError, match=rf"checksum mismatch in '{f.name}'.*tensor '{tensor}'") as e:
        gc.load(targets(), tmp_path)
    if tensor == "a":  # the 16 blocks are checked as one run, then one by one to name the bad block
        assert f"block {where // 4096} of" in str(e.value)
    with pytest.raises(CheckpointError, match=rf"tensor '{tensor}'"):
        gc.open(tmp_path).read(tensor)
    with pytest.raises(CheckpointError, match=rf"checksum mismatch.*'{tensor}'"):
        gc.verify(tmp_path)
    # a sub-box that does not touch the flipped block still reads (partial reads verify blocks)
    if tensor == "a" and where == 0:
        np.testing.assert_array_equal(gc.open(tmp_path).read("a", np.s_[32:, :]).shape, (32, 256))


def test_truncated_and_missing_files(tmp_path: Path) -> None:
    make(tmp_path)
    f = data_file(tmp_path)
    raw = f.read_bytes()
    f.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(CheckpointError, match=rf"data file .*{f.name}.* is {len(raw) // 2} bytes.*truncated.*'a'"):
        gc.load(targets(), tmp_path)
    f.unlink()
    with pytest.raises(CheckpointError, match=rf"data file .*{f.name}.* is missing.*'a'"):
        gc.load(targets(), tmp_path)
    with pytest.raises(CheckpointError, match="missing"):
        gc.verify(tmp_path)


def test_manifest_and_metadata_from_another_checkpoint(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    make(a, 1)
    make(b, 2)
    # a's metadata replaced by b's (same name, other content)
    ma = msgspec.json.decode((a / MANIFEST).read_bytes(), type=Manifest)
    mb = msgspec.json.decode((b / MANIFEST).read_bytes(), type=Manifest)
    saved = (a / ma.metadata.name).read_bytes()
    (a / ma.metadata.name).write_bytes((b / mb.metadata.name).read_bytes())
    with pytest.raises(CheckpointError, match=r"metadata.*(from another checkpoint|does not match)"):
        gc.open(a)
    (a / ma.metadata.name).write_bytes(saved)
    gc.open(a)
    # b's manifest dropped into a
    shutil.copy(b / MANIFEST, a / MANIFEST)
    with pytest.raises(CheckpointError, match=r"metadata file .* is missing"):
        gc.load(targets(), a)
    # b's data file renamed into a (same size, internally consistent): bound to a's metadata, so caught
    shutil.copy(b / MANIFEST, a / MANIFEST)
    (a / MANIFEST).write_bytes(encode_manifest(ma))
    shutil.copy(data_file(b), data_file(a))
    with pytest.raises(CheckpointError, match=r"(another checkpoint|checksum mismatch)"):
        gc.load(targets(), a)


def test_no_manifest_means_no_checkpoint(tmp_path: Path) -> None:
    make(tmp_path)
    (tmp_path / MANIFEST).unlink()
    with pytest.raises(CheckpointError, match="not a committed checkpoint"):
        gc.open(tmp_path)
    assert gc.latest(tmp_path) is None


# ------------------------------------------------------------------------------ hostile metadata
def tamper(path: Path, mutate) -> None:
    """Rewrite the metadata through ``mutate`` and re-sign the manifest, as an attacker could."""
    m = msgspec.json.decode((path / MANIFEST).read_bytes(), type=Manifest)
    md = decode_metadata((path / m.metadata.name).read_bytes(), "x", m)
    md.cols = {k: v.copy() for k, v in md.cols.items()}
    mutate(md)
    raw = encode_metadata(md)
    (path / m.metadata.name).write_bytes(raw)
    m.metadata.bytes = len(raw)
    m.metadata.crc32c = crc32c.crc32c(raw)
    (path / MANIFEST).write_bytes(encode_manifest(m))


def _file_name(md, name):
    md.files[0].name = name


CASES = {
    "escaping file name": (lambda md: _file_name(md, "../../etc/passwd"), r"refusing file name '\.\./\.\./etc/passwd'"),
    "absolute file name": (lambda md: _file_name(md, "/etc/passwd"), r"refusing file name '/etc/passwd'"),
    "negative offset": (lambda md: md.cols["offset"].__setitem__(0, -4096), r"tensor 'a'.*negative offset"),
    "overflowing offset": (lambda md: md.cols["offset"].__setitem__(0, 2**63 - 10), r"tensor 'a'.*past the end"),
    "length vs dtype x box": (lambda md: md.cols["length"].__setitem__(0, 4096), r"tensor 'a'.*length disagrees"),
    "box outside tensor": (lambda md: md.cols["offsets"].__setitem__((0, 0), 10), r"tensor 'a'.*outside the tensor"),
    "huge box": (lambda md: md.cols["sizes"].__setitem__((0, 1), 2**62), r"tensor 'a'.*(implausibly large|outside)"),
    "box end wraps past 2**63": (
        lambda md: md.cols["offsets"].__setitem__((0, 0), 2**63 - 10),
        r"tensor 'a'.*outside the tensor",
    ),
    "unknown tensor id": (lambda md: md.cols["tensor"].__setitem__(1, 7), r"names tensor #7"),
    "checksum table outside file": (lambda md: md.cols["block0"].__setitem__(0, 10**9), r"tensor 'a'.*block checksums"),
    "unknown dtype": (lambda md: setattr(md.tensors[0], "dtype", "pickle"), r"tensor 'a' has unknown dtype"),
    "file size past int64": (lambda md: setattr(md.files[0], "bytes", 2**64 - 1), r"invalid size"),
    "negative writer rank": (lambda md: setattr(md.files[0], "rank", -5), r"invalid rank -5"),
    "malformed float value": (
        lambda md: md.values.__setitem__("lr", {"__float__": "x"}),
        r"value 'lr'.*malformed float",
    ),
    "malformed tuple value": (lambda md: md.values.__setitem__("lr", {"__tuple__": 3}), r"value 'lr'.*malformed tuple"),
    "malformed dict value": (
        lambda md: md.values.__setitem__("lr", {"__dict__": [[1]]}),
        r"value 'lr'.*malformed dict",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_hostile_metadata_is_rejected_before_any_read(tmp_path: Path, case: str) -> None:
    make(tmp_path)
    mutate, msg = CASES[case]
    tamper(tmp_path, mutate)
    data_file(tmp_path).unlink()  # a check that came after a read would complain about this instead
    with pytest.raises(CheckpointError, match=msg):
        gc.open(tmp_path)


def test_garbage_manifest_and_metadata(tmp_path: Path) -> None:
    make(tmp_path)
    (tmp_path / MANIFEST).write_bytes(b'{"format": "goodput.ckpt", "version": 99}')
    with pytest.raises(CheckpointError, match="not a valid manifest|version"):
        gc.open(tmp_path)
    (tmp_path / MANIFEST).write_bytes(b"\x80\x04pickle")
    with pytest.raises(CheckpointError, match="not a valid manifest"):
        gc.open(tmp_path)


def test_a_gap_in_a_tensor_fails_verify_and_load(tmp_path: Path) -> None:
    """Metadata that covers only half of 'a' (consistent otherwise) decodes, but verify names the
    tensor before reading a byte, and a load of 'a' refuses rather than leaving half unfilled."""
    make(tmp_path)

    def halve(md):
        i = int(np.flatnonzero(md.cols["tensor"] == 0)[0])
        md.cols["sizes"][i, 0] = 32
        md.cols["length"][i] = 32 * 256 * 4

    tamper(tmp_path, halve)
    ck = gc.open(tmp_path)
    with pytest.raises(CheckpointError, match=r"tensor 'a': its chunks do not tile it: .*8192 of the tensor's 16384"):
        ck.verify()
    with pytest.raises(CheckpointError, match=r"tensor 'a': cannot fill region \[0:64, 0:256\] \(8192 of 16384"):
        gc.load(targets(), tmp_path)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 40_000), flip=st.floats(0, 1, exclude_max=True), lo=st.floats(0, 1, exclude_max=True))
def test_any_flipped_byte_is_named_by_its_block(n: int, flip: float, lo: float) -> None:
    """Runs of blocks are verified with one CRC against their combined block CRCs; a bad run is
    then checked block by block: whatever the chunk length and the byte, the error names the
    block holding it, and a read that does not touch that block still succeeds."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp)
        data = np.arange(n, dtype=np.float32)
        gc.save({"x": data}, path, block_bytes=512)
        f = data_file(path)
        ch = gc.open(path).tensors["x"].chunks[0]
        at = int(flip * n * 4)
        raw = bytearray(f.read_bytes())
        raw[ch.offset + at] ^= 0x01
        f.write_bytes(raw)
        with pytest.raises(CheckpointError, match=rf"block {at // 512} of chunk"):
            gc.open(path).read("x")
        first = int(lo * n)  # a read of elements [first, n) skips the bad block if it lies before
        if first * 4 // 512 > at // 512:
            np.testing.assert_array_equal(gc.open(path).read("x", np.s_[first:]), data[first:])


def test_hostile_manifest_fields_are_refused_and_ls_lists_the_rest(tmp_path: Path) -> None:
    """A manifest whose creation time cannot be a date (or whose sizes cannot be) is not a
    checkpoint: ``open`` names the field, ``latest`` skips it and keeps the others, and ``ls`` lists
    it apart as damaged, with why."""
    from typer.testing import CliRunner

    from goodput.cli.main import app

    make(tmp_path / "good")
    make(tmp_path / "bad")
    m = msgspec.json.decode((tmp_path / "bad" / MANIFEST).read_bytes(), type=Manifest)
    m.created = 1e300
    (tmp_path / "bad" / MANIFEST).write_bytes(msgspec.json.encode(m))
    with pytest.raises(CheckpointError, match="invalid creation time"):
        gc.open(tmp_path / "bad")
    assert gc.latest(tmp_path) == tmp_path / "good"
    r = CliRunner().invoke(app, ["ckpt", "ls", str(tmp_path)])
    assert r.exit_code == 0, r.output
    damaged, committed = r.output.split("committed checkpoints in")
    assert "good" in committed and "bad" not in committed  # listed apart, with why
    assert "bad" in damaged and "invalid creation time" in damaged


def test_a_symlinked_data_file_is_refused(tmp_path: Path) -> None:
    """A link planted under a plain name must not lead a reader out of the checkpoint."""
    ck = tmp_path / "ck"
    make(ck)
    f = data_file(ck)
    outside = tmp_path / "outside.bin"
    shutil.move(f, outside)  # the same bytes, CRCs and all: only the link is wrong
    f.symlink_to(outside)
    for verify in (True, False):
        with pytest.raises(CheckpointError, match="symbolic link"):
            gc.load(targets(), ck, verify=verify)
    (ck / MANIFEST).rename(tmp_path / "m.json")
    (ck / MANIFEST).symlink_to(tmp_path / "m.json")
    with pytest.raises(CheckpointError, match="symbolic link"):
        gc.open(ck)


def test_values_that_look_like_tags_round_trip(tmp_path: Path) -> None:
    """A user's dict whose only key is one of the format's tags is escaped, not misread."""
    # dicts inside a list reach the value encoder whole (nested dicts are the state's own tree)
    vals = {"a": [{"__float__": "nan"}], "b": [{"__tuple__": [1, 2]}], "c": (1, {"__dict__": 3}), "d": float("-inf")}
    gc.save({"w": torch.zeros(2), **vals}, tmp_path)
    got = gc.open(tmp_path).values
    assert got["a"] == [{"__float__": "nan"}] and got["b"] == [{"__tuple__": [1, 2]}]
    assert got["c"] == (1, {"__dict__": 3}) and got["d"] == float("-inf")


def test_a_fifo_under_a_data_file_name_is_refused_not_waited_on(tmp_path: Path) -> None:
    import os

    ck = tmp_path / "ck"
    make(ck)
    f = data_file(ck)
    f.unlink()
    os.mkfifo(f)  # opening it for reading would block until a writer came
    with pytest.raises(CheckpointError, match="not a regular file"):
        gc.load(targets(), ck)


def test_values_nested_past_the_recursion_limit_are_refused(tmp_path: Path) -> None:
    make(tmp_path)
    deep: list = []
    for _ in range(5000):
        deep = [deep]

    def nest(md):
        md.values["deep"] = deep

    import sys

    old = sys.getrecursionlimit()
    sys.setrecursionlimit(20000)  # only so that the tamper can encode it
    try:
        tamper(tmp_path, nest)
    finally:
        sys.setrecursionlimit(old)
    with pytest.raises(CheckpointError, match="nested too deeply|malformed metadata header|recursion"):
        gc.open(tmp_path)


def test_a_chunk_crc_that_disagrees_with_its_blocks_fails_load_and_verify_alike(tmp_path: Path) -> None:
    """The metadata's whole-chunk crc32c changed (and the manifest re-sealed): a load used to
    succeed while verify called the intact data corrupt; both now name the metadata."""
    make(tmp_path)
    tamper(tmp_path, lambda md: md.cols["crc32c"].__setitem__(0, (int(md.cols["crc32c"][0]) + 1) % 2**32))
    msg = r"the metadata's crc32c of .*tensor 'a'.* does not match its block checksums"
    with pytest.raises(CheckpointError, match=msg):
        gc.load(targets(), tmp_path)
    with pytest.raises(CheckpointError, match=msg):
        gc.verify(tmp_path)
