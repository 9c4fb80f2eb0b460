"""Read a checkpoint with numpy alone: no torch import, no pickle.

``goodput.ckpt.open(path)`` gives the tensors, their global shapes, dtypes and chunk layouts, and
any tensor or sub-box of one as a numpy array, reading only the bytes that box needs.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CheckpointError, StorageError
from ..format.dtypes import bf16_bits_to_f32, dtype
from ..format.format import (
    ALIGN,
    LATEST,
    MANIFEST,
    MAX_MANIFEST_BYTES,
    MAX_POINTER_BYTES,
    STEP_DIR,
    Manifest,
    Metadata,
    decode_metadata,
    decode_sealed_manifest,
    decode_value,
    header_length,
    metadata_need,
)
from ..format.geometry import Region
from ..storage.base import Storage
from ..storage.location import as_location, display, storage_for
from .read_exec import DEFAULT_READ_BUFFER, Files, ReadStats, read_requests
from .read_plan import ReadPlanner, Request


@dataclass(frozen=True)
class ChunkInfo:
    region: Region
    file: str
    offset: int
    length: int
    crc32c: int
    rank: int


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    kind: str
    chunks: tuple[ChunkInfo, ...]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * dtype(self.dtype).itemsize


def read_manifest(path: Path, storage: Storage | None = None) -> Manifest:
    return read_sealed_manifest(path, storage)[0]


def read_sealed_manifest(path: Path, storage: Storage | None = None) -> tuple[Manifest, bool]:
    storage = storage or storage_for(path)
    try:  # one request on an object store; whether it is missing is asked only when it fails
        raw = storage.get(path, MANIFEST, "manifest", MAX_MANIFEST_BYTES)
    except (CheckpointError, OSError):
        if not storage.exists(path, MANIFEST):
            raise CheckpointError(
                f"{display(path)!r} is not a committed checkpoint ({_why_missing(storage, path)})"
                f"{foreign_hint(storage, path)}"
            ) from None
        raise
    return decode_sealed_manifest(raw, str(path / MANIFEST))


def _why_missing(storage: Storage, path: Path) -> str:
    """Why ``path`` has no manifest, asked only once it has none: a location that does not exist
    (a typo) or a bucket that does not (raised: the store's own answer) is not "no manifest"."""
    try:
        storage.list(path)
    except FileNotFoundError:
        if str(path).startswith("s3:/"):
            return "nothing is stored under it"
        return "it does not exist"
    except NotADirectoryError:
        return f"it is not a directory{_file_hint(path)}"
    except StorageError:
        raise
    except (OSError, CheckpointError, ValueError):
        pass
    return f"no {MANIFEST}"


def _file_hint(path: Path) -> str:
    """What to pass instead of a file of a checkpoint: its directory. Passing the file a user
    sees (``model.safetensors``, the manifest) is the natural mistake; "not a directory" alone
    does not say which directory is meant."""
    name, parent = path.name, display(path.parent)
    if name.endswith(".safetensors") or name.endswith(".safetensors.index.json"):
        return f": {name!r} is a file; pass the directory holding the safetensors files, {parent!r}"
    if name in (MANIFEST, DCP_METADATA):
        return f": {name!r} is a checkpoint's file; pass the checkpoint directory, {parent!r}"
    return ""


DCP_METADATA = ".metadata"  # torch.distributed.checkpoint's global metadata file
HF_INDEX = "model.safetensors.index.json"


def foreign_hint(storage: Storage, path: Path) -> str:
    """What to do when ``path`` holds another format's checkpoint (asked only once the manifest
    is known to be missing, so a goodput load pays nothing for it)."""
    try:
        if storage.exists(path, DCP_METADATA):
            return (
                f"; it holds a torch.distributed.checkpoint (DCP) checkpoint ({DCP_METADATA}): convert it with "
                f"`goodput ckpt import-dcp {display(path)} DEST` (or goodput.ckpt.compat.dcp_import.import_dcp), then load DEST"
            )
        hf = storage.exists(path, HF_INDEX) or any(e.name.endswith(".safetensors") for e in storage.list(path))
    except (OSError, CheckpointError, ValueError):
        return ""
    if hf:
        return (
            "; it holds Hugging Face safetensors: goodput.ckpt.load(state, path) reads those into any layout "
            "(from a local directory)"
        )
    return ""


SMALL_METADATA_BYTES = 64 << 20  # 16k ranks' metadata is about 10 MiB: below this, read it at once
ONE_READ_BYTES = 4 << 20  # below this the metadata is read in one request (each is a round trip on S3)


def read_metadata(storage: Storage, path: Path, name: str, size: int) -> bytes:
    """The metadata file, read only as far as its header can account for: first its header, then
    the columns that header describes, whose rows can be no more than the chunks the data files
    on storage have room for. A forged size (a sparse file of gigabytes) is refused before it
    is read."""
    where = str(path / name)
    src = storage.open(path, name, "metadata file", size)
    try:
        if src.size != size:
            raise CheckpointError(
                f"{where}: metadata is {src.size} bytes, the manifest says {size} (truncated, or from another checkpoint)"
            )
        whole = None
        if size <= ONE_READ_BYTES:  # allocating this much is harmless: read it all, check it below
            whole = bytearray(size)
            src.read_into(memoryview(whole), 0)
        head = whole[:16] if whole is not None else bytearray(min(16, size))
        if whole is None:
            src.read_into(memoryview(head), 0)
        hlen = header_length(bytes(head), where)
        if hlen > size - 16:
            raise CheckpointError(f"{where}: header length {hlen} exceeds the file")
        head = whole[: 16 + hlen] if whole is not None else bytearray(16 + hlen)
        if whole is None:
            src.read_into(memoryview(head), 0)
        need, rows, files = metadata_need(bytes(head), where)
        if size > need:
            raise CheckpointError(f"{where}: metadata is {size} bytes, its header accounts for at most {need}")
        if size > SMALL_METADATA_BYTES:  # worth a listing: is there data for that many chunks?
            sizes = {e.name: e.size for e in storage.list(path) if e.kind == "file"}
            room = sum(-(-sizes.get(f, 0) // ALIGN) for f in set(files))  # every chunk starts on its own page
        if size > SMALL_METADATA_BYTES and rows > room:
            raise CheckpointError(
                f"{where}: metadata claims {rows} chunks, its data files have room for at most {room}"
            )
        if whole is not None:
            return bytes(whole)
        raw = bytearray(size)
        src.read_into(memoryview(raw), 0)
        return bytes(raw)
    finally:
        src.close()


class UnsealedManifestWarning(UserWarning):
    """A checkpoint written before manifests carried their own checksum: it loads, but a
    corrupted step or user dict in its manifest would go unnoticed."""


class Checkpoint:
    """A committed checkpoint opened for reading."""

    def __init__(self, path: str | os.PathLike, storage: Storage | None = None):
        self.path = Path(path)
        self.storage = storage or storage_for(self.path)
        self.manifest, self.sealed = read_sealed_manifest(self.path, self.storage)
        mref = self.manifest.metadata
        mpath = self.path / mref.name
        raw = read_metadata(self.storage, self.path, mref.name, mref.bytes)
        self.metadata: Metadata = decode_metadata(raw, str(mpath), self.manifest)
        if self.metadata.manifest_sealed and not self.sealed:
            raise CheckpointError(
                f"{str(self.path / MANIFEST)!r}: the manifest lost its checksum (its metadata says it was "
                "written with one): corrupt"
            )
        if not self.sealed:
            warnings.warn(
                f"{str(self.path)!r}: its manifest has no checksum (written by an older goodput); "
                "it loads, but damage to its step or user fields cannot be detected",
                UnsealedManifestWarning,
                stacklevel=3,
            )
        self._planner = ReadPlanner(self.metadata)
        self._tensors: dict[str, TensorInfo] | None = None

    # ------------------------------------------------------------------ description
    @property
    def step(self) -> int | None:
        return self.manifest.step

    @property
    def values(self) -> dict[str, Any]:
        return {k: decode_value(v, k, self.metadata.version) for k, v in self.metadata.values.items()}

    @property
    def tensors(self) -> dict[str, TensorInfo]:
        if self._tensors is None:
            md = self.metadata
            c = md.cols
            out = {}
            for tid, t in enumerate(md.tensors):
                a, b = md.chunk_range(tid)
                chunks = tuple(
                    ChunkInfo(
                        md.region(i),
                        md.files[int(c["file"][i])].name,
                        int(c["offset"][i]),
                        int(c["length"][i]),
                        int(c["crc32c"][i]),
                        md.files[int(c["file"][i])].rank,
                    )
                    for i in range(a, b)
                )
                out[t.name] = TensorInfo(t.name, t.dtype, tuple(t.shape), t.kind, chunks)
            self._tensors = out
        return self._tensors

    def keys(self) -> list[str]:
        return [t.name for t in self.metadata.tensors]

    def bytes_per_rank(self) -> dict[int, int]:
        md = self.metadata
        per: dict[int, int] = {}
        lengths = np.bincount(md.cols["file"].astype(np.int64), weights=md.cols["length"], minlength=len(md.files))
        for f, n in zip(md.files, lengths.tolist()):
            per[f.rank] = per.get(f.rank, 0) + int(n)
        return per

    # ------------------------------------------------------------------ reading
    def read(
        self,
        name: str,
        index: Any = None,
        *,
        raw: bool = False,
        verify: bool = True,
        read_buffer: int = DEFAULT_READ_BUFFER,
        threads: int = 4,
    ) -> np.ndarray:
        """A tensor, or the box ``index`` of it (a tuple of slices with step 1), as numpy.

        bfloat16 is widened to float32 exactly unless ``raw``; the float8 types come back as
        their raw ``uint8`` bits.
        """
        tid = self._planner.tensor_id(name)
        t = self.metadata.tensors[tid]
        shape = tuple(t.shape)
        region = box_from_index(shape, index, name)
        dt = dtype(t.dtype)
        self._check_readable(name, region, dt.itemsize)
        out = np.empty(region.sizes, dtype=np.dtype(dt.raw))
        dest = out.reshape(-1).view(np.uint8)
        read_requests(
            self.path, self.metadata, [Request(name, region, dest)],
            verify=verify, read_buffer=read_buffer, threads=threads, planner=self._planner, storage=self.storage,
        )  # fmt: skip
        if raw or dt.numpy is None and dt.name != "bfloat16":
            return out
        if dt.name == "bfloat16":
            return bf16_bits_to_f32(out)
        return out.view(np.dtype(dt.numpy))

    def _check_readable(self, name: str, region: Region, itemsize: int) -> None:
        """Before allocating the output: the saved chunks must cover the region exactly, and the
        files they lie in must hold the bytes the metadata claims. A forged shape then fails
        cleanly instead of allocating what no file on storage backs."""
        probe = np.lib.stride_tricks.as_strided(np.zeros(1, np.uint8), (region.numel * itemsize,), (0,))
        plan = self._planner.plan([Request(name, region, probe)])
        fids = np.unique(self.metadata.cols["file"][plan.P[:, plan.cols[4]]]) if len(plan.P) else []
        files = Files(self.path, self.metadata, self.storage)
        try:
            for fid in fids:
                files.source(int(fid))
        finally:
            files.close()

    def __getitem__(self, name: str) -> np.ndarray:
        return self.read(name)

    def read_into(self, requests: list[Request], **kw: Any) -> ReadStats:
        return read_requests(self.path, self.metadata, requests, planner=self._planner, storage=self.storage, **kw)

    # ------------------------------------------------------------------ integrity
    def verify(self, progress: Callable[[int], None] | None = None, read_buffer: int = 64 << 20) -> int:
        """Check every byte: files present with their sizes, every block and chunk checksum, and
        that each tensor's chunks tile it exactly. Returns the bytes checked."""
        md = self.metadata
        c = md.cols
        # decoding proved that no two chunks of a tensor overlap, so they tile it exactly when
        # their elements add up to the tensor's
        tables = md.tables()
        elems = c["length"] // tables.itemsize[c["tensor"].astype(np.int64)]
        held = np.bincount(c["tensor"].astype(np.int64), weights=elems, minlength=len(md.tensors))
        short = np.flatnonzero(held.astype(np.int64) != tables.numel)
        if len(short):
            t = md.tensors[int(short[0])]
            raise CheckpointError(
                f"tensor {t.name!r}: its chunks do not tile it: the pieces hold {int(held[short[0]])} of the "
                f"tensor's {int(tables.numel[short[0]])} elements (shape {tuple(t.shape)})"
            )
        files = Files(self.path, md, self.storage)
        stats = ReadStats()
        checked = 0
        buf = np.empty(max(md.block_bytes, read_buffer // md.block_bytes * md.block_bytes), np.uint8)
        try:
            for fid in range(len(md.files)):
                files.source(fid)  # presence and size, even for files with no chunk
            from .read_exec import check_blocks, chunk_block_crcs

            for ch in np.argsort(c["file"].astype(np.int64) * (1 << 40) + c["offset"], kind="stable").tolist():
                src = files.source(int(c["file"][ch]))
                fname = md.files[int(c["file"][ch])].name
                base, length = int(c["offset"][ch]), int(c["length"][ch])
                expect = chunk_block_crcs(files, md, ch, stats)
                for a in range(0, length, len(buf)):
                    part = memoryview(buf)[: min(len(buf), length - a)]
                    src.read_into(part, base + a, fname)
                    check_blocks(md, ch, part, a // md.block_bytes, expect)
                    checked += len(part)
                    if progress:
                        progress(len(part))
        finally:
            files.close()
        return checked


def box_from_index(shape: tuple[int, ...], index: Any, name: str) -> Region:
    if index is None:
        return Region.whole(shape)
    if not isinstance(index, tuple):
        index = (index,)
    if len(index) > len(shape):
        raise IndexError(f"{name!r}: {len(index)} indices for a {len(shape)}-D tensor")
    offs, sizes = [], []
    for d, n in enumerate(shape):
        sl = index[d] if d < len(index) else slice(None)
        if isinstance(sl, int):
            i = sl + n if sl < 0 else sl
            if not 0 <= i < n:
                raise IndexError(f"{name!r}: index {sl} out of range for dimension {d} of size {n}")
            sl = slice(i, i + 1)
        if not isinstance(sl, slice):
            raise TypeError(f"{name!r}: only ints and slices select a box, got {type(sl).__name__}")
        a, b, step = sl.indices(n)
        if step != 1:
            raise ValueError(f"{name!r}: a box needs step 1 slices")
        offs.append(a)
        sizes.append(max(0, b - a))
    return Region.box(offs, sizes)


def open(path: str | os.PathLike) -> Checkpoint:  # noqa: A001 - mirrors the builtin on purpose
    return Checkpoint(path)


def is_committed(path: str | os.PathLike) -> bool:
    """True when ``path`` holds a committed checkpoint, False when nothing was committed there
    (no ``MANIFEST.json``; also when the storage cannot be asked: a save that must not replace a
    checkpoint still commits only if no manifest is there).

    A ``MANIFEST.json`` that is there but cannot be read (damaged, or written by a newer goodput)
    is neither: it raises :class:`CheckpointError` naming the directory and why, so that a save
    with ``overwrite=False`` refuses it, as it refuses a readable one, instead of writing its data
    beside it and failing at the commit."""
    try:
        got = manifest_or_damage(Path(path))
    except (CheckpointError, OSError):
        return False
    if isinstance(got, DamagedCheckpoint):
        raise CheckpointError(
            f"{display(got.path)!r}: its {MANIFEST} is there but cannot be read ({got.reason}): a damaged "
            "checkpoint, or one written by a newer goodput; it is not replaced where a checkpoint must not be "
            "(overwrite=False). Look at it, then remove it, or save elsewhere"
        )
    return got is not None


def _subdirs(storage: Storage, root: Path) -> list[str]:
    """Directories directly under ``root``; links are never followed (a link to another run's
    checkpoint is not this run's checkpoint). A missing ``root`` whose parent exists is an empty
    list (a run that has not saved yet); a missing parent too is an error (a mistyped path must
    not read as "start from step 0"), as is a listing that fails (:class:`StorageError`)."""
    try:
        entries = storage.list(root)
    except FileNotFoundError:
        _check_parent(storage, root)
        return []
    except NotADirectoryError:
        raise StorageError(f"{display(root)!r} is not a directory") from None
    except StorageError:
        raise
    except OSError as e:
        raise StorageError(f"{display(root)!r} cannot be listed: {e.strerror or e}") from None
    return [e.name for e in entries if e.kind == "dir"]


def _check_parent(storage: Storage, root: Path) -> None:
    """``root`` does not exist: fine when its parent does (a Checkpointer's root before its first
    run), an error when that is missing too. An object store has no directories: a prefix with
    nothing under it is empty, and only a missing bucket (raised by the listing) is an error."""
    if str(root).startswith("s3:/"):
        return
    parent = Path(os.path.abspath(root)).parent
    if parent == parent.parent:
        return
    if not storage.exists(parent.parent, parent.name):
        raise StorageError(
            f"{display(root)!r} does not exist, nor does its parent {str(parent)!r}: a mistyped path? "
            "(a checkpoint root that does not exist yet is fine only inside an existing directory)"
        )


class DamagedCheckpointWarning(UserWarning):
    """A directory holds a manifest that cannot be read: damaged, not a regular file, or written
    by a newer goodput. It is skipped by :func:`latest` and never deleted by a Checkpointer."""


@dataclass(frozen=True)
class DamagedCheckpoint:
    """A directory with a ``MANIFEST.json`` this goodput cannot read, and why. Unlike a directory
    without one (a save that never committed), it may hold a good checkpoint: one written by a
    newer goodput, or one whose data is intact and whose manifest a person can repair."""

    path: Path
    reason: str


@dataclass(frozen=True)
class Listing:
    """What :func:`scan_checkpoints` found: committed checkpoints (oldest first) and damaged ones."""

    committed: list[tuple[Path, Manifest]]
    damaged: list[DamagedCheckpoint]


def manifest_or_damage(path: Path, storage: Storage | None = None) -> Manifest | DamagedCheckpoint | None:
    """``path``'s manifest; None when it has no ``MANIFEST.json`` (nothing committed there); a
    :class:`DamagedCheckpoint` when one is there but cannot be read as a manifest of this goodput
    (a link, a FIFO, an oversized, empty, truncated or corrupt file, a newer format version). A
    storage failure raises :class:`StorageError`: it says nothing about what ``path`` holds."""
    storage = storage or storage_for(path)
    try:
        raw = storage.get_if_exists(path, MANIFEST, "manifest", MAX_MANIFEST_BYTES)
        if raw is None:
            return None
        return decode_sealed_manifest(raw, str(path / MANIFEST))[0]
    except StorageError:
        raise
    except CheckpointError as e:
        return DamagedCheckpoint(path, str(e))


def committed_manifest(path: Path, storage: Storage | None = None) -> Manifest | None:
    """``path``'s manifest, or None when it holds none that can be read (see
    :func:`manifest_or_damage`, which tells a damaged one from none)."""
    m = manifest_or_damage(path, storage)
    return m if isinstance(m, Manifest) else None


def scan_checkpoints(root: str | os.PathLike) -> Listing:
    """Committed checkpoints directly under ``root`` (and ``root`` itself), oldest first, and the
    directories whose manifest cannot be read. A storage failure raises :class:`StorageError`."""
    root = as_location(root)
    storage = storage_for(root)
    found: list[tuple[Path, Manifest]] = []
    damaged: list[DamagedCheckpoint] = []
    for p in [root, *(root / n for n in _subdirs(storage, root))]:
        try:
            m = manifest_or_damage(p, storage)
        except StorageError as e:
            if p == root or STEP_DIR.match(p.name):
                raise
            # a directory of someone else's that cannot be looked at (``lost+found`` at a mount's
            # root): said, not fatal; a step directory that cannot be is an error
            warnings.warn(f"skipping {display(p)!r}: {e}", RuntimeWarning, stacklevel=3)
            continue
        if isinstance(m, DamagedCheckpoint):
            damaged.append(m)
        elif m is not None:
            found.append((p, m))
    found.sort(key=lambda pm: (pm[1].step if pm[1].step is not None else -1, pm[1].created))
    damaged.sort(key=lambda d: d.path.name)
    return Listing(found, damaged)


def warn_damaged(d: DamagedCheckpoint, what: str = "skipped", stacklevel: int = 3) -> None:
    warnings.warn(
        f"{display(d.path)!r}: its {MANIFEST} cannot be read, {what}: {d.reason} (a damaged checkpoint, or one "
        "written by a newer goodput; a Checkpointer never deletes it)",
        DamagedCheckpointWarning,
        stacklevel=stacklevel,
    )


def list_checkpoints(root: str | os.PathLike) -> list[tuple[Path, Manifest]]:
    """Committed checkpoints directly under ``root`` (and ``root`` itself), oldest first. A
    directory whose manifest is there but cannot be read is left out with a
    :class:`DamagedCheckpointWarning` naming it and why (:func:`scan_checkpoints` returns them).
    Empty only when the storage answered (a missing ``root`` counts as empty only when its parent
    exists); a storage failure raises :class:`StorageError`."""
    listing = scan_checkpoints(root)
    for d in listing.damaged:
        warn_damaged(d, "left out")
    return listing.committed


def latest(root: str | os.PathLike) -> Path | None:
    """The newest committed checkpoint under ``root``: the ``latest`` pointer a Checkpointer
    keeps, when it names a committed checkpoint; else the newest by listing (step, then time).

    A directory whose manifest is there but cannot be read (damaged, or written by a newer
    goodput) is skipped with a :class:`DamagedCheckpointWarning` naming it and why, and the
    newest readable one is the answer: a resume goes on from the checkpoint before it, which a
    plain restore can load, while the damaged one stays on storage for a person to look at.

    None means the storage answered and holds no committed checkpoint there; a ``root`` that does
    not exist counts as empty only when its parent directory exists (a first run), else it is an
    error. Any storage failure (credentials, a missing bucket, an unreachable endpoint, a 5xx
    after the store's retries, a listing that fails) raises :class:`StorageError` naming
    ``root``: a resume must never take an error for "start from step 0"."""
    root = as_location(root)
    storage = storage_for(root)
    try:
        raw = storage.get_if_exists(root, LATEST, "latest pointer", MAX_POINTER_BYTES)
    except StorageError as e:
        raise StorageError(f"no answer from {display(root)!r} on its newest checkpoint: {e}") from e
    except CheckpointError:  # a pointer that is no plain small file: the listing decides
        raw = None
    name = raw.decode("utf-8", "replace").strip() if raw is not None else ""
    m = STEP_DIR.match(name)
    try:
        dirs = set(_subdirs(storage, root)) if m else set()
        if m and name in dirs and isinstance(manifest_or_damage(root / name, storage), Manifest):
            # a crash between a commit and the pointer's update leaves it behind: prefer any
            # newer committed step directory (names only are listed, manifests of newer ones read)
            newer = sorted(
                (int(q.group(1)), n) for n in dirs if (q := STEP_DIR.match(n)) and int(q.group(1)) > int(m.group(1))
            )
            for _, n in reversed(newer):
                got = manifest_or_damage(root / n, storage)
                if isinstance(got, DamagedCheckpoint):
                    warn_damaged(got)
                elif got is not None:
                    return root / n
            return root / name
        listing = scan_checkpoints(root)
    except StorageError as e:
        raise StorageError(f"no answer from {display(root)!r} on its newest checkpoint: {e}") from e
    for d in listing.damaged:
        warn_damaged(d)
    return listing.committed[-1][0] if listing.committed else None
