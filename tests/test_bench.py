"""The benchmark commands run end to end at toy sizes (their numbers are not asserted: speed goals
live in the commands, not in tests); what is asserted is that they measure what they claim."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from goodput.cli.main import app

runner = CliRunner()


def test_bench_ckpt_metadata_small() -> None:
    r = runner.invoke(app, ["bench", "ckpt-metadata", "--ranks", "1024", "--tensors", "64", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output[r.output.index("{") :])
    s = out["scales"]["1024"]
    assert s["ours"]["chunks"] > 0 and s["dcp"]["chunks"] > 0
    assert s["ours_commit"]["same_chunks"] is True  # the real commit path rebuilt every chunk
    assert {g["goal"].split(" @")[0] for g in out["goals"]} >= {"decode + validate metadata < 2 s"}
    ag = s["ours_agree"]  # the save's own agreement code planned exactly the bytes the layout holds
    assert ag["declarations"] > 0 and ag["cache_hit"] is True
    assert ag["planned_bytes"] == ag["layout_bytes"]
    d = s["dcp_save"]  # DCP's coordinator planned the same state (replicas deduplicated)
    assert d["write_items"] > d["items_written"] > 0 and "save_plan" in s["ratios"]


def test_bench_async_small() -> None:
    r = runner.invoke(app, ["bench", "async", "--size", "16MiB", "--repeat", "1", "--loop-steps", "40", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output[r.output.index("{") :])
    assert out["bytes"] == 16 << 20
    for k in ("memcpy_s", "stall_s", "dcp_stall_s", "slowdown_process", "slowdown_thread", "slowdown_dcp"):
        assert k in out
    assert out["saves_during_process"] >= 1
    assert set(out["goals"]) == {
        "stall <= 1.2 x all-core floor",
        "lazy stall <= 0.1 x all-core floor",
        "stall >= 10 x smaller than DCP",
        "concurrent slowdown <= 10 %",
    }


def test_bench_ckpt_rounds_small() -> None:
    """Interleaved rounds: every phase runs once per round, goals carry each round's ratio."""
    args = ["bench", "ckpt", "--size", "8MiB", "--ranks", "2", "--tensors", "2", "--repeat", "1", "--rounds", "2"]
    r = runner.invoke(app, [*args, "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output[r.output.index("{") :])
    assert out["config"]["rounds"] == 2 and out["all_verified"] is True
    for g in out["goals"]:
        assert len(g["per_round"]) == 2
    assert all(len(p["seconds_per_repeat"]) == 2 for p in out["phases"].values())
    # the O_DIRECT ceiling writes the same bytes as the plain raw write, and is reported
    assert out["config"]["files_bytes"]["rawd"] == out["config"]["files_bytes"]["raw"] > 0
    assert out["ratios"]["ours_save_vs_raw_write_direct"] > 0
    # the second round ran the systems in reverse; every repeat started from a flushed, dropped,
    # ballasted cache; the raw read was plain readinto calls into one buffer; goals carry a spread
    first, second = out["config"]["order_per_round"]
    assert first[0] == "raw_write" and second[0] == "ours_save" and sorted(first) == sorted(second)
    assert out["config"]["ballast_bytes"] == out["config"]["size_bytes"]
    for p in out["phases"].values():
        for cold in p["cold_start_per_repeat"]:
            assert cold["ballast_bytes"] == out["config"]["size_bytes"] and cold["drop"] in ("drop_caches", "fadvise")
            assert cold["dirty_before"] is None or cold["flush_s"] >= 0
    assert all(t["readinto_calls"] >= 1 for t in out["phases"]["raw_read"]["timings_last_repeat_per_rank"])
    for g in out["goals"]:
        assert g["spread"] == [min(g["per_round"]), max(g["per_round"])]


def test_bench_ckpt_order_is_balanced() -> None:
    """Over two rounds each goal's phase and its baseline each run first once; a load always
    comes after the save that wrote what it reads; every phase runs once a round."""
    from goodput.bench.ckpt import GOALS, PHASES, phase_order

    names = [n for n, _ in PHASES]
    orders = [phase_order(0), phase_order(1)]
    for order in orders:
        assert sorted(order) == sorted(names)
        for load, save in (("raw_read", "raw_write"), ("torch_load", "torch_save"), ("dcp_load", "dcp_save")):
            assert order.index(save) < order.index(load)
        assert order.index("ours_save") < order.index("ours_load") < order.index("ours_reshard_load")
    for _, _, ours, base, _ in GOALS:
        firsts = {order.index(ours) < order.index(base) for order in orders}
        assert firsts == {True, False}, (ours, base)
    assert phase_order(2) == orders[0] and phase_order(3) == orders[1]


def test_bench_raw_read_fills_one_buffer_without_copies(tmp_path) -> None:  # noqa: ANN001
    """The raw baseline reads the file, in order, into the caller's one buffer: the bytes land
    there, and the process never holds a second copy of them (peak RSS grows by far less than
    the file while it reads into a buffer already touched)."""
    import numpy as np
    import pytest

    from goodput.bench.ckpt import PeakMemory, raw_read_into

    n = (64 << 20) + 123
    data = np.random.default_rng(3).integers(0, 256, n, dtype=np.uint8)
    path = tmp_path / "raw.bin"
    path.write_bytes(data.tobytes())
    buf = np.empty(n, np.uint8)
    buf.fill(0)  # touched, as the bench's buffer is
    mem = PeakMemory()
    mem.start()
    calls = raw_read_into(path, memoryview(buf))
    grew = mem.delta()
    assert np.array_equal(buf, data) and 1 <= calls <= 4
    if mem.method == "VmHWM":  # ru_maxrss cannot be reset: the write above already peaked it
        assert grew < n // 4, f"the raw read grew the peak RSS by {grew} bytes for a {n}-byte file"
    with pytest.raises(OSError, match="ends early"):
        raw_read_into(path, memoryview(np.zeros(n + 1, np.uint8)))


def _resident_pages(path) -> int:  # noqa: ANN001
    """Pages of ``path`` in the page cache (mincore(2) over a read-only mapping, which faults
    nothing in)."""
    import ctypes
    import mmap
    import os

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    size = os.path.getsize(path)
    pages = -(-size // mmap.PAGESIZE)
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert addr not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
        try:
            vec = ctypes.create_string_buffer(pages)
            assert libc.mincore(addr, size, vec) == 0, ctypes.get_errno()
            return sum(b & 1 for b in vec.raw)
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)


def _write_dirty(path, nbytes: int) -> None:  # noqa: ANN001
    import os

    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        block = b"\x01" * (8 << 20)
        for _ in range(nbytes // len(block)):
            os.write(fd, block)  # no fsync: these pages stay dirty until someone writes them back
    finally:
        os.close(fd)


def test_bench_cold_start_flushes_dirty_pages_before_dropping(tmp_path) -> None:  # noqa: ANN001
    """A phase never inherits the previous one's dirty pages. Dropping the cache alone leaves
    them (``drop_caches`` frees clean pages only); the bench's cold start writes them back and
    waits first, so after it none of the file is cached, and the ballast was read before the
    drop. Checked on the file's own pages (mincore), not on machine-wide counters."""
    import sys

    import pytest

    from goodput.bench.ckpt import cold_start, dirty_bytes, drop_caches, flush_writeback, make_ballast

    if not sys.platform.startswith("linux"):
        pytest.skip("mincore and /proc/meminfo are Linux's")
    ballast = make_ballast(tmp_path, 8 << 20)
    assert ballast.stat().st_size == 8 << 20
    n = 64 << 20
    pages = n // 4096
    plain = tmp_path / "dropped-only.bin"
    _write_dirty(plain, n)
    if drop_caches(tmp_path) == "drop_caches":  # root: the drop the bench used before
        left = _resident_pages(plain)
        assert left > pages // 2, f"only {left} of {pages} dirty pages survived drop_caches"
        flush_writeback()
    flushed = tmp_path / "cold-started.bin"
    _write_dirty(flushed, n)
    assert _resident_pages(flushed) == pages
    rec = cold_start(tmp_path, ballast)
    assert _resident_pages(flushed) == 0, rec  # written back, then dropped
    assert rec["ballast_bytes"] == 8 << 20 and rec["drop"] in ("drop_caches", "fadvise")
    if dirty_bytes() is not None:
        assert rec["dirty_before"] is not None and rec["flushed"] is True, rec


def test_bench_crc_small() -> None:
    """Every block size is timed against one whole-buffer call; finer blocks cost more calls."""
    r = runner.invoke(app, ["bench", "crc", "--size", "4MiB", "--repeat", "1", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output[r.output.index("{") :])
    sizes = [row["block_bytes"] for row in out["rows"]]
    assert sizes[0] == 0 and sizes[1:] == sorted(sizes[1:]) and all(row["gbps"] > 0 for row in out["rows"])


def test_bench_ckpt_tiered_small(tmp_path) -> None:  # noqa: ANN001
    """A tiered Checkpointer against a local-only one on the same fast directory; every restore
    in it must come from the fast tier and hold the saved values (the bench checks both)."""
    # no wait for quiet cores: the test checks what the bench reports, not how fast
    args = ["bench", "ckpt", "--size", "8MiB", "--tensors", "2", "--repeat", "2", "--settle-s", "0"]
    r = runner.invoke(app, [*args, "--dir", str(tmp_path / "durable"), "--fast", str(tmp_path), "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output[r.output.index("{") :])
    assert out["bytes"] == 8 << 20 and out["restored_tiers"] == ["fast", "fast"]
    assert len(out["drain_s"]) == 2 and out["drain_mb_per_s"] > 0
    for k in ("stall_ratio", "commit_ratio", "restore_ratio"):
        assert out[k] > 0
    assert list(tmp_path.iterdir()) == [tmp_path / "durable"]  # the bench removed what it wrote
    assert list((tmp_path / "durable").iterdir()) == []
