"""CRC-32C of a whole chunk from the CRC-32C of its blocks, without reading the bytes again.

The writer must checksum every 4 KiB block (partial reads verify just the blocks they touch), and
the format also records each chunk's CRC. Computing both costs two passes over the bytes; the
block pass is the expensive one (a call per block), so the chunk CRC is derived from the block
CRCs instead: ``crc(A || B) = shift(crc(A), len(B)) ^ crc(B)`` (zlib's ``crc32_combine``), where
``shift(c, n)`` multiplies the CRC register by x^(8n) modulo the polynomial, a linear map on 32
bits. The maps for 2^k bytes are tabulated once (four byte-tables each), and the blocks are folded
pairwise in numpy, log2(blocks) vectorised steps per chunk.

numpy only: the torch-free reader uses it.
"""

from __future__ import annotations

from functools import cache

import numpy as np

POLY = 0x82F63B78  # CRC-32C (Castagnoli), reflected
_BITS = np.array([[(b >> t) & 1 for t in range(8)] for b in range(256)], bool)  # (256, 8)


def _apply(cols: list[int], v: int) -> int:
    out = 0
    k = 0
    while v:
        if v & 1:
            out ^= cols[k]
        v >>= 1
        k += 1
    return out


@cache
def _operators() -> list[list[int]]:
    """Column form (image of each register bit) of "append 2^k zero bytes", k = 0..62."""
    one_bit = [POLY] + [1 << (k - 1) for k in range(1, 32)]
    op = one_bit
    for _ in range(3):  # 1 -> 2 -> 4 -> 8 bits: one zero byte
        op = [_apply(op, c) for c in op]
    ops = [op]
    for _ in range(62):
        op = [_apply(op, c) for c in op]
        ops.append(op)
    return ops


@cache
def _tables(k: int) -> np.ndarray:
    """(4, 256) uint32: the map for 2^k zero bytes, one table per register byte."""
    cols = np.array(_operators()[k], np.uint32).reshape(4, 8)
    out = np.zeros((4, 256), np.uint32)
    for j in range(4):
        out[j] = np.bitwise_xor.reduce(np.where(_BITS, cols[j][None, :], np.uint32(0)), axis=1)
    return out


def _shift_pow2(v: np.ndarray, k: int) -> np.ndarray:
    t = _tables(k)
    return t[0][v & 0xFF] ^ t[1][(v >> 8) & 0xFF] ^ t[2][(v >> 16) & 0xFF] ^ t[3][v >> 24]


def shift(crc: int, nbytes: int) -> int:
    """The CRC register after ``nbytes`` zero bytes (no pre/post conditioning)."""
    v = np.array([crc], np.uint32)
    k = 0
    while nbytes:
        if nbytes & 1:
            v = _shift_pow2(v, k)
        nbytes >>= 1
        k += 1
    return int(v[0])


def combine(crc_a: int, crc_b: int, len_b: int) -> int:
    """CRC-32C of ``A || B`` from the CRCs of A and B and the length of B."""
    return shift(crc_a, len_b) ^ crc_b


def combine_blocks(crcs: np.ndarray | list[int], block: int, length: int) -> int:
    """CRC-32C of ``length`` bytes from the CRCs of their ``block``-byte blocks (the last may be
    shorter). ``block`` must be a power of two."""
    if length <= 0:
        return 0
    if block & (block - 1):
        raise ValueError(f"block size {block} is not a power of two")
    v = np.asarray(crcs, np.uint32)
    nblocks = -(-length // block)
    if len(v) != nblocks:
        raise ValueError(f"{len(v)} block checksums for {length} bytes of {block}-byte blocks")
    last_len = length - (nblocks - 1) * block
    full, last = v[:-1], int(v[-1])
    if len(full) == 0:
        return last
    # pad at the front with zero CRCs (they add nothing), then fold pairs: each step joins
    # neighbours of 2^step blocks, the left one shifted past the right one
    size = 1 << (len(full) - 1).bit_length()
    acc = np.zeros(size, np.uint32)
    acc[size - len(full) :] = full
    k = block.bit_length() - 1  # 2^k bytes per block
    while len(acc) > 1:
        acc = _shift_pow2(acc[0::2], k) ^ acc[1::2]
        k += 1
    return combine(int(acc[0]), last, last_len)
