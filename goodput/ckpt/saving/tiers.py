"""Storage tiers: a fast tier that commits first and drains to a durable one.

The checkpoint burst is tens of GB/s; a parallel file system or an object store takes it at a
fraction of that. A tiered :class:`~goodput.ckpt.Checkpointer` writes each rank's data files to a
fast directory (NVMe, ``/dev/shm``; it may be node-local, a different directory on every node)
and commits there first: a restart on the same nodes restores from it at once. A drain thread on
every rank then copies that rank's files to the durable tier at a bounded rate, and the durable
commit follows once every rank has drained.

The ranks never talk through the fast tier (another node's fast directory cannot be seen). They
talk through the step's durable directory, which every rank sees:

1. the save (:mod:`goodput.ckpt.saving.background`): done files there; rank 0 writes the metadata and a
   *staged* manifest there (``.goodput-<save_id>.staged``); every rank copies both into its own
   fast directory, the staged manifest as ``MANIFEST.json``: **the fast commit on that node**;
2. the drain (:class:`Drainer`): each rank copies the data files it wrote, fsyncs, and drops
   ``.goodput-<save_id>-r<rank>.drained``; rank 0 waits for every rank's, then publishes the
   staged manifest as the durable ``MANIFEST.json``: **the durable commit** (create-if-absent, as
   any first commit). A rank that cannot drain (its fast files are gone) writes the abort file
   instead, and the step stays fast-only.

The durable directory of an undrained step thus holds the metadata and the staged manifest, and
no ``MANIFEST.json``: a plain reader does not see it, and a tiered restore on replaced nodes
still finds the metadata there and takes every file it can from the tiers that hold it
(:class:`TierView`). Losing the fast tier costs exactly the steps not yet drained.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from ..errors import CheckpointError, StorageError, describe
from ..format.format import MANIFEST, MAX_MANIFEST_BYTES, STEP_DIR, decode_manifest, decode_metadata
from ..format.format import metadata_file_name as md_name
from ..loading.reader import DamagedCheckpoint, warn_damaged
from ..storage.base import Entry, Sink, Source, Storage
from ..storage.location import display, storage_for
from .background import POLL_S, abort_name
from .commit import previous_files, staged_name

log = logging.getLogger("goodput.ckpt")

COPY_BYTES = 8 << 20  # one read from the fast tier, one write to the durable one


def drained_name(save_id: str, rank: int) -> str:
    return f".goodput-{save_id}-r{rank:05d}.drained"


def _step_dirs(storage: Storage, root: Path, strict: bool = False) -> list[tuple[int, Path]]:
    """``strict``: a listing that fails raises :class:`StorageError` (only a missing root is empty)."""
    try:
        entries = storage.list(root)
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as e:
        if strict:
            raise e if isinstance(e, StorageError) else StorageError(f"{display(root)!r} cannot be listed: {e}") from e
        return []
    return [(int(m.group(1)), root / e.name) for e in entries if (m := STEP_DIR.match(e.name)) and e.kind == "dir"]


def fast_committed(root: Path) -> dict[int, tuple[str, bytes]]:
    """This rank's fast tier: step -> (save id, manifest bytes) of each committed checkpoint.

    The fast tier is a copy: a manifest there that cannot be read (damaged, a newer goodput's, a
    disk error) leaves its step to the durable tier, but never silently: a
    :class:`DamagedCheckpointWarning` names it and why (once per directory and reason)."""
    storage = storage_for(root)
    out: dict[int, tuple[str, bytes]] = {}
    for step, d in _step_dirs(storage, root):
        try:
            raw = storage.get_if_exists(d, MANIFEST, "manifest", MAX_MANIFEST_BYTES)
            if raw is not None:
                out[step] = (decode_manifest(raw, str(d / MANIFEST)).save_id, raw)
        except (FileNotFoundError, NotADirectoryError):
            continue  # removed meanwhile (retention, another rank of this node)
        except (OSError, CheckpointError) as e:
            reason = str(e) if isinstance(e, CheckpointError) else f"{type(e).__name__}: {e}"
            warn_damaged(DamagedCheckpoint(d, reason), "left to the durable tier", stacklevel=3)
    return out


def durable_state(root: Path, damaged: list[DamagedCheckpoint] | None = None) -> dict[int, tuple[str, bytes, bool]]:
    """The durable tier: step -> (save id, manifest bytes, durably committed) of each step that is
    committed there, or committed on the fast tier and not yet drained (a staged manifest).
    A storage failure raises :class:`StorageError`: it says nothing about what is there.

    A step directory whose ``MANIFEST.json`` is there but cannot be read (damaged, or written by
    a newer goodput) is left out with a :class:`DamagedCheckpointWarning` naming it and why, as
    :func:`~goodput.ckpt.latest` does, and added to ``damaged`` when given: a tiered restore must
    not take it for a step that was never saved (it refuses to resume before it, as an untiered
    one does)."""
    storage = storage_for(root)
    out: dict[int, tuple[str, bytes, bool]] = {}
    for step, d in _step_dirs(storage, root, strict=True):
        try:
            raw = storage.get_if_exists(d, MANIFEST, "manifest", MAX_MANIFEST_BYTES)
            if raw is not None:
                out[step] = (decode_manifest(raw, str(d / MANIFEST)).save_id, raw, True)
                continue
            names = [f.name for f in storage.list(d)]
        except StorageError:
            raise
        except (FileNotFoundError, NotADirectoryError):
            continue
        except CheckpointError as e:  # a MANIFEST.json that is there: a damaged checkpoint, said
            bad = DamagedCheckpoint(d, str(e))
            warn_damaged(bad, "skipped", stacklevel=3)
            if damaged is not None:
                damaged.append(bad)
            continue
        except OSError as e:
            raise StorageError(f"{display(d)!r} cannot be listed: {e}") from e
        newest = -1.0
        for name in names:
            if not (name.startswith(".goodput-") and name.endswith(".staged")):
                continue
            with contextlib.suppress(OSError, CheckpointError):  # one bad file hides only itself
                raw = storage.get(d, name, "staged manifest", MAX_MANIFEST_BYTES)
                man = decode_manifest(raw, str(d / name))
                if name == staged_name(man.save_id) and man.created > newest:
                    out[step], newest = (man.save_id, raw, False), man.created
    return out


class TierView(Storage):
    """One checkpoint, each file read from the fastest tier that holds it: this rank's fast
    directory where the file is there, else the durable directory. The manifest is the one the
    restore chose (both tiers hold the same bytes). The reader checks every file's size and every
    block's checksum as always, so a stale or damaged fast copy fails the load, and the restore
    then falls back to the durable tier alone."""

    def __init__(self, fast_dir: Path, durable_dir: Path, manifest: bytes, *, on_fast: bool = False):
        self.fast_dir, self.durable_dir = Path(fast_dir), Path(durable_dir)
        self.fast, self.durable = storage_for(self.fast_dir), storage_for(self.durable_dir)
        self.manifest = manifest
        # every rank holds the save on its fast tier (``on_fast``): the fast tier's parallelism,
        # since more threads than cores copying from memory cost their start-up and give nothing
        # (a file found missing there is still read from the durable tier, more slowly)
        self.read_threads = (
            self.fast.read_threads if on_fast else max(self.fast.read_threads, self.durable.read_threads)
        )
        self.bytes_from: dict[str, int] = {"fast": 0, "durable": 0}
        self._lock = threading.Lock()

    def _where(self, name: str) -> tuple[Storage, Path, str]:
        if self.fast.exists(self.fast_dir, name):
            return self.fast, self.fast_dir, "fast"
        return self.durable, self.durable_dir, "durable"

    def exists(self, directory: Path, name: str) -> bool:
        return name == MANIFEST or self._where(name)[0].exists(self._where(name)[1], name)

    def get(self, directory: Path, name: str, what: str, limit: int) -> bytes:
        if name == MANIFEST:
            return self.manifest
        s, d, tier = self._where(name)
        raw = s.get(d, name, what, limit)
        self._count(tier, len(raw))
        return raw

    def open(self, directory: Path, name: str, what: str, size: int | None = None) -> Source:
        s, d, tier = self._where(name)
        src = s.open(d, name, what, size)
        self._count(tier, src.size)
        return src

    def _count(self, tier: str, n: int) -> None:
        with self._lock:
            self.bytes_from[tier] += n

    def list(self, directory: Path) -> list[Entry]:
        """Both tiers' names, the fast tier's entry where both have one (what ``open`` reads)."""
        entries: dict[str, Entry] = {}
        for s, d in ((self.durable, self.durable_dir), (self.fast, self.fast_dir)):
            with contextlib.suppress(OSError):
                entries.update((e.name, e) for e in s.list(d))
        return [entries[n] for n in sorted(entries)]


@dataclass
class Drain:
    """One step to drain, as this rank's drain thread sees it."""

    step: int
    save_id: str
    fast_dir: Path
    durable_dir: Path
    t_request: float  # perf_counter of the save's request (for total_s)
    stall_s: float = 0.0
    preempted: bool = False


@dataclass
class Drained:
    """The outcome of one drain on this rank (``ok``: the step is committed on the durable tier)."""

    drain: Drain
    ok: bool
    error: str | None
    bytes: int
    drain_s: float
    total_s: float
    time: float = field(default_factory=time.time)


class RateLimit:
    """At most ``rate`` bytes per second on average (None: unbounded), so that the drain leaves
    the network and the durable tier to the job's other traffic (the data loader, other jobs).
    ``rate`` may be a callable, read at every step: a preemption lifts the bound mid-file."""

    def __init__(self, rate: float | None | Callable[[], float | None]):
        self.rate = rate
        self.t0 = time.perf_counter()
        self.sent = 0

    def take(self, n: int) -> None:
        self.sent += n
        while True:
            rate = self.rate() if callable(self.rate) else self.rate
            ahead = self.sent / rate - (time.perf_counter() - self.t0) if rate else 0.0
            if ahead <= 0:
                return
            time.sleep(min(ahead, 0.25))  # short naps, so that a lifted bound takes effect at once


def copy_file(src_storage: Storage, src_dir: Path, dst_storage: Storage, dst_dir: Path, name: str, size: int,
              limit: RateLimit) -> None:  # fmt: skip
    """``name`` from one tier to the other, ``size`` bytes exactly, durable when this returns."""
    src = src_storage.open(src_dir, name, f"fast-tier file {name!r}")
    sink: Sink | None = None
    try:
        if src.size != size:
            raise CheckpointError(
                f"{display(src_dir / name)!r}: {src.size} bytes on the fast tier, the metadata says {size}"
            )
        sink = dst_storage.create(dst_dir, name)
        buf = bytearray(min(COPY_BYTES, max(size, 1)))
        view = memoryview(buf)
        off = 0
        while off < size:
            n = min(len(buf), size - off)
            src.read_into(view[:n], off)
            sink.write(view[:n])
            off += n
            limit.take(n)
        sink.finish()
    finally:
        if sink is not None:
            sink.close()
        src.close()


class Drainer:
    """This rank's drain thread: steps in the order they were committed on the fast tier, one at
    a time, each to its durable commit (rank 0) or until rank 0 commits it (the others)."""

    def __init__(self, rank: int, world: int, rate: float | None, timeout_s: float,
                 on_done: Callable[[Drained], None]):  # fmt: skip
        self.rank, self.world = rank, world
        self.rate, self.timeout_s = rate, timeout_s
        self.on_done = on_done
        self._queue: queue.SimpleQueue[Drain | None] = queue.SimpleQueue()
        self._pending: dict[str, Drain] = {}  # by save id: one step may be saved twice
        self._skip_before: int | None = None
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self.history: list[Drained] = []

    def submit(self, d: Drain) -> None:
        with self._lock:
            self._pending[d.save_id] = d
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="goodput-drain", daemon=True)
                self._thread.start()
        self._queue.put(d)

    def has(self, save_id: str) -> bool:
        """Whether a drain of this save was submitted here (pending, or ended)."""
        with self._lock:
            return save_id in self._pending or any(o.drain.save_id == save_id for o in self.history)

    def pending(self) -> set[int]:
        """Steps committed on the fast tier whose drain has not finished (fast retention keeps them)."""
        with self._lock:
            return {d.step for d in self._pending.values()}

    def hurry(self, step: int) -> None:
        """A preemption saved ``step``: drain it next, unbounded, and skip the older queued steps
        (every rank is told the same step; rank 0 marks each skipped one aborted, so a rank
        still copying one stops waiting for its commit)."""
        self._skip_before = step
        self.rate = None

    def _skipped(self, d: Drain) -> bool:
        return self._skip_before is not None and d.step < self._skip_before

    def wait(self, timeout: float | None = None) -> bool:
        """Until every submitted step has drained (or failed to); False on a timeout."""
        end = None if timeout is None else time.monotonic() + timeout
        with self._idle:
            while self._pending:
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def close(self, timeout: float | None = None) -> bool:
        done = self.wait(timeout)
        with self._lock:
            t, self._thread = self._thread, None
        if t is not None:
            self._queue.put(None)
        return done

    def _run(self) -> None:
        while True:
            d = self._queue.get()
            if d is None:
                return
            try:
                if self._skipped(d):
                    out = self._skip(d)
                else:
                    out = self.drain(d)
            except BaseException as e:  # noqa: BLE001 - reported, never fatal to training
                out = Drained(d, False, describe(e), 0, 0.0, 0.0)
            self.history.append(out)
            try:
                self.on_done(out)
            except Exception:  # noqa: BLE001 - the drain's outcome stands; what failed after it is said
                log.exception("after the drain of step %s, its bookkeeping failed", d.step)
            with self._idle:
                self._pending.pop(d.save_id, None)
                self._idle.notify_all()

    def _skip(self, d: Drain) -> Drained:
        reason = f"skipped: a preemption drains step {self._skip_before} first"
        if self.rank == 0:
            self._abort(d, storage_for(d.durable_dir), reason)
        return Drained(d, False, reason, 0, 0.0, 0.0)

    def _abort(self, d: Drain, ds: Storage, reason: str) -> str:
        with contextlib.suppress(OSError):
            ds.publish(d.durable_dir, abort_name(d.save_id), msgspec.msgpack.encode({"error": reason}))
        return reason

    def drain(self, d: Drain) -> Drained:
        t0 = time.perf_counter()
        fs, ds = storage_for(d.fast_dir), storage_for(d.durable_dir)
        copied = 0
        error = None
        try:
            raw = fs.get(d.fast_dir, MANIFEST, "fast-tier manifest", MAX_MANIFEST_BYTES)
            man = decode_manifest(raw, str(d.fast_dir / MANIFEST))
            if man.save_id != d.save_id:
                raise CheckpointError(f"{display(d.fast_dir)!r} holds save {man.save_id}, not {d.save_id}")
            meta = fs.get(d.fast_dir, man.metadata.name, "metadata file", man.metadata.bytes)
            md = decode_metadata(meta, str(d.fast_dir / man.metadata.name), man)
            limit = RateLimit(lambda: self.rate)
            for f in md.files:
                if f.rank == self.rank:
                    copy_file(fs, d.fast_dir, ds, d.durable_dir, f.name, f.bytes, limit)
                    copied += f.bytes
            ds.sync(d.durable_dir)
            ds.put(d.durable_dir, drained_name(d.save_id, self.rank), b"")
        except BaseException as e:  # noqa: BLE001 - tell rank 0 at once, then report
            error = self._abort(d, ds, f"rank {self.rank} could not drain step {d.step}: {describe(e)}")
        drain_s = time.perf_counter() - t0
        if error is None:
            error = self._commit(d, ds, md) if self.rank == 0 else self._wait_commit(d, ds)
        return Drained(d, error is None, error, copied, drain_s, time.perf_counter() - d.t_request)

    def _aborted(self, d: Drain, ds: Storage) -> str | None:
        if not ds.exists(d.durable_dir, abort_name(d.save_id)):
            return None
        try:
            got = msgspec.msgpack.decode(ds.get(d.durable_dir, abort_name(d.save_id), "abort file", 1 << 20))
            return str(got.get("error")) if isinstance(got, dict) else "unknown"
        except (OSError, CheckpointError, msgspec.DecodeError):
            return "unknown"

    def _commit(self, d: Drain, ds: Storage, md: Any) -> str | None:
        """Rank 0: the durable commit once every rank has drained; the reason if not (then also
        in the abort file, so that the other ranks stop waiting)."""
        end = time.perf_counter() + self.timeout_s
        waiting = set(range(self.world))
        while waiting:
            waiting = {r for r in waiting if not ds.exists(d.durable_dir, drained_name(d.save_id, r))}
            if not waiting:
                break
            reason = self._aborted(d, ds)
            if reason is not None:
                return f"step {d.step} was not drained: {reason}"
            if self._skipped(d):
                return self._abort(d, ds, f"skipped: a preemption drains step {self._skip_before} first")
            if time.perf_counter() > end:
                return self._abort(
                    d, ds, f"ranks {sorted(waiting)} did not drain step {d.step} within {self.timeout_s:.0f} s"
                )
            time.sleep(POLL_S * 25)
        try:
            # every file the metadata names is on the durable tier, whole: a drain by a world of
            # another size, or a lost copy, must never be committed
            sizes = {e.name: e.size for e in ds.list(d.durable_dir) if e.kind == "file"}
            for f in md.files:
                if sizes.get(f.name) != f.bytes:
                    return self._abort(
                        d, ds, f"{display(d.durable_dir / f.name)!r} is missing or not {f.bytes} bytes after the drain"
                    )
            raw = ds.get(d.durable_dir, staged_name(d.save_id), "staged manifest", MAX_MANIFEST_BYTES)
            replaced = previous_files(ds, d.durable_dir)
            if ds.exists(d.durable_dir, MANIFEST):
                ds.publish(d.durable_dir, MANIFEST, raw)
            elif not ds.publish_new(d.durable_dir, MANIFEST, raw):
                return self._abort(
                    d, ds, f"another save committed {display(d.durable_dir)!r} on the durable tier first"
                )
        except (OSError, CheckpointError) as e:
            return self._abort(d, ds, f"durable commit of step {d.step} failed: {describe(e)}")
        mine = {f.name for f in md.files} | {md_name(d.save_id)}
        for name in [
            *(replaced - mine),
            staged_name(d.save_id),
            *(drained_name(d.save_id, r) for r in range(self.world)),
        ]:
            ds.remove(d.durable_dir, name)
        return None

    def _wait_commit(self, d: Drain, ds: Storage) -> str | None:
        end = time.perf_counter() + self.timeout_s + 60
        while True:
            with contextlib.suppress(OSError, CheckpointError):
                raw = ds.get_if_exists(d.durable_dir, MANIFEST, "manifest", MAX_MANIFEST_BYTES)
                if raw is not None and decode_manifest(raw, str(d.durable_dir / MANIFEST)).save_id == d.save_id:
                    return None
            reason = self._aborted(d, ds)
            if reason is not None:
                return f"step {d.step} was not drained: {reason}"
            if time.perf_counter() > end:
                return f"no durable commit of step {d.step} from rank 0 within {self.timeout_s + 60:.0f} s"
            time.sleep(POLL_S * 25)
