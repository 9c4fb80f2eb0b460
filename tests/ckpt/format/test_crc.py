"""The chunk CRC folded from block CRCs equals a CRC of the bytes (hypothesis, real crc32c)."""

from __future__ import annotations

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from goodput.ckpt.format.crc import combine, combine_blocks


@given(st.binary(max_size=3000), st.binary(max_size=3000))
def test_combine_is_crc_of_concatenation(a: bytes, b: bytes) -> None:
    assert combine(crc32c.crc32c(a), crc32c.crc32c(b), len(b)) == crc32c.crc32c(a + b)


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 40_000), st.sampled_from([512, 1024, 4096]), st.randoms(use_true_random=False))
def test_combine_blocks_is_crc_of_the_chunk(n: int, block: int, rnd) -> None:
    data = rnd.randbytes(n)
    blocks = [crc32c.crc32c(data[i : i + block]) for i in range(0, n, block)]
    assert combine_blocks(blocks, block, n) == crc32c.crc32c(data)


def test_combine_blocks_at_scale_and_errors() -> None:
    data = bytes(range(256)) * (1 << 14) + b"tail"  # 4 MiB + 4: 1025 blocks, a short last one
    blocks = [crc32c.crc32c(data[i : i + 4096]) for i in range(0, len(data), 4096)]
    assert combine_blocks(blocks, 4096, len(data)) == crc32c.crc32c(data)
    assert combine_blocks([], 4096, 0) == 0
    with pytest.raises(ValueError, match="not a power of two"):
        combine_blocks(blocks, 3000, len(data))
    with pytest.raises(ValueError, match="1024 block checksums"):
        combine_blocks(blocks[:-1], 4096, len(data))
