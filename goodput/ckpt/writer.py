"""Writes one rank's data file: raw chunk bytes on page boundaries, then the block-checksum table.

Checksums are computed while writing: the bytes are cut into segments; a background thread
writes segment i while this thread computes the checksums of segment i (both release the GIL
for the long parts), so the checksum costs almost nothing on top of the write.
"""

from __future__ import annotations

import contextlib
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import crc32c
import numpy as np

from .format import ALIGN
from .geometry import Region
from .storage import write_all

SEGMENT = 32 << 20


@dataclass
class Piece:
    """A chunk this rank writes: a region of a named tensor and its bytes (C-contiguous)."""

    name: str
    region: Region
    data: np.ndarray  # uint8, 1-D, contiguous


@dataclass
class ChunkRecord:
    name: str
    region: Region
    offset: int
    length: int
    crc32c: int
    block0: int
    blocks_crc32c: int  # binds the file's block table to the global metadata


@dataclass
class FileResult:
    name: str
    bytes: int
    crc_offset: int
    crc_count: int
    records: list[ChunkRecord]
    seconds: float


def block_crcs(data: memoryview, block: int, out: list[int]) -> None:
    for i in range(0, len(data), block):
        out.append(crc32c.crc32c(data[i : i + block]))


def write_data_file(path: str, pieces: list[Piece], block_bytes: int) -> FileResult:
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    records: list[ChunkRecord] = []
    crcs: list[int] = []
    pos = 0
    pending: Future | None = None
    zeros = bytes(ALIGN)
    try:
        with ThreadPoolExecutor(1, thread_name_prefix="goodput-write") as pool:
            for p in pieces:
                pad = (-pos) % ALIGN
                if pad:
                    if pending is not None:
                        pending.result()
                    write_all(fd, zeros[:pad])
                    pos += pad
                mv = memoryview(p.data).cast("B")
                block0 = len(crcs)
                crc = 0
                # segments are whole blocks, so block checksums never straddle two segments
                seg = max(block_bytes, SEGMENT - SEGMENT % block_bytes)
                for s in range(0, len(mv), seg):
                    part = mv[s : s + seg]
                    if pending is not None:
                        pending.result()
                    pending = pool.submit(write_all, fd, part)
                    crc = crc32c.crc32c(part, crc)
                    block_crcs(part, block_bytes, crcs)
                table_crc = crc32c.crc32c(np.asarray(crcs[block0:], dtype="<u4").tobytes())
                records.append(ChunkRecord(p.name, p.region, pos, len(mv), crc, block0, table_crc))
                pos += len(mv)
            if pending is not None:
                pending.result()
            pad = (-pos) % 8
            write_all(fd, bytes(pad))
            pos += pad
            crc_offset = pos
            table = np.asarray(crcs, dtype="<u4").tobytes()
            write_all(fd, table)
            pos += len(table)
        os.fsync(fd)
    finally:
        os.close(fd)
    return FileResult(os.path.basename(path), pos, crc_offset, len(crcs), records, time.perf_counter() - t0)


def data_file_name(save_id: str, rank: int, index: int) -> str:
    return f"data-{save_id}-r{rank:05d}-{index}.bin"


def write_rank_files(
    directory: str, save_id: str, rank: int, pieces: list[Piece], block_bytes: int, files: int = 1
) -> list[FileResult]:
    """Write one rank's pieces into ``files`` data files in parallel (for storage that rewards
    concurrent streams: NVMe, parallel file systems). Large pieces are cut along their leading
    dimension, which keeps each cut a contiguous byte range, so the files come out balanced."""
    from .plan_save import split_region

    if not pieces:
        return []
    files = max(1, files)
    if files > 1:
        total = sum(len(p.data) for p in pieces)
        target = max(1 << 20, total // (files * 4))
        cut: list[Piece] = []
        for p in pieces:
            if len(p.data) <= target:
                cut.append(p)
                continue
            item = len(p.data) // max(p.region.numel, 1)
            pos = 0
            for sub in split_region(p.region, -(-len(p.data) // target)):
                n = sub.numel * item
                cut.append(Piece(p.name, sub, p.data[pos : pos + n]))
                pos += n
        pieces = cut
    groups: list[list[Piece]] = [[] for _ in range(files)]
    load = [0] * files
    for p in sorted(pieces, key=lambda p: -len(p.data)):
        i = load.index(min(load))
        groups[i].append(p)
        load[i] += len(p.data)
    groups = [g for g in groups if g]
    paths = [os.path.join(directory, data_file_name(save_id, rank, i)) for i in range(len(groups))]
    try:
        if len(groups) == 1:
            return [write_data_file(paths[0], groups[0], block_bytes)]
        with ThreadPoolExecutor(len(groups), thread_name_prefix="goodput-file") as pool:
            futs = [pool.submit(write_data_file, path, g, block_bytes) for path, g in zip(paths, groups)]
            return [f.result() for f in futs]
    except BaseException:
        for path in paths:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        raise
