"""Convert a PyTorch Distributed Checkpoint (``torch.distributed.checkpoint``, DCP) directory into
a goodput checkpoint.

DCP's own format is pickle: its ``.metadata`` file is a pickled ``Metadata`` object and every
non-tensor entry is a ``torch.save`` blob. Reading DCP therefore means unpickling DCP's metadata;
that is DCP's problem, and we only do it here to convert away from it. **Only import checkpoints
you trust**: unpickling a hostile ``.metadata`` runs arbitrary code, and no option of ours can
prevent that. The non-tensor entries are safer: they are loaded with ``torch.load(...,
weights_only=True)`` (DCP's default planner uses ``weights_only=False``; we override it), which
refuses anything but plain Python containers, numbers, strings, bytes, ``io.BytesIO`` and torch
types. ``bytes`` values (torchtitan's pickled dataloader state) and ``io.BytesIO`` values are kept
as opaque bytes, never unpickled. An entry that does not load that way, or that goodput cannot
store, fails the import naming it, unless ``allow_skipped=True`` (``--allow-skipped``): then it is
left out with a :class:`DCPImportWarning` and listed in :attr:`ImportResult.skipped`.

Tensor names are DCP's fully qualified names (``model.layers.0.weight``), which is exactly how
goodput names the leaves of a state dict, so ``goodput.ckpt.open(dest).read(fqn)`` and a
``goodput.ckpt.load`` of the same nested state dict both work. DCP's saved chunk layout is not
kept: every tensor is written whole, as one replica, by this single process.

Memory. Tensors are read with ``torch.distributed.checkpoint.load`` in batches of at most
``max_batch_bytes`` (a tensor larger than the budget forms a batch of its own). goodput's
:func:`~goodput.ckpt.saving.saver.save` writes one checkpoint per call from a state dict it is given whole,
so every tensor must exist at once when it runs:

* if all tensors together fit in ``max_batch_bytes`` they are loaded into ordinary memory; peak
  memory is then the checkpoint's tensor bytes plus one DCP storage chunk (DCP ``torch.load``\\ s
  each stored chunk whole before copying it out);
* otherwise they are loaded into a scratch file (``scratch_dir``, default ``dest``) mapped into
  memory. After each batch the mapped pages are written back (``msync``) and dropped from the
  process (``madvise(MADV_DONTNEED)``), so what the process holds dirty is bounded by one batch
  (the largest tensor, if that is larger) plus one DCP chunk. The final save then streams through
  the mapping: those pages are clean and file-backed, so the kernel can reclaim them whenever it
  needs to, but they may show up in the process's RSS meanwhile. The cost is disk: the scratch
  file holds every tensor once more (written once, read once), and is unlinked as soon as it is
  mapped so that nothing is left behind even if the process dies.

Run the import in a process without an initialised ``torch.distributed`` process group of more
than one rank: goodput's save uses the default group when one exists and would wait for the
other ranks.
"""

from __future__ import annotations

import contextlib
import io
import mmap
import os
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..format.dtypes import dtype as dtype_info
from ..format.format import MANIFEST, CheckpointError, encode_value
from ..state import torch_dtype_name
from ..storage.local import PosixStorage
from ..storage.location import display, storage_for

DCP_METADATA = ".metadata"  # torch.distributed.checkpoint.filesystem._metadata_fn

#: ``progress(event, nbytes)``: ``("total", bytes to load)`` once, ``("load", bytes)`` after each
#: batch, ``("write", bytes)`` as the goodput save starts and ``("done", bytes)`` after it commits.
Progress = Callable[[str, int], None]


class DCPImportError(CheckpointError):
    """The DCP checkpoint could not be converted; nothing was committed at the destination."""


class DCPImportWarning(UserWarning):
    """Some entries of the DCP checkpoint were not converted (see ImportResult.skipped)."""


@dataclass
class ImportResult:
    path: Path  # the goodput checkpoint written (``Path("s3:/b/k")`` for ``s3://b/k``: see ``display``)
    tensors: int  # tensors converted
    bytes: int  # their bytes
    values: int = 0  # non-tensor values converted
    skipped: dict[str, str] = field(default_factory=dict)  # DCP key -> why it was not converted
    batches: int = 0  # dcp.load calls made for tensors
    spilled: bool = False  # True when tensors went through the memory-mapped scratch file
    seconds: float = 0.0


@dataclass
class _TensorSpec:
    fqn: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    nbytes: int
    offset: int = 0  # in the scratch file, when spilling


def read_dcp_metadata(dcp_dir: str | os.PathLike) -> Any:
    """DCP's ``Metadata`` for the checkpoint in ``dcp_dir``, with errors that say what is wrong."""
    from torch.distributed.checkpoint import FileSystemReader

    d = Path(dcp_dir)
    if not d.exists():
        raise DCPImportError(f"{str(d)!r} does not exist")
    if not d.is_dir():
        raise DCPImportError(f"{str(d)!r} is not a directory")
    if not (d / DCP_METADATA).is_file():
        if (d / f"__0{DCP_METADATA}").is_file():
            raise DCPImportError(
                f"{str(d)!r} holds per-rank DCP metadata (__<rank>{DCP_METADATA}, written with "
                f"use_collectives=False) and no global {DCP_METADATA}; importing that is not supported"
            )
        if (d / MANIFEST).is_file() or any(d.glob("metadata-*.bin")):
            hint = "; it looks like a goodput checkpoint already"
        else:
            hint = ""
        raise DCPImportError(f"{str(d)!r} is not a DCP checkpoint (no {DCP_METADATA} file){hint}")
    try:
        md = FileSystemReader(str(d)).read_metadata()
    except Exception as e:
        raise DCPImportError(
            f"{str(d / DCP_METADATA)!r} could not be read as DCP metadata: {type(e).__name__}: {e}"
        ) from e
    if not hasattr(md, "state_dict_metadata"):
        raise DCPImportError(f"{str(d / DCP_METADATA)!r} is not DCP metadata (unpickled a {type(md).__name__})")
    return md


def _safe_planner(values: dict[str, Any], failed: dict[str, str]) -> Any:
    """DCP's default load planner, except that byte entries are unpickled with weights_only."""
    from torch.distributed.checkpoint import DefaultLoadPlanner

    class _SafeLoadPlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            fqn = read_item.dest_index.fqn
            try:
                # DCP torch.saves every non-tensor entry; an io.BytesIO value comes back as one
                # (never unpickled further: goodput keeps it as opaque bytes)
                with torch.serialization.safe_globals([io.BytesIO]):
                    values[fqn] = torch.load(value, weights_only=True, map_location="cpu")
            except Exception as e:
                first = str(e).strip().splitlines()[0] if str(e).strip() else ""
                failed[fqn] = f"not loadable with weights_only=True ({type(e).__name__}: {first})"

    return _SafeLoadPlanner()


def _describe(e: BaseException) -> str:
    """One line per cause; DCP's CheckpointException otherwise prints whole tracebacks."""
    failures = getattr(e, "failures", None)
    if isinstance(failures, dict) and failures:
        causes = []
        for exc, _trace in failures.values():
            causes.append(f"{type(exc).__name__}: {exc}")
        return "; ".join(dict.fromkeys(causes))
    return f"{type(e).__name__}: {e}"


def _dcp_load(state: dict[str, Any], dcp_dir: Path, planner: Any) -> None:
    from torch.distributed.checkpoint import FileSystemReader, load
    from torch.distributed.checkpoint.api import CheckpointException

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*assuming the intent is to load in a single process")
        try:
            load(state, storage_reader=FileSystemReader(str(dcp_dir)), planner=planner, no_dist=True)
        except (Exception, CheckpointException) as e:  # CheckpointException is a BaseException
            raise DCPImportError(f"reading {str(dcp_dir)!r} with DCP failed: {_describe(e)}") from e


def _batches(specs: list[_TensorSpec], budget: int) -> list[list[_TensorSpec]]:
    out: list[list[_TensorSpec]] = []
    cur: list[_TensorSpec] = []
    size = 0
    for s in specs:
        if cur and size + s.nbytes > budget:
            out.append(cur)
            cur, size = [], 0
        cur.append(s)
        size += s.nbytes
    if cur:
        out.append(cur)
    return out


class _Scratch:
    """One unlinked, memory-mapped file holding every tensor on its own page-aligned range."""

    def __init__(self, directory: Path, specs: list[_TensorSpec]):
        page = mmap.PAGESIZE
        pos = 0
        for s in specs:
            s.offset = pos
            pos += -(-s.nbytes // page) * page
        self.size = max(pos, page)
        fd, name = tempfile.mkstemp(prefix=".import-dcp-scratch-", dir=directory)
        try:
            os.unlink(name)  # the mapping keeps the file alive; a crash leaves nothing behind
            os.ftruncate(fd, self.size)
            self.mm = mmap.mmap(fd, self.size)
        finally:
            os.close(fd)

    def tensor(self, s: _TensorSpec) -> torch.Tensor:
        numel = s.nbytes // s.dtype.itemsize
        return torch.frombuffer(self.mm, dtype=s.dtype, count=numel, offset=s.offset).view(s.shape)

    def release(self, batch: list[_TensorSpec]) -> None:
        """Write the batch's pages back and drop them from this process."""
        start = batch[0].offset
        end = batch[-1].offset + batch[-1].nbytes
        if end <= start:
            return
        self.mm.flush(start, end - start)
        if hasattr(self.mm, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
            self.mm.madvise(mmap.MADV_DONTNEED, start, end - start)

    def close(self) -> None:
        with contextlib.suppress(BufferError):  # a tensor view still exists; it goes with that
            self.mm.close()


def _check_not_distributed() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        raise DCPImportError(
            "import_dcp runs in one process, but a torch.distributed process group of "
            f"{dist.get_world_size()} ranks is initialised: goodput's save would use it and wait for "
            "the other ranks. Run the import in a separate process (e.g. `goodput ckpt import-dcp`)"
        )


def _check_destination(src: Path, dst: Path, overwrite: bool) -> bool:
    """Refuse a destination that is the source, not a directory, or not empty (on the storage it
    names: a directory, or an ``s3://`` prefix). Returns whether it is a local directory that does
    not exist yet (a failed import removes it again)."""
    storage = storage_for(dst)
    local = isinstance(storage, PosixStorage)
    if local and dst.resolve() == src.resolve():
        raise DCPImportError(f"the destination {str(dst)!r} is the DCP checkpoint itself; choose another directory")
    if local and dst.exists() and not dst.is_dir():
        raise DCPImportError(f"the destination {str(dst)!r} exists and is not a directory")
    try:
        held = storage.list(dst)
    except FileNotFoundError:
        held = []
    except OSError as e:
        raise DCPImportError(f"the destination {display(dst)!r} cannot be listed: {e}") from None
    if held and not overwrite:
        raise DCPImportError(
            f"the destination {display(dst)!r} is not empty (pass overwrite=True / --overwrite to replace it)"
        )
    return local and not dst.exists()


def import_dcp(
    dcp_dir: str | os.PathLike,
    dest: str | os.PathLike,
    *,
    max_batch_bytes: int = 1 << 30,
    progress: Progress | None = None,
    overwrite: bool = False,
    scratch_dir: str | os.PathLike | None = None,
    allow_skipped: bool = False,
) -> ImportResult:
    """Convert the DCP checkpoint in ``dcp_dir`` into a goodput checkpoint at ``dest``.

    Every tensor entry becomes a goodput tensor of the same name (DCP's fqn), dtype, shape and
    bytes; non-tensor entries become goodput values when they are JSON-able (see the module
    docstring for what is skipped and why, and for the memory behaviour). An entry that cannot
    be converted fails the import, naming it, unless ``allow_skipped`` (then it is left out,
    warned about and listed in :attr:`ImportResult.skipped`). ``dest`` (a directory or an
    ``s3://`` prefix) must be empty or absent unless ``overwrite`` (then a goodput checkpoint
    already there is replaced atomically and other files are left alone); the goodput save is
    atomic, so a failed import commits nothing. The manifest's ``user`` field records
    ``{"imported_from": "dcp", "source": ...}``.
    """
    from ..saving.saver import save

    t0 = time.perf_counter()
    if max_batch_bytes <= 0:
        raise ValueError(f"max_batch_bytes must be positive, got {max_batch_bytes}")
    src = Path(dcp_dir)
    dst = Path(dest)
    md = read_dcp_metadata(src)
    _check_not_distributed()
    created = _check_destination(src, dst, overwrite)

    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata

    specs: list[_TensorSpec] = []
    byte_keys: list[str] = []
    skipped: dict[str, str] = {}
    unsupported: list[str] = []
    for fqn, entry in md.state_dict_metadata.items():
        if isinstance(entry, TensorStorageMetadata):
            dt = entry.properties.dtype
            try:
                name = torch_dtype_name(dt, fqn)
            except TypeError:
                unsupported.append(f"{fqn} ({dt})")
                continue
            shape = tuple(int(x) for x in entry.size)
            numel = 1
            for x in shape:
                numel *= x
            specs.append(_TensorSpec(fqn, shape, dt, numel * dtype_info(name).itemsize))
        elif isinstance(entry, BytesStorageMetadata):
            byte_keys.append(fqn)
        else:
            skipped[fqn] = f"unknown DCP entry type {type(entry).__name__}"
    if unsupported:
        raise DCPImportError("tensors of dtypes goodput cannot store: " + ", ".join(unsupported))

    # ---- non-tensor entries: small, loaded first so that surprises surface early -------------
    values: dict[str, Any] = {}
    if byte_keys:
        loaded: dict[str, Any] = {}
        failed: dict[str, str] = {}
        _dcp_load({k: io.BytesIO() for k in byte_keys}, src, _safe_planner(loaded, failed))
        for k in byte_keys:
            if k in failed:
                skipped[k] = failed[k]
                continue
            if k not in loaded:
                skipped[k] = "DCP did not return it"
                continue
            v = loaded[k]
            if isinstance(v, io.BytesIO):  # saved as goodput's opaque bytes, refilled into a BytesIO
                values[k] = v
                continue
            try:
                encode_value(v, k)
            except TypeError as e:
                skipped[k] = f"a {type(v).__name__}, which goodput cannot store ({e})"
                continue
            if isinstance(v, dict) and not v:
                skipped[k] = "an empty dict (goodput stores a dict as its leaves, so it would vanish)"
                continue
            values[k] = v
    if skipped:
        listed = "; ".join(f"{k!r}: {why}" for k, why in skipped.items())
        if not allow_skipped:
            raise DCPImportError(
                f"{len(skipped)} DCP entries cannot be converted: {listed}. Nothing was written; pass "
                "allow_skipped=True (--allow-skipped) to import without them"
            )
        warnings.warn(f"{len(skipped)} DCP entries were not converted: {listed}", DCPImportWarning, stacklevel=2)

    # ---- tensors, in batches ----------------------------------------------------------------
    total = sum(s.nbytes for s in specs)
    spill = total > max_batch_bytes
    batches = _batches(specs, max_batch_bytes)
    if progress:
        progress("total", total)
    storage = storage_for(dst)
    local = isinstance(storage, PosixStorage)
    scratch: _Scratch | None = None
    state: dict[str, Any] = {}
    try:
        storage.prepare(dst)
        if spill:
            where = scratch_dir if scratch_dir is not None else dst if local else tempfile.gettempdir()
            scratch = _Scratch(Path(where), specs)
        for batch in batches:
            targets: dict[str, torch.Tensor] = {}
            for s in batch:
                if scratch is not None and s.nbytes:
                    targets[s.fqn] = scratch.tensor(s)
                else:
                    targets[s.fqn] = torch.empty(s.shape, dtype=s.dtype)
            _dcp_load(dict(targets), src, _safe_planner({}, {}))
            if scratch is not None:
                scratch.release(batch)
            state.update(targets)
            targets = {}
            if progress:
                progress("load", sum(s.nbytes for s in batch))
        clash = sorted(set(values) & set(state))
        if clash:  # cannot happen for a well-formed DCP checkpoint
            raise DCPImportError(f"keys both tensor and value: {clash}")
        state.update(values)
        if progress:
            progress("write", total)
        save(state, dst, user={"imported_from": "dcp", "source": str(src)})
        if progress:
            progress("done", total)
    except BaseException:
        if created:
            with contextlib.suppress(OSError):
                dst.rmdir()  # a local directory the import made, only if it is still empty
        raise
    finally:
        state.clear()
        if scratch is not None:
            scratch.close()
    return ImportResult(
        path=dst,
        tensors=len(specs),
        bytes=total,
        values=len(values),
        skipped=skipped,
        batches=len(batches),
        spilled=spill,
        seconds=time.perf_counter() - t0,
    )
