"""The on-disk format (specified in docs/FORMAT.md): manifest, global metadata, validation.

Nothing here trusts what it reads. Decoding checks types (msgspec, strict), then every column's
dtype and shape, then every chunk's file, offset, length and box against the tensor it claims to
belong to, before a single data byte is read. numpy only: the torch-free reader uses it.
"""

from __future__ import annotations

import base64
import enum
import functools
import math
import re
import struct
import sys
from dataclasses import dataclass, field
from typing import Any

import crc32c
import msgspec
import numpy as np

from ..errors import CheckpointError, SaveError
from .chunk_index import BoxTable, build_box_table_from, overlapping_chunks
from .dtypes import DTYPES, dtype
from .geometry import Region

FORMAT_NAME = "goodput.ckpt"
# 2: the value tags __int__, __complex__, __bytes__, __numpy__ and __torch__ (version 1 knew only
# __tuple__, __float__ and __dict__ and wrote a user's dict keyed by one of the new names as is)
FORMAT_VERSION = 2
MANIFEST = "MANIFEST.json"
LATEST = "latest"  # a Checkpointer's root: the name of its newest committed step directory
MAX_POINTER_BYTES = 4096
META_MAGIC = b"GPCKMETA"
ALIGN = 4096  # every chunk starts on a page boundary in its data file
DEFAULT_BLOCK = 4096  # bytes covered by one block checksum
MAX_NDIM = 32
MAX_INT_DIGITS = 100_000  # a decimal int in a value (read or written): bounded, as everything read
MAX_MANIFEST_BYTES = 64 << 20  # a manifest is a few hundred bytes plus the user's own dict
_FILE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}\Z")
_SAVE_ID_RE = re.compile(r"^[0-9a-f]{16,32}\Z")
# the step directories a Checkpointer writes under its root, and what latest() recognises
STEP_DIR = re.compile(r"^step_(\d{9,})\Z")
# the data files one save writes (its save id in each name), which a failed save's cleanup may remove
DATA_FILE = re.compile(r"^data-[0-9a-f]{16}-r\d{5,}-\d+\.bin\Z")


def step_dir_name(step: int) -> str:
    return f"step_{step:09d}"


def data_file_name(save_id: str, rank: int, index: int) -> str:
    return f"data-{save_id}-r{rank:05d}-{index}.bin"


def metadata_file_name(save_id: str) -> str:
    return f"metadata-{save_id}.bin"


class MetadataRef(msgspec.Struct, forbid_unknown_fields=False):
    name: str
    bytes: int
    crc32c: int


class Manifest(msgspec.Struct, forbid_unknown_fields=False):
    """Written last; its presence is what makes a checkpoint exist."""

    format: str
    version: int
    save_id: str
    created: float
    world_size: int
    metadata: MetadataRef
    data_bytes: int
    num_files: int
    num_tensors: int
    step: int | None = None
    user: dict[str, Any] = {}


class TensorEntry(msgspec.Struct):
    name: str
    dtype: str
    shape: list[int]
    kind: str = "torch"  # "torch" | "numpy" | "bytes" (an io.BytesIO): what the saver held


class FileEntry(msgspec.Struct):
    name: str
    bytes: int
    crc_offset: int
    crc_count: int
    rank: int


class ColumnEntry(msgspec.Struct):
    dtype: str
    shape: list[int]
    offset: int


class Header(msgspec.Struct):
    version: int
    save_id: str
    block_bytes: int
    ndim: int
    tensors: list[TensorEntry]
    files: list[FileEntry]
    values: dict[str, Any]
    columns: dict[str, ColumnEntry]
    # the manifest naming this metadata is sealed (ends in its own CRC-32C): a manifest that
    # lost its seal is then corrupt, not old. Absent in metadata written before seals (False).
    manifest_sealed: bool = False


# column name -> (dtype, is 2-D with ``ndim`` columns)
COLUMNS: dict[str, tuple[str, bool]] = {
    "tensor": ("<u4", False),
    "file": ("<u4", False),
    "offset": ("<i8", False),
    "length": ("<i8", False),
    "crc32c": ("<u4", False),
    "block0": ("<i8", False),
    "blocks_crc32c": ("<u4", False),  # crc32c of the chunk's slice of its file's block table
    "flat_start": ("<i8", False),
    "flat_count": ("<i8", False),
    "offsets": ("<i8", True),
    "sizes": ("<i8", True),
}


@dataclass
class Metadata:
    """Global metadata: every chunk of every tensor, as columns (one row per chunk)."""

    save_id: str
    block_bytes: int
    tensors: list[TensorEntry]
    files: list[FileEntry]
    values: dict[str, Any]
    cols: dict[str, np.ndarray]
    manifest_sealed: bool = False  # see Header.manifest_sealed
    # the format version it was written in: it decides how ``values`` decode (see decode_value)
    version: int = FORMAT_VERSION
    _tables: TensorTables | None = field(default=None, repr=False, compare=False)
    _box_table: Any = field(default=None, repr=False, compare=False)

    def box_table(self) -> Any:
        """The chunks' spatial index (:class:`goodput.ckpt.format.chunk_index.BoxTable`), built once."""
        if self._box_table is None:
            self._box_table = build_box_table(self)
        return self._box_table

    def tables(self) -> TensorTables:
        """Per-tensor lookups, built once (validation needs them too, so a decode pays for them)."""
        if self._tables is None:
            self._tables = TensorTables.build(self)
        return self._tables

    @property
    def num_chunks(self) -> int:
        return len(self.cols["tensor"])

    def region(self, i: int) -> Region:
        t = self.tensors[int(self.cols["tensor"][i])]
        d = len(t.shape)
        if self.cols["flat_start"][i] >= 0:
            return Region.flat(int(self.cols["flat_start"][i]), int(self.cols["flat_count"][i]), d)
        return Region.box(self.cols["offsets"][i, :d].tolist(), self.cols["sizes"][i, :d].tolist())

    def chunk_range(self, tensor_id: int) -> tuple[int, int]:
        """Rows [a, b) of a tensor's chunks (rows are sorted by tensor)."""
        bounds = self.tables().bounds
        return int(bounds[tensor_id]), int(bounds[tensor_id + 1])

    def describe_chunk(self, i: int) -> str:
        t = self.tensors[int(self.cols["tensor"][i])]
        f = self.files[int(self.cols["file"][i])]
        return f"chunk {self.region(i).describe()} of tensor {t.name!r} in file {f.name!r}"


@dataclass(frozen=True)
class TensorTables:
    """Per-tensor arrays indexed by tensor id, for vectorised planning and validation.

    Shapes are padded on the right with extent-1 dimensions to ``ndim`` columns, as the box
    columns are: tensors of any rank share one array, and no row-major address changes.
    """

    by_name: dict[str, int]
    itemsize: np.ndarray  # (T,)
    ndim: np.ndarray  # (T,)
    shape: np.ndarray  # (T, D), padded with 1
    numel: np.ndarray  # (T,)
    bounds: np.ndarray  # (T + 1,): rows [bounds[t], bounds[t+1]) hold tensor t's chunks

    @staticmethod
    def build(md: Metadata) -> TensorTables:
        T = len(md.tensors)
        D = max(md_ndim(md), 1)
        ndim = np.fromiter((len(t.shape) for t in md.tensors), np.int64, T)
        shape = np.ones((T, D), np.int64)
        for i, t in enumerate(md.tensors):
            if t.shape:
                shape[i, : len(t.shape)] = t.shape
        sizes = {name: dtype(name).itemsize for name in {t.dtype for t in md.tensors} if name in DTYPES}
        itemsize = np.fromiter((sizes.get(t.dtype, 1) for t in md.tensors), np.int64, T)
        bounds = np.searchsorted(md.cols["tensor"], np.arange(T + 1), side="left").astype(np.int64)
        return TensorTables(
            by_name={t.name: i for i, t in enumerate(md.tensors)},
            itemsize=itemsize,
            ndim=ndim,
            shape=shape,
            numel=shape.prod(axis=1) if T else np.zeros(0, np.int64),
            bounds=bounds,
        )


# --------------------------------------------------------------------------- values (JSON leaves)

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def build_box_table(md: Metadata) -> BoxTable:
    tables = md.tables()
    c = md.cols
    return build_box_table_from(
        tables.shape,
        tables.ndim,
        c["tensor"].astype(np.int64),
        c["flat_start"],
        c["flat_count"],
        c["offsets"],
        c["sizes"],
    )


NUMPY_KINDS = "biufc"  # numpy scalars kept: bool, ints, floats, complex (not longdouble: no exact JSON)
HOW_TO_SAVE = (
    "values may be None, bool, int, float, complex, str, bytes, list, tuple, dict, numpy scalars, "
    "torch.dtype, torch.device and torch.Size; save an object through its state_dict() (a Stateful), "
    "a tensor or numpy array as such, or pickle it yourself into bytes (kept opaque, never unpickled)"
)
# values live in the metadata's JSON header, which every rank's values share and a reader refuses
# beyond MAX_HEADER_BYTES: large blobs go where data goes, chunked and checksummed
HOW_TO_SAVE_LARGE = (
    "save large blobs as an io.BytesIO or a uint8 tensor/array (stored in the data files, chunked and "
    "checksummed), not as bytes or str values"
)
MAX_VALUE_DEPTH = 100  # lists, tuples and dicts within a value: deeper is refused at save, naming the key


def encode_value(v: Any, where: str = "", *, depth: int = 0) -> Any:
    """JSON-able leaves. What JSON cannot tell apart or hold is tagged (a one-key dict), so it
    comes back as it was: tuples, non-finite floats, ints beyond 64 bits, complex numbers, bytes
    (base64, opaque: never unpickled), numpy scalars (with their dtype), torch dtypes, devices and
    sizes. Anything else, and what no reader could read back (a string that is not UTF-8, an int
    of more than MAX_INT_DIGITS digits, nesting beyond MAX_VALUE_DEPTH, a single value larger than
    a header may be), is a TypeError naming the key and saying how to save it."""
    if depth == 0:
        _check_text(where, where, "key")  # the value's dotted name is its key in the header
    elif depth > MAX_VALUE_DEPTH:
        raise TypeError(
            f"{where!r}: nested more than {MAX_VALUE_DEPTH} levels deep; flatten it, or pickle it yourself into "
            "bytes (kept opaque, never unpickled)"
        )
    if isinstance(v, np.generic) and not isinstance(v, (np.str_, np.bytes_)):  # np.float64 is a float
        return _encode_numpy(v, where)
    if v is None or isinstance(v, bool):
        return v
    if isinstance(v, enum.Enum):
        # an IntEnum would come back a plain int, and str() of a str-mixin member is its name
        # ("Phase.WARMUP"), not its value: refused rather than changed in silence
        raise TypeError(
            f"{where!r}: an enum member ({type(v).__name__}.{v.name}) would not come back as one; "
            f"save its .value (or .name) and rebuild the member after loading"
        )
    if isinstance(v, str):
        _check_text(v, where, "string")
        _check_size(len(v), where, "string")
        return str.__str__(v)  # the characters, whatever a subclass's __str__ says (np.str_: docs/FORMAT.md)
    if isinstance(v, int):
        i = int.__int__(v)
        return i if INT64_MIN <= i <= INT64_MAX else {"__int__": int_to_decimal(i, where)}
    if isinstance(v, float):
        f = float.__float__(v)
        return f if math.isfinite(f) else {"__float__": repr(f)}
    if isinstance(v, complex):
        return {
            "__complex__": [encode_value(v.real, where, depth=depth + 1), encode_value(v.imag, where, depth=depth + 1)]
        }
    if isinstance(v, (bytes, bytearray, memoryview)):
        b = bytes(v)
        _check_size(4 * ((len(b) + 2) // 3), where, "bytes value")
        return {"__bytes__": base64.b64encode(b).decode("ascii")}
    if type(v).__module__ == "torch":
        return _encode_torch(v, where)
    d = depth + 1
    if isinstance(v, tuple):
        return {"__tuple__": [encode_value(x, f"{where}[{i}]", depth=d) for i, x in enumerate(v)]}
    if isinstance(v, list):
        return [encode_value(x, f"{where}[{i}]", depth=d) for i, x in enumerate(v)]
    if isinstance(v, dict):
        for k in v:
            if isinstance(k, str):
                _check_text(k, f"{where}[{k!r}]", "key")
        if not all(isinstance(k, str) for k in v) or (len(v) == 1 and next(iter(v)) in _TAGS):
            return {
                "__dict__": [
                    [encode_value(k, f"{where} key", depth=d), encode_value(x, f"{where}[{k!r}]", depth=d)]
                    for k, x in v.items()
                ]
            }
        return {k: encode_value(x, f"{where}.{k}", depth=d) for k, x in v.items()}
    raise TypeError(
        f"{where!r}: cannot checkpoint a value of type {type(v).__module__}.{type(v).__qualname__}; " + HOW_TO_SAVE
    )


def value_repr(v: Any, limit: int = 200) -> str:
    """A value as a message or a listing shows it: ``repr``, cut to ``limit`` characters, and an
    int too long for Python's str-digits limit as its digit count (repr would raise)."""
    try:
        r = repr(v)
    except ValueError:  # an int (possibly deep inside) beyond sys.get_int_max_str_digits()
        r = (
            f"<int of about {int(abs(v).bit_length() * math.log10(2)) + 1:,} digits>"
            if isinstance(v, int)
            else f"<{type(v).__name__} holding an int of more than {sys.get_int_max_str_digits():,} digits>"
        )
    return r if len(r) <= limit else r[: limit - 5] + " ...>"


def _check_text(s: str, where: str, what: str) -> None:
    """JSON is UTF-8: a lone surrogate (from a file name decoded with surrogateescape) has no encoding."""
    if s.isascii():
        return
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise TypeError(
            f"{where!r}: the {what} {s!r} is not valid Unicode (a lone surrogate at position {e.start}); "
            "save it as bytes (s.encode('utf-8', 'surrogateescape')) or clean it"
        ) from None


def _check_size(encoded: int, where: str, what: str) -> None:
    if encoded > MAX_HEADER_BYTES:
        raise TypeError(
            f"{where!r}: a {what} of {encoded:,} encoded bytes cannot fit in the metadata header "
            f"({MAX_HEADER_BYTES:,} bytes, shared by every value of every rank); " + HOW_TO_SAVE_LARGE
        )


# CPython refuses int <-> str conversions beyond sys.get_int_max_str_digits() digits (4300 by
# default, never less than 640 when set): big ints convert in pieces of fewer digits than that
_PIECE_DIGITS = 600
_PIECE = 10**_PIECE_DIGITS
_MAX_INT_BITS = math.ceil(MAX_INT_DIGITS * math.log2(10))  # a bound from below: the digits are counted too


def int_to_decimal(v: int, where: str) -> str:
    """An int's decimal digits, whatever Python's str-digits limit; beyond MAX_INT_DIGITS digits
    (a reader's bound on what it parses) a TypeError naming the key."""
    if v.bit_length() > _MAX_INT_BITS + 1:
        raise _too_many_digits(where)
    sign, v = ("-", -v) if v < 0 else ("", v)
    pieces: list[int] = []
    while v >= _PIECE:
        v, r = divmod(v, _PIECE)
        pieces.append(r)
    out = sign + str(v) + "".join(str(p).zfill(_PIECE_DIGITS) for p in reversed(pieces))
    if len(out) > MAX_INT_DIGITS:  # the sign counts: a reader bounds the string
        raise _too_many_digits(where)
    return out


def _too_many_digits(where: str) -> TypeError:
    return TypeError(
        f"{where!r}: an int of more than {MAX_INT_DIGITS:,} decimal digits (sign included) cannot be "
        "checkpointed (a reader refuses longer ones); save it as bytes (v.to_bytes(...)) or a uint8 array"
    )


def decimal_to_int(s: str) -> int:
    """The inverse of :func:`int_to_decimal` (``s`` already checked: ``-?[0-9]+``, bounded). Halves
    split recursively: a header read from storage may hold many ints of the most digits allowed."""
    if s.startswith("-"):
        return -_parse_digits(s[1:])
    return _parse_digits(s)


def _parse_digits(d: str) -> int:
    if len(d) <= _PIECE_DIGITS:
        return int(d)
    k = len(d) // 2
    return _parse_digits(d[:-k]) * _pow10(k) + _parse_digits(d[-k:])


@functools.lru_cache(maxsize=64)
def _pow10(k: int) -> int:
    return 10**k


def _encode_numpy(v: np.generic, where: str) -> Any:
    dt = v.dtype
    if dt.kind not in NUMPY_KINDS or (dt.kind in "fc" and dt.itemsize > (8 if dt.kind == "f" else 16)):
        raise TypeError(f"{where!r}: cannot checkpoint a numpy {dt} scalar; " + HOW_TO_SAVE)
    return {"__numpy__": [dt.str, encode_value(v.item(), where)]}


def _encode_torch(v: Any, where: str) -> Any:
    name = type(v).__name__
    if name == "dtype":
        return {"__torch__": ["dtype", str(v).removeprefix("torch.")]}
    if name == "device":
        return {"__torch__": ["device", str(v)]}
    if name == "Size":
        return {"__torch__": ["Size", [int(x) for x in v]]}
    raise TypeError(f"{where!r}: cannot checkpoint a value of type torch.{name}; " + HOW_TO_SAVE)


# a user dict with one of these as its only key is escaped (written as "__dict__" pairs)
_TAGS = ("__tuple__", "__float__", "__dict__", "__int__", "__complex__", "__bytes__", "__numpy__", "__torch__")
# the tags each format version wrote: a one-key dict keyed by any other name is a user's dict.
# Version 1 wrote {"__bytes__": ...} of a user's as it was; read with today's tags it would come
# back as bytes (or be refused as a malformed tag), not as the dict that was saved. But goodput
# from 2096bf8 to the version bump wrote the later tags under version 1 too (bytes, big ints,
# numpy and torch values: a torchtitan loader's state), so a version-1 dict keyed by a later tag
# reads as that tag when it is well formed (said in an AmbiguousValueWarning) and as the dict
# saved when it is not: the common checkpoint loads right, the rare one is never refused.
TAGS_BY_VERSION = {1: _TAGS[:3], 2: _TAGS}
_LATER_TAGS = frozenset(_TAGS[3:])


class AmbiguousValueWarning(UserWarning):
    """A version-1 value that two builds of goodput wrote differently was read one way."""


def decode_value(v: Any, where: str = "value", version: int = FORMAT_VERSION) -> Any:
    """The inverse of :func:`encode_value` of the format ``version`` the value was written in
    (the checkpoint's: :attr:`Metadata.version`), so that an old checkpoint loads exactly as it
    was saved. Values come from storage: a malformed tag is a :class:`CheckpointError` naming
    the value, never a bare ``ValueError`` from deep inside. torch is imported only for a torch
    value (the numpy-only reader never meets one otherwise)."""
    tags = TAGS_BY_VERSION.get(version)
    if tags is None:
        raise CheckpointError(f"{where}: format version {version} is not supported (max {FORMAT_VERSION})")
    return _decode(v, where, tags)


def _decode(v: Any, where: str, tags: tuple[str, ...]) -> Any:
    if isinstance(v, list):
        return [_decode(x, f"{where}[{i}]", tags) for i, x in enumerate(v)]
    if isinstance(v, dict):
        if len(v) == 1:
            ((k, x),) = v.items()
            if k in tags:
                return _decode_tag(k, x, where, tags)
            if k in _LATER_TAGS and tags is TAGS_BY_VERSION[1]:
                return _decode_later_tag_in_v1(k, x, where)
        return {k: _decode(x, f"{where}.{k}", tags) for k, x in v.items()}
    return v


def _decode_later_tag_in_v1(k: str, x: Any, where: str) -> Any:
    try:
        val = _decode_tag(k, x, where, _TAGS)
    except CheckpointError:  # not what a later build wrote: a user's dict of the older one
        return {k: _decode(x, f"{where}.{k}", TAGS_BY_VERSION[1])}
    import warnings

    warnings.warn(
        f"{where}: a format-version-1 checkpoint holds {{{k!r}: ...}}, read as the {k.strip('_')} value goodput "
        "wrote under version 1 from commit 2096bf8 on; if it was a dict of yours saved by an older goodput, its "
        "value as stored is in goodput.ckpt.open(path).metadata.values",
        AmbiguousValueWarning,
        stacklevel=2,
    )
    return val


def _decode_tag(k: str, x: Any, where: str, tags: tuple[str, ...]) -> Any:
    if k == "__tuple__":
        if not isinstance(x, list):
            raise CheckpointError(f"{where}: malformed tuple")
        return tuple(_decode(y, f"{where}[{i}]", tags) for i, y in enumerate(x))
    if k == "__float__":
        if x not in ("nan", "inf", "-inf"):
            raise CheckpointError(f"{where}: malformed float {x!r}")
        return float(x)
    if k == "__dict__":
        if not isinstance(x, list) or not all(isinstance(p, list) and len(p) == 2 for p in x):
            raise CheckpointError(f"{where}: malformed dict")
        out = {}
        for a, b in x:
            key = _decode(a, f"{where} key", tags)
            try:
                out[key] = _decode(b, f"{where}[{key!r}]", tags)
            except TypeError:  # an unhashable key (a list): never written by a save
                raise CheckpointError(f"{where}: unhashable key {key!r}") from None
        return out
    if k == "__int__":
        if not isinstance(x, str) or not 0 < len(x) <= MAX_INT_DIGITS or not re.fullmatch(r"-?[0-9]+", x):
            raise CheckpointError(f"{where}: malformed int")
        return decimal_to_int(x)
    if k == "__complex__":
        parts = [_decode(y, where, tags) for y in x] if isinstance(x, list) else None
        if parts is None or len(parts) != 2 or not all(isinstance(p, (int, float)) for p in parts):
            raise CheckpointError(f"{where}: malformed complex")
        return complex(parts[0], parts[1])
    if k == "__bytes__":
        if not isinstance(x, str):
            raise CheckpointError(f"{where}: malformed bytes")
        try:
            return base64.b64decode(x.encode("ascii"), validate=True)
        except (ValueError, UnicodeEncodeError):
            raise CheckpointError(f"{where}: malformed bytes (not base64)") from None
    if k == "__numpy__":
        return _decode_numpy(x, where)
    return _decode_torch(x, where)


def _decode_numpy(x: Any, where: str) -> Any:
    if not (isinstance(x, list) and len(x) == 2 and isinstance(x[0], str) and len(x[0]) <= 8):
        raise CheckpointError(f"{where}: malformed numpy scalar")
    try:
        dt = np.dtype(x[0])
    except TypeError:
        raise CheckpointError(f"{where}: numpy scalar of unknown dtype {x[0]!r}") from None
    if dt.kind not in NUMPY_KINDS:
        raise CheckpointError(f"{where}: numpy scalar of dtype {dt} is not a value goodput writes")
    val = _decode(x[1], where, _TAGS)
    if not isinstance(val, (bool, int, float, complex)):
        raise CheckpointError(f"{where}: malformed numpy scalar {val!r}")
    try:
        return dt.type(val)
    except (OverflowError, ValueError, TypeError):
        raise CheckpointError(f"{where}: {val!r} is not a numpy {dt}") from None


def _decode_torch(x: Any, where: str) -> Any:
    if not (isinstance(x, list) and len(x) == 2 and x[0] in ("dtype", "device", "Size")):
        raise CheckpointError(f"{where}: malformed torch value")
    import torch

    kind, val = x
    if kind == "dtype":
        dt = getattr(torch, val, None) if isinstance(val, str) and val.isidentifier() else None
        if not isinstance(dt, torch.dtype):
            raise CheckpointError(f"{where}: {val!r} is not a torch dtype")
        return dt
    if kind == "device":
        if not isinstance(val, str) or len(val) > 64:
            raise CheckpointError(f"{where}: malformed torch device")
        try:
            return torch.device(val)
        except RuntimeError:
            raise CheckpointError(f"{where}: {val!r} is not a torch device") from None
    if not isinstance(val, list) or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in val):
        raise CheckpointError(f"{where}: malformed torch.Size")
    return torch.Size(val)


# --------------------------------------------------------------------------- encode


def encode_metadata(md: Metadata) -> bytes:
    n = md.num_chunks
    columns: dict[str, ColumnEntry] = {}
    blobs: list[bytes] = []
    pos = 0
    for name, (dt, two_d) in COLUMNS.items():
        arr = np.ascontiguousarray(md.cols[name], dtype=dt)
        want = (n, md_ndim(md)) if two_d else (n,)
        if arr.shape != want:
            raise ValueError(f"column {name}: shape {arr.shape}, expected {want}")
        raw = arr.tobytes()
        columns[name] = ColumnEntry(dt, list(arr.shape), pos)
        pad = (-len(raw)) % 64
        blobs.append(raw + b"\0" * pad)
        pos += len(raw) + pad
    header = Header(
        version=md.version,
        save_id=md.save_id,
        block_bytes=md.block_bytes,
        ndim=md_ndim(md),
        tensors=md.tensors,
        files=md.files,
        values=md.values,
        columns=columns,
        manifest_sealed=md.manifest_sealed,
    )
    try:
        hj = msgspec.json.encode(header)
    except UnicodeEncodeError:  # a tensor's name (a value's was checked when it was encoded)
        bad = next((t.name for t in md.tensors if not _utf8(t.name)), None)
        raise SaveError(f"tensor name {bad!r} is not valid Unicode (a lone surrogate); rename it") from None
    if len(hj) > MAX_HEADER_BYTES:
        raise SaveError(header_too_large(len(hj), md))
    head = META_MAGIC + struct.pack("<Q", len(hj)) + hj
    head += b"\0" * ((-len(head)) % 64)
    return head + b"".join(blobs)


def _utf8(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def header_too_large(hlen: int, md: Metadata) -> str:
    """Why a save is refused before its commit: a reader refuses a header beyond MAX_HEADER_BYTES,
    so committing it would make a checkpoint nobody can load. Names the largest values."""
    sizes = sorted(((len(msgspec.json.encode(v)), k) for k, v in md.values.items()), reverse=True)
    top = ", ".join(f"{k!r} ({n:,} bytes)" for n, k in sizes[:5])
    rest = hlen - sum(n for n, _ in sizes)
    return (
        f"the checkpoint's metadata header would be {hlen:,} bytes, more than the {MAX_HEADER_BYTES:,} a reader "
        f"accepts: nothing was committed. Largest values (every rank's values share rank 0's header): "
        f"{top or 'none'}; tensor and file entries: {rest:,} bytes ({len(md.tensors):,} tensors, "
        f"{len(md.files):,} files). " + HOW_TO_SAVE_LARGE
    )


def md_ndim(md: Metadata) -> int:
    return max([len(t.shape) for t in md.tensors], default=0)


# --------------------------------------------------------------------------- decode + validate


_SEAL = re.compile(rb',"crc32c":(\d{1,10})\}\s*\Z')


def encode_manifest(m: Manifest) -> bytes:
    """The manifest's JSON, sealed: it ends in ``,"crc32c":N}`` where N is the CRC-32C of the
    same JSON without that member (the bytes up to it, closed by ``}``). The commit record is
    then protected like every other byte of a checkpoint."""
    body = msgspec.json.encode(m)
    return body[:-1] + b',"crc32c":%d}' % crc32c.crc32c(body)


def no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        dup = next(k for k in keys if keys.count(k) > 1)
        raise ValueError(f"duplicate key {dup!r}")
    return dict(pairs)


def decode_manifest(raw: bytes, where: str) -> Manifest:
    return decode_sealed_manifest(raw, where)[0]


def decode_sealed_manifest(raw: bytes, where: str) -> tuple[Manifest, bool]:
    """The manifest, and whether it carried its seal (see :func:`encode_manifest`); a broken seal,
    a duplicate key or any malformed field is a :class:`CheckpointError`."""
    import json

    seal = _SEAL.search(raw)
    if seal is not None and crc32c.crc32c(raw[: seal.start()] + b"}") != int(seal.group(1)):
        raise CheckpointError(f"{where}: manifest checksum does not match its content (corrupt)")
    try:
        json.loads(raw, object_pairs_hook=no_duplicate_keys)
        m = msgspec.json.decode(raw, type=Manifest)
    except (ValueError, msgspec.DecodeError, RecursionError) as e:
        raise CheckpointError(f"{where}: not a valid manifest ({e})") from None
    if m.format != FORMAT_NAME:
        raise CheckpointError(f"{where}: format {m.format!r} is not {FORMAT_NAME!r}")
    if m.version > FORMAT_VERSION or m.version < 1:
        raise CheckpointError(f"{where}: format version {m.version} is not supported (max {FORMAT_VERSION})")
    if not _SAVE_ID_RE.match(m.save_id):
        raise CheckpointError(f"{where}: malformed save_id {m.save_id!r}")
    check_file_name(m.metadata.name, where)
    if not (0 <= m.metadata.bytes < 1 << 48):
        raise CheckpointError(f"{where}: invalid metadata size {m.metadata.bytes}")
    if not (math.isfinite(m.created) and 0 <= m.created < 1e11):  # seconds since 1970, before year 5138
        raise CheckpointError(f"{where}: invalid creation time {m.created!r}")
    if not (1 <= m.world_size <= 1 << 24) or not (0 <= m.data_bytes < 1 << 62):
        raise CheckpointError(f"{where}: invalid world size {m.world_size} or data size {m.data_bytes}")
    if not (0 <= m.num_files < 1 << 32) or not (0 <= m.num_tensors < 1 << 32):
        raise CheckpointError(f"{where}: invalid file or tensor count ({m.num_files}, {m.num_tensors})")
    if m.step is not None and not (-(1 << 62) < m.step < 1 << 62):
        raise CheckpointError(f"{where}: invalid step {m.step}")
    return m, seal is not None


def check_file_name(name: str, where: str) -> None:
    """File names from storage must be plain names inside the checkpoint directory."""
    if not isinstance(name, str) or not _FILE_RE.match(name) or ".." in name:
        raise CheckpointError(f"{where}: refusing file name {name!r} (must be a plain name inside the checkpoint)")


MAX_HEADER_BYTES = 256 << 20  # the metadata's JSON header: tensors, files and values, not chunks


def header_length(head: bytes, where: str) -> int:
    """The JSON header's length, from the first 16 bytes of a metadata file (magic, u64)."""
    if len(head) < 16 or head[:8] != META_MAGIC:
        raise CheckpointError(f"{where}: not goodput metadata (bad magic)")
    (hlen,) = struct.unpack("<Q", head[8:16])
    if hlen > MAX_HEADER_BYTES:
        raise CheckpointError(f"{where}: header length {hlen} is more than the {MAX_HEADER_BYTES} a header may be")
    return int(hlen)


def metadata_need(head: bytes, where: str) -> tuple[int, int, list[str]]:
    """``(the most bytes the metadata file may have, its rows, its data files' names)``, from the
    magic, length and JSON header at the start of the file: a reader bounds what it reads by what
    the header can need before reading the rest."""
    hlen = header_length(head, where)
    if len(head) < 16 + hlen:
        raise CheckpointError(f"{where}: header length {hlen} exceeds the file")
    try:
        h = msgspec.json.decode(head[16 : 16 + hlen], type=Header)
    except (msgspec.DecodeError, RecursionError) as e:
        raise CheckpointError(f"{where}: malformed metadata header ({e})") from None
    body_start = 16 + hlen + ((-(16 + hlen)) % 64)
    end, rows = 0, 0
    for name, (dt, _two_d) in COLUMNS.items():
        c = h.columns.get(name)
        if c is None or not c.shape or any(not isinstance(x, int) or x < 0 for x in c.shape) or c.offset < 0:
            raise CheckpointError(f"{where}: metadata column {name!r} is missing or malformed")
        nbytes = int(np.prod(c.shape, dtype=np.float64)) * np.dtype(dt).itemsize
        end = max(end, c.offset + nbytes + (-nbytes) % 64)
        rows = max(rows, int(c.shape[0]))
    return body_start + end, rows, [f.name for f in h.files]


def decode_metadata(raw: bytes, where: str, manifest: Manifest | None = None) -> Metadata:
    if manifest is not None:
        if len(raw) != manifest.metadata.bytes:
            raise CheckpointError(
                f"{where}: metadata is {len(raw)} bytes, the manifest says {manifest.metadata.bytes} "
                "(truncated, or from another checkpoint)"
            )
        if crc32c.crc32c(raw) != manifest.metadata.crc32c:
            raise CheckpointError(
                f"{where}: metadata checksum does not match the manifest (corrupt or from another checkpoint)"
            )
    if len(raw) < 16 or raw[:8] != META_MAGIC:
        raise CheckpointError(f"{where}: not goodput metadata (bad magic)")
    (hlen,) = struct.unpack("<Q", raw[8:16])
    if hlen > len(raw) - 16:
        raise CheckpointError(f"{where}: header length {hlen} exceeds the file")
    try:
        h = msgspec.json.decode(raw[16 : 16 + hlen], type=Header)
    except (msgspec.DecodeError, RecursionError) as e:
        raise CheckpointError(f"{where}: malformed metadata header ({e})") from None
    if h.version > FORMAT_VERSION or h.version < 1:
        raise CheckpointError(f"{where}: metadata version {h.version} is not supported")
    if manifest is not None and h.version != manifest.version:
        raise CheckpointError(
            f"{where}: metadata is format version {h.version}, its manifest version {manifest.version} "
            "(the version decides how values decode: they must agree)"
        )
    if manifest is not None and h.save_id != manifest.save_id:
        raise CheckpointError(
            f"{where}: metadata belongs to save {h.save_id}, the manifest to save {manifest.save_id} "
            "(metadata from another checkpoint)"
        )
    if not (1 <= h.block_bytes <= 1 << 30) or h.block_bytes & (h.block_bytes - 1) or not (0 <= h.ndim <= MAX_NDIM):
        raise CheckpointError(f"{where}: bad block size {h.block_bytes} (a power of two) or ndim {h.ndim}")
    body_start = 16 + hlen + ((-(16 + hlen)) % 64)
    body = memoryview(raw)[body_start:]
    n = None
    cols: dict[str, np.ndarray] = {}
    for name, (dt, two_d) in COLUMNS.items():
        c = h.columns.get(name)
        if c is None:
            raise CheckpointError(f"{where}: metadata lacks column {name!r}")
        if c.dtype != dt:
            raise CheckpointError(f"{where}: column {name!r} has dtype {c.dtype}, expected {dt}")
        if n is None:
            n = c.shape[0] if c.shape else -1
        want = [n, h.ndim] if two_d else [n]
        if c.shape != want or n < 0:
            raise CheckpointError(f"{where}: column {name!r} has shape {c.shape}, expected {want}")
        nbytes = int(np.prod(want)) * np.dtype(dt).itemsize
        if c.offset < 0 or c.offset + nbytes > len(body):
            raise CheckpointError(f"{where}: column {name!r} lies outside the metadata file")
        cols[name] = np.frombuffer(body[c.offset : c.offset + nbytes], dtype=dt).reshape(want)
    md = Metadata(
        h.save_id,
        h.block_bytes,
        h.tensors,
        h.files,
        h.values,
        cols,
        manifest_sealed=h.manifest_sealed,
        version=h.version,
    )
    validate_metadata(md, where)
    return md


def shape_error(shape: Any) -> str | None:
    """Why a global shape cannot be in a checkpoint (the save refuses what a reader would):
    at most MAX_NDIM dimensions of 0..2^48, at most 2^50 elements, so that every offset and
    element count stays far inside int64."""
    if len(shape) > MAX_NDIM or any((not isinstance(s, int)) or s < 0 or s > 1 << 48 for s in shape):
        return f"has invalid shape {tuple(shape)}"
    if math.prod(shape) > 1 << 50:
        return f"is implausibly large {tuple(shape)}"
    return None


def validate_metadata(md: Metadata, where: str) -> None:
    """Reject metadata that could make a reader escape, overflow, or mis-read (before any read)."""
    width = md.cols["offsets"].shape[1] if md.cols["offsets"].ndim == 2 else -1
    if width != md_ndim(md) or md.cols["sizes"].shape[1:] != (width,):
        raise CheckpointError(
            f"{where}: box columns are {width} wide, the highest tensor rank is {md_ndim(md)} (they must agree)"
        )
    for t in md.tensors:
        if t.dtype not in DTYPES:
            raise CheckpointError(f"{where}: tensor {t.name!r} has unknown dtype {t.dtype!r}")
        bad = shape_error(t.shape)
        if bad:
            raise CheckpointError(f"{where}: tensor {t.name!r} {bad}")
    names = [t.name for t in md.tensors]
    if len(set(names)) != len(names):
        raise CheckpointError(f"{where}: duplicate tensor names")
    for f in md.files:
        check_file_name(f.name, where)
        if (
            not (0 <= f.bytes < 1 << 62)
            or f.crc_offset < 0
            or f.crc_count < 0
            or f.crc_offset + 4 * f.crc_count > f.bytes
        ):
            raise CheckpointError(f"{where}: file {f.name!r} has an invalid size or checksum table")
        if not (0 <= f.rank < 1 << 24):
            raise CheckpointError(f"{where}: file {f.name!r} names an invalid rank {f.rank}")
    for k, v in md.values.items():
        try:
            decode_value(v, f"{where}: value {k!r}", md.version)  # refuse a malformed value before any read
        except RecursionError:
            raise CheckpointError(f"{where}: value {k!r} is nested too deeply") from None
    c = md.cols
    n = md.num_chunks
    if n == 0:
        return
    tid = c["tensor"].astype(np.int64)
    fid = c["file"].astype(np.int64)
    if tid.max() >= len(md.tensors):
        raise CheckpointError(f"{where}: a chunk names tensor #{int(tid.max())}, there are {len(md.tensors)}")
    if np.any(np.diff(tid) < 0):
        raise CheckpointError(f"{where}: chunks are not sorted by tensor")
    if fid.max() >= len(md.files):
        raise CheckpointError(f"{where}: a chunk names file #{int(fid.max())}, there are {len(md.files)}")
    tables = md.tables()  # shapes were checked above, so their products cannot overflow
    itemsize = tables.itemsize[tid]
    ndims = tables.ndim[tid]
    shapes = tables.shape
    numels = tables.numel[tid]
    off, length = c["offset"], c["length"]
    fbytes = np.array([f.bytes for f in md.files], np.int64)[fid]
    is_flat = c["flat_start"] >= 0

    def bad(mask: np.ndarray, what: str) -> None:
        if np.any(mask):
            i = int(np.argmax(mask))
            t = md.tensors[int(tid[i])]
            f = md.files[int(fid[i])]
            raise CheckpointError(f"{where}: chunk #{i} of tensor {t.name!r} in file {f.name!r}: {what}")

    bad((off < 0) | (length < 0), "negative offset or length")
    bad(off > fbytes - length, "byte range runs past the end of its file")
    bad(np.any((c["offsets"] < 0) | (c["sizes"] < 0), axis=1), "negative box")
    d = c["offsets"].shape[1]
    if d:
        cols_idx = np.arange(d)[None, :]
        inside = cols_idx < ndims[:, None]
        out_of = inside & (c["offsets"] > shapes[tid][:, :d] - c["sizes"])  # no overflow: both >= 0
        bad(~is_flat & np.any(out_of, axis=1), "box lies outside the tensor")
        bad(np.any(~inside & ((c["offsets"] != 0) | (c["sizes"] != 0)), axis=1), "box has extra dimensions")
        big = np.where(inside, c["sizes"], 1)
        # overflow-safe: bound the product in floating point before computing it exactly
        bad(np.prod(big.astype(np.float64), axis=1) > 2.0**56, "box is implausibly large")
        box_numel = np.prod(big, axis=1)
    else:
        box_numel = np.ones(n, np.int64)
    fs, fc = c["flat_start"], c["flat_count"]
    bad(is_flat & ((fc < 0) | (fs > numels - fc)), "flat range lies outside the tensor")
    bad(~is_flat & (fc != 0), "box chunk carries a flat count")
    bad(is_flat & (fc > 1 << 56), "flat range is implausibly large")
    numel = np.where(is_flat, fc, box_numel)
    bad(numel * itemsize != length, "length disagrees with dtype x box")
    nblocks = (length + md.block_bytes - 1) // md.block_bytes
    ccount = np.array([f.crc_count for f in md.files], np.int64)[fid]
    bad((c["block0"] < 0) | (c["block0"] > ccount - nblocks), "block checksums lie outside the file's table")
    check_disjoint(md, where)


def check_disjoint(md: Metadata, where: str) -> None:
    """No two chunks of a tensor may share an element: a reader would otherwise take an overlap
    for coverage and could fill a request from the wrong bytes while the counts still add up."""
    try:
        pair = overlapping_chunks(md.box_table())
    except ValueError as e:
        raise CheckpointError(f"{where}: {e}") from None
    if pair is not None:
        a, b = pair
        raise CheckpointError(f"{where}: {md.describe_chunk(a)} overlaps {md.region(b).describe()} (chunk #{b})")
