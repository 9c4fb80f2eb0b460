"""Large reads whose buffer and file offset sit at the same place in their pages take their whole
pages by O_DIRECT (not through the page cache); every other read goes through the cache. Either
way the bytes are the file's, whatever the offset, the length, the buffer's alignment and
whether the file ends inside the read's last page."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from goodput.ckpt.errors import CheckpointError
from goodput.ckpt.storage.local import ALIGN, DIRECT_READ_MIN, POSIX

SIZE = (3 << 20) + 777  # ends inside a page
BLOB = np.random.default_rng(3).integers(0, 256, SIZE, dtype=np.uint8)


@pytest.fixture(scope="module")
def data_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("direct")
    (d / "f.bin").write_bytes(BLOB.tobytes())
    return d


def _uncached(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _buffer(n: int, phase: int) -> memoryview:
    raw = np.empty(n + 2 * ALIGN, np.uint8)
    start = (phase - raw.ctypes.data) % ALIGN
    return memoryview(raw[start : start + n])


def _direct_capable(d: Path) -> bool:
    try:
        os.close(os.open(d / "f.bin", os.O_RDONLY | os.O_DIRECT))
        return True
    except OSError:
        return False


@settings(max_examples=40, deadline=None)
@given(
    offset=st.integers(0, SIZE - 1),
    length=st.integers(1, 2 << 20),
    phase=st.sampled_from([None, 0, 64, 4032]),
    cold=st.booleans(),
)
def test_every_read_returns_the_files_bytes(data_file: Path, offset: int, length: int, phase: int | None, cold: bool):
    length = min(length, SIZE - offset)
    if cold:
        _uncached(data_file / "f.bin")
    src = POSIX.open(data_file, "f.bin", "data file")
    try:
        buf = _buffer(length, offset % ALIGN if phase is None else phase)
        src.read_into(buf, offset)
        assert bytes(buf) == BLOB[offset : offset + length].tobytes()
    finally:
        src.close()


def test_a_cold_matching_read_goes_direct_and_a_cached_or_mismatched_one_does_not(data_file: Path) -> None:
    if not _direct_capable(data_file):
        pytest.skip("this file system refuses O_DIRECT")
    path = data_file / "f.bin"
    offset, n = 64 + ALIGN, DIRECT_READ_MIN + 5000
    for phase, cold, direct in [(64, True, True), (64, False, False), (128, True, False)]:
        if cold:
            _uncached(path)
        else:
            path.read_bytes()
        src = POSIX.open(data_file, "f.bin", "data file")
        try:
            buf = _buffer(n, phase)
            src.read_into(buf, offset)
            assert bytes(buf) == BLOB[offset : offset + n].tobytes()
            assert (src._direct is not None) == direct, (phase, cold)
        finally:
            src.close()


def test_a_read_past_the_end_is_named_as_truncated(data_file: Path) -> None:
    _uncached(data_file / "f.bin")
    src = POSIX.open(data_file, "f.bin", "data file")
    try:
        buf = _buffer(2 << 20, (SIZE - (1 << 20)) % ALIGN)
        with pytest.raises(CheckpointError, match="ends early"):
            src.read_into(buf, SIZE - (1 << 20))
    finally:
        src.close()
