"""Writes one rank's data file: raw chunk bytes on page boundaries, then the block-checksum table.

Checksums are computed while writing: the bytes are cut into segments; a background thread
writes segment i while this thread computes the block checksums of segment i (both release the
GIL for the long parts), so the checksum costs little on top of the write. The chunk's own CRC
is folded from its block CRCs (:mod:`goodput.ckpt.format.crc`), not computed by a second pass.
"""

from __future__ import annotations

import errno
import mmap
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import crc32c
import numpy as np

from ..format.crc import combine_blocks
from ..format.format import ALIGN, data_file_name
from ..format.geometry import Region
from ..storage.base import Storage

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


YIELD_BYTES = 1 << 20


def block_crcs(data: memoryview, block: int, out: list[int]) -> None:
    """Append the crc32c of each ``block`` bytes of ``data``. The C call holds the GIL for blocks
    this small, so the loop hands the GIL over every MiB: a writer thread returning from its
    syscall would otherwise wait out the interpreter's 5 ms switch interval while the device
    idles. ``time.sleep(0)`` is the hand-over: ``os.sched_yield`` does not hand the GIL over at
    all, and releasing it in every C call instead (the crc32c package's ``gil_release_mode=1``)
    makes it ping-pong between the writer's threads and slows a training loop running beside the
    save (docs/BENCHMARKS.md has the figures)."""
    crc = crc32c.crc32c
    step = max(block, YIELD_BYTES - YIELD_BYTES % block)
    for j in range(0, len(data), step):
        part = data[j : j + step]
        out.extend([crc(part[i : i + block]) for i in range(0, len(part), block)])
        time.sleep(0)  # releases the GIL: a thread waiting for it runs now, not in 5 ms


def copy_block_crcs(src: memoryview, dst: memoryview, block: int, out: list[int]) -> None:
    """Copy ``src`` into ``dst`` (a page-aligned bounce buffer for O_DIRECT) and append the block
    checksums, a MiB at a time so the checksum reads bytes the copy just left in cache: one pass
    over memory instead of two (unaligned sources, e.g. a CPU tensor from torch's allocator, are
    64-byte aligned, so every sync save of CPU tensors takes this path)."""
    crc = crc32c.crc32c
    step = max(block, YIELD_BYTES - YIELD_BYTES % block)
    d8 = np.frombuffer(dst, np.uint8)
    s8 = np.frombuffer(src, np.uint8)
    for j in range(0, len(src), step):
        np.copyto(d8[j : j + step], s8[j : j + step])
        part = dst[j : j + step]
        out.extend([crc(part[i : i + block]) for i in range(0, len(part), block)])
        time.sleep(0)


class BouncePool:
    """Page-aligned O_DIRECT bounce buffers kept from one save for the next. A fresh anonymous
    mapping faults in every page when first touched, and where freed memory goes back to a VM's
    host each fault is slow: fresh buffers cost a third of a two-rank save, reused ones make the
    copy as cheap as writing page-aligned memory directly (docs/BENCHMARKS.md, run 18). A process
    keeps at most ``keep_bytes`` of them (a rank writing two files uses 128 MiB); the first save
    of a process pays the faults."""

    def __init__(self, keep_bytes: int):
        self.keep_bytes = keep_bytes
        self._free: list[np.ndarray] = []
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> np.ndarray:
        with self._lock:
            for i, b in enumerate(self._free):
                if len(b) == nbytes:
                    return self._free.pop(i)
        return np.frombuffer(mmap.mmap(-1, nbytes), np.uint8)

    def give(self, bufs: list[np.ndarray]) -> None:
        with self._lock:
            for b in bufs:
                if sum(len(f) for f in self._free) + len(b) <= self.keep_bytes:
                    self._free.append(b)

    def held_bytes(self) -> int:
        with self._lock:
            return sum(len(f) for f in self._free)


BOUNCES = BouncePool(256 << 20)


def write_data_file(
    storage: Storage, directory: str, name: str, pieces: list[Piece], block_bytes: int, direct: bool = False
) -> FileResult:
    """Write pieces page-aligned, then the block-checksum table; fsync. With ``direct`` the bytes
    go by O_DIRECT, straight from page-aligned buffers or through two 32 MiB page-aligned bounce
    buffers (copy one while the other is written): no copy into the page cache and no writeback
    storm at fsync, and close to ``dd oflag=direct`` (docs/BENCHMARKS.md). Where the file system
    refuses O_DIRECT, buffered writes are used."""
    if direct:
        try:
            return _write(storage, directory, name, pieces, block_bytes, True)
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
    return _write(storage, directory, name, pieces, block_bytes, False)


def _write(
    storage: Storage, directory: str, name: str, pieces: list[Piece], block_bytes: int, direct: bool
) -> FileResult:
    t0 = time.perf_counter()
    out = storage.create(Path(directory), name, direct)
    direct = bool(getattr(out, "direct", False))  # the storage may have refused it, or have no such mode
    bounces: list[np.ndarray] = []
    k = 0
    records: list[ChunkRecord] = []
    crcs: list[int] = []
    pending: Future | None = None
    try:
        with ThreadPoolExecutor(1, thread_name_prefix="goodput-write") as pool:
            for p in pieces:
                if pending is not None:
                    pending.result()
                    pending = None
                out.align(ALIGN)
                start = out.pos
                mv = memoryview(p.data).cast("B")
                block0 = len(crcs)
                # segments are whole blocks (and pages), so checksums and direct writes stay aligned
                seg = max(block_bytes, SEGMENT - SEGMENT % max(block_bytes, ALIGN))
                for s in range(0, len(mv), seg):
                    part = mv[s : s + seg]
                    if direct and (
                        np.frombuffer(part, np.uint8).ctypes.data % ALIGN or len(part) % ALIGN and s + seg < len(mv)
                    ):
                        if not bounces:
                            bounces = [BOUNCES.take(seg) for _ in range(2)]
                        b = bounces[k % 2]  # the write in flight uses the other one
                        k += 1
                        src = memoryview(b[: len(part)])
                        copy_block_crcs(part, src, block_bytes, crcs)  # while the last segment is written
                        if pending is not None:
                            pending.result()
                        pending = pool.submit(out.write, src)
                    else:
                        if pending is not None:
                            pending.result()
                        pending = pool.submit(out.write, part)
                        block_crcs(part, block_bytes, crcs)  # while this segment is written
                mine = np.asarray(crcs[block0:], dtype="<u4")
                crc = combine_blocks(mine, block_bytes, len(mv))  # no second pass over the bytes
                table_crc = crc32c.crc32c(mine.tobytes())
                records.append(ChunkRecord(p.name, p.region, start, len(mv), crc, block0, table_crc))
            if pending is not None:
                pending.result()
            out.align(ALIGN if direct else 8)
            crc_offset = out.pos
            table = np.asarray(crcs, dtype="<u4").tobytes()
            if direct:
                buf = mmap.mmap(-1, len(table) + (-len(table)) % ALIGN or ALIGN)
                buf[: len(table)] = table
                out.write(memoryview(buf)[: len(table)])
                buf.close()
            else:
                out.write(memoryview(table))
        out.finish()
    except BaseException:
        out.close()
        storage.remove(Path(directory), name)
        raise
    finally:
        BOUNCES.give(bounces)  # no write uses them any more: the pool above has shut down
    out.close()
    return FileResult(name, out.pos, crc_offset, len(crcs), records, time.perf_counter() - t0)


AUTO_FILES_MIN_BYTES = 256 << 20  # a rank writing at least this much writes two files at once


def auto_files(nbytes: int) -> int:
    """Files per rank when the caller did not say: two concurrent streams once a rank writes
    256 MiB or more (one O_DIRECT stream leaves the device idle between its requests; ``goodput
    bench ckpt`` times one file against this default), one below that, where a second file is
    only overhead."""
    return 2 if nbytes >= AUTO_FILES_MIN_BYTES else 1


def write_rank_files(
    storage: Storage,
    directory: str,
    save_id: str,
    rank: int,
    pieces: list[Piece],
    block_bytes: int,
    files: int | None = 1,
    direct: bool = False,
) -> list[FileResult]:
    """Write one rank's pieces into ``files`` data files in parallel (for storage that rewards
    concurrent streams: NVMe, parallel file systems); ``None`` chooses (:func:`auto_files`).
    Pieces are spread largest first over the files; only when that leaves the files more than
    10 % apart are large pieces cut along their leading dimension (a contiguous byte range each),
    so the metadata gains chunks only where balance needs them."""
    from .agreement import split_region

    if not pieces:
        return []
    total = sum(len(p.data) for p in pieces)
    files = auto_files(total) if files is None else max(1, files)

    def spread(ps: list[Piece]) -> tuple[list[list[Piece]], list[int]]:
        groups: list[list[Piece]] = [[] for _ in range(files)]
        load = [0] * files
        for p in sorted(ps, key=lambda p: -len(p.data)):
            i = load.index(min(load))
            groups[i].append(p)
            load[i] += len(p.data)
        return groups, load

    groups, load = spread(pieces)
    if files > 1 and max(load) > 1.1 * total / files:
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
        groups, load = spread(cut)
    groups = [g for g in groups if g]
    names = [data_file_name(save_id, rank, i) for i in range(len(groups))]
    try:
        if len(groups) == 1:
            return [write_data_file(storage, directory, names[0], groups[0], block_bytes, direct)]
        with ThreadPoolExecutor(len(groups), thread_name_prefix="goodput-file") as pool:
            futs = [
                pool.submit(write_data_file, storage, directory, n, g, block_bytes, direct)
                for n, g in zip(names, groups)
            ]
            return [f.result() for f in futs]
    except BaseException:
        for n in names:
            storage.remove(Path(directory), n)
        raise
