"""Forged sizes and fields in a checkpoint's metadata fail cleanly, before any large allocation."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import crc32c
import msgspec
import numpy as np
import pytest
import torch

import goodput.ckpt as gc
from goodput.ckpt.format.format import (
    COLUMNS,
    MANIFEST,
    META_MAGIC,
    Header,
    decode_manifest,
    decode_metadata,
    encode_manifest,
    encode_metadata,
)


def _forge(path: Path, change) -> None:
    """Rewrite the metadata through ``change(md)`` and re-seal it in the manifest, as an attacker
    who knows the format would: every checksum the manifest holds is then consistent."""
    m = decode_manifest((path / MANIFEST).read_bytes(), "manifest")
    md = decode_metadata((path / m.metadata.name).read_bytes(), "metadata", m)
    change(md)
    raw = encode_metadata(md)
    (path / m.metadata.name).write_bytes(raw)
    m.metadata.bytes, m.metadata.crc32c = len(raw), crc32c.crc32c(raw)
    (path / MANIFEST).write_bytes(encode_manifest(m))


@pytest.mark.parametrize("claimed", [1 << 40, 1 << 30])
def test_forged_shape_is_refused_before_allocating(tmp_path: Path, claimed: int) -> None:
    path = tmp_path / "ck"
    gc.save({"x": torch.arange(10.0)}, path)

    def grow(md) -> None:
        md.tensors[0].shape = [claimed]

    _forge(path, grow)
    with pytest.raises(gc.CheckpointError, match=r"tensor 'x'.*10 of \d+ elements"):
        gc.open(path).read("x")


def test_block_bytes_must_be_a_power_of_two(tmp_path: Path) -> None:
    path = tmp_path / "ck"
    gc.save({"x": torch.arange(10.0)}, path)

    def odd(md) -> None:
        md.block_bytes = 3000

    _forge(path, odd)
    with pytest.raises(gc.CheckpointError, match="bad block size 3000"):
        gc.load({"x": torch.zeros(10)}, path)


def _reseal(path: Path, meta_bytes: int) -> None:
    m = decode_manifest((path / MANIFEST).read_bytes(), "manifest")
    m.metadata.bytes = meta_bytes
    (path / MANIFEST).write_bytes(encode_manifest(m))


def test_a_huge_metadata_file_is_refused_before_it_is_read(tmp_path: Path) -> None:
    """A 2 GiB (sparse) metadata file named by the manifest: refused from its header alone."""
    path = tmp_path / "ck"
    gc.save({"x": torch.arange(10.0)}, path)
    m = decode_manifest((path / MANIFEST).read_bytes(), "manifest")
    os.truncate(path / m.metadata.name, 2 << 30)
    _reseal(path, 2 << 30)
    with pytest.raises(gc.CheckpointError, match=r"metadata is 2147483648 bytes, its header accounts for at most \d+"):
        gc.open(path)


def test_forged_row_counts_are_refused_by_the_data_there_is(tmp_path: Path) -> None:
    """A header whose columns claim 2^24 chunks, the file (sparse) grown to match: the data files
    hold room for a few chunks only, so the metadata is refused before its columns are read."""
    path = tmp_path / "ck"
    gc.save({"x": torch.arange(10.0)}, path)
    m = decode_manifest((path / MANIFEST).read_bytes(), "manifest")
    raw = (path / m.metadata.name).read_bytes()
    (hlen,) = struct.unpack("<Q", raw[8:16])
    h = msgspec.json.decode(raw[16 : 16 + hlen], type=Header)
    n = 1 << 24
    pos = 0
    for name, (dt, two_d) in COLUMNS.items():
        c = h.columns[name]
        c.shape = [n, h.ndim] if two_d else [n]
        c.offset = pos
        nbytes = n * (h.ndim if two_d else 1) * np.dtype(dt).itemsize
        pos += nbytes + (-nbytes) % 64
    hj = msgspec.json.encode(h)
    head = META_MAGIC + struct.pack("<Q", len(hj)) + hj
    head += b"\0" * ((-len(head)) % 64)
    f = path / m.metadata.name
    f.write_bytes(head)
    os.truncate(f, len(head) + pos)
    _reseal(path, len(head) + pos)
    with pytest.raises(gc.CheckpointError, match=r"claims 16777216 chunks, its data files have room for at most \d+"):
        gc.open(path)
