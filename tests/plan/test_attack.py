"""Hostile input and realistic-scale checks of goodput.plan: each test here reproduced a defect or
guards a property (hypothesis) the arithmetic must keep."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from goodput.cli.main import app
from goodput.plan import units as U
from goodput.plan.interval import daly, interval, optimal_exact, useful_fraction, young
from goodput.plan.nccl import parse_nccl_log
from goodput.plan.spot import spot

runner = CliRunner()
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "llama3-405b.yaml"
P = "node1:123:456 [0] NCCL INFO "
HUGE = "1" + "0" * 400  # a whole number no float can hold


def plan(*args: str):
    return runner.invoke(app, ["plan", *args])


def bad(args: list[str], flag: str) -> str:
    """The command fails with exit status 2 and a message naming ``flag``, not a traceback."""
    r = plan(*args)
    assert r.exit_code == 2, (r.exit_code, r.output)
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert flag in r.output, r.output
    return r.output


# --- hand-computed figures at a realistic scale -------------------------------------------------


def test_16k_h100_two_minute_write_by_hand():
    # 16,384 H100s at a per-GPU MTBF of 50,000 h: M = 50,000 × 3600 / 16,384 = 10,986.3 s (3.05 h).
    # A blocking 2-minute write: Young √(2·120·10,986.3) = 1,623.8 s (27.1 min); Daly 1,544.8 s;
    # the exact optimum M·[1 + W₀(−e^{−(1+δ/M)})] = 1,544.8 s (mpmath.lambertw agrees to 1e-12).
    m = 50_000 * 3600 / 16_384
    assert m == pytest.approx(10_986.33, abs=0.01)
    assert young(120, m) == pytest.approx(1623.80, abs=0.01)
    assert daly(120, m) == pytest.approx(1544.78, abs=0.01)
    assert optimal_exact(120, m) == pytest.approx(1544.8025668279, rel=1e-12)
    r = interval(120, m, 600)
    # u = τ / [M·e^{R/M}·(e^{(τ+δ)/M} − 1)] at τ = 1,544.8 s, R = 10 min: 81.4 %
    assert r.useful_fraction_at_optimal == pytest.approx(0.8137, abs=5e-4)
    # first order δ/τ + (τ/2 + R)/M = 120/1,544.8 + (772.4 + 600)/10,986.3 = 0.0777 + 0.1249 = 20.3 %
    assert r.waste_first_order_at_optimal == pytest.approx(120 / 1544.8 + (772.4 + 600) / m, abs=1e-4)


def test_optimum_keeps_precision_for_tiny_stalls():
    # an async staging stall of 7 ms against a single GPU's 50,677 h: δ/M ≈ 3.8e-11. Young's √(2δM) is
    # the leading term; the exact optimum must agree with Daly's series to many digits, not lose them
    # in 1 + W₀(x) with x next to −1/e (it returned 0 for δ/M = 1e-16).
    for ratio in (1e-8, 1e-11, 1e-13, 1e-15, 1e-16, 1e-18, 1e-30):
        m = 1.0
        assert optimal_exact(ratio * m, m) == pytest.approx(daly(ratio * m, m), rel=1e-9), ratio
    d, m = 346.1e6 / 50e9, 50_677 * 3600.0
    assert optimal_exact(d, m) == pytest.approx(daly(d, m), rel=1e-9)
    # and stays right where δ ≫ M (τ* → M)
    assert optimal_exact(1e6, 1.0) == pytest.approx(1.0)
    assert optimal_exact(300.0, 86400.0) / 60 == pytest.approx(116.7, abs=0.05)


# --- overflow and non-finite input --------------------------------------------------------------


def test_useful_fraction_does_not_overflow():
    # restart ≫ MTBI: e^{R/M} overflows a float; the useful fraction is 0, not an OverflowError
    assert useful_fraction(1.0, 1.0, 1.0, 1000.0) == 0.0
    assert useful_fraction(1.0, 1.0, 1e-300, 0.0) == 0.0


def test_interval_restart_much_longer_than_mtbi_is_not_a_traceback():
    r = plan("interval", "--mtbf", "1s", "--stall", "1s", "--restart", "1000s", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["useful_fraction_at_optimal"] == 0.0


@pytest.mark.parametrize("fn", [U.parse_duration, U.parse_bytes, U.parse_bandwidth, U.parse_count, U.parse_rate])
def test_overflowing_values_say_too_large_not_negative(fn):
    text = {U.parse_bandwidth: "1e308TB/s", U.parse_rate: "1e308/ms"}.get(fn, "1e308T" if fn is U.parse_count else None)
    text = text or ("1e308h" if fn is U.parse_duration else "1e308TB")
    with pytest.raises(U.UnitError, match="too large") as e:
        fn(text)
    assert "positive" not in str(e.value) and "non-negative" not in str(e.value)


@pytest.mark.parametrize("fn,text", [(U.parse_bytes, "346mb"), (U.parse_bytes, "100gb"), (U.parse_bandwidth, "100gb/s"),
                                     (U.parse_bandwidth, "400gbps"), (U.parse_size, "1gb")])  # fmt: skip
def test_lowercase_bits_or_bytes_is_ambiguous(fn, text):
    # "346mb" was read as megabits (43 MB): a silent factor of 8; "Mb" (bits) and "MB" (bytes) stay clear
    with pytest.raises(U.UnitError, match="ambiguous"):
        fn(text)
    assert U.parse_bytes("8Gb") == 1e9 and U.parse_bytes("8kb") == 1e3 and U.parse_bandwidth("400Gbps") == 50e9


def test_plot_to_an_unwritable_path_names_the_flag(tmp_path):
    missing = str(tmp_path / "no" / "such" / "dir" / "x.png")
    bad(["interval", "--mtbf", "3h", "--stall", "60s", "--plot", missing], "--plot")
    bad(["spot", "--discount", "0.6", "--node-rate", "0.02/h", "--nodes", "4", "--plot", missing], "--plot")


def test_trace_with_a_non_finite_gap_is_refused(tmp_path):
    t = tmp_path / "t.json"
    t.write_text('{"data": [1, 1, 0], "metadata": {"gap_seconds": "nan"}}')
    bad(["spot", "--discount", "0.6", "--node-rate", "0.02/h", "--nodes", "2", "--trace", str(t)], "--trace")


def test_tiny_durations_are_not_printed_as_zero():
    # 50,677 h over 10^29 GPUs is 1.8e-18 s: it printed "0.0 µs"
    assert U.fmt_duration(1.8e-18) == "1.8e-18 s"
    assert U.fmt_duration(5e-4) == "500.0 µs" and U.fmt_duration(0) == "0 s"


def test_gbps_with_capital_b_is_bytes():
    # "B" is bytes and "b" bits, in "GBps" as in "GB/s": 100 GBps is 100e9 B/s, not 12.5e9
    assert U.parse_bandwidth("100GBps") == pytest.approx(100e9)
    assert U.parse_bandwidth("400Gbps") == pytest.approx(50e9)
    assert U.parse_bandwidth("2TBps") == pytest.approx(2e12)


@pytest.mark.parametrize(
    "args,flag",
    [
        (["size", "--params", "1e308"], "--params"),
        (["size", "--params", "405e9", "--bytes-per-param", "inf"], "--bytes-per-param"),
        (["tokens", "--bytes-per-token", "inf"], "--bytes-per-token"),
        (["tokens", "--bytes-per-token", "nan"], "--bytes-per-token"),
        (["pcie", "--mts", "nan"], "--mts"),
        (["pcie", "--mts", "inf"], "--mts"),
        (["pcie", "--mts", "0"], "--mts"),
        (["pcie", "--nics", "0"], "--nics"),
        (["pcie", "--sockets", "0"], "--sockets"),
        (["pcie", "--dram-channels", "-1"], "--dram-channels"),
        (["pcie", "--lanes", "12"], "--lanes"),
        (["pcie", "--gen", "9"], "--gen"),
        (
            ["activations", "--seq", "1" + "0" * 200, "--hidden", "1" + "0" * 200, "--heads", "1", "--layers", "1"],
            "--seq",
        ),
        (["interval", "--mtbf", "3h", "--gpu-mtbf", "5h", "--stall", "60s"], "--gpu-mtbf"),
        (["failures", "--gpus", HUGE], "--gpus"),
        (["interval", "--gpus", HUGE, "--gpu-mtbf", "5h", "--stall", "1s"], "--gpus"),
        (["size", "--params", "1e9", "--gpus", HUGE, "--tp", "1", "--pp", "1"], "--gpus"),
        (["tokens", "--gpus", HUGE], "--gpus"),
        (["tokens", "--dp", HUGE], "--dp"),
        (["spot", "--discount", "0.5", "--node-rate", "0.02/h", "--nodes", HUGE], "--nodes"),
        (["pcie", "--nics", HUGE], "--nics"),
        (["interval", "--mtbf", "3h", "--stall", "60s", "--write", "10min", "--interval", "5min"], "--interval"),
    ],
)
def test_bad_numbers_name_the_flag(args, flag):
    bad(args, flag)


# --- spot --------------------------------------------------------------------------------------


def test_spot_without_a_stall_does_not_say_never_checkpoint():
    # δ = 0: checkpoints cost nothing, so the optimum is as often as possible (0), never ∞
    r = spot(0.6, 0.02 / 3600, 16, 1800, 600, 0.0)
    assert r.optimal_interval_s == 0.0
    # no preemptions at all: no optimum (∞), and no gang limit (not a made-up 1,048,576 nodes)
    r0 = spot(0.6, 0.0, 4, 1800, 600, 60)
    assert math.isinf(r0.optimal_interval_s) and r0.max_gang_nodes is None
    out = plan("spot", "--discount", "0.6", "--node-rate", "0/h", "--nodes", "4", "--json")
    assert out.exit_code == 0 and json.loads(out.output)["max_gang_nodes"] is None
    out = plan("spot", "--discount", "0.6", "--node-rate", "0/h", "--nodes", "4")
    assert "1048576" not in out.output and "no limit" in out.output


def test_spot_tiny_rate_is_not_capped():
    # λ = 1e-9 per node-hour, τ/2 + R = 25 min: half the discount is kept up to Λ·(τ/2+R) ≈ 0.43,
    # i.e. about 1e9 nodes; the old search stopped at 2^20 = 1,048,576 and reported that.
    r = spot(0.6, 1e-9 / 3600, 4, 1800, 600, 0.0)
    assert r.max_gang_nodes is not None and r.max_gang_nodes > 1e8


# --- plan run: every bad configuration value is a ConfigError naming the key ----------------------


def _cfg(tmp_path: Path, section: str, key: str, value: str) -> Path:
    import yaml

    cfg = yaml.safe_load(EXAMPLE.read_text())
    cfg[section][key] = yaml.safe_load(value)
    p = tmp_path / "cfg.yaml"
    p.write_text(yaml.safe_dump(cfg))
    return p


@pytest.mark.parametrize(
    "section,key,value",
    [
        ("model", "bytes_per_param", "-3"),
        ("model", "bytes_per_param", ".nan"),
        ("model", "bytes_per_param", ".inf"),
        ("model", "recompute", "some"),
        ("model", "sp", "'false'"),
        ("cluster", "gpus", ".inf"),
        ("cluster", "gpus", "[1, 2]"),
        ("cluster", "pcie_gen", "9"),
        ("cluster", "pcie_lanes", "12"),
        ("checkpoint", "async", "'false'"),
        ("checkpoint", "interval", "1s"),
        ("spot", "discount", "1.0"),
    ],
)
def test_run_bad_config_names_the_key(tmp_path, section, key, value):
    cfg = _cfg(tmp_path, section, key, value)
    bad(["run", str(cfg), "--out", str(tmp_path / "out")], f"{section}.{key}")


def test_run_config_without_suffix_and_undecodable_config(tmp_path):
    cfg = tmp_path / "llama"
    cfg.write_text(EXAMPLE.read_text())
    r = plan("run", str(cfg), "--json")
    assert r.exit_code == 0, r.output
    assert Path(json.loads(r.output)["report"]).is_file()
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\xff\xfe\x00bad")
    bad(["run", str(binary)], "CONFIG")
    out_file = tmp_path / "taken"
    out_file.write_text("")
    bad(["run", str(EXAMPLE), "--out", str(out_file)], "--out")


def test_run_interval_shorter_than_write_is_refused(tmp_path):
    # the example writes 5.67 TB at 100 GB/s: 56.7 s; a 1 s cadence is impossible, not "94 % useful"
    cfg = _cfg(tmp_path, "checkpoint", "interval", "1s")
    out = bad(["run", str(cfg), "--out", str(tmp_path / "out")], "checkpoint.interval")
    assert "56.7 s" in out


def test_run_async_false_means_synchronous(tmp_path):
    cfg = _cfg(tmp_path, "checkpoint", "async", "false")
    r = plan("run", str(cfg), "--out", str(tmp_path / "out"), "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["stall_s"] == pytest.approx(56.7) and d["write_s"] == 0.0


# --- nccl ----------------------------------------------------------------------------------------


def test_nccl_markup_in_log_is_printed_not_interpreted(tmp_path):
    log = tmp_path / "n.log"
    log.write_text(
        "\n".join(
            [
                P + "Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0",
                P + "NET/IB : GPU Direct RDMA Disabled for HCA 0 '[/]'",
                P + "Using network [/bold]",
                P + "Channel 00/0 : 0[0] -> 8[0] [send] via NET/Socket/0",
            ]
        )
        + "\n",
        encoding="utf-8",
    )
    r = plan("nccl", str(log))
    assert r.exit_code == 0, r.output
    assert "'[/]'" in r.output and "[/bold]" in r.output


def test_nccl_truncated_net_token_is_not_a_connection():
    # "via NET/IB" with no device index is a cut-off line: it must not count as a non-GDR connection
    text = "\n".join(
        [
            P + "Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA",
            P + "Channel 01/0 : 0[0] -> 8[0] [send] via NET/IB",
            P + "Channel 02/0 : 0[0] -> 8[0] [send] via NET/",
            P + "Channel 03/0 : 0[0] -> 8[0] [send] via ",
            P + "Channel 03/0 : 0[0] -> 8[",
        ]
    )
    r = parse_nccl_log(text)
    assert (r.inter_node, r.inter_node_gdr) == (1, 1)
    assert r.verdict == "the inter-node connection uses GPUDirect RDMA"
    assert r.skipped_lines == [2, 3, 4, 5]
    assert any("4 connection lines" in a and "truncated" in a for a in r.advice)
    assert r.to_dict()["skipped_lines"] == [2, 3, 4, 5]


def test_nccl_long_garbage_line_is_fast():
    import time

    text = (
        "NET/" * 50_000 + "\n" + ("via " * 50_000) + "\n" + P + "Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA"
    )
    t0 = time.perf_counter()
    r = parse_nccl_log(text)
    assert time.perf_counter() - t0 < 2.0
    assert r.inter_node_gdr == 1


@given(st.text(max_size=400))
@settings(max_examples=200, deadline=None)
def test_nccl_never_raises(text):
    r = parse_nccl_log(text)
    json.dumps(r.to_dict())
    assert 0 <= r.inter_node_gdr <= r.inter_node <= len(r.connections)


# --- properties ------------------------------------------------------------------------------------

pos = st.floats(min_value=1e-3, max_value=1e7, allow_nan=False, allow_infinity=False)


@given(d=pos, m1=pos, m2=pos)
@settings(max_examples=300, deadline=None)
def test_more_failures_never_lengthen_the_optimal_interval(d, m1, m2):
    lo, hi = sorted((m1, m2))
    assert optimal_exact(d, lo) <= optimal_exact(d, hi) * (1 + 1e-12)
    assert young(d, lo) <= young(d, hi)
    # Daly's formula is monotone within its branch δ < 2M (it jumps to M at δ = 2M, as published)
    if d < 2 * lo:
        assert daly(d, lo) <= daly(d, hi) * (1 + 1e-12)


@given(d=pos, m=pos, r=st.floats(min_value=0, max_value=1e6), k=st.floats(min_value=0.05, max_value=20))
@settings(max_examples=300, deadline=None)
def test_exact_optimum_maximises_useful_fraction(d, m, r, k):
    o = optimal_exact(d, m)
    u = useful_fraction(o, d, m, r)
    assert 0.0 <= u <= 1.0
    assert useful_fraction(o * k, d, m, r) <= u * (1 + 1e-9) + 1e-300


@given(
    bw1=st.floats(min_value=1e9, max_value=1e13),
    bw2=st.floats(min_value=1e9, max_value=1e13),
    mtbf_h=st.floats(min_value=1e3, max_value=1e6),
    asynchronous=st.booleans(),
)
@settings(max_examples=60, deadline=None)
def test_a_faster_disk_never_lowers_goodput(bw1, bw2, mtbf_h, asynchronous):
    from goodput.plan.run import plan_run

    def u(bw: float) -> float:
        cfg = {
            "model": {"params": 70e9, "bytes_per_param": 14},
            "cluster": {"gpus": 16384, "tp": 8, "pp": 4, "gpu_mtbf": f"{mtbf_h}h"},
            "storage": {"write_bandwidth": f"{bw}B/s", "read_bandwidth": "2TB/s"},
            "checkpoint": {"async": asynchronous, "restart": "10min"},
        }
        return plan_run(cfg).interval.useful_fraction_at_interval

    slow, fast = sorted((bw1, bw2))
    assert u(fast) >= u(slow) - 1e-12


@given(
    n=st.integers(min_value=1, max_value=10_000),
    rate=st.floats(min_value=1e-6, max_value=1.0),
    d=st.floats(min_value=0.0, max_value=0.9),
)
@settings(max_examples=100, deadline=None)
def test_spot_bigger_gangs_cost_more(n, rate, d):
    a = spot(d, rate / 3600, n, 1800, 600, 60)
    b = spot(d, rate / 3600, n + 1, 1800, 600, 60)
    assert b.useful_fraction <= a.useful_fraction + 1e-12
    assert a.max_gang_nodes == b.max_gang_nodes  # the limit does not depend on the gang asked about


def test_cli_output_fits_80_columns_without_ellipsis(tmp_path):
    import os

    log = tmp_path / "n.log"
    log.write_text(
        "\n".join(
            P
            + f"Channel {i:02d}/0 : {i}[{i % 8}] -> {i + 8}[{i % 8}] [send] via NET/IBext_v8/{i % 8}/GDRDMA(PCI)/Shared"
            for i in range(12)
        )
        + "\n"
    )
    runs = [
        ["failures", "--gpus", "16384"],
        ["interval", "--gpus", "16384", "--gpu-mtbf", "50000h", "--stall", "2min", "--restart", "10min"],
        ["size", "--params", "405e9"],
        ["tokens"],
        ["activations", "--seq", "8192", "--hidden", "8192", "--heads", "64", "--layers", "80"],
        ["spot", "--discount", "0.6", "--node-rate", "0.02/h", "--nodes", "16"],
        ["pcie"],
        ["nccl", str(log)],
    ]
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "80"
    try:
        for args in runs:
            r = plan(*args)
            assert r.exit_code == 0, (args, r.output)
            assert "…" not in r.output, (args, r.output)
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old


unit_text = st.one_of(
    st.text(max_size=20),
    st.from_regex(r"\s*[-+]?[0-9]{0,4}(\.[0-9]{0,3})?([eE][-+]?[0-9]{1,3})?\s*[a-zA-Zµ/%]{0,6}\s*", fullmatch=True),
)


@given(text=unit_text)
@settings(max_examples=500, deadline=None)
def test_unit_parsers_return_a_finite_number_or_say_why(text):
    for fn in (U.parse_duration, U.parse_bytes, U.parse_bandwidth, U.parse_count, U.parse_flops, U.parse_rate,
               U.parse_fraction, U.parse_size):  # fmt: skip
        try:
            v = fn(text)
        except U.UnitError:
            continue
        assert math.isfinite(v) and v >= 0, (fn.__name__, text, v)


@given(
    r1=st.floats(min_value=1e-6, max_value=10.0),
    r2=st.floats(min_value=1e-6, max_value=10.0),
    d=st.floats(min_value=0.05, max_value=0.95),
)
@settings(max_examples=100, deadline=None)
def test_spot_more_preemptions_never_allow_a_bigger_gang(r1, r2, d):
    lo, hi = sorted((r1, r2))
    a, b = spot(d, lo / 3600, 1, 1800, 600, 60), spot(d, hi / 3600, 1, 1800, 600, 60)
    assert b.max_gang_nodes <= a.max_gang_nodes
    assert b.max_gang_nodes_first_order <= a.max_gang_nodes_first_order
    assert b.optimal_interval_s <= a.optimal_interval_s * (1 + 1e-12)


def test_run_spot_section_respects_the_write_floor(tmp_path):
    # the example's async write takes 56.7 s: a "τ = 28.4 s" comparison cadence is impossible, and the
    # spot optimum (M = 1/Λ = 3.125 h) is floored at the write too: it "stays at" 56.7 s, not "shortens to"
    r = plan("run", str(EXAMPLE), "--out", str(tmp_path / "out"), "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert [round(c["interval_s"], 1) for c in d["spot"]["cadences"]] == [56.7, 113.4]
    md = (tmp_path / "out" / "report.md").read_text()
    assert "28.4 s" not in md and "shortens to 56.7 s" not in md
    assert "the optimal interval stays at 56.7 s (floored at the write time 56.7 s)" in md


def test_spot_rate_too_high_to_plot(tmp_path):
    # 1e300 preemptions a second: every gang loses all its work; the plot had no finite point and crashed
    png = tmp_path / "s.png"
    bad(["spot", "--discount", "0.6", "--node-rate", "1e300/s", "--nodes", "4", "--plot", str(png)], "--plot")
    cfg = _cfg(tmp_path, "spot", "node_rate", "1e300/s")
    r = plan("run", str(cfg), "--out", str(tmp_path / "out"))
    assert r.exit_code == 0, r.output
    assert not (tmp_path / "out" / "spot.png").exists() and "cost ratio inf" in r.output


def test_activations_refuse_a_tp_that_splits_a_head_or_a_sequence_position():
    """Korthikanti's per-rank terms hold a/t whole heads (and s/t positions with SP); a t that does
    not divide them gave a figure for a layout no framework runs."""
    from goodput.plan.activations import activations, per_layer

    with pytest.raises(ValueError, match="TP 3 must divide the heads 32"):
        per_layer(2048, 1, 4096, 32, 3)
    with pytest.raises(ValueError, match="must divide the sequence length 1000"):
        activations(1000, 4096, 32, 2, tp=16, sp=True)
    r = activations(1001, 4096, 32, 2, tp=8)  # without SP each rank holds the whole sequence
    assert r.bytes_total > 0 and "tp_with_sp" not in r.options and "tp_without_sp" in r.options
    r = plan("activations", "--seq", "2048", "--hidden", "4096", "--heads", "32", "--layers", "2", "--tp", "3")
    assert r.exit_code == 2 and "--tp" in r.output and "must divide --heads 32" in " ".join(r.output.split())


def test_optimal_exact_near_its_large_stall_branch_has_no_domain_error():
    """For δ/M just below 40 the root v sits a few doubles below 1: the bisection's midpoint rounded
    to 1 and ln(1 - v) raised 'math domain error' (a hypothesis run of spot() found it)."""
    taus = [optimal_exact(e * 1000.0, 1000.0) for e in (39.5 + i * 0.0005 for i in range(2001))]
    assert all(math.isfinite(t) and 0 < t <= 1000.0 for t in taus)
    assert all(a <= b for a, b in zip(taus, taus[1:], strict=False))  # τ* grows with the stall
