"""The writer's checksum paths: block CRCs with and without a bounce copy, equal to a plain
per-block crc32c whatever the alignment of the source and the length of the tail."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import crc32c
import numpy as np
import pytest

from goodput.ckpt.format.crc import combine_blocks
from goodput.ckpt.format.geometry import Region
from goodput.ckpt.saving import writer
from goodput.ckpt.storage.local import POSIX


def _reference(data: bytes, block: int) -> list[int]:
    return [crc32c.crc32c(data[i : i + block]) for i in range(0, len(data), block)]


@pytest.mark.parametrize("n", [1, 4095, 4096, 4097, (1 << 20) + 123, (3 << 20) - 1])
@pytest.mark.parametrize("block", [512, 4096, 65536])
def test_block_crcs_and_copy_match_reference(n: int, block: int) -> None:
    rng = np.random.default_rng(n + block)
    raw = rng.integers(0, 256, n + 3, dtype=np.uint8)
    src = memoryview(raw[3:])  # deliberately unaligned
    want = _reference(bytes(src), block)
    got: list[int] = []
    writer.block_crcs(src, block, got)
    assert got == want
    bounce = np.frombuffer(mmap.mmap(-1, n + 4096), np.uint8)
    dst = memoryview(bounce[:n])
    got2: list[int] = []
    writer.copy_block_crcs(src, dst, block, got2)
    assert got2 == want
    assert bytes(dst) == bytes(src)


@pytest.mark.parametrize("direct", [False, True])
def test_write_data_file_from_unaligned_source(tmp_path: Path, direct: bool) -> None:
    """A source that is not page-aligned (as torch's allocator gives) goes through the bounce
    buffers under O_DIRECT; the bytes on disk and every recorded CRC are those of the source."""
    rng = np.random.default_rng(7)
    sizes = [(40 << 20) + 100, 5000, 1 << 20]  # more than one 32 MiB segment, ragged tails
    raws = [rng.integers(0, 256, s + 64, dtype=np.uint8)[64:] for s in sizes]
    pieces = [writer.Piece(f"t{i}", Region((0,), (len(r),)), r) for i, r in enumerate(raws)]
    path = tmp_path / "d.bin"
    res = writer.write_data_file(POSIX, str(path.parent), path.name, pieces, 4096, direct=direct)
    blob = path.read_bytes()
    assert len(blob) == res.bytes == os.path.getsize(path)
    table = np.frombuffer(blob[res.crc_offset : res.crc_offset + 4 * res.crc_count], "<u4")
    for rec, r in zip(res.records, raws):
        assert rec.offset % 4096 == 0 and rec.length == len(r)
        assert blob[rec.offset : rec.offset + rec.length] == r.tobytes()
        assert rec.crc32c == crc32c.crc32c(r.tobytes())
        blocks = table[rec.block0 : rec.block0 + -(-rec.length // 4096)]
        assert blocks.tolist() == _reference(r.tobytes(), 4096)
        assert combine_blocks(blocks, 4096, rec.length) == rec.crc32c


def test_bounce_buffers_are_kept_for_the_next_save_within_the_cap(tmp_path: Path) -> None:
    """The O_DIRECT bounce buffers go back to the process's pool when a file is written (fresh
    ones fault in every page; docs/BENCHMARKS.md run 17) and come out again for the next one;
    the pool never holds more than its cap, and a buffer of another size is never handed out."""
    pool = writer.BouncePool(3 << 20)
    a = pool.take(1 << 20)
    b = pool.take(1 << 20)
    assert len(a) == 1 << 20 and a.ctypes.data % 4096 == 0
    pool.give([a, b, pool.take(1 << 20), pool.take(1 << 20)])
    assert pool.held_bytes() == 3 << 20  # the fourth is dropped
    assert pool.take(2 << 20) is not a and len(pool.take(2 << 20)) == 2 << 20
    assert pool.take(1 << 20) is not None and pool.held_bytes() == 2 << 20

    raw = np.random.default_rng(1).integers(0, 256, (40 << 20) + 64, dtype=np.uint8)[64:]  # not page-aligned
    pieces = [writer.Piece("t", Region((0,), (len(raw),)), raw)]
    before = writer.BOUNCES.held_bytes()
    for i in range(2):
        writer.write_data_file(POSIX, str(tmp_path), f"d{i}.bin", pieces, 4096, direct=True)
        assert (tmp_path / f"d{i}.bin").read_bytes()[: len(raw)] == raw.tobytes()
    if writer.BOUNCES.held_bytes() == before == 0:
        pytest.skip("this file system refuses O_DIRECT: no bounce buffers")
    assert before <= writer.BOUNCES.held_bytes() <= writer.BOUNCES.keep_bytes
