"""Executes a read plan: the byte runs read and verified against the block checksums with
bounded memory, so a load never holds a whole saved chunk it does not need (which is where DCP
runs out of memory). On a file system each data file is read in order by one thread while a
pool as wide as the cores checks and places the landed pieces; on an object store the pieces
are read in parallel (:class:`ChunkReader`).

numpy only: the torch-free reader uses it.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from itertools import chain, islice
from pathlib import Path

import crc32c
import numpy as np

from ..errors import CheckpointError
from ..format.crc import combine_blocks
from ..format.format import Metadata
from ..storage.base import Source, Storage
from ..storage.location import storage_for
from .read_plan import ChunkOps, ReadPlan, ReadPlanner, Request

DEFAULT_READ_BUFFER = 256 << 20
PIECE = 16 << 20  # unit of work handed to one I/O thread
INLINE = 1 << 20  # a landed piece smaller than this is checked by its reader: handing it over costs more
MAX_IN_FLIGHT = 16  # pieces read and not yet checked: enough to keep a device and the checks busy
TABLE_REGION_BYTES = 4 << 20  # a file's whole checksum table up to this is read in one request


@dataclass
class ReadStats:
    bytes_needed: int = 0
    bytes_read: int = 0  # data bytes read from storage (checksum tables counted apart)
    checksum_bytes_read: int = 0
    reads: int = 0
    chunks: int = 0
    verified_blocks: int = 0
    seconds: float = 0.0
    plan_seconds: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, **kw: int) -> None:
        with self._lock:
            for k, v in kw.items():
                setattr(self, k, getattr(self, k) + v)

    def as_dict(self) -> dict[str, float]:
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}


class Files:
    """Opened data files, each checked against the size the metadata promises."""

    def __init__(self, directory: Path, md: Metadata, storage: Storage | None = None):
        self.dir = directory
        self.md = md
        self.storage = storage or storage_for(directory)
        self._open: dict[int, Source] = {}
        self._tables: dict[int, _Once] = {}
        self._lock = threading.Lock()

    def source(self, fid: int) -> Source:
        with self._lock:
            src = self._open.get(fid)
            if src is not None:
                return src
            f = self.md.files[fid]
            try:
                src = self.storage.open(self.dir, f.name, "data file", f.bytes)
            except CheckpointError as e:
                raise CheckpointError(f"{e} (it holds {self._tensors_in(fid)})") from None
            if src.size != f.bytes:
                src.close()
                raise CheckpointError(
                    f"data file {str(self.dir / f.name)!r} is {src.size} bytes, the metadata says {f.bytes} "
                    f"(truncated or replaced; it holds {self._tensors_in(fid)})"
                )
            self._open[fid] = src
            return src

    def table(self, fid: int, stats: ReadStats) -> np.ndarray | None:
        """The file's whole block-checksum table, read once in one request, when it is at most
        ``TABLE_REGION_BYTES`` (4 bytes a 4 KiB block: files up to 4 GiB); None above that, where
        each chunk's part is read on its own. One request instead of one a chunk: on an object
        store each is a round trip and a request's CPU, and the table is a thousandth of the
        file, so a load that needs only part of the file reads a little more for it."""
        f = self.md.files[fid]
        if 4 * f.crc_count > TABLE_REGION_BYTES:
            return None
        with self._lock:
            once = self._tables.get(fid)
            if once is None:
                once = self._tables[fid] = _Once(partial(self._read_table, fid, stats))
        return once.get()

    def _read_table(self, fid: int, stats: ReadStats) -> np.ndarray:
        f = self.md.files[fid]
        buf = np.empty(f.crc_count, dtype="<u4")
        self.source(fid).read_into(memoryview(buf).cast("B"), f.crc_offset, f.name)
        stats.add(checksum_bytes_read=4 * f.crc_count, reads=1)
        return buf

    def _tensors_in(self, fid: int) -> str:
        tids = np.unique(self.md.cols["tensor"][self.md.cols["file"] == fid])
        names = [repr(self.md.tensors[int(t)].name) for t in tids[:5]]
        more = f" and {len(tids) - 5} more" if len(tids) > 5 else ""
        return "tensors " + ", ".join(names) + more

    def close(self) -> None:
        with self._lock:
            for src in self._open.values():
                src.close()
            self._open.clear()


def chunk_block_crcs(files: Files, md: Metadata, ch: int, stats: ReadStats) -> np.ndarray:
    """The chunk's block-checksum table (4 bytes a block: kept as an array, not a list of Python
    ints, which would cost ten times that for a large chunk), checked against the metadata."""
    fid = int(md.cols["file"][ch])
    f = md.files[fid]
    nblocks = -(-int(md.cols["length"][ch]) // md.block_bytes)
    block0 = int(md.cols["block0"][ch])
    region = files.table(fid, stats)
    if region is not None:  # validated: block0 + nblocks lies within the file's table
        buf = region[block0 : block0 + nblocks]
    else:
        buf = np.empty(nblocks, dtype="<u4")
        files.source(fid).read_into(memoryview(buf).cast("B"), f.crc_offset + 4 * block0, f.name)
        stats.add(checksum_bytes_read=4 * nblocks, reads=1)
    if crc32c.crc32c(buf.tobytes()) != int(md.cols["blocks_crc32c"][ch]):
        raise CheckpointError(
            f"block checksum table of {md.describe_chunk(ch)} does not match the metadata "
            f"(file {f.name!r} is corrupt or from another checkpoint)"
        )
    # the metadata's whole-chunk CRC is the fold of the blocks' (one call, no data read): a load
    # checks it as verify does, so the two never disagree on one checkpoint
    if combine_blocks(buf, md.block_bytes, int(md.cols["length"][ch])) != int(md.cols["crc32c"][ch]):
        raise CheckpointError(
            f"the metadata's crc32c of {md.describe_chunk(ch)} does not match its block checksums "
            f"(in file {f.name!r}): the metadata is damaged, or the file is from another checkpoint"
        )
    return buf


class _Once:
    """A value computed once, by the first thread that asks; the others wait for it."""

    def __init__(self, fn: Callable[[], np.ndarray]):
        self._fn: Callable[[], np.ndarray] | None = fn
        self._value: np.ndarray | None = None
        self._lock = threading.Lock()

    def get(self) -> np.ndarray:
        with self._lock:
            if self._fn is not None:
                self._value, self._fn = self._fn(), None
        assert self._value is not None
        return self._value


def check_blocks(md: Metadata, ch: int, data: memoryview, first_block: int, expect: np.ndarray) -> int:
    """Compare the checksums of whole blocks in ``data`` (starting at ``first_block``).

    A run of blocks is checked with one CRC over all its bytes, against the CRC the recorded
    block CRCs combine to (:func:`crc.combine_blocks`): one C call at full speed instead of a
    call per 4 KiB block, which halves the CPU a verified load spends. Only on a mismatch are the
    blocks checked one by one, to name the corrupt one. The GIL is released while hashing, so
    threads verify pieces in parallel."""
    B = md.block_bytes
    nb = -(-len(data) // B)
    if nb >= 8:
        want = combine_blocks(expect[first_block : first_block + nb], B, len(data))
        if crc32c.crc32c(data, 0, 1) == want:
            return nb
    k = first_block
    for i in range(0, len(data), B):
        if crc32c.crc32c(data[i : i + B], 0, 1) != int(expect[k]):
            raise _corrupt(md, ch, k, len(data[i : i + B]))
        k += 1
    if nb >= 8:  # the run failed but no block did: the recorded block CRCs disagree with each other
        raise _corrupt(md, ch, first_block, len(data))
    return nb


def _corrupt(md: Metadata, ch: int, k: int, n: int) -> CheckpointError:
    f = md.files[int(md.cols["file"][ch])]
    start = int(md.cols["offset"][ch]) + k * md.block_bytes
    return CheckpointError(
        f"checksum mismatch in {f.name!r} at bytes [{start}, {start + n}): block {k} of {md.describe_chunk(ch)} is corrupt"
    )


class _Stream:
    """What one consumer of a chunk sequence remembers between its ChunkOps: a chunk with more
    runs than a batch comes in parts, counted once, its checksum table read once."""

    def __init__(self) -> None:
        self.last_chunk = -1
        self.table: tuple[int, _Once] | None = None


class _Groups:
    """The reads of a partial chunk read (some runs of a chunk, verified): the blocks the runs
    touch, joined across gaps within the amplification budget, cut into groups of at most
    ``piece`` bytes. A group is read back to back into one buffer (:meth:`read`), then verified
    with one CRC and its runs copied out in one call (:meth:`place`): the per-read Python cost is
    what bounds a load made of many small reads."""

    def __init__(self, md: Metadata, o: ChunkOps, piece: int, max_amplification: float):
        B = md.block_bytes
        length = int(md.cols["length"][o.chunk])
        # mark the blocks the runs touch; read maximal spans of them, bounded by the piece
        # (over the blocks between this part's first and last run only: a chunk in many parts
        # must not cost a pass over all its blocks for each)
        self.ends = ends = o.src + o.nbytes
        b_lo = int(o.src.min()) // B
        nblocks = (int(ends.max()) - 1) // B + 1 - b_lo
        marks = np.zeros(nblocks + 1, np.int64)
        np.add.at(marks, o.src // B - b_lo, 1)
        np.add.at(marks, (ends - 1) // B + 1 - b_lo, -1)
        touched = np.cumsum(marks[:-1]) > 0
        edges = np.flatnonzero(np.diff(np.concatenate([[False], touched, [False]]).astype(np.int8))) + b_lo
        spans = coalesce(edges.reshape(-1, 2), B, max_amplification * int(o.nbytes.sum()))
        longest = int(o.nbytes.max())
        per_piece = max(1, piece // B)
        groups: list[list[tuple[int, int]]] = [[]]
        size = 0
        for b0, b1 in spans.tolist():
            for p0 in range(b0, b1, per_piece):
                p1 = min(b1, p0 + per_piece)
                if size + (p1 - p0) > per_piece and groups[-1]:
                    groups.append([])
                    size = 0
                groups[-1].append((p0, p1))
                size += p1 - p0
        # per piece: its byte range and the runs that meet it, found for all pieces at once
        flat = [pc for g in groups for pc in g]
        self.p_lo = p_lo = np.array([p0 for p0, _ in flat], np.int64) * B
        self.p_hi = p_hi = np.minimum(np.array([p1 for _, p1 in flat], np.int64) * B, length)
        self.i0s = np.searchsorted(o.src, p_lo - longest, side="left")
        self.i1s = np.searchsorted(o.src, p_hi, side="left")
        cuts = np.cumsum([0] + [len(g) for g in groups if g])
        self.bounds = list(zip(cuts[:-1].tolist(), cuts[1:].tolist()))
        self.o = o

    def size(self, g0: int, g1: int) -> int:
        return int((self.p_hi[g0:g1] - self.p_lo[g0:g1]).sum())

    def read(self, g0: int, g1: int, buf: memoryview, src: Source, base: int, fname: str) -> None:
        """The group's pieces back to back into ``buf``: one system call each, nothing else."""
        lo, hi = self.p_lo[g0:g1], self.p_hi[g0:g1]
        n = hi - lo
        pos = np.concatenate([[0], np.cumsum(n)])
        fd = src.fd  # POSIX: os.preadv directly, without a method call per read
        preadv = os.preadv
        for a, m, at in zip((lo + base).tolist(), n.tolist(), pos[:-1].tolist()):
            if fd is None:
                src.read_into(buf[at : at + m], a, fname)
                continue
            try:
                got = preadv(fd, [buf[at : at + m]], a)
            except OSError:
                got = 0  # read_into retries and, if it fails again, names the file
            if got != m:  # short read: finish it, or fail naming the file
                src.read_into(buf[at + max(got, 0) : at + m], a + max(got, 0), fname)

    def place(self, reader: ChunkReader, g0: int, g1: int, buf: memoryview, expect: np.ndarray, dests: list) -> None:
        """Verify the group in ``buf`` and copy every run meeting it into the destinations."""
        o = self.o
        lo, hi = self.p_lo[g0:g1], self.p_hi[g0:g1]
        n = hi - lo
        pos = np.concatenate([[0], np.cumsum(n)])
        total = int(pos[-1])
        nv = reader._verify_pieces(o.chunk, buf, lo, hi, pos, expect)
        # the runs meeting each piece, clipped to it, at their place in the buffer
        c0, c1 = self.i0s[g0:g1], self.i1s[g0:g1]
        cnt = c1 - c0
        idx = np.arange(int(cnt.sum())) - np.repeat(np.cumsum(cnt) - cnt, cnt) + np.repeat(c0, cnt)
        plo, phi, ppos = np.repeat(lo, cnt), np.repeat(hi, cnt), np.repeat(pos[:-1], cnt)
        ra = np.maximum(o.src[idx], plo)
        rb = np.minimum(self.ends[idx], phi)
        keep = ra < rb
        if not keep.all():
            idx, ra, rb, plo, ppos = idx[keep], ra[keep], rb[keep], plo[keep], ppos[keep]
        copy_at(
            np.frombuffer(buf, np.uint8),
            ppos + (ra - plo),
            rb - ra,
            o.dst[idx] + (ra - o.src[idx]),
            o.req[idx],
            dests,
        )
        reader.stats.add(verified_blocks=nv, reads=len(n), bytes_read=total)


class _Pipeline:
    """Pieces landed by the file readers, checked and placed by a pool as wide as the cores.

    A reader takes a slot (:meth:`acquire`) before it reads a piece and the task it hands over
    (:meth:`submit`) gives it back when done, so at most ``slots`` pieces are in flight, and the
    buffers pieces are read into when they are not read in place (``slots`` × ``slot_bytes``,
    made on first use) stay within the load's read buffer. The pool starts with the second
    piece: a load of one piece starts no thread. The first error (a reader's or a task's) stops
    every reader at its next piece; :meth:`finish` waits for every task before it raises it, so
    nothing writes into the caller's tensors after the load returns."""

    def __init__(self, workers: int, slots: int, slot_bytes: int):
        self.workers = max(1, workers)
        self.slots = max(1, slots)
        self.slot_bytes = slot_bytes
        self._sem = threading.Semaphore(self.slots)
        self._free: queue.SimpleQueue[np.ndarray] = queue.SimpleQueue()
        self._made = 0
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._held: Callable[[], None] | None = None
        self.errors: list[BaseException] = []
        self.failed = threading.Event()

    def fail(self, e: BaseException) -> None:
        with self._lock:
            self.errors.append(e)
        self.failed.set()

    def acquire(self) -> bool:
        """Wait for a slot; False once the load has failed (the reader stops)."""
        if not self._sem.acquire(blocking=False):
            with self._lock:
                self._start()  # a task held back for a small load must run to free its slot
            self._sem.acquire()
        if self.failed.is_set():
            self._sem.release()
            return False
        return True

    def buffer(self) -> np.ndarray:
        """A read buffer of ``slot_bytes`` (called holding a slot: one is free or can be made)."""
        try:
            return self._free.get_nowait()
        except queue.Empty:
            pass
        with self._lock:
            if self._made < self.slots:
                self._made += 1
                return np.empty(self.slot_bytes, np.uint8)
        return self._free.get()

    def release(self, buf: np.ndarray | None = None) -> None:
        """Give a slot back unused (the read failed before its task was handed over)."""
        if buf is not None:
            self._free.put(buf)
        self._sem.release()

    def submit(self, fn: Callable[[], None], buf: np.ndarray | None = None, inline: bool = False) -> None:
        """Hand ``fn`` to the pool (``inline``: run it here, for work too small to hand over);
        the slot (and ``buf``) is given back when it is done."""

        def task() -> None:
            try:
                if not self.failed.is_set():
                    fn()
            except BaseException as e:
                self.fail(e)
            finally:
                self.release(buf)

        if inline:
            task()
            return
        with self._lock:
            if self._pool is None and self._held is None:
                self._held = task
                return
            self._start()
            assert self._pool is not None
            self._pool.submit(task)

    def _start(self) -> None:
        if self._pool is None and self._held is not None:
            self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="goodput-check")
        if self._held is not None:
            assert self._pool is not None
            self._pool.submit(self._held)
            self._held = None

    def finish(self) -> None:
        """Run or wait for every task handed over; raise the first error."""
        with self._lock:
            held, self._held = (self._held, None) if self._pool is None else (None, self._held)
            self._start()
            pool = self._pool
        if held is not None:
            held()
        if pool is not None:
            pool.shutdown(wait=True)
        if self.errors:
            raise self.errors[0]


class ChunkReader:
    """Reads and verifies the byte runs of a plan into the destinations.

    On storage with file descriptors (POSIX) each data file is read by one thread in file order,
    in large pieces straight into the destination (or into a bounded read buffer where only some
    bytes of a chunk are needed), while the checksums of landed pieces and their placement run
    on a pool as wide as the cores: a file read in order at one offset gets the device's large
    requests and the kernel's readahead, where pieces read at several interleaved offsets ran
    at about half the throughput (docs/BENCHMARKS.md). Up to ``threads`` files are read at once.
    On an object store, where every request is a round trip, ``threads`` pieces are read in
    parallel instead, each verified by the thread that read it."""

    def __init__(
        self,
        directory: Path,
        md: Metadata,
        *,
        verify: bool,
        read_buffer: int,
        threads: int,
        max_amplification: float = 1.1,
        storage: Storage | None = None,
        check_threads: int | None = None,
    ):
        self.md = md
        self.max_amplification = max_amplification
        self.files = Files(directory, md, storage)
        self.verify = verify
        self.threads = max(1, threads)
        self.read_buffer = read_buffer
        self.check_threads = max(1, check_threads or os.cpu_count() or 1)
        self.scratch_bytes = max(md.block_bytes, (read_buffer // self.threads) // md.block_bytes * md.block_bytes)
        self._local = threading.local()
        self.stats = ReadStats()
        self._stream = _Stream()

    def scratch(self, n: int) -> memoryview:
        buf = getattr(self._local, "buf", None)
        if buf is None:
            buf = np.empty(self.scratch_bytes, np.uint8)
            self._local.buf = buf
        return memoryview(buf)[:n]

    def run(self, ops: Iterable[ChunkOps], dests: list[np.ndarray]) -> ReadStats:
        t0 = time.perf_counter()
        try:
            streams = self._file_streams(ops)
            if streams is None:
                self._run_parallel(ops, dests)
            else:
                self._run_sequential(streams, dests)
        finally:
            self.files.close()
        self.stats.seconds += time.perf_counter() - t0
        return self.stats

    def _file_streams(self, ops: Iterable[ChunkOps]) -> list[tuple[int, Iterable[ChunkOps]]] | None:
        """The plan cut into one plan per data file (the plan is ordered by file), when every
        file it reads has a descriptor; None otherwise (an object store, or ``ops`` that is not
        a whole plan), for the parallel ranged reads."""
        if not isinstance(ops, ReadPlan):
            return None
        streams = ops.by_file()
        if any(self.files.source(fid).fd is None for fid, _ in streams):
            return None
        return streams

    def _pieces(self) -> tuple[int, int]:
        """(slots, bytes a slot): the pieces in flight, within the read buffer."""
        B = self.md.block_bytes
        want = min(MAX_IN_FLIGHT, 2 * self.check_threads + min(self.threads, len(self.md.files)))
        piece = min(PIECE, max(B, self.read_buffer // want // B * B))
        return max(1, min(want, self.read_buffer // piece)), piece

    def _run_sequential(self, streams: list[tuple[int, Iterable[ChunkOps]]], dests: list[np.ndarray]) -> None:
        slots, piece = self._pieces()
        pipe = _Pipeline(self.check_threads, slots, piece)
        try:
            readers = min(self.threads, len(streams))
            if readers <= 1:
                for _, sub in streams:
                    self._read_file(sub, dests, pipe, piece)
            else:
                with ThreadPoolExecutor(readers, thread_name_prefix="goodput-read") as rp:
                    futures = [rp.submit(self._read_file, sub, dests, pipe, piece) for _, sub in streams]
                    try:
                        for f in futures:
                            f.result()
                    except BaseException as e:  # (an interrupt) stops the readers before waiting on them
                        pipe.fail(e)
                        raise
        except BaseException as e:
            pipe.fail(e)
        pipe.finish()

    def _read_file(self, ops: Iterable[ChunkOps], dests: list[np.ndarray], pipe: _Pipeline, piece: int) -> None:
        """One data file's runs, in file order, by one thread; checks and copies go to the pool."""
        st = _Stream()
        try:
            for o in ops:
                if pipe.failed.is_set():
                    return
                self._read_chunk(o, dests, pipe, piece, st)
        except BaseException as e:
            pipe.fail(e)

    def _begin(self, o: ChunkOps, st: _Stream) -> tuple[Source, str, int, int]:
        md = self.md
        ch = o.chunk
        src = self.files.source(int(md.cols["file"][ch]))
        first_part = ch != st.last_chunk  # a chunk with more runs than a batch comes in parts
        st.last_chunk = ch
        self.stats.add(chunks=int(first_part), bytes_needed=int(o.nbytes.sum()))
        # read errors name the file and the tensor
        return src, md.describe_chunk(ch), int(md.cols["offset"][ch]), int(md.cols["length"][ch])

    def _table(self, ch: int, st: _Stream) -> _Once:
        if st.table is None or st.table[0] != ch:  # read once for all of a chunk's parts
            st.table = (ch, _Once(partial(chunk_block_crcs, self.files, self.md, ch, self.stats)))
        return st.table[1]

    def _read_chunk(self, o: ChunkOps, dests: list[np.ndarray], pipe: _Pipeline, piece: int, st: _Stream) -> None:
        md = self.md
        ch = o.chunk
        src, fname, base, length = self._begin(o, st)
        if not self.verify:  # nothing to check: every run read straight into its destination
            reads = 0
            for s, d, n, r in zip(o.src.tolist(), o.dst.tolist(), o.nbytes.tolist(), o.req.tolist()):
                view = memoryview(dests[r])[d : d + n]
                for a in range(0, n, PIECE):
                    src.read_into(view[a : a + PIECE], base + s + a, fname)
                    reads += 1
            self.stats.add(bytes_read=int(o.nbytes.sum()), reads=reads)
            return
        table = self._table(ch, st).get()  # on this thread: one read a file (or a chunk), in order
        B = md.block_bytes
        if len(o.src) == 1 and o.src[0] == 0 and o.nbytes[0] == length:
            # whole chunk into one contiguous destination: read in place, verified there
            view = memoryview(dests[int(o.req[0])])[int(o.dst[0]) : int(o.dst[0]) + length]
            for a in range(0, length, PIECE):
                if not pipe.acquire():
                    return
                part = view[a : a + PIECE]
                try:
                    src.read_into(part, base + a, fname)
                except BaseException:
                    pipe.release()
                    raise
                pipe.submit(partial(self._check_in_place, ch, part, a // B, table), inline=len(part) < INLINE)
            return
        groups = _Groups(md, o, piece, self.max_amplification)
        for g0, g1 in groups.bounds:
            if not pipe.acquire():
                return
            buf = pipe.buffer()
            mv = memoryview(buf)[: groups.size(g0, g1)]
            try:
                groups.read(g0, g1, mv, src, base, fname)
            except BaseException:
                pipe.release(buf)
                raise
            pipe.submit(partial(groups.place, self, g0, g1, mv, table, dests), buf, inline=len(mv) < INLINE)

    def _check_in_place(self, ch: int, part: memoryview, first_block: int, table: np.ndarray) -> None:
        self.stats.add(
            verified_blocks=check_blocks(self.md, ch, part, first_block, table), reads=1, bytes_read=len(part)
        )

    def _run_parallel(self, ops: Iterable[ChunkOps], dests: list[np.ndarray]) -> None:
        tasks = (t for o in ops for t in self.chunk_tasks(o, dests))
        head = list(islice(tasks, 2))
        if self.threads == 1 or len(head) <= 1:  # a small load starts no threads
            for task in chain(head, tasks):
                task()
            return
        tasks = chain(head, tasks)
        # tasks are made as the plan is consumed and at most 2 x threads wait at once,
        # so the runs and checksum tables held stay bounded however large the load
        with ThreadPoolExecutor(self.threads, thread_name_prefix="goodput-read") as pool:
            pending: deque[Future] = deque()
            for task in tasks:
                if len(pending) >= 2 * self.threads:
                    pending.popleft().result()
                pending.append(pool.submit(task))
            while pending:
                pending.popleft().result()

    def chunk_tasks(self, o: ChunkOps, dests: list[np.ndarray]) -> list[Callable[[], None]]:
        """Independent pieces of work (each at most one scratch buffer) for the parallel reads,
        so that one large chunk is still read and verified by all threads at once."""
        md = self.md
        ch = o.chunk
        src, fname, base, length = self._begin(o, self._stream)
        piece = min(self.scratch_bytes, PIECE)
        if not self.verify:
            groups: list[list[tuple[int, int, int, int]]] = [[]]
            size = 0
            for run in zip(o.src.tolist(), o.dst.tolist(), o.nbytes.tolist(), o.req.tolist()):
                if size >= piece:
                    groups.append([])
                    size = 0
                groups[-1].append(run)
                size += run[2]

            def plain(group: list[tuple[int, int, int, int]]) -> None:
                for s, d, n, r in group:
                    src.read_into(memoryview(dests[r])[d : d + n], base + s, fname)
                self.stats.add(bytes_read=sum(g[2] for g in group), reads=len(group))

            return [partial(plain, g) for g in groups if g]
        # the table is read by the first of the chunk's tasks to run, on a reader thread: the
        # tables of the chunks in flight are fetched in parallel (on an object store each is a
        # round trip)
        table = self._table(ch, self._stream)
        B = md.block_bytes
        if len(o.src) == 1 and o.src[0] == 0 and o.nbytes[0] == length:
            # whole chunk into one contiguous destination: read in place, verify there
            view = memoryview(dests[int(o.req[0])])[int(o.dst[0]) : int(o.dst[0]) + length]

            def direct(a: int) -> None:
                part = view[a : a + piece]
                src.read_into(part, base + a, fname)
                self._check_in_place(ch, part, a // B, table.get())

            return [partial(direct, a) for a in range(0, length, piece)]
        g = _Groups(md, o, piece, self.max_amplification)

        def run_group(g0: int, g1: int) -> None:
            buf = self.scratch(g.size(g0, g1))
            g.read(g0, g1, buf, src, base, fname)
            g.place(self, g0, g1, buf, table.get(), dests)

        return [partial(run_group, g0, g1) for g0, g1 in g.bounds]

    def _verify_pieces(
        self,
        ch: int,
        buf: memoryview,
        lo: np.ndarray,
        hi: np.ndarray,
        pos: np.ndarray,
        expect: np.ndarray,
    ) -> int:
        """Verify pieces laid back to back in ``buf``: one CRC over all of them against the
        combination of their blocks' CRCs (every block but the very last is whole: pieces are
        whole blocks, and only the chunk's last block may be short); piece by piece on a
        mismatch, to name the corrupt block."""
        B = self.md.block_bytes
        b0 = lo // B
        nb = -(-(hi - lo) // B)
        total = int(pos[-1])
        if int(nb.sum()) >= 8:
            blocks = np.arange(int(nb.sum())) - np.repeat(np.cumsum(nb) - nb, nb) + np.repeat(b0, nb)
            if crc32c.crc32c(buf[:total], 0, 1) == combine_blocks(expect[blocks], B, total):
                return int(nb.sum())
        count = 0
        for a, s, e in zip(b0.tolist(), pos[:-1].tolist(), pos[1:].tolist()):
            count += check_blocks(self.md, ch, buf[s:e], a, expect)
        return count


def coalesce(spans: np.ndarray, block: int, budget: float) -> np.ndarray:
    """Join block spans across the smallest gaps while the bytes read stay within ``budget``:
    fewer, larger reads for the same amplification limit (``max_amplification`` × needed)."""
    if len(spans) < 2:
        return spans
    total = int(((spans[:, 1] - spans[:, 0]) * block).sum())
    gaps = (spans[1:, 0] - spans[:-1, 1]) * block
    order = np.argsort(gaps, kind="stable")
    fill = int(np.searchsorted(np.cumsum(gaps[order]), budget - total, side="right"))
    if fill == 0:
        return spans
    join = np.zeros(len(gaps), bool)
    join[order[:fill]] = True
    starts = spans[np.concatenate([[True], ~join]), 0]
    ends = spans[np.concatenate([~join, [True]]), 1]
    return np.stack([starts, ends], axis=1)


def copy_at(buf: np.ndarray, sa: np.ndarray, n: np.ndarray, da: np.ndarray, req: np.ndarray, dests: list) -> None:
    """Copy ``n[i]`` bytes from ``buf[sa[i]:]`` to ``dests[req[i]][da[i]:]``: one strided numpy
    copy when the runs are evenly spaced on both sides (the resharding common case)."""
    k = len(n)
    if k == 0:
        return
    if k > 2 and (req == req[0]).all() and (n == n[0]).all():
        ss, ds = np.diff(sa), np.diff(da)
        if (ss == ss[0]).all() and (ds == ds[0]).all() and ss[0] >= n[0] and ds[0] >= n[0]:
            L = int(n[0])
            view_src = np.lib.stride_tricks.as_strided(
                buf[int(sa[0]) :], shape=(k, L), strides=(int(ss[0]), 1), writeable=False
            )
            out = dests[int(req[0])]
            view_dst = np.lib.stride_tricks.as_strided(out[int(da[0]) :], shape=(k, L), strides=(int(ds[0]), 1))
            view_dst[...] = view_src
            return
    for s0, d0, n0, r0 in zip(sa.tolist(), da.tolist(), n.tolist(), req.tolist()):
        dests[r0][d0 : d0 + n0] = buf[s0 : s0 + n0]


def read_requests(
    directory: Path,
    md: Metadata,
    requests: list[Request],
    *,
    verify: bool = True,
    read_buffer: int = DEFAULT_READ_BUFFER,
    threads: int = 4,
    planner: ReadPlanner | None = None,
    max_amplification: float = 1.1,
    storage: Storage | None = None,
) -> ReadStats:
    t0 = time.perf_counter()
    planner = planner or ReadPlanner(md)
    # the runs a batch expands cost about 300 B each while it is consumed: a budget of one run per
    # 4 KiB of read buffer keeps a batch within about 7 % of it
    ops = planner.plan(requests, run_budget=max(4096, read_buffer // 4096))
    plan_s = time.perf_counter() - t0
    ex = ChunkReader(
        directory,
        md,
        verify=verify,
        read_buffer=read_buffer,
        threads=threads,
        max_amplification=max_amplification,
        storage=storage,
    )
    stats = ex.run(ops, [r.dest for r in requests])
    stats.plan_seconds = plan_s
    return stats
