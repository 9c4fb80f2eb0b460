"""``goodput bench ckpt``: durable save and load throughput against baselines on the same disk.

One run, one directory, ``R`` real rank processes (fresh processes from a forkserver that imported torch once, gloo over a ``file://`` rendezvous).
The state is a dict of 2-D fp32/bf16 tensors totalling ``--size`` bytes; rank ``r`` holds rows
``[r*rows/R, (r+1)*rows/R)`` of each. Each phase runs in fresh rank processes (so a phase's peak
memory is its own) and is timed from a barrier before to a barrier after, max over ranks:

* raw: each rank writes its shard bytes sequentially to one file and fsyncs it; then reads that
  file back with plain ``readinto`` calls into one preallocated, touched buffer (the floor any
  checkpoint format pays: no per-tensor reads, no copies); and, for reference, the same bytes
  written with O_DIRECT from a page-aligned buffer (the device's ceiling);
* ``torch.save`` of each rank's shards + fsync (and ``torch.load`` of them, for reference);
* DCP (``torch.distributed.checkpoint``) save and load of DTensors, and a resharded load;
* ours: ``goodput.ckpt.save`` / ``load`` with ``LocalShard`` row boxes, and a resharded load
  into column boxes (``Shard(1)``).

Every timed repeat starts from the same state, whatever ran before it (:func:`cold_start`): the
previous phase's dirty pages are written back and waited for (``sync``, then until the kernel
reports no dirty or writeback pages), a ballast file as large as the state is read, and the page
cache is dropped (``echo 1 > /proc/sys/vm/drop_caches`` where allowed, else fsync +
``posix_fadvise(DONTNEED)`` of every file in the directory). The ballast is there because on a
VM whose free memory is handed back to the host (virtio-balloon free page reporting), a cold read
or a buffered write runs several times faster right after a drop that freed a cache of its size
than after one that freed nothing (the previous phase wrote with O_DIRECT): without it the order
of phases decided the baselines. Save repeats write into an emptied directory, the first one of
every round included. With ``rounds > 1`` the order of the systems (raw, torch, DCP, goodput) is
reversed in every other round, so that drift falls on both sides of each ratio alike.

Peak memory is the rank's peak RSS during the phase minus its RSS when the phase starts (state
or destination already allocated and touched): Linux's ``VmHWM`` reset through
``/proc/self/clear_refs``, or ``ru_maxrss`` where that reset is unavailable. Every load is checked
element by element against the pattern that was saved (outside the timed region).
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from goodput.demo.localdist import run_ranks
from goodput.plan.units import fmt_bytes

GB = 1e9

GOALS = (
    # (key, description, ours phase, baseline phase, target ratio of throughputs)
    ("save_vs_raw_write", "save ≥ 0.9 × raw durable write", "ours_save", "raw_write", 0.9),
    ("save_vs_dcp_save", "save ≥ 1.3 × DCP save", "ours_save", "dcp_save", 1.3),
    ("load_vs_raw_read", "load ≥ 0.9 × raw read", "ours_load", "raw_read", 0.9),
)

# (phase, label) in the order they run in even rounds; each system's phases stay together (a
# load reads what its save wrote) and odd rounds run the systems in reverse (:func:`phase_order`)
PHASES: list[tuple[str, str]] = [
    ("raw_write", "raw write + fsync"),
    ("raw_write_direct", "raw write O_DIRECT + fsync"),
    ("raw_read", "raw read (readinto one buffer)"),
    ("torch_save", "torch.save + fsync"),
    ("torch_load", "torch.load"),
    ("dcp_save", "DCP save"),
    ("dcp_load", "DCP load"),
    ("dcp_reshard_load", "DCP load, resharded rows→cols"),
    ("ours_save", "goodput save"),
    ("ours_save_one_file", "goodput save, files_per_rank=1"),
    ("ours_load", "goodput load"),
    ("ours_reshard_load", "goodput load, resharded rows→cols"),
    ("ours_reshard_load_amp2", "goodput load, resharded, max_amplification=2"),
]
SYSTEMS = ("raw", "torch", "dcp", "ours")


def phase_order(round_index: int) -> list[str]:
    """The phases of one round: the systems in order in even rounds, reversed in odd ones, so
    that over an even number of rounds each goal's two phases run first equally often."""
    systems = SYSTEMS if round_index % 2 == 0 else SYSTEMS[::-1]
    return [name for sys_ in systems for name, _ in PHASES if name.split("_", 1)[0] == sys_]


BASELINES = {
    "ours_save": ("raw_write", "dcp_save"),
    "ours_save_one_file": ("raw_write", "dcp_save"),
    "ours_load": ("raw_read", "dcp_load"),
    "ours_reshard_load": ("raw_read", "dcp_reshard_load"),
    "ours_reshard_load_amp2": ("raw_read", "dcp_reshard_load"),
}


# --------------------------------------------------------------------------- the state


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # "float32" | "bfloat16"
    rows: int
    cols: int
    k: int  # pattern seed

    @property
    def itemsize(self) -> int:
        return 4 if self.dtype == "float32" else 2

    @property
    def nbytes(self) -> int:
        return self.rows * self.cols * self.itemsize


def make_layout(total: int, ranks: int, ntensors: int = 8) -> list[TensorSpec]:
    """``ntensors`` 2-D tensors, fp32 and bf16 alternating, of about ``total`` bytes in all;
    rows and columns divisible by ``ranks`` so row and column shards are even."""
    cols = max(ranks, 4096 // ranks * ranks)
    per = total // ntensors
    specs = []
    for k in range(ntensors):
        dt = "float32" if k % 2 == 0 else "bfloat16"
        item = 4 if dt == "float32" else 2
        rows = max(ranks, per // (item * cols) // ranks * ranks)
        specs.append(TensorSpec(f"model.layers.{k}.weight", dt, rows, cols, k))
    return specs


def _box(spec: TensorSpec, rank: int, world: int, layout: str) -> tuple[int, int, int, int]:
    """(row0, col0, rows, cols) of this rank's shard: ``rows`` = Shard(0), ``cols`` = Shard(1)."""
    if layout == "rows":
        n = spec.rows // world
        return rank * n, 0, n, spec.cols
    n = spec.cols // world
    return 0, rank * n, spec.rows, n


def _pattern(spec: TensorSpec, r0: int, c0: int, rows: int, cols: int) -> Any:
    """Values of the box: ``(131 i + 7 j + 13 k) mod 251``, exact in fp32 and bf16."""
    import torch

    ri = (torch.arange(r0, r0 + rows, dtype=torch.int32) * 131 + spec.k * 13) % 251
    cj = (torch.arange(c0, c0 + cols, dtype=torch.int32) * 7) % 251
    return ((ri[:, None] + cj[None, :]) % 251).to(getattr(torch, spec.dtype))


def _row_blocks(rows: int, cols: int) -> list[tuple[int, int]]:
    step = max(1, (4 << 20) // max(cols, 1))
    return [(a, min(rows, a + step)) for a in range(0, rows, step)]


def _local(spec: TensorSpec, rank: int, world: int, layout: str, fill: bool) -> tuple[Any, int, int]:
    """This rank's shard, its pages touched: the pattern when ``fill``, else zeros."""
    import torch

    r0, c0, n, m = _box(spec, rank, world, layout)
    t = torch.empty((n, m), dtype=getattr(torch, spec.dtype))
    if fill:
        for a, b in _row_blocks(n, m):
            t[a:b] = _pattern(spec, r0 + a, c0, b - a, m)
    else:
        t.zero_()
    return t, r0, c0


def _check(spec: TensorSpec, t: Any, r0: int, c0: int) -> bool:
    import torch

    n, m = t.shape
    return all(torch.equal(t[a:b], _pattern(spec, r0 + a, c0, b - a, m)) for a, b in _row_blocks(n, m))


def _bytes_of(t: Any) -> memoryview:
    import torch

    return memoryview(t.reshape(-1).view(torch.uint8).numpy())


# --------------------------------------------------------------------------- measurement


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def current_rss() -> int:
    rss = _status_kib("VmRSS")
    if rss is None:
        import psutil

        rss = psutil.Process().memory_info().rss
    return rss


class PeakMemory:
    """Peak RSS of this process over a span, minus its RSS when the span began."""

    def start(self) -> None:
        self.base = current_rss()
        self.method = "ru_maxrss"
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # reset the RSS high-water mark (Linux >= 4.0)
            if _status_kib("VmHWM") is not None:
                self.method = "VmHWM"
        except OSError:
            pass

    def delta(self) -> int:
        if self.method == "VmHWM":
            peak = _status_kib("VmHWM") or 0
        else:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return max(0, peak - self.base)


def dirty_bytes() -> int | None:
    """Bytes of the page cache the kernel still has to write: ``Dirty`` + ``Writeback`` of
    ``/proc/meminfo`` (machine-wide); None where there is no such file."""
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        return (int(fields["Dirty"].split()[0]) + int(fields["Writeback"].split()[0])) * 1024
    except (OSError, KeyError, ValueError):
        return None


def flush_writeback(threshold: int = 32 << 20, timeout: float = 20.0) -> dict:
    """Write back every dirty page and wait until the kernel has (almost) none left, so that a
    phase never pays for the previous one's writes: ``sync`` again until ``Dirty`` + ``Writeback``
    is at most ``threshold`` (others' processes may keep dirtying pages on a shared machine) or
    ``timeout`` seconds have passed; says what it saw."""
    t0 = time.perf_counter()
    before = dirty_bytes()
    os.sync()
    after = dirty_bytes()
    while after is not None and after > threshold and time.perf_counter() - t0 < timeout:
        time.sleep(0.05)
        os.sync()
        after = dirty_bytes()
    return {
        "dirty_before": before,
        "dirty_after": after,
        "flush_s": time.perf_counter() - t0,
        "flushed": after is None or after <= threshold,
    }


def drop_caches(directory: Path) -> str:
    """Evict cached file pages so that the next read comes from storage; says how. Dirty pages
    cannot be dropped: call :func:`flush_writeback` first."""
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
        return "drop_caches"
    except OSError:
        pass
    if not hasattr(os, "posix_fadvise"):
        return "none"
    for p in sorted(Path(directory).rglob("*")):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
    return "fadvise"


BALLAST = "ballast.bin"


def make_ballast(directory: Path, nbytes: int) -> Path:
    """A file of ``nbytes`` that :func:`cold_start` reads before each drop (see there)."""
    path = Path(directory) / BALLAST
    block = b"\x5a" * (8 << 20)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        left = nbytes
        while left > 0:
            _write_all(fd, memoryview(block)[: min(left, len(block))])
            left -= min(left, len(block))
        os.fsync(fd)
    finally:
        os.close(fd)
    return path


def read_ballast(path: Path) -> int:
    """Read the ballast through the page cache (into a small reused buffer); returns its bytes."""
    buf = bytearray(8 << 20)
    mv = memoryview(buf)
    n = 0
    with open(path, "rb", buffering=0) as f:
        while got := f.readinto(mv):
            n += got
    return n


def cold_start(directory: Path, ballast: Path | None = None) -> dict:
    """Bring the machine to the state every timed repeat starts from, whatever ran before it.

    1. The previous phase's dirty pages are written back and waited for (:func:`flush_writeback`;
       ``drop_caches`` leaves dirty pages behind, and the next phase would pay for writing them).
    2. The ballast (as large as the state) is read, so that the drop below frees a cache of that
       size. On a VM that hands free memory back to its host (virtio-balloon free page reporting,
       about two seconds after it is freed), cold reads and buffered writes run several times
       faster right after a drop that freed a cache of their size than after one that freed
       nothing; without the ballast a phase that follows an O_DIRECT phase (which caches nothing)
       ran in the slow state and one that follows a buffered phase in the fast one
       (docs/BENCHMARKS.md). On bare metal the ballast changes nothing.
    3. The page cache is dropped (:func:`drop_caches`), so reads come from storage."""
    rec = flush_writeback()
    rec["ballast_bytes"] = read_ballast(ballast) if ballast is not None and ballast.exists() else 0
    rec["drop"] = drop_caches(directory)
    return rec


def page_reported_kib() -> int | None:
    """KiB of free memory handed back to the host so far, where the kernel counts it (some VM
    kernels' ``page_reporting`` module does); None elsewhere."""
    try:
        with open("/sys/module/page_reporting/parameters/reported_kib") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def _timed(rank: int, root: Path, body: Callable[[], dict], profile: str | None, ballast: Path | None) -> dict:
    import torch.distributed as dist

    dist.barrier()
    cold = cold_start(root, ballast) if rank == 0 else None
    dist.barrier()
    mem = PeakMemory()
    mem.start()
    prof = None
    if profile:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    reported0 = page_reported_kib()
    t0 = time.perf_counter()
    extra = body() or {}
    if prof is not None:
        prof.disable()
    dist.barrier()
    seconds = time.perf_counter() - t0
    reported1 = page_reported_kib()
    peak = mem.delta()
    if prof is not None:
        prof.dump_stats(profile.format(rank=rank))
    return {
        "seconds": seconds,
        "peak_delta": peak,
        "base_rss": mem.base,
        "drop": cold["drop"] if cold else None,
        "cold_start": cold,
        "reported_kib_during": None if reported0 is None or reported1 is None else reported1 - reported0,
        "mem_method": mem.method,
        **extra,
    }


# --------------------------------------------------------------------------- phases (in ranks)


def _write_all(fd: int, mv: memoryview) -> None:
    while len(mv):
        mv = mv[os.write(fd, mv) :]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# Each phase's setup runs untimed in the rank and returns (body, reset, check): ``body`` is the
# timed part (it may return extra numbers), ``reset`` runs untimed between repeats (zeroing the
# destinations, so each load must really fill them), ``check`` verifies what was loaded.


def _fresh(rank, d: Path):
    """Reset for save phases: every repeat writes into an emptied directory, as a job writes each
    checkpoint to a new step directory. Without it, DCP and torch.save overwrite their files in
    place (reusing the pages just freed) while goodput, which never overwrites a committed
    checkpoint, writes new files beside the old ones: on a RAM-backed file system that measured
    first-touch page allocation, not the writers. Rank 0 empties it; the barrier that opens each
    timed repeat keeps the others out until it is done."""

    def reset():
        if rank == 0:
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir(parents=True, exist_ok=True)

    return reset


def _raw_write(rank, world, specs, root):
    state = [_local(s, rank, world, "rows", True)[0] for s in specs]
    d = root / "raw"
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"raw-r{rank:05d}.bin"

    def body():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            for t in state:
                _write_all(fd, _bytes_of(t))
            os.fsync(fd)
        finally:
            os.close(fd)
        _fsync_dir(d)

    return body, _fresh(rank, d), None


def _raw_write_direct(rank, world, specs, root):
    """The device's durable-write ceiling: the same bytes from one page-aligned buffer (filled
    before the clock starts) in 32 MiB O_DIRECT writes, no page cache. Not a goal's baseline (the
    issue's raw write is the plain one); printed so that a reader sees how close to the device
    each writer gets. Buffered where the file system refuses O_DIRECT (tmpfs)."""
    import mmap

    state = [_local(s, rank, world, "rows", True)[0] for s in specs]
    n = sum(len(_bytes_of(t)) for t in state)
    buf = mmap.mmap(-1, max(4096, -(-n // 4096) * 4096))
    mv = memoryview(buf)
    at = 0
    for t in state:
        b = _bytes_of(t)
        mv[at : at + len(b)] = b
        at += len(b)
    del state
    d = root / "rawd"
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"raw-r{rank:05d}.bin"

    def body():
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        try:
            fd = os.open(path, flags | getattr(os, "O_DIRECT", 0), 0o644)
            direct = hasattr(os, "O_DIRECT")
        except OSError:
            fd, direct = os.open(path, flags, 0o644), False
        try:
            whole = len(mv) if direct else n  # direct writes whole pages; the tail is trimmed
            for a in range(0, whole, 32 << 20):
                _write_all(fd, mv[a : min(whole, a + (32 << 20))])
            if direct:
                os.ftruncate(fd, n)
            os.fsync(fd)
        except OSError as e:  # EINVAL: the file system refuses O_DIRECT
            os.close(fd)
            if not direct or e.errno != 22:
                raise
            fd, direct = os.open(path, flags, 0o644), False
            _write_all(fd, mv[:n])
            os.fsync(fd)
        finally:
            with contextlib.suppress(OSError):
                os.close(fd)
        _fsync_dir(d)
        return {"timings": {"o_direct": float(direct)}}

    return body, _fresh(rank, d), None


def raw_read_into(path: Path, buf: memoryview) -> int:
    """The plain read every format is measured against: the whole file, in order, with
    ``readinto`` straight into one caller-owned buffer (no per-tensor reads, no copies, no
    threads); returns the number of ``readinto`` calls. A file shorter than the buffer is an
    error naming it."""
    mv = memoryview(buf).cast("B")
    calls = off = 0
    with open(path, "rb", buffering=0) as f:
        while off < len(mv):
            got = f.readinto(mv[off:])
            calls += 1
            if not got:
                raise OSError(f"{path} ends early at byte {off} of {len(mv)}")
            off += got
    return calls


def _raw_read(rank, world, specs, root):
    """Reads this rank's raw file into one buffer of its size, allocated and touched before the
    clock starts; checked afterwards by viewing the buffer as the rank's tensors."""
    import numpy as np
    import torch

    boxes = [_box(s, rank, world, "rows") for s in specs]
    sizes = [n * m * s.itemsize for s, (_, _, n, m) in zip(specs, boxes)]
    buf = np.empty(sum(sizes), np.uint8)
    buf.fill(0)  # every page touched, as the targets of a load are (np.zeros would map them lazily)
    path = root / "raw" / f"raw-r{rank:05d}.bin"

    def body():
        return {"timings": {"readinto_calls": float(raw_read_into(path, memoryview(buf)))}}

    def reset():
        buf.fill(0)

    def check():
        at, ok = 0, True
        t = torch.from_numpy(buf)
        for s, (r0, c0, n, m), size in zip(specs, boxes, sizes):
            ok = ok and _check(s, t[at : at + size].view(getattr(torch, s.dtype)).view(n, m), r0, c0)
            at += size
        return ok

    return body, reset, check


def _torch_save(rank, world, specs, root):
    import torch

    state = {s.name: _local(s, rank, world, "rows", True)[0] for s in specs}
    d = root / "torch"
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"shard-r{rank:05d}.pt"

    def body():
        with open(path, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(d)

    return body, _fresh(rank, d), None


def _torch_load(rank, world, specs, root):
    import torch

    path = root / "torch" / f"shard-r{rank:05d}.pt"
    got: dict = {}

    def body():
        got.update(torch.load(path, weights_only=True))

    def check():
        return all(_check(s, got[s.name], *_box(s, rank, world, "rows")[:2]) for s in specs)

    return body, got.clear, check


def _dtensors(specs, rank, world, layout, fill):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    mesh = init_device_mesh("cpu", (world,))
    placement = [Shard(0 if layout == "rows" else 1)]
    locs = {s.name: _local(s, rank, world, layout, fill) for s in specs}
    sd = {n: DTensor.from_local(t, mesh, placement, run_check=False) for n, (t, _, _) in locs.items()}
    return sd, locs


def _zero(locs):
    def reset():
        for t, _, _ in locs.values():
            t.zero_()

    return reset


def _checker(specs, locs):
    def check():
        return all(_check(s, *locs[s.name]) for s in specs)

    return check


def _dcp_save(rank, world, specs, root):
    import torch.distributed.checkpoint as dcp

    sd, _ = _dtensors(specs, rank, world, "rows", True)
    path = str(root / "dcp")

    def body():
        dcp.save(sd, storage_writer=dcp.FileSystemWriter(path, sync_files=True))

    return body, _fresh(rank, Path(path)), None


def _dcp_load_any(rank, world, specs, root, layout):
    import torch.distributed.checkpoint as dcp

    sd, locs = _dtensors(specs, rank, world, layout, False)
    path = str(root / "dcp")

    def body():
        dcp.load(sd, storage_reader=dcp.FileSystemReader(path))

    return body, _zero(locs), _checker(specs, locs)


def _dcp_load(rank, world, specs, root):
    return _dcp_load_any(rank, world, specs, root, "rows")


def _dcp_reshard_load(rank, world, specs, root):
    return _dcp_load_any(rank, world, specs, root, "cols")


def _ours_state(specs, rank, world, layout, fill):
    from goodput.ckpt import LocalShard

    locs = {s.name: _local(s, rank, world, layout, fill) for s in specs}
    sd = {s.name: LocalShard(locs[s.name][0], (s.rows, s.cols), locs[s.name][1:]) for s in specs}
    return sd, locs


def _ours_save(rank, world, specs, root, sub="ours", files=None):
    from goodput.ckpt.saving.saver import save  # imported before the clock starts

    sd, _ = _ours_state(specs, rank, world, "rows", True)

    def body():
        return {"timings": save(sd, root / sub, step=1, files_per_rank=files).timings}

    return body, _fresh(rank, root / sub), None


def _ours_save_one_file(rank, world, specs, root):
    """The save with one data file per rank, against the default (two from 256 MiB a rank)."""
    return _ours_save(rank, world, specs, root, "ours1", 1)


def _ours_load_any(rank, world, specs, root, layout, amplification=1.1):
    from goodput.ckpt.loading.loader import load

    sd, locs = _ours_state(specs, rank, world, layout, False)

    def body():
        r = load(sd, root / "ours", max_amplification=amplification)
        return {"timings": {**r.timings, **r.stats.as_dict()}}

    return body, _zero(locs), _checker(specs, locs)


def _ours_load(rank, world, specs, root):
    return _ours_load_any(rank, world, specs, root, "rows")


def _ours_reshard_load(rank, world, specs, root):
    return _ours_load_any(rank, world, specs, root, "cols")


def _ours_reshard_load_amp2(rank, world, specs, root):
    """The same load allowed to read up to 2 × the bytes it needs (as DCP reads whole chunks):
    fewer, larger reads, where the default (1.1 ×) makes one small read per needed run."""
    return _ours_load_any(rank, world, specs, root, "cols", 2.0)


_SETUP = {
    "raw_write": _raw_write,
    "raw_write_direct": _raw_write_direct,
    "raw_read": _raw_read,
    "torch_save": _torch_save,
    "torch_load": _torch_load,
    "dcp_save": _dcp_save,
    "dcp_load": _dcp_load,
    "dcp_reshard_load": _dcp_reshard_load,
    "ours_save": _ours_save,
    "ours_save_one_file": _ours_save_one_file,
    "ours_load": _ours_load,
    "ours_reshard_load": _ours_reshard_load,
    "ours_reshard_load_amp2": _ours_reshard_load_amp2,
}


def _phase(
    rank: int,
    world: int,
    phase: str,
    specs: list[dict],
    root: str,
    repeat: int,
    profile: str | None,
    ballast: str | None = None,
) -> dict:
    body, reset, check = _SETUP[phase](rank, world, [TensorSpec(**s) for s in specs], Path(root))
    runs = []
    for i in range(repeat):
        if reset is not None:  # the first repeat too: a round's save must not overwrite the last round's files
            reset()
        last = i == repeat - 1
        prof = profile if last and phase.startswith("ours") else None
        runs.append(_timed(rank, Path(root), body, prof, Path(ballast) if ballast else None))
    out: dict[str, Any] = {"runs": runs}
    if check is not None:
        out["verified"] = bool(check())
    return out


# --------------------------------------------------------------------------- driver


def _summarize(label: str, total: int, per_rank: list[dict]) -> dict:
    """A phase's time is the median over repeats of (max over ranks of barrier-to-barrier)."""
    import statistics

    reps = len(per_rank[0]["runs"])
    rep_secs = [max(r["runs"][i]["seconds"] for r in per_rank) for i in range(reps)]
    secs = statistics.median(rep_secs)
    peaks = [max(run["peak_delta"] for run in r["runs"]) for r in per_rank]
    ph: dict[str, Any] = {
        "label": label,
        "seconds": secs,
        "gbps": total / secs / GB,
        "seconds_per_repeat": rep_secs,
        "gbps_best": total / min(rep_secs) / GB,
        "gbps_worst": total / max(rep_secs) / GB,
        "peak_rss_delta_bytes": max(peaks),
        "peak_rss_delta_per_rank": peaks,
        "rss_at_start_per_rank": [r["runs"][0]["base_rss"] for r in per_rank],
        "cache_drop": per_rank[0]["runs"][0]["drop"],
        "memory_method": per_rank[0]["runs"][0]["mem_method"],
        # rank 0 brought each repeat to its starting state: what it found and did
        "cold_start_per_repeat": [run["cold_start"] for run in per_rank[0]["runs"]],
        "reported_kib_during_per_repeat": [run["reported_kib_during"] for run in per_rank[0]["runs"]],
    }
    if "verified" in per_rank[0]:
        ph["verified"] = all(r["verified"] for r in per_rank)
    if "timings" in per_rank[0]["runs"][-1]:
        ph["timings_last_repeat_per_rank"] = [r["runs"][-1]["timings"] for r in per_rank]
    return ph


def run(
    size: int,
    ranks: int,
    directory: str | None = None,
    *,
    ntensors: int = 8,
    repeat: int = 3,
    rounds: int = 1,
    keep: bool = False,
    profile_dir: str | None = None,
    on_phase: Callable[[int, int, str], None] | None = None,
    ballast: bool = True,
) -> dict:
    """Run every phase; returns all the numbers (what ``--json`` prints).

    With ``rounds > 1`` the whole sequence of phases runs that many times, one after the other,
    the systems in reverse order in every other round (:func:`phase_order`: use an even number
    of rounds for a balanced order), so that a drift in the storage's speed (shared disks, a VM's
    burst credits) falls on every writer alike. Each phase's time is then the median over all its
    repeats of all rounds, and each goal is judged on the median over rounds of that round's
    ratio (ours and its baseline measured minutes apart, not a quarter of an hour), with the
    lowest and highest round as its spread. ``ballast=False`` skips the ballast read before each
    drop (:func:`cold_start`)."""
    if ranks < 1:
        raise ValueError("--ranks must be at least 1")
    if repeat < 1:
        raise ValueError("--repeat must be at least 1")
    if rounds < 1:
        raise ValueError("--rounds must be at least 1")
    specs = make_layout(size, ranks, ntensors)
    total = sum(s.nbytes for s in specs)
    base = Path(directory) if directory else Path(tempfile.gettempdir())
    base.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="goodput-bench-ckpt-", dir=base))
    profile = None
    if profile_dir:
        Path(profile_dir).mkdir(parents=True, exist_ok=True)
        profile = str(Path(profile_dir).resolve()) + "/{phase}-r{{rank}}.pstats"
    phases: dict[str, dict] = {}
    by_round: list[dict[str, dict]] = []
    steps = len(PHASES) * rounds
    labels = dict(PHASES)
    orders: list[list[str]] = []
    try:
        ballast_path = str(make_ballast(root, total)) if ballast else None
        merged: dict[str, list[dict]] = {}
        for rnd in range(rounds):
            this: dict[str, dict] = {}
            orders.append(phase_order(rnd))
            for i, name in enumerate(orders[-1]):
                label = labels[name]
                if on_phase:
                    on_phase(rnd * len(PHASES) + i, steps, label if rounds == 1 else f"round {rnd + 1}: {label}")
                prof = profile.format(phase=name) if profile and rnd == rounds - 1 else None
                args = (name, [asdict(s) for s in specs], str(root), repeat, prof, ballast_path)
                per_rank = run_ranks(_phase, ranks, *args)
                this[name] = _summarize(label, total, per_rank)
                if name not in merged:
                    merged[name] = per_rank
                else:
                    for acc, r in zip(merged[name], per_rank):
                        acc["runs"] = acc["runs"] + r["runs"]
                        if "verified" in r:
                            acc["verified"] = acc["verified"] and r["verified"]
            by_round.append(this)
        for name, label in PHASES:
            phases[name] = _summarize(label, total, merged[name])
        if on_phase:
            on_phase(steps, steps, "done")
        disk = shutil.disk_usage(root)
        fs_bytes = {
            sub: sum(p.stat().st_size for p in (root / sub).rglob("*") if p.is_file())
            for sub in ("raw", "rawd", "torch", "dcp", "ours", "ours1")
        }
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)

    def ratio(a: str, b: str) -> float:
        return phases[a]["gbps"] / phases[b]["gbps"]

    def round_ratios(a: str, b: str) -> list[float]:
        return [rd[a]["gbps"] / rd[b]["gbps"] for rd in by_round]

    import statistics

    ratios = {}
    for ours, (raw, dcp) in BASELINES.items():
        ratios[f"{ours}_vs_{raw}"] = ratio(ours, raw)
        ratios[f"{ours}_vs_{dcp}"] = ratio(ours, dcp)
    ratios["ours_save_vs_raw_write_direct"] = ratio("ours_save", "raw_write_direct")
    goals = []
    for key, desc, ours, other, target in GOALS:
        per = round_ratios(ours, other)
        r = statistics.median(per) if rounds > 1 else ratio(ours, other)
        goals.append(
            {
                "key": key,
                "goal": desc,
                "ratio": r,
                "per_round": per,
                "spread": [min(per), max(per)],
                "target": target,
                "pass": r >= target,
            }
        )
    return {
        "config": {
            "size_bytes": total,
            "size_requested": size,
            "ranks": ranks,
            "repeat": repeat,
            "rounds": rounds,
            "tensors": [asdict(s) for s in specs],
            "directory": str(root),
            "kept": keep,
            "disk_free_bytes": disk.free,
            "cache_drop": phases["raw_read"]["cache_drop"],
            "ballast_bytes": total if ballast else 0,
            "order_per_round": orders,
            "memory_method": phases["raw_read"]["memory_method"],
            "files_bytes": fs_bytes,
        },
        "phases": phases,
        "ratios": ratios,
        "goals": goals,
        "all_verified": all(p.get("verified", True) for p in phases.values()),
        "pass": all(g["pass"] for g in goals),
    }


def render(res: dict, console: Any) -> None:
    from rich.table import Table

    cfg = res["config"]
    ph = res["phases"]
    console.print(
        f"[bold]goodput bench ckpt[/bold]: {fmt_bytes(cfg['size_bytes'])} ({cfg['size_bytes'] / GB:.3f} GB) "
        f"in {len(cfg['tensors'])} fp32/bf16 tensors, {cfg['ranks']} ranks (gloo), "
        f"dir {cfg['directory']}{' (kept)' if cfg['kept'] else ''}"
    )
    rounds = cfg.get("rounds", 1)
    console.print(
        "before every repeat: dirty pages written back and waited for, "
        + (f"a {fmt_bytes(cfg['ballast_bytes'])} ballast read, " if cfg.get("ballast_bytes") else "")
        + f"page cache dropped with [bold]{cfg['cache_drop']}[/bold]; "
        f"peak memory = peak RSS − RSS at phase start, per rank via {cfg['memory_method']}; "
        f"time = barrier to barrier, max over ranks, median of {cfg['repeat']} repeats"
        + (
            f" × {rounds} rounds, systems in reverse order in every other round "
            "(goals: median over rounds of each round's ratio, and its range)"
            if rounds > 1
            else ""
        )
        + "; GB = 1e9 B"
    )
    if rounds % 2:
        console.print(
            f"[yellow]{rounds} round{'s' if rounds > 1 else ''}: the order of phases favours one side; "
            "use an even --rounds[/yellow]"
        )
    unflushed = [c for p in ph.values() for c in p.get("cold_start_per_repeat", []) if c and not c["flushed"]]
    if unflushed:
        worst = max(c["dirty_after"] or 0 for c in unflushed)
        console.print(
            f"[yellow]dirty pages stayed above the threshold before some repeats (up to {fmt_bytes(worst)}): "
            "another process was writing[/yellow]"
        )
    t = Table(title="checkpoint throughput")
    t.add_column("phase")
    t.add_column("seconds", justify="right")
    t.add_column("GB/s", justify="right")
    t.add_column("range GB/s", justify="right")
    t.add_column("peak mem Δ (max rank)", justify="right")
    t.add_column("ours/raw", justify="right")
    t.add_column("ours/DCP", justify="right")
    t.add_column("data ok", justify="center")
    for name, _ in PHASES:
        p = ph[name]
        vs_raw = vs_dcp = ""
        if name in BASELINES:
            raw, dcp = BASELINES[name]
            vs_raw = f"{res['ratios'][f'{name}_vs_{raw}']:.2f}×"
            vs_dcp = f"{res['ratios'][f'{name}_vs_{dcp}']:.2f}×"
        ok = {True: "[green]yes[/green]", False: "[red]NO[/red]"}.get(p.get("verified"), "")
        style = "bold" if name.startswith("ours") else None
        t.add_row(
            p["label"],
            f"{p['seconds']:.3f}",
            f"{p['gbps']:.3f}",
            f"{p['gbps_worst']:.2f}–{p['gbps_best']:.2f}",
            fmt_bytes(p["peak_rss_delta_bytes"]),
            vs_raw,
            vs_dcp,
            ok,
            style=style,
        )
    console.print(t)
    console.print(
        f"the device's durable-write ceiling here (raw O_DIRECT write): {ph['raw_write_direct']['gbps']:.3f} GB/s; "
        f"goodput save = {res['ratios']['ours_save_vs_raw_write_direct']:.2f}× that (not a goal: the plain raw "
        "write is the goals' baseline)"
    )
    g = Table(title="goals (ratios of throughput, same run, same directory)")
    g.add_column("goal")
    g.add_column("measured", justify="right")
    g.add_column("target", justify="right")
    g.add_column("result", justify="center")
    multi = rounds > 1
    if multi:
        g.add_column("range over rounds", justify="right")
        g.add_column("per round", justify="right")
    for x in res["goals"]:
        verdict = "[green]PASS[/green]" if x["pass"] else "[red]MISS[/red]"
        lo, hi = x["spread"]
        extra = [f"{lo:.2f}–{hi:.2f}", " ".join(f"{v:.2f}" for v in x["per_round"])] if multi else []
        g.add_row(x["goal"], f"{x['ratio']:.2f}×", f"≥ {x['target']}×", verdict, *extra)
    console.print(g)
    if not res["all_verified"]:
        console.print("[red]some loaded data differs from what was saved[/red]")
