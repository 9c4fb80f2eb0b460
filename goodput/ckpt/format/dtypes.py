"""The element types a checkpoint may hold, by the name written in the format.

Kept free of torch so that the numpy-only reader can decode every dtype. Types numpy lacks
(bfloat16, the float8 family) are stored as their raw little-endian bits; the reader widens
bfloat16 to float32 exactly, and hands float8 back as raw ``uint8`` unless asked otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DType:
    name: str  # the name in the format
    itemsize: int
    numpy: str | None  # numpy dtype string, None where numpy has no such type
    raw: str  # numpy dtype of the same width used to move the raw bits


_TABLE = [
    DType("bool", 1, "|b1", "|u1"),
    DType("uint8", 1, "|u1", "|u1"),
    DType("int8", 1, "|i1", "|u1"),
    DType("int16", 2, "<i2", "<u2"),
    DType("uint16", 2, "<u2", "<u2"),
    DType("int32", 4, "<i4", "<u4"),
    DType("uint32", 4, "<u4", "<u4"),
    DType("int64", 8, "<i8", "<u8"),
    DType("uint64", 8, "<u8", "<u8"),
    DType("float16", 2, "<f2", "<u2"),
    DType("float32", 4, "<f4", "<u4"),
    DType("float64", 8, "<f8", "<u8"),
    DType("complex64", 8, "<c8", "<u8"),
    DType("complex128", 16, "<c16", "|V16"),
    DType("bfloat16", 2, None, "<u2"),
    DType("float8_e4m3fn", 1, None, "|u1"),
    DType("float8_e4m3fnuz", 1, None, "|u1"),
    DType("float8_e5m2", 1, None, "|u1"),
    DType("float8_e5m2fnuz", 1, None, "|u1"),
    DType("float8_e8m0fnu", 1, None, "|u1"),
]

DTYPES: dict[str, DType] = {d.name: d for d in _TABLE}


def dtype(name: str) -> DType:
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; known: {', '.join(DTYPES)}") from None


def from_numpy(dt: np.dtype) -> DType:
    """The format's dtype for a numpy dtype (little-endian or native)."""
    dt = np.dtype(dt)
    if dt.byteorder == ">":
        raise TypeError(f"big-endian arrays are not supported ({dt}); convert with .astype('<...')")
    for d in _TABLE:
        if d.numpy is not None and np.dtype(d.numpy) == dt.newbyteorder("<"):
            return d
    raise TypeError(f"numpy dtype {dt} cannot be checkpointed")


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    """Exact widening: a bfloat16 is the top half of a float32."""
    return (bits.astype("<u4") << 16).view("<f4")
