"""The file-system read path (goodput.ckpt.loading.read_exec): each data file read in order by one
thread, checks and placement on a pool; every byte still verified, errors still named."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import torch

import goodput.ckpt as gc
from goodput.ckpt.errors import CheckpointError
from goodput.ckpt.loading.read_exec import PIECE
from goodput.ckpt.storage.local import PosixSource, PosixStorage


def _state(n: int = 6, rows: int = 1024, cols: int = 2048) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return {f"t{i}": torch.rand(rows, cols, generator=g) for i in range(n)}  # 8 MiB each


class _Recorded(PosixSource):
    log: list[tuple[str, int, int, int]] = []
    lock = threading.Lock()

    def read_into(self, buf: memoryview, offset: int, what: str | None = None) -> None:
        with self.lock:
            self.log.append((self.name, offset, len(memoryview(buf).cast("B")), threading.get_ident()))
        super().read_into(buf, offset, what)


class _Recording(PosixStorage):
    def open(self, directory: Path, name: str, what: str, size: int | None = None) -> PosixSource:
        src = super().open(directory, name, what, size)
        assert isinstance(src, PosixSource)
        src.__class__ = _Recorded
        return src


@pytest.mark.parametrize("verify", [True, False])
def test_each_file_is_read_in_order_by_one_thread(tmp_path: Path, verify: bool) -> None:
    state = _state()
    gc.save(state, tmp_path, files_per_rank=2)
    md = gc.open(tmp_path).metadata
    assert len(md.files) == 2
    _Recorded.log = []
    out = {k: torch.zeros_like(v) for k, v in state.items()}
    stats = gc.load(out, tmp_path, storage=_Recording(), verify=verify).stats
    assert all(torch.equal(out[k], state[k]) for k in state)
    data = {f.name: f.crc_offset for f in md.files}
    for fid, f in enumerate(md.files):
        reads = [(o, n, t) for name, o, n, t in _Recorded.log if name.endswith(f.name) and o < data[f.name]]
        assert reads, f.name
        offsets = [o for o, _, _ in reads]
        assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets), f.name  # file order
        assert len({t for _, _, t in reads}) == 1, f.name  # one reader a file
        lengths = md.cols["length"][md.cols["file"] == fid]
        assert len(reads) == sum(-(-int(n) // PIECE) for n in lengths), f.name  # whole pieces, no more
    if verify:
        assert stats.verified_blocks == sum(-(-v.numel() * 4 // md.block_bytes) for v in state.values())
    assert stats.bytes_read == stats.bytes_needed == sum(v.numel() * 4 for v in state.values())


def _flip(path: Path, at: int) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x40]))


@pytest.mark.parametrize("read_buffer", [256 << 20, 1 << 20])
def test_a_flipped_byte_in_either_file_is_named(tmp_path: Path, read_buffer: int) -> None:
    state = _state()
    gc.save(state, tmp_path, files_per_rank=2)
    md = gc.open(tmp_path).metadata
    f = md.files[1]
    ch = int(np.flatnonzero(md.cols["file"] == 1)[-1])  # the last chunk of the second file
    at = int(md.cols["offset"][ch]) + int(md.cols["length"][ch]) - 1000  # in the right half of the last row
    _flip(tmp_path / f.name, at)
    name = md.tensors[int(md.cols["tensor"][ch])].name
    out = {k: torch.zeros_like(v) for k, v in state.items()}
    with pytest.raises(CheckpointError, match=rf"checksum mismatch in '{f.name}'.*tensor '{name}'"):
        gc.load(out, tmp_path, read_buffer=read_buffer)
    # a resharded load (a column half of every tensor: runs through the read buffer) names it too
    cols = state[name].shape[1]
    half = {
        k: gc.LocalShard(torch.zeros(v.shape[0], cols // 2), tuple(v.shape), (0, cols // 2)) for k, v in state.items()
    }
    with pytest.raises(CheckpointError, match=rf"checksum mismatch in '{f.name}'.*tensor '{name}'"):
        gc.load(half, tmp_path, read_buffer=read_buffer)
    # verify=False reads the bytes as they are
    gc.load(out, tmp_path, verify=False, read_buffer=read_buffer)
    assert not torch.equal(out[name], state[name])


def test_resharded_load_through_a_small_read_buffer_is_exact(tmp_path: Path) -> None:
    state = _state(n=4)
    gc.save(state, tmp_path, files_per_rank=2)
    for read_buffer in (1 << 20, 4096, 8 << 20):
        for off in (0, 1000):
            half = {k: torch.zeros(v.shape[0], 700) for k, v in state.items()}
            st = {k: gc.LocalShard(half[k], tuple(v.shape), (0, off)) for k, v in state.items()}
            stats = gc.load(st, tmp_path, read_buffer=read_buffer).stats
            assert all(torch.equal(half[k], v[:, off : off + 700]) for k, v in state.items()), read_buffer
            assert stats.verified_blocks > 0


def test_a_truncated_file_is_named(tmp_path: Path) -> None:
    state = _state(n=4)
    gc.save(state, tmp_path, files_per_rank=2)
    f = gc.open(tmp_path).metadata.files[0]
    with open(tmp_path / f.name, "r+b") as fh:
        fh.truncate(f.bytes // 2)
    out = {k: torch.zeros_like(v) for k, v in state.items()}
    with pytest.raises(CheckpointError, match=f.name):
        gc.load(out, tmp_path)


def test_a_read_error_mid_file_is_named_and_stops_the_load(tmp_path: Path) -> None:
    """A read failing part-way through one file (as EIO would) fails the load, naming the file
    and the tensor, and no check is still running when load returns."""
    state = _state()
    gc.save(state, tmp_path, files_per_rank=2)
    md = gc.open(tmp_path).metadata
    bad, table_at = md.files[1].name, md.files[1].crc_offset

    class Failing(PosixSource):
        def read_into(self, buf: memoryview, offset: int, what: str | None = None) -> None:
            if self.name.endswith(bad) and (4 << 20) < offset < table_at:  # data past the first chunk
                raise CheckpointError(f"{what}: read failed at byte {offset}: Input/output error")
            super().read_into(buf, offset, what)

    class Storage(PosixStorage):
        def open(self, directory: Path, name: str, what: str, size: int | None = None) -> PosixSource:
            src = super().open(directory, name, what, size)
            assert isinstance(src, PosixSource)
            src.__class__ = Failing
            return src

    before = {t.ident for t in threading.enumerate()}
    out = {k: torch.zeros_like(v) for k, v in state.items()}
    with pytest.raises(CheckpointError, match=rf"in file '{bad}'.*Input/output error"):
        gc.load(out, tmp_path, storage=Storage())
    assert {t.ident for t in threading.enumerate() if t.name.startswith("goodput-")} <= before


def test_a_small_load_starts_no_thread(tmp_path: Path) -> None:
    state = {"w": torch.arange(1000, dtype=torch.float32)}
    gc.save(state, tmp_path)
    seen: list[str] = []
    orig = threading.Thread.start

    def start(self: threading.Thread) -> None:
        seen.append(self.name)
        orig(self)

    out = {"w": torch.zeros(1000)}
    threading.Thread.start = start  # type: ignore[method-assign]
    try:
        gc.load(out, tmp_path, no_dist=True)
    finally:
        threading.Thread.start = orig  # type: ignore[method-assign]
    assert torch.equal(out["w"], state["w"])
    assert not [n for n in seen if n.startswith("goodput-")], seen
