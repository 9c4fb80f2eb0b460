"""export: a goodput checkpoint out as full (consolidated) tensors, in Hugging Face's safetensors
layout or as one ``torch.save`` file.

Hugging Face's layout: ``model.safetensors`` when everything fits in one shard, else
``model-00001-of-0000N.safetensors`` ... and ``model.safetensors.index.json`` (``metadata.
total_size`` and ``weight_map``: tensor name -> file), the index written last. Shards are filled
in tensor-name order up to ``max_shard_size`` (a tensor larger than that is a shard of its own),
so at most one shard's tensors are in memory at once; each is written by the ``safetensors``
library (``metadata={"format": "pt"}``, as ``transformers`` writes). The source may be any
checkpoint location (a directory or ``s3://``), saved in any layout on any number of ranks: each
tensor is read whole, every checksum verified. The destination is a directory or ``s3://``
prefix that must hold nothing yet (``overwrite=True`` writes into a non-empty one); on an
object store each shard is written to a local temporary file first, then uploaded.

An export that does not finish (killed, power lost) must leave nothing a loader takes for a
model: before it touches the destination the export creates the marker :data:`EXPORTING` there
(fsynced); on overwrite it then removes the earlier export (index first, then its shards, values
and this exporter's own temporary files); it writes the shards, the values, the index last, and
only then removes the marker. The Hugging Face loader refuses a directory holding the marker,
and shards of a set without their index (:mod:`goodput.ckpt.loading.hf`).

The marker is also the destination's lock (:func:`acquire`): it is created only where no
marker is (``link(2)`` locally, a conditional PUT ``If-None-Match: *`` on ``s3://``) and names
its export (pid, host, boot, the process's start, when), so a second export into the same
destination fails at once, naming the first, and touches nothing. Locally the export also holds
``flock`` on the destination directory, which the kernel lets go when the process dies: a marker
whose export held it and no longer does is a dead export's. Elsewhere (``s3://``, a file system
without ``flock``) a marker is a dead export's when it names this host and its process is gone;
one of another host cannot be judged from here and is never taken over: the error says to remove
it. Only a dead export's marker is taken over, by ``overwrite`` (on ``s3://`` removed by a
conditional DELETE ``If-Match`` its ETag, so two exports taking over one marker cannot both win),
and on ``s3://`` the incomplete multipart uploads that export left are aborted
(:func:`_abort_dead_uploads`): those of the exporter's own file names at the top of the
destination opened while its marker stood, or of exactly the names this export writes, never
another key under the prefix. The destination may not be inside the source checkpoint (by
resolved path, or bucket and key components: ``ck2`` is not inside ``ck``); the source inside the
destination is allowed: ``overwrite`` removes only the exporter's own file names at the top of the
destination, never a directory.

What is not a tensor goes beside the shards, never silently away. A safetensors file holds
tensors only (its ``__metadata__`` is str -> str), and Hugging Face's tools read only the tensors,
so the values (``step``, ``param_groups``, a ``torch.dtype``...) and ``io.BytesIO`` blobs under
the prefix are carried in ``goodput_values.json`` (:data:`VALUES`), in goodput's value encoding
(docs/FORMAT.md, no pickle: a blob is base64), which the Hugging Face loader
(:mod:`goodput.ckpt.loading.hf`) reads back: export then ``gc.load`` of the directory restores
them. ``transformers`` and ``safetensors`` ignore the file. They are listed in
:attr:`ExportResult.carried`. ``--format torch`` (one ``{name: tensor}`` file for
``torch.load(weights_only=True)``) has no such place: there they are listed by key in
:attr:`ExportResult.skipped`, and the CLI prints each.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ExportError
from ..format.dtypes import dtype as dtype_info
from ..format.format import FORMAT_VERSION, decode_value, encode_value
from ..loading.hf import EXPORTING, VALUES, VALUES_FORMAT  # values beside the tensors; the marker (module doc)
from ..loading.reader import Checkpoint
from ..storage.base import Storage
from ..storage.local import PosixStorage
from ..storage.location import display, storage_for
from .destination import Hold, acquire, read_marker, refuse_running, remove_marker, who

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
FORMATS = ("safetensors", "torch")
UPLOAD_SLICE = 8 << 20
_SHARD = re.compile(r"^model-\d{5}-of-\d{5}\.safetensors\Z")
#: this exporter's own temporary files in the destination (:func:`_write`, and the storage's
#: ``publish`` of the index and values), which a killed export leaves behind
_TEMP = re.compile(
    r"^\.(model\.safetensors|model-\d{5}-of-\d{5}\.safetensors|model\.safetensors\.index\.json"
    r"|goodput_values\.json)\.tmp-\d+\Z"
)
#: the goodput dtypes a safetensors file can hold (safetensors has no complex128)
SAFETENSORS_DTYPES = (
    "bool", "uint8", "int8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16", "bfloat16",
    "float32", "float64", "complex64", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz",
    "float8_e8m0fnu",
)  # fmt: skip
#: the key of a safetensors header that is not a tensor: a tensor cannot be written under it
RESERVED = "__metadata__"

#: --dtype spellings -> torch dtype names
CASTS = {
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp16": "float16",
    "float16": "float16",
    "half": "float16",
    "fp32": "float32",
    "float32": "float32",
    "float": "float32",
}
_FLOATS = {"float16", "bfloat16", "float32", "float64"}

#: ``progress(event, n)``: ``("total", bytes)`` once, ``("read", bytes)`` after each tensor,
#: ``("shard", index)`` after each file is written
Progress = Callable[[str, int], None]


@dataclass
class ExportResult:
    path: str  # the destination, as given (s3:// URL or directory or file)
    format: str
    files: list[str]  # written, in order (the index last)
    tensors: int
    bytes: int  # tensor bytes written (after any cast)
    skipped: dict[str, str] = field(default_factory=dict)  # name -> why it was not exported
    carried: list[str] = field(default_factory=list)  # values and blobs written to VALUES (names as written)
    seconds: float = 0.0
    aborted: list[str] = field(default_factory=list)  # s3:// incomplete uploads a dead export left, aborted


@dataclass
class _Item:
    source: str  # the name in the goodput checkpoint
    name: str  # the name written
    dtype: str  # goodput dtype as saved
    out_dtype: str  # as written
    shape: tuple[int, ...]
    nbytes: int  # as written


def plan_shards(items: list[_Item], max_bytes: int) -> list[list[_Item]]:
    """Greedy, in order: a shard takes tensors until the next would exceed ``max_bytes``."""
    shards: list[list[_Item]] = []
    cur: list[_Item] = []
    size = 0
    for it in items:
        if cur and size + it.nbytes > max_bytes:
            shards.append(cur)
            cur, size = [], 0
        cur.append(it)
        size += it.nbytes
    if cur:
        shards.append(cur)
    return shards


def shard_name(i: int, n: int) -> str:
    return SINGLE if n == 1 else f"model-{i + 1:05d}-of-{n:05d}.safetensors"


def _select(
    ck: Checkpoint, prefix: str | None, cast: str | None, fmt: str = "safetensors"
) -> tuple[list[_Item], list[str], list[str]]:
    """(tensors to export, blobs, values): names as in the checkpoint, those under ``prefix``.
    ``cast`` applies to floating tensors of at least one dimension: a 0-d one is an optimizer's
    counter (``torch.optim`` keeps ``step``, NAdam's ``mu_product``, as float32 scalars) or a
    scalar parameter, costs nothing as saved, and cast would change value (step 1001 is 1000 in
    bfloat16), so it is written as saved. For safetensors, a tensor it cannot hold (a dtype it
    lacks, the name ``__metadata__``) is refused here, before anything is written."""
    items: list[_Item] = []
    blobs: list[str] = []
    for t in ck.metadata.tensors:
        if prefix and not t.name.startswith(prefix):
            continue
        name = t.name[len(prefix) :] if prefix else t.name
        if t.kind == "bytes":
            blobs.append(t.name)
            continue
        if not name:
            raise ExportError(f"tensor {t.name!r}: the prefix {prefix!r} leaves it no name")
        out = cast if cast is not None and t.dtype in _FLOATS and len(t.shape) > 0 else t.dtype
        if fmt == "safetensors":
            _storable(t.name, name, t.dtype, out)
        numel = 1
        for s in t.shape:
            numel *= int(s)
        items.append(
            _Item(t.name, name, t.dtype, out, tuple(int(s) for s in t.shape), numel * dtype_info(out).itemsize)
        )
    values = [k for k in ck.metadata.values if not prefix or k.startswith(prefix)]
    for k in values:
        if prefix and k == prefix:
            raise ExportError(f"value {k!r}: the prefix {prefix!r} leaves it no name")
    items.sort(key=lambda it: it.name)
    names = [it.name for it in items]
    if len(set(names)) != len(names):  # cannot happen: the checkpoint's names are unique
        raise ExportError("two tensors would be written under one name")
    return items, blobs, values


def _storable(source: str, name: str, saved: str, out: str) -> None:
    """Refuse what a safetensors file cannot hold, naming the tensor."""
    called = repr(source) + (f" (written as {name!r})" if name != source else "")
    if name == RESERVED:
        raise ExportError(
            f"tensor {called}: {RESERVED!r} is the safetensors header's reserved key (the file's metadata), "
            "so no tensor can be written under it; rename it, or export with --format torch"
        )
    if out not in SAFETENSORS_DTYPES:
        cast = f" (cast to {out} by --dtype)" if out != saved else ""
        raise ExportError(
            f"tensor {called} is {out}{cast}, which safetensors cannot hold (it holds {', '.join(SAFETENSORS_DTYPES)}); "
            "leave it out with --prefix, or export with --format torch"
        )


def _values_doc(ck: Checkpoint, prefix: str | None, blobs: list[str], values: list[str], read_buffer: int) -> bytes:
    """``goodput_values.json``: the values re-encoded in this format version (decoded in the
    source's own), the blobs as base64 bytes values; names without ``prefix``."""
    import base64

    cut = len(prefix) if prefix else 0
    md = ck.metadata
    out_values = {k[cut:]: encode_value(decode_value(md.values[k], k, md.version), k) for k in values}
    out_blobs = {
        k[cut:]: base64.b64encode(ck.read(k, raw=True, read_buffer=read_buffer).tobytes()).decode("ascii")
        for k in blobs
    }
    doc = {"format": VALUES_FORMAT, "version": FORMAT_VERSION, "values": out_values, "blobs": out_blobs}
    return (json.dumps(doc, indent=1, sort_keys=True, allow_nan=False) + "\n").encode()


def _tensor(ck: Checkpoint, it: _Item, read_buffer: int, threads: int) -> Any:
    import torch

    raw = ck.read(it.source, raw=True, read_buffer=read_buffer, threads=threads)
    t = torch.from_numpy(raw.reshape(-1).view("u1")).view(getattr(torch, it.dtype)).reshape(it.shape)
    if it.out_dtype != it.dtype:
        t = t.to(getattr(torch, it.out_dtype))
    return t


def _check_destination(storage: Storage, dst: Path, overwrite: bool, fmt: str) -> None:
    if fmt == "torch":
        # a local directory cannot be replaced by the file (os.replace fails after the whole model was
        # read into memory); said first, and never as "pass --overwrite". (On s3://, an object and a
        # prefix of one name coexist.)
        if isinstance(storage, PosixStorage) and os.path.isdir(dst):
            raise ExportError(
                f"{display(dst)!r} is a directory; --format torch writes one file: name the file (e.g. "
                f"{display(dst / 'model.pt')!r})"
            )
        if storage.exists(dst.parent, dst.name) and not overwrite:
            raise ExportError(f"{display(dst)!r} exists (pass overwrite=True / --overwrite to replace it)")
        return
    try:
        held = storage.list(dst)
    except (FileNotFoundError, NotADirectoryError) as e:
        if isinstance(e, NotADirectoryError) or (os.path.exists(dst) and not os.path.isdir(dst)):
            raise ExportError(f"the destination {display(dst)!r} exists and is not a directory") from None
        return
    if any(e.name == EXPORTING for e in held):
        refuse_running(storage, dst)
    if held and not overwrite:
        unfinished = any(e.name == EXPORTING for e in held)
        raise ExportError(
            f"the destination {display(dst)!r} is not empty ({len(held)} entries, e.g. {held[0].name!r}"
            + ("; an earlier export into it did not finish" if unfinished else "")
            + "; pass overwrite=True / --overwrite to write into it)"
        )


def _remove_dead_temps(parent: Path, name: str) -> None:
    """A killed ``--format torch`` export's temporary file (``.<name>.tmp-<pid>`` beside the file,
    as large as the model): removed when that process is gone, never a running export's."""
    pattern = re.compile(rf"^\.{re.escape(name)}\.tmp-(\d+)\Z")
    with contextlib.suppress(OSError):
        for e in os.scandir(parent):
            m = pattern.match(e.name)
            if m is None or not e.is_file(follow_symlinks=False) or int(m.group(1)) == os.getpid():
                continue
            try:
                os.kill(int(m.group(1)), 0)
            except ProcessLookupError:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(e.path)
            except (PermissionError, OverflowError):
                continue  # alive under another user, or no such pid: left as it is


def _umask() -> int:
    """The process's umask, read without setting it (``os.umask`` sets it: a race with threads
    creating files meanwhile)."""
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _write(storage: Storage, dst: Path, name: str, fill: Callable[[str], None]) -> None:
    """Write one file: ``fill(local_path)`` makes it; on POSIX it is renamed into place, on an
    object store it is uploaded (in slices: never a second copy in memory) and the local
    temporary file removed."""
    if isinstance(storage, PosixStorage):
        tmp = dst / f".{name}.tmp-{os.getpid()}"
        try:
            fill(str(tmp))
            # as any file the user's process makes (safetensors' writer creates it 0600): an
            # exported model is for others to read, which the user's umask decides
            os.chmod(tmp, 0o666 & ~_umask())
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            os.replace(tmp, dst / name)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        return
    fd, tmp = tempfile.mkstemp(prefix=".goodput-export-", suffix=".part")
    os.close(fd)
    try:
        fill(tmp)
        sink = storage.create(dst, name)
        try:
            with open(tmp, "rb") as f:
                buf = bytearray(UPLOAD_SLICE)
                mv = memoryview(buf)
                while True:
                    n = f.readinto(buf)
                    if not n:
                        break
                    sink.write(mv[:n])
            sink.finish()
        finally:
            sink.close()
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def export(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    *,
    format: str = "safetensors",  # noqa: A002 - the CLI's --format
    prefix: str | None = None,
    dtype: str | None = None,
    max_shard_size: int | str = "5GB",
    overwrite: bool = False,
    progress: Progress | None = None,
    read_buffer: int = 64 << 20,
    threads: int | None = None,
) -> ExportResult:
    """Write the tensors of the goodput checkpoint ``src`` as full tensors at ``dst``.

    ``format="safetensors"``: Hugging Face's layout in the directory (or ``s3://`` prefix)
    ``dst``, shards of at most ``max_shard_size`` (bytes, or ``"5GB"``, ``"500MiB"``); memory
    holds one shard's tensors at a time. ``format="torch"``: one ``torch.save`` file ``dst`` of
    ``{name: tensor}``, refused when the tensors exceed ``max_shard_size`` (it is built in memory).
    ``prefix``: only tensors under that dotted path, written without it (``"model."`` or
    ``"model"`` takes the model out of ``{"model": ..., "optim": ...}``, not ``model_ema``). ``dtype``: floating tensors cast to
    ``"bf16"``, ``"fp16"`` or ``"fp32"``; others, and 0-d ones (an optimizer's ``step``), are written as saved.
    """
    t0 = time.perf_counter()
    if format not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {format!r}")
    cast = None
    if dtype is not None:
        cast = CASTS.get(str(dtype).lower())
        if cast is None:
            raise ValueError(f"dtype must be one of {sorted(CASTS)}, got {dtype!r}")
    if isinstance(max_shard_size, str):
        from goodput.plan.units import parse_size

        max_shard_size = parse_size(max_shard_size)
    if isinstance(max_shard_size, bool) or not (isinstance(max_shard_size, int) and max_shard_size > 0):
        raise ValueError(f"max_shard_size must be a positive number of bytes, got {max_shard_size!r}")
    src_p, dst_p = Path(src), Path(dst)
    if _same_location(src_p, dst_p):
        raise ExportError(f"the destination {display(dst_p)!r} is the checkpoint itself; choose another")
    if _contains(src_p, dst_p):
        raise ExportError(
            f"the destination {display(dst_p)!r} is inside the checkpoint {display(src_p)!r} (the export would "
            "write into the checkpoint's own directory); choose a destination outside it"
        )
    if prefix and not prefix.endswith("."):
        prefix += "."  # a dotted path: "model" must not take "model_ema.*" or write ".weight"
    ck = Checkpoint(src_p)
    items, blobs, values = _select(ck, prefix, cast, format)
    skipped: dict[str, str] = {}
    carried: list[str] = []
    if format == "torch":  # one {name: tensor} file: no place for them, each reported
        skipped = {k: "an io.BytesIO blob, not a tensor" for k in blobs}
        skipped.update({k: "a value, not a tensor" for k in values})
    if not items:
        raise ExportError(
            f"no tensor of {display(src_p)!r} to export"
            + (
                f" under the prefix {prefix!r} (its names: {', '.join(repr(n) for n in ck.keys()[:5])}...)"
                if prefix
                else ""
            )
        )
    total = sum(it.nbytes for it in items)
    storage = storage_for(dst_p)
    _check_destination(storage, dst_p, overwrite, format)
    if threads is None:
        threads = ck.storage.read_threads
    if progress:
        progress("total", total)
    files: list[str] = []
    aborted: list[str] = []
    if format == "torch":
        if total > max_shard_size:
            raise ExportError(
                f"--format torch builds the file in memory: {total} bytes of tensors exceed max_shard_size "
                f"{max_shard_size}; raise it or export as safetensors"
            )
        import torch

        tensors = {}
        for it in items:
            tensors[it.name] = _tensor(ck, it, read_buffer, threads)
            if progress:
                progress("read", it.nbytes)
        storage.prepare(dst_p.parent)
        if isinstance(storage, PosixStorage):
            _remove_dead_temps(dst_p.parent, dst_p.name)
        _write(storage, dst_p.parent, dst_p.name, lambda p: torch.save(tensors, p))
        files.append(dst_p.name)
        if progress:
            progress("shard", 1)
    else:
        fresh = not _holds_anything(storage, dst_p)
        storage.prepare(dst_p)
        hold = acquire(storage, dst_p, src_p, overwrite)  # refuses a running export's destination
        try:
            try:
                aborted = _abort_dead_uploads(
                    storage, dst_p, hold, _names(items, max_shard_size, bool(blobs or values))
                )
                if overwrite:
                    _sweep(storage, dst_p, keep=[EXPORTING])
                _write_safetensors(
                    storage,
                    ck,
                    dst_p,
                    items,
                    (prefix, blobs, values),
                    max_shard_size,
                    files,
                    progress,
                    (read_buffer, threads),
                )
            except BaseException:
                _undo(storage, dst_p, files, fresh, hold)
                raise
            if blobs or values:
                carried = sorted(k[len(prefix) if prefix else 0 :] for k in blobs + values)
            if overwrite:  # what the first sweep could not remove: it would mislead a loader beside this export
                _sweep(storage, dst_p, keep=[*files, EXPORTING])
            _finish(storage, dst_p, hold)
        finally:
            hold.release()
    return ExportResult(
        display(dst_p), format, files, len(items), total, skipped, carried,
        seconds=time.perf_counter() - t0, aborted=aborted if format != "torch" else [],
    )  # fmt: skip


def _same_location(src: Path, dst: Path) -> bool:
    """Whether ``dst`` names the checkpoint ``src`` itself: by resolved path locally (``a/../ck``,
    a link to it), by bucket and key on an object store."""
    s, d = display(src), display(dst)
    if s.startswith("s3://") or d.startswith("s3://"):
        if not (s.startswith("s3://") and d.startswith("s3://")):
            return False
        from ..storage.s3 import split

        try:
            return split(s) == split(d)
        except ValueError:
            return s.rstrip("/") == d.rstrip("/")
    return os.path.realpath(src) == os.path.realpath(dst)


def _parts(location: Path | str) -> tuple[str, ...] | None:
    """A location as components: ``("s3", bucket, *key parts)``, or a resolved local path's
    parts; None for an ``s3://`` URL with no bucket."""
    s = display(location)
    if s.startswith("s3://"):
        parts = tuple(p for p in s[len("s3://") :].split("/") if p not in ("", "."))
        return ("s3", *parts) if parts else None
    return Path(os.path.realpath(location)).parts


def _contains(outer: Path | str, inner: Path | str) -> bool:
    """Whether ``inner`` lies strictly inside ``outer``: by resolved path (``ck/../ck/hf``, a link
    into ``ck``), by bucket and key components on an object store (``ck2`` is not in ``ck``)."""
    o, i = _parts(outer), _parts(inner)
    return o is not None and i is not None and len(i) > len(o) and i[: len(o)] == o


def _stale(name: str) -> bool:
    """An earlier export's file (or this exporter's leftover temporary file) in the destination."""
    return name in (INDEX, SINGLE, VALUES) or bool(_SHARD.match(name) or _TEMP.match(name))


def _sweep(storage: Storage, dst: Path, keep: list[str]) -> None:
    """Remove an earlier export from ``dst``: the index first (a reader that follows it must
    not find a mix), then its shards, values and leftover temporary files."""
    names = [e.name for e in storage.list(dst) if e.name not in keep and _stale(e.name)]
    if INDEX in names:
        storage.remove(dst, INDEX)
        storage.sync(dst)
    for n in names:
        if n != INDEX:
            storage.remove(dst, n)
    storage.sync(dst)


def _finish(storage: Storage, dst: Path, hold: Hold) -> None:
    """Every file durably in place, then the marker removed (only if it is still this export's):
    the export is whole."""
    storage.sync(dst)
    held = read_marker(storage, dst)
    if held is None or held.note.get("token") != hold.token:
        other = f" ({who(held.note)})" if held is not None else ""
        raise ExportError(
            f"the export into {display(dst)!r} wrote every file, but its marker {EXPORTING} was "
            + ("removed" if held is None else f"replaced by another export's{other}")
            + " while it ran (someone removed it by hand?): the files may be a mix of two exports; export again"
        )
    remove_marker(storage, dst, hold.etag)
    storage.sync(dst)
    if storage.exists(dst, EXPORTING):
        raise ExportError(
            f"the export into {display(dst)!r} is complete, but its marker {EXPORTING} could not be removed "
            "(loaders refuse the directory while it is there); remove it"
        )


def _names(items: list[_Item], max_shard_size: int, extras: bool) -> set[str]:
    """The names this export writes."""
    n = len(plan_shards(items, max_shard_size))
    return {shard_name(i, n) for i in range(n)} | ({VALUES} if extras else set()) | ({INDEX} if n > 1 else set())


def _abort_dead_uploads(storage: Storage, dst: Path, hold: Hold, names: set[str]) -> list[str]:
    """On s3://: abort the incomplete multipart uploads a dead export left in ``dst`` (a killed
    upload holds billed space, and no listing shows it). Only keys ``dst/<name>`` of this
    exporter's own file names, opened before this export took ``dst``, and either while the
    dead export's marker (taken over) stood, or under exactly a name this export writes; never
    another key under the prefix, nor one a level down: they may be someone else's. Best effort:
    a failure leaves the upload (docs/S3.md). Returns the keys aborted."""
    if isinstance(storage, PosixStorage) or not hasattr(storage, "client"):
        return []
    from ..storage.s3 import split

    client = storage.client()  # type: ignore[attr-defined]
    bucket, prefix = split(dst)
    pre = f"{prefix}/" if prefix else ""
    out: list[str] = []
    with contextlib.suppress(Exception):
        for page in client.get_paginator("list_multipart_uploads").paginate(Bucket=bucket, Prefix=pre):
            for u in page.get("Uploads", []):
                name = u["Key"][len(pre) :]
                if "/" in name or not _stale(name) or _TEMP.match(name):
                    continue
                t = u["Initiated"].timestamp() if u.get("Initiated") else None
                if t is not None and hold.since is not None and t > hold.since + 1:
                    continue  # opened after this export took dst: not a dead one's
                dead = t is not None and hold.taken_from is not None and t >= hold.taken_from - 2  # 1 s clocks
                if not (dead or name in names):
                    continue
                with contextlib.suppress(Exception):
                    client.abort_multipart_upload(Bucket=bucket, Key=u["Key"], UploadId=u["UploadId"])
                    out.append(f"s3://{bucket}/{u['Key']}")
    return out


def _holds_anything(storage: Storage, dst: Path) -> bool:
    try:
        return bool(storage.list(dst))
    except (FileNotFoundError, NotADirectoryError):
        return False


def _undo(storage: Storage, dst: Path, files: list[str], fresh: bool, hold: Hold) -> None:
    """A failed export removes what it wrote: a shard without its index is not a model (a loader
    given ``strict=False`` would take part of one), and a destination it created is removed too.
    Its marker goes last, only when it is still this export's and no export's file is left (a
    removal can fail)."""
    for name in files:
        with contextlib.suppress(OSError):
            storage.remove(dst, name)
    files.clear()
    with contextlib.suppress(Exception):  # the export's own error is the one to raise
        held = read_marker(storage, dst)
        if (
            held is not None
            and held.note.get("token") == hold.token
            and not any(_stale(e.name) for e in storage.list(dst))
        ):
            remove_marker(storage, dst, hold.etag)
    if fresh:
        with contextlib.suppress(OSError):
            if not storage.list(dst):
                storage.remove_tree(dst)


def _write_safetensors(
    storage: Storage,
    ck: Checkpoint,
    dst: Path,
    items: list[_Item],
    extras: tuple[str | None, list[str], list[str]],
    max_shard_size: int,
    files: list[str],
    progress: Progress | None,
    read: tuple[int, int],
) -> None:
    """The shards, then the values, then the index, each appended to ``files`` once written."""
    from safetensors.torch import save_file

    prefix, blobs, values = extras
    read_buffer, threads = read
    shards = plan_shards(items, max_shard_size)
    weight_map: dict[str, str] = {}
    for i, shard in enumerate(shards):
        name = shard_name(i, len(shards))
        tensors = {}
        for it in shard:
            tensors[it.name] = _tensor(ck, it, read_buffer, threads)
            weight_map[it.name] = name
            if progress:
                progress("read", it.nbytes)
        _write(storage, dst, name, lambda p, t=tensors: save_file(t, p, metadata={"format": "pt"}))
        tensors = {}
        files.append(name)
        if progress:
            progress("shard", i + 1)
    if blobs or values:  # before the index: a loader that finds the index finds them too
        storage.publish(dst, VALUES, _values_doc(ck, prefix, blobs, values, read_buffer))
        files.append(VALUES)
    if len(shards) > 1:
        index = {"metadata": {"total_size": sum(it.nbytes for it in items)}, "weight_map": weight_map}
        storage.publish(dst, INDEX, (json.dumps(index, indent=2, sort_keys=True) + "\n").encode())
        files.append(INDEX)
