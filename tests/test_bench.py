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
    args = ["bench", "ckpt", "--size", "8MiB", "--tensors", "2", "--repeat", "2"]
    r = runner.invoke(app, [*args, "--dir", str(tmp_path / "durable"), "--fast", str(tmp_path), "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output[r.output.index("{") :])
    assert out["bytes"] == 8 << 20 and out["restored_tiers"] == ["fast", "fast"]
    assert len(out["drain_s"]) == 2 and out["drain_mb_per_s"] > 0
    for k in ("stall_ratio", "commit_ratio", "restore_ratio"):
        assert out[k] > 0
    assert list(tmp_path.iterdir()) == [tmp_path / "durable"]  # the bench removed what it wrote
    assert list((tmp_path / "durable").iterdir()) == []
