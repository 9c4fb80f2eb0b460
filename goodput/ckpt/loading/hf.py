"""Hugging Face safetensors checkpoints, read into any layout without materializing them.

A Hugging Face checkpoint directory holds ``*.safetensors`` files and, when sharded,
``model.safetensors.index.json`` (``weight_map``: tensor name -> file). Every tensor there is one
whole, row-major, contiguous byte range of one file: to goodput that is a checkpoint whose every
tensor is a single chunk. So this module describes the directory as goodput metadata (one chunk
per tensor, no checksums: safetensors has none) and the ordinary load path does the rest: the
read plan intersects each rank's DTensor / LocalShard / FlatShard regions with those chunks, and
each rank reads only the byte runs its regions cover (an FSDP2 rank reads its rows of each
tensor, nothing else), cast into the target's dtype where they differ.

Headers are read by the ``safetensors`` library itself (``safe_open``: names in file order,
shapes, dtypes; it refuses a malformed header, overlapping or out-of-file ranges); since a valid
file's data is packed without holes in that order, each tensor's offset follows from the sizes
before it, and the file's length is checked against the 8-byte header length and those sizes.
A directory is local (the Hugging Face Hub cache's links to blobs are followed) or an
``s3://bucket/prefix``: every byte goes through the storage seam (:mod:`goodput.ckpt.storage`),
so from an object store a load fetches each file's header and then exactly the byte ranges its
shards need, as from a disk.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import stat
import struct
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CheckpointError
from ..format.dtypes import dtype as dtype_info
from ..format.format import (
    FORMAT_VERSION,
    MANIFEST,
    FileEntry,
    Metadata,
    TensorEntry,
    check_file_name,
    decode_value,
    no_duplicate_keys,
    shape_error,
)
from ..storage.base import Source, Storage
from ..storage.local import PosixSource, PosixStorage
from ..storage.location import as_location, display, storage_for
from .read_exec import DEFAULT_READ_BUFFER, ReadStats, read_requests
from .read_plan import ReadPlanner, Request

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"  # Hugging Face's unsharded layout: read alone when there is no index
SINGLE = "model.safetensors"
MAX_INDEX_BYTES = 64 << 20
VALUES = "goodput_values.json"  # what goodput's export carried beside the tensors
VALUES_FORMAT = "goodput.values"
MAX_HEADER_BYTES = 100_000_000  # the safetensors library's own limit on a header
#: written by ``goodput ckpt export`` before it touches the destination, removed once the index
#: (the last file) is in place: a directory holding it is an export that did not finish (or is
#: still running: the marker is also the export's lock on the destination, goodput.ckpt.compat.exporter)
EXPORTING = ".goodput-export-in-progress"
#: one file of a sharded set, ``<stem>-00001-of-00008.safetensors``: its set needs
#: ``<stem>.safetensors.index.json`` (without it, nothing says whether the set is whole)
SHARDED = re.compile(r"^(?P<stem>.+)-\d{5,}-of-\d{5,}\.safetensors\Z")

#: safetensors' dtype names -> goodput's
HF_DTYPES = {
    "BOOL": "bool",
    "U8": "uint8",
    "I8": "int8",
    "I16": "int16",
    "U16": "uint16",
    "I32": "int32",
    "U32": "uint32",
    "I64": "int64",
    "U64": "uint64",
    "F16": "float16",
    "BF16": "bfloat16",
    "F32": "float32",
    "F64": "float64",
    "C64": "complex64",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2FNUZ": "float8_e5m2fnuz",
    "F8_E8M0": "float8_e8m0fnu",
}


def is_hf_dir(path: str | os.PathLike) -> bool:
    """A directory (or ``s3://`` prefix) with safetensors files or their index, or an unfinished
    export's marker (:data:`EXPORTING`, so that the load says so), and no goodput manifest. A
    storage that cannot answer raises (:class:`StorageError`): never "not one"."""
    s = os.fspath(path)
    if not isinstance(s, str):
        return False
    if s.startswith("s3:/"):
        try:
            names = {e.name for e in storage_for(s).list(as_location(s)) if e.kind == "file"}
        except FileNotFoundError:  # nothing under the prefix
            return False
        return MANIFEST not in names and (
            INDEX in names or EXPORTING in names or any(n.endswith(".safetensors") for n in names)
        )
    if not os.path.isdir(s):
        return False
    if os.path.lexists(os.path.join(s, MANIFEST)):
        return False
    if os.path.lexists(os.path.join(s, INDEX)) or os.path.lexists(os.path.join(s, EXPORTING)):
        return True
    try:
        return any(n.endswith(".safetensors") for n in os.listdir(s))
    except OSError:
        return False


def _open_file(path: str, what: str) -> int:
    """Open a file of the directory, following links (the Hub's cache is links to blobs), and
    refuse anything but a regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise CheckpointError(f"{what} {path!r} is missing") from None
    except OSError as e:
        raise CheckpointError(f"{what} {path!r} cannot be opened: {e.strerror or e}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise CheckpointError(f"{what} {path!r} is not a regular file; refusing to read it")
    if hasattr(os, "O_NONBLOCK"):
        os.set_blocking(fd, True)
    return fd


def _inside(fd: int, path: str, directory: Path, what: str) -> None:
    """Refuse a file a link led outside the directory, or outside the Hub cache's ``blobs/`` for
    a ``snapshots/<rev>/`` directory: a downloaded directory whose link names ``/etc/shadow``
    or another user's model must not be read as this model. The file checked is the one opened
    (its descriptor's path), not a second look up of the name."""
    real_dir = os.path.realpath(directory)
    roots = [real_dir]
    if os.path.basename(os.path.dirname(real_dir)) == "snapshots":
        roots.append(os.path.join(os.path.dirname(os.path.dirname(real_dir)), "blobs"))
    try:
        real = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        real = os.path.realpath(path)
    if not any(os.path.commonpath([real, r]) == r for r in roots):
        raise CheckpointError(
            f"{what} {path!r} is a link to {real!r}, outside the directory "
            f"(links are followed only within it, or to the Hub cache's blobs/); refusing to read it"
        )


class _LinkFollowingStorage(PosixStorage):
    """POSIX reads that follow links inside a Hugging Face directory (goodput's own checkpoints
    never follow one)."""

    def open(self, directory: Path, name: str, what: str, size: int | None = None) -> Source:
        path = os.path.join(directory, name)
        fd = _open_file(path, what)
        try:
            _inside(fd, path, directory, what)
        except BaseException:
            os.close(fd)
            raise
        return PosixSource(fd, path)

    def get(self, directory: Path, name: str, what: str, limit: int) -> bytes:
        src = self.open(directory, name, what)
        try:
            if src.size > limit:
                raise CheckpointError(f"{src.name!r} is {src.size} bytes, more than the {limit} it may be")
            buf = bytearray(src.size)
            src.read_into(memoryview(buf), 0, what)
            return bytes(buf)
        finally:
            src.close()


def _storage(d: Path) -> Storage:
    """The storage the directory is read through: its own (``s3://``: the object store), or, for
    a local one, POSIX reads that follow the Hub cache's links."""
    st = storage_for(d)
    return _LinkFollowingStorage() if isinstance(st, PosixStorage) else st


def _json(raw: bytes, where: str) -> Any:
    """A JSON file of the directory (the index, the carried values), refusing a duplicate key:
    ``json`` keeps the last of two, so ``{"w": "a.safetensors", "w": "b.safetensors"}`` would
    load ``w`` from whichever file the writer (or an attacker) put last, in silence."""
    try:
        return json.loads(raw, object_pairs_hook=no_duplicate_keys)
    except ValueError as e:  # JSONDecodeError, and the hook's duplicate key
        raise CheckpointError(f"{where!r} is not valid JSON: {e}") from None
    except RecursionError:  # json's C scanner recurses per level: 200,000 brackets exhaust the stack
        raise CheckpointError(f"{where!r} is nested too deeply to be read") from None


def _index_files(st: Storage, d: Path) -> tuple[list[str], dict[str, str] | None]:
    """The safetensors files of the directory and the index's weight map (None without index).

    Refused: a directory an export into did not finish (its marker, :data:`EXPORTING`: the files
    may be part of one export or a mix of two), and shards of a set (``*-00001-of-00008``) without
    their index (a lone ``model.safetensors`` needs none: Hugging Face's unsharded layout)."""
    if st.exists(d, EXPORTING):
        raise CheckpointError(
            f"{display(d)!r} holds {EXPORTING}: an export into it did not finish (it is still "
            "running, or it was killed or failed partway), so its files may be part of one export or a mix of two; "
            "wait for it to finish, or export again"
        )
    where = display(d / INDEX)
    raw = st.get_if_exists(d, INDEX, "safetensors index", MAX_INDEX_BYTES)
    if raw is not None:
        doc = _json(raw, where)
        wm = doc.get("weight_map") if isinstance(doc, dict) else None
        if not isinstance(wm, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in wm.items()):
            raise CheckpointError(f"{where!r} has no weight_map of tensor name -> file name")
        for f in set(wm.values()):
            check_file_name(f, where)
            if not f.endswith(".safetensors"):
                raise CheckpointError(f"{where!r} maps tensors to {f!r}, not a .safetensors file")
        return sorted(set(wm.values())), wm
    try:
        listed = st.list(d)
    except FileNotFoundError:
        listed = []
    files = sorted(e.name for e in listed if e.name.endswith(".safetensors") and e.kind in ("file", "link"))
    if not files:
        raise CheckpointError(f"{display(d)!r} holds no .safetensors file and no {INDEX}")
    names = {e.name for e in listed}
    for f in files:
        check_file_name(f, display(d))
        m = SHARDED.match(f)
        if m and f"{m['stem']}.safetensors.index.json" not in names:
            raise CheckpointError(
                f"{display(d)!r} holds {f!r}, one file of a sharded set, but no {m['stem']}.safetensors.index.json: "
                "a sharded checkpoint needs its index to say which files make it whole (an export that "
                "did not finish leaves shards without it); export again, or restore the index"
            )
    stems = {m["stem"] if (m := SHARDED.match(f)) else f for f in files}
    if len(stems) > 1:
        # Hugging Face's unsharded layout is model.safetensors alone (a sharded set, one stem, with
        # its index: diffusers' names); beside it a directory often holds other models' files (a
        # PEFT adapter_model.safetensors, Mistral's consolidated file): merged in, their tensors
        # were loaded too, or set aside, without a word
        if SINGLE in files:
            return [SINGLE], None
        raise CheckpointError(
            f"{display(d)!r} holds {len(files)} .safetensors files ({', '.join(files[:4])}"
            f"{', ...' if len(files) > 4 else ''}) and no {INDEX} nor {SINGLE}: which of them make the model is "
            f"not said; add the index (weight_map: tensor name -> file), or pass a directory holding only the "
            "model's file"
        )
    return files, None


def _describe_file(st: Storage, d: Path, name: str) -> tuple[int, list[tuple[str, str, list[int]]], int]:
    """(file size, [(tensor, goodput dtype, shape)] in file order, offset of the data), read by
    the safetensors library and checked against the file's length.

    Only the header is fetched (two reads: its length, then itself, bounded), on any storage.
    The library parses it from a sparse local copy the size of the file, the header in place
    and holes where the data is: it checks the header against that length as it would the file,
    and reading names, dtypes and shapes touches no data page, so no data byte is fetched."""
    from safetensors import safe_open

    path = display(d / name)
    src = st.open(d, name, "safetensors file")
    try:
        size = src.size
        if size < 8:
            raise CheckpointError(f"{path!r} is not a safetensors file ({size} bytes)")
        head = bytearray(8)
        src.read_into(memoryview(head), 0, path)
        (hlen,) = struct.unpack("<Q", head)
        if hlen > min(MAX_HEADER_BYTES, size - 8):
            raise CheckpointError(
                f"{path!r} is not a valid safetensors file: a header of {hlen} bytes in a file of {size}"
            )
        header = bytearray(hlen)
        src.read_into(memoryview(header), 8, path)
    finally:
        src.close()
    with tempfile.NamedTemporaryFile(prefix="goodput-hf-header-", suffix=".safetensors") as tmp:
        tmp.write(head + header)
        tmp.truncate(size)  # holes: no disk, no data
        tmp.flush()
        try:
            with safe_open(tmp.name, framework="numpy") as f:
                entries = []
                for k in f.offset_keys():
                    sl = f.get_slice(k)
                    entries.append((k, sl.get_dtype(), [int(x) for x in sl.get_shape()]))
        except Exception as e:  # the library's own refusal (SafetensorError, OSError...)
            raise CheckpointError(f"{path!r} is not a valid safetensors file: {type(e).__name__}: {e}") from None
    out = []
    total = 0
    for k, hf_dtype, shape in entries:
        gdt = HF_DTYPES.get(hf_dtype)
        if gdt is None:
            raise CheckpointError(f"{path!r}: tensor {k!r} has dtype {hf_dtype}, which goodput cannot load")
        bad = shape_error(shape)
        if bad:
            raise CheckpointError(f"{path!r}: tensor {k!r} {bad}")
        total += int(np.prod(shape, dtype=np.int64)) * dtype_info(gdt).itemsize
        out.append((k, gdt, shape))
    start = 8 + hlen
    if start + total != size:
        raise CheckpointError(
            f"{path!r}: header ({hlen} bytes) and tensors ({total} bytes) do not add up to the file's {size} bytes"
        )
    return size, out, start


def hf_metadata(d: Path, storage: Storage | None = None) -> tuple[Metadata, dict[str, str] | None]:
    """The directory as goodput metadata: one chunk per tensor, at its byte range in its file."""
    d = as_location(d)
    st = storage or _storage(d)
    files, weight_map = _index_files(st, d)
    tensors: list[TensorEntry] = []
    fentries: list[FileEntry] = []
    rows: list[tuple[int, int, int, list[int]]] = []  # file, offset, length, shape
    where: dict[str, str] = {}
    for fid, name in enumerate(files):
        size, entries, start = _describe_file(st, d, name)
        fentries.append(FileEntry(name, size, 0, 0, 0))
        pos = start
        for k, gdt, shape in entries:
            n = int(np.prod(shape, dtype=np.int64)) * dtype_info(gdt).itemsize
            if k in where:
                raise CheckpointError(f"{display(d)!r}: tensor {k!r} is in both {where[k]!r} and {name!r}")
            if weight_map is not None and weight_map.get(k) != name:
                placed = f"places in {weight_map[k]!r}" if k in weight_map else "does not list"
                raise CheckpointError(f"{display(d / name)!r} holds tensor {k!r}, which {INDEX} {placed}")
            where[k] = name
            tensors.append(TensorEntry(k, gdt, shape))
            rows.append((fid, pos, n, shape))
            pos += n
    if weight_map is not None:
        missing = sorted(set(weight_map) - set(where))
        if missing:
            raise CheckpointError(
                f"{INDEX} in {display(d)!r} names {len(missing)} tensors no file holds, e.g. {missing[0]!r} "
                f"(in {weight_map[missing[0]]!r})"
            )
    order = sorted(range(len(tensors)), key=lambda i: tensors[i].name)
    tensors = [tensors[i] for i in order]
    rows = [rows[i] for i in order]
    D = max([len(t.shape) for t in tensors], default=0)
    n = len(rows)
    cols = {
        "tensor": np.arange(n, dtype="<u4"),
        "file": np.array([r[0] for r in rows], "<u4"),
        "offset": np.array([r[1] for r in rows], "<i8"),
        "length": np.array([r[2] for r in rows], "<i8"),
        "crc32c": np.zeros(n, "<u4"),
        "block0": np.zeros(n, "<i8"),
        "blocks_crc32c": np.zeros(n, "<u4"),
        "flat_start": np.full(n, -1, "<i8"),
        "flat_count": np.zeros(n, "<i8"),
        "offsets": np.zeros((n, D), "<i8"),
        "sizes": np.array([list(r[3]) + [0] * (D - len(r[3])) for r in rows], "<i8").reshape(n, D),
    }
    md = Metadata("hf", 4096, tensors, fentries, {}, cols)
    return md, weight_map


def _carried(st: Storage, d: Path) -> tuple[dict[str, Any], int, dict[str, bytes]]:
    """What ``goodput ckpt export`` carried beside the tensors (``goodput_values.json``, see
    :mod:`goodput.ckpt.compat.exporter`): (values in their stored encoding, the format version
    that encoding is in, blobs). Nothing when the file is absent (any other Hugging Face
    directory); a malformed one is refused, naming it, never half-read."""
    import base64

    where = display(d / VALUES)
    raw = st.get_if_exists(d, VALUES, "goodput values", MAX_INDEX_BYTES)
    if raw is None:
        return {}, FORMAT_VERSION, {}
    doc = _json(raw, where)
    ok = isinstance(doc, dict) and doc.get("format") == VALUES_FORMAT and isinstance(doc.get("version"), int)
    values, blobs = (doc.get("values"), doc.get("blobs")) if ok else (None, None)
    if not (isinstance(values, dict) and isinstance(blobs, dict) and all(isinstance(v, str) for v in blobs.values())):
        raise CheckpointError(f"{where!r} is not a goodput values file (format, version, values, blobs)")
    version = doc["version"]
    if not 1 <= version <= FORMAT_VERSION:
        raise CheckpointError(f"{where!r}: format version {version} is not supported (max {FORMAT_VERSION})")
    for k, v in values.items():
        try:
            decode_value(v, f"{where}: value {k!r}", version)  # refuse a malformed value before any read
        except RecursionError:
            raise CheckpointError(f"{where}: value {k!r} is nested too deeply") from None
    out: dict[str, bytes] = {}
    for k, b in blobs.items():
        try:
            out[k] = base64.b64decode(b.encode("ascii"), validate=True)
        except (ValueError, UnicodeEncodeError):
            raise CheckpointError(f"{where}: blob {k!r} is not base64") from None
    both = set(values) & set(out)
    if both:
        raise CheckpointError(f"{where}: {sorted(both)[0]!r} is both a value and a blob")
    return values, version, out


class HFCheckpoint:
    """A Hugging Face safetensors directory opened for :func:`goodput.ckpt.load`: the same
    surface the loader uses of :class:`goodput.ckpt.loading.reader.Checkpoint`. No checksums exist to
    verify; what is read is exactly the byte runs the requests cover."""

    step = None

    def __init__(self, path: str | os.PathLike):
        self.path = as_location(path)
        self.storage = _storage(self.path)
        if isinstance(self.storage, PosixStorage) and not self.path.is_dir():
            raise CheckpointError(f"{str(self.path)!r} is not a directory")
        # the tensors' metadata plans and reads; the one the loader sees adds what the export
        # carried beside them: values, and blobs (served from memory by :meth:`read`)
        self._data, self.weight_map = hf_metadata(self.path, self.storage)
        values, version, self.blobs = _carried(self.storage, self.path)
        clash = sorted((set(values) | set(self.blobs)) & {t.name for t in self._data.tensors})
        if clash:
            raise CheckpointError(f"{display(self.path / VALUES)!r} names {clash[0]!r}, a tensor of the directory")
        blob_entries = [TensorEntry(k, "uint8", [len(b)], kind="bytes") for k, b in sorted(self.blobs.items())]
        self.metadata = dataclasses.replace(
            self._data, tensors=self._data.tensors + blob_entries, values=values, version=version
        )
        self._planner = ReadPlanner(self._data)

    @property
    def tensors(self) -> dict[str, TensorEntry]:
        return {t.name: t for t in self.metadata.tensors}

    def read_into(self, requests: list[Request], **kw: Any) -> ReadStats:
        kw["verify"] = False  # safetensors carries no checksums
        return read_requests(self.path, self._data, requests, planner=self._planner, storage=self.storage, **kw)

    def read(self, name: str, raw: bool = True, read_buffer: int = DEFAULT_READ_BUFFER, **kw: Any) -> np.ndarray:
        """A whole tensor as numpy, raw bits for the types numpy lacks; a carried blob's bytes."""
        if name in self.blobs:
            return np.frombuffer(self.blobs[name], np.uint8)
        tid = self._planner.tensor_id(name)
        t = self._data.tensors[tid]
        from ..format.geometry import Region

        dt = dtype_info(t.dtype)
        out = np.empty(tuple(t.shape), dtype=np.dtype(dt.raw))
        self.read_into(
            [Request(name, Region.whole(tuple(t.shape)), out.reshape(-1).view(np.uint8))], read_buffer=read_buffer
        )
        return out
