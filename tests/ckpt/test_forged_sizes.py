"""Forged sizes and fields in a checkpoint's metadata fail cleanly, before any large allocation."""

from __future__ import annotations

from pathlib import Path

import crc32c
import pytest
import torch

import goodput.ckpt as gc
from goodput.ckpt.format import MANIFEST, decode_manifest, decode_metadata, encode_manifest, encode_metadata


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
