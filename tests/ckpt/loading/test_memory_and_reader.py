"""Bounded load memory, and the numpy-only reader (torch import blocked), in fresh processes."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import goodput.ckpt as gc

ROWS, COLS = 4096, 16384  # one 256 MiB float32 chunk


def run_py(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux's VmHWM")
def test_load_peak_memory_is_target_plus_read_buffer(tmp_path: Path) -> None:
    t = torch.arange(ROWS * COLS, dtype=torch.float32).reshape(ROWS, COLS)
    gc.save({"w": t}, tmp_path)  # saved as ONE 256 MiB chunk
    del t
    # load a column half (128 MiB) with a 32 MiB read buffer: DCP would hold the whole saved chunk
    out = run_py(f"""
        import json, torch, goodput.ckpt as gc
        def rss():  # peak RSS of this process (VmHWM); ru_maxrss would carry pytest's over exec
            with open("/proc/self/status") as f:
                return next(int(x.split()[1]) * 1024 for x in f if x.startswith("VmHWM:"))
        target = torch.zeros({ROWS}, {COLS // 2})
        target += 1  # touched: its pages count in the baseline
        base = rss()
        st = {{"w": gc.LocalShard(target, ({ROWS}, {COLS}), (0, {COLS // 4}))}}
        stats = gc.load(st, {str(tmp_path)!r}, read_buffer=32 << 20, threads=2).stats
        peak = rss()
        ok = bool(target[5, 7] == 5 * {COLS} + {COLS // 4} + 7)
        print(json.dumps({{"delta": peak - base, "ok": ok, "read": stats.bytes_read}}))
    """)
    r = json.loads(out.strip().splitlines()[-1])
    assert r["ok"] and r["delta"] > 0, r  # the read buffer is touched, so the peak must move
    # within the 32 MiB buffer plus interpreter noise; a whole-chunk read would add 256 MiB
    assert r["delta"] <= (32 + 24) << 20, r


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux's VmHWM")
def test_load_memory_stays_bounded_with_millions_of_tiny_runs(tmp_path: Path) -> None:
    """One column of a tall [4M, 4] fp32 matrix saved whole: 4 million 4-byte runs, one box.
    The plan expands them a batch at a time, so the peak stays within the read buffer (planned
    at once they took 650 MiB for a 15 MiB target)."""
    n = 4_000_000
    gc.save({"w": torch.arange(n * 4, dtype=torch.float32).reshape(n, 4)}, tmp_path)
    out = run_py(f"""
        import json, torch, goodput.ckpt as gc
        def rss():
            with open("/proc/self/status") as f:
                return next(int(x.split()[1]) * 1024 for x in f if x.startswith("VmHWM:"))
        target = torch.zeros({n}, 1)
        target += 1
        base = rss()
        gc.load({{"w": gc.LocalShard(target, ({n}, 4), (0, 1))}}, {str(tmp_path)!r}, read_buffer=32 << 20, threads=2)
        peak = rss()
        ok = bool(torch.equal(target[:, 0], torch.arange({n}, dtype=torch.float32) * 4 + 1))
        print(json.dumps({{"delta": peak - base, "ok": ok}}))
    """)
    r = json.loads(out.strip().splitlines()[-1])
    assert r["ok"], r
    assert r["delta"] <= (32 + 24) << 20, r


def test_reader_needs_numpy_only(tmp_path: Path) -> None:
    w = torch.randn(6, 4)
    gc.save({"w": w, "h": w.to(torch.bfloat16), "cfg": {"lr": 0.5}}, tmp_path, step=3)
    out = run_py(f"""
        import sys
        sys.modules["torch"] = None  # any torch import now fails
        import json
        import goodput.ckpt as gc
        ck = gc.open({str(tmp_path)!r})
        n = ck.verify()
        print(json.dumps({{
            "step": ck.step, "keys": ck.keys(), "values": ck.values, "w": ck.read("w").tolist(),
            "h": ck.read("h", (slice(1, 3),)).tolist(), "shape": list(ck.tensors["w"].shape),
            "latest": str(gc.latest({str(tmp_path.parent)!r})), "checked": n,
        }}))
    """)
    r = json.loads(out.strip().splitlines()[-1])
    assert r["step"] == 3 and r["keys"] == ["h", "w"] and r["values"] == {"cfg.lr": 0.5} and r["shape"] == [6, 4]
    np.testing.assert_array_equal(np.array(r["w"], np.float32), w.numpy())
    np.testing.assert_array_equal(np.array(r["h"], np.float32), w.to(torch.bfloat16)[1:3].float().numpy())
    assert r["latest"] == str(tmp_path) and r["checked"] > 0


def test_a_chunk_read_in_parts_reads_its_checksum_table_once(tmp_path: Path) -> None:
    """A column of a tall chunk is more runs than one batch: the chunk comes in parts, yet its
    block-checksum table is read (and counted) once, and the chunk once."""
    n = 300_000
    gc.save({"w": torch.arange(n * 4, dtype=torch.float32).reshape(n, 4)}, tmp_path)
    target = torch.zeros(n, 1)
    stats = gc.load({"w": gc.LocalShard(target, (n, 4), (0, 2))}, tmp_path, read_buffer=4 << 20).stats
    assert torch.equal(target[:, 0], torch.arange(n, dtype=torch.float32) * 4 + 2)
    blocks = -(-(n * 16) // 4096)
    assert stats.chunks == 1 and stats.checksum_bytes_read == 4 * blocks


@pytest.mark.parametrize("whole_table", [True, False])
def test_a_file_s_checksum_table_is_one_read(
    tmp_path: Path, whole_table: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight chunks in one file: a load reads the file's block-checksum table in one request
    (on an object store each is a round trip), or, for a table over ``TABLE_REGION_BYTES``,
    each chunk's part of it once. The values are exact either way."""
    from goodput.ckpt.loading import read_exec
    from goodput.ckpt.storage.local import PosixSource, PosixStorage

    if not whole_table:
        monkeypatch.setattr(read_exec, "TABLE_REGION_BYTES", 0)
    state = {f"t{i}": torch.arange(5000, dtype=torch.float32) + i for i in range(8)}
    gc.save(state, tmp_path)
    reads: list[tuple[str, int, int]] = []

    class Counted(PosixSource):
        def read_into(self, buf: memoryview, offset: int, what: str | None = None) -> None:
            reads.append((self.name, offset, len(memoryview(buf).cast("B"))))
            super().read_into(buf, offset, what)

    class Counting(PosixStorage):
        def open(self, directory: Path, name: str, what: str, size: int | None = None) -> PosixSource:
            src = super().open(directory, name, what, size)
            assert isinstance(src, PosixSource)
            src.__class__ = Counted  # table reads always go through read_into
            return src

    out = {k: torch.zeros_like(v) for k, v in state.items()}
    gc.load(out, tmp_path, storage=Counting())
    assert all(torch.equal(out[k], state[k]) for k in state)
    (f,) = gc.open(tmp_path).metadata.files
    table_reads = [r for r in reads if r[0].endswith(f.name) and r[1] >= f.crc_offset]
    if whole_table:
        assert table_reads == [(str(tmp_path / f.name), f.crc_offset, 4 * f.crc_count)]
    else:
        assert len(table_reads) == 8 and sum(n for _, _, n in table_reads) == 4 * f.crc_count
