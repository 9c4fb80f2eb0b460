"""Unit parsing, bad input (exit status 2), and every plan command's --json keys."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from goodput.cli.main import app
from goodput.plan import units as U

runner = CliRunner()
SKYPILOT = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "traces" / "skypilot-spot"


@pytest.mark.parametrize(
    "text,want",
    [
        ("60s", 60),
        ("30min", 1800),
        ("30m", 1800),
        ("3.09h", 3.09 * 3600),
        ("2d", 172800),
        ("50677h", 50677 * 3600),
        ("90", 90),
    ],
)
def test_durations(text, want):
    assert U.parse_duration(text) == pytest.approx(want)


@pytest.mark.parametrize(
    "text,want",
    [
        ("16KiB", 16384),
        ("100GB", 100e9),
        ("6.48TB", 6.48e12),
        ("1GiB", 2**30),
        ("346MB", 346e6),
        ("1e9", 1e9),
        ("8Gb", 1e9),
    ],
)
def test_bytes(text, want):
    assert U.parse_bytes(text) == pytest.approx(want)


@pytest.mark.parametrize(
    "text,want", [("100GB/s", 100e9), ("400Gbps", 50e9), ("400Gb/s", 50e9), ("2TB/s", 2e12), ("1GiB/s", 2**30)]
)
def test_bandwidth(text, want):
    assert U.parse_bandwidth(text) == pytest.approx(want)


def test_counts_rates_flops_fractions():
    assert U.parse_count("405e9") == 405e9 and U.parse_count("405B") == 405e9 and U.parse_count("16k") == 16000
    assert U.parse_rate("0.02/h") == pytest.approx(0.02 / 3600) and U.parse_rate("1/day") == pytest.approx(1 / 86400)
    assert U.parse_flops("400T") == 400e12 and U.parse_flops("400TFLOPS") == 400e12
    assert U.parse_fraction("60%") == pytest.approx(0.6) and U.parse_fraction("0.6") == 0.6


@pytest.mark.parametrize(
    "fn,text,msg",
    [
        (U.parse_duration, "-5min", "positive"),
        (U.parse_duration, "0s", "positive"),
        (U.parse_duration, "3 fortnights", "unknown time unit"),
        (U.parse_bytes, "12 parsecs", "unknown size unit"),
        (U.parse_bandwidth, "100GB", "per second"),
        (U.parse_count, "lots", "cannot read"),
        (U.parse_fraction, "1.5", "between 0 and 1"),
    ],
)
def test_bad_units_are_clear_errors(fn, text, msg):
    with pytest.raises(U.UnitError, match=msg):
        fn(text)


def test_formatting_says_the_unit():
    assert U.fmt_bytes(6.48e12) == "6.480 TB (5.894 TiB)"
    assert U.fmt_bandwidth(108e9) == "108.0 GB/s"
    assert U.fmt_duration(64.8) == "64.8 s"


def run_json(*args: str) -> dict:
    r = runner.invoke(app, ["plan", *args, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def test_every_command_json_keys(tmp_path: Path):
    f = run_json("failures")
    assert f["mtbi_s"] == pytest.approx(3.093 * 3600, rel=1e-3) and f["gpu_mtbf_s"] > 0
    f = run_json("failures", "--gpus", "1024", "--gpu-mtbf", "50677h")
    assert f["mtbi_s"] == pytest.approx(50677 * 3600 / 1024)
    i = run_json("interval", "--mtbf", "3.09h", "--stall", "60s", "--restart", "10min", "--interval", "30min")
    for k in ("young_s", "daly_s", "optimal_s", "waste_first_order_at_young", "useful_fraction_at_optimal"):
        assert k in i
    i2 = run_json("interval", "--gpus", "16384", "--gpu-mtbf", "50677h", "--stall", "60s")
    assert i2["mtbi_s"] == pytest.approx(50677 * 3600 / 16384)
    s = run_json("size", "--params", "405e9", "--bandwidth", "100GB/s", "--interval", "30min")
    assert (
        s["total_bytes"] == 6.48e12
        and s["write_s"] == pytest.approx(64.8)
        and "bytes_per_gpu" in s
        and "overhead_fraction" in s
    )
    t = run_json("tokens", "--gpus", "16384", "--tflops", "400", "--params", "405e9")
    for k in ("tokens_per_s", "token_stream_Bps", "burst_Bps", "restore_s"):
        assert k in t
    a = run_json("activations", "--seq", "8192", "--hidden", "8192", "--heads", "64", "--layers", "80", "--flash")
    assert a["bytes_per_layer"] == pytest.approx(2.28e9, rel=1e-3) and "bytes_total" in a
    sp = run_json(
        "spot",
        "--discount",
        "0.6",
        "--node-rate",
        "0.02/h",
        "--nodes",
        "16",
        "--interval",
        "30min",
        "--restart",
        "10min",
    )
    for k in ("job_rate_per_h", "useful_fraction", "cost_ratio", "break_even_discount", "max_gang_nodes"):
        assert k in sp
    p = run_json("pcie", "--gen", "5", "--lanes", "16")
    assert (
        p["pcie_Bps_per_direction"] == pytest.approx(63.0e9, rel=1e-3)
        and p["nic_Bps"] == 50e9
        and p["nic_fits"] is True
    )
    out = tmp_path / "i.png"
    r = runner.invoke(app, ["plan", "interval", "--mtbf", "3.09h", "--stall", "60s", "--plot", str(out)])
    assert r.exit_code == 0 and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "args",
    [
        ["interval", "--mtbf", "-3h", "--stall", "60s"],
        ["interval", "--mtbf", "3h", "--stall", "0s"],
        ["interval", "--stall", "60s"],
        ["size", "--params", "405e9", "--bandwidth", "100 parsecs"],
        ["size", "--params", "0"],
        ["spot", "--discount", "1.2", "--node-rate", "0.02/h", "--nodes", "4"],
        ["spot", "--discount", "0.6", "--node-rate", "0.02/fortnight", "--nodes", "4"],
        ["activations", "--seq", "0", "--hidden", "8", "--heads", "1", "--layers", "1"],
        ["activations", "--seq", "8", "--hidden", "8", "--heads", "1", "--layers", "1", "--recompute", "some"],
        ["pcie", "--gen", "9"],
        ["failures", "--gpus", "-1"],
    ],
)
def test_bad_input_exits_2(args):
    r = runner.invoke(app, ["plan", *args])
    assert r.exit_code == 2, r.output


def test_spot_trace_when_present():
    f = SKYPILOT / "preemption" / "4-node" / "aws-08-03-2023" / "us-east-2a_v100_1.json"
    if not f.exists():
        pytest.skip("../shared/data/traces/skypilot-spot not present (only in the development workspace)")
    sp = run_json("spot", "--discount", "0.6", "--node-rate", "0.02/h", "--nodes", "4", "--trace", str(f))
    tr = sp["trace"]
    assert tr["gang_size"] == 4 and tr["nodes_lost"] > 0 and tr["gang_interruptions"] > 0
    # correlated reclaims: the 4-node gang is interrupted far less often than 4 x the per-node rate
    assert 1.0 <= tr["gang_vs_node"] <= 4.0 and tr["gang_vs_independent"] < 1.0


def test_nccl_command(tmp_path: Path):
    log = tmp_path / "nccl.log"
    log.write_text(
        "node1:123:456 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA\n"
        "node1:123:456 [0] NCCL INFO Channel 01/0 : 0[0] -> 8[0] [send] via NET/IB/0\n"
        "node1:123:456 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read\n"
    )
    out = run_json("nccl", str(log))
    assert out["inter_node"] == 2 and out["inter_node_gdr"] == 1
    assert [c["gdr"] for c in out["connections"]] == [True, False, False]
    assert [c["transport"] for c in out["connections"]] == ["NET", "NET", "P2P"]
    r = runner.invoke(app, ["plan", "nccl", str(log)])
    assert r.exit_code == 0 and "1 of 2 inter-node connections" in r.output
    r = runner.invoke(app, ["plan", "nccl", str(tmp_path / "missing.log")])
    assert r.exit_code == 2


def test_every_size_option_reads_units_the_same_way() -> None:
    """One parser for the project: the ckpt and bench options read 1GB as 10^9 bytes, as plan does."""
    from goodput.cli.bench import _size
    from goodput.cli.ckpt import _parse_bytes

    for text, n in (("1GB", 10**9), ("1GiB", 2**30), ("512MiB", 512 * 2**20), ("4096", 4096)):
        assert U.parse_size(text) == _parse_bytes(text) == _size(text) == n
    with pytest.raises(U.UnitError, match="whole"):
        U.parse_size("1.5")
    assert U.fmt_bytes(2**30) == "1.074 GB (1.000 GiB)"
