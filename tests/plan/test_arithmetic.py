"""Golden figures: the brief's chain and published numbers, each with its source."""

from __future__ import annotations

import math

import pytest

from goodput.plan import activations, failures, interval, pcie, size, spot, tokens
from goodput.plan.interval import lambert_w0, useful_fraction, waste_first_order


def test_llama3_failures():
    # Dubey et al. 2024, §3.3.4, Table 5: 419 unexpected interruptions in 54 days on 16,384 GPUs
    r = failures.failures()
    assert r.total == 419
    assert r.printed_pct_sum == pytest.approx(94.9)  # the table's own printed column
    assert r.recomputed_pct[0] == pytest.approx(35.3, abs=0.05)  # 148/419, printed 30.1
    assert r.job_mtbi_s / 3600 == pytest.approx(3.093, abs=1e-3)  # "one every three hours"
    assert r.gpu_mtbf_s / 3600 == pytest.approx(50_677, rel=1e-4)  # ≈ 50,700 h, 5.8 years
    assert r.gpu_mtbf_s / 3600 / 24 / 365.25 == pytest.approx(5.8, abs=0.05)
    assert failures.failures(gpus=1024).mtbi_s == pytest.approx(r.gpu_mtbf_s / 1024)


def test_daly_published_check():
    # Daly 2006: δ = 5 min, M = 24 h -> optimum 116.7 min (the paper prints 117); Young 120 min
    d, m = 300.0, 86400.0
    assert interval.optimal_exact(d, m) / 60 == pytest.approx(116.7, abs=0.05)
    assert interval.daly(d, m) / 60 == pytest.approx(116.7, abs=0.05)
    assert interval.young(d, m) / 60 == pytest.approx(120.0)
    # the exact optimum really maximises Daly's useful fraction
    o = interval.optimal_exact(d, m)
    for f in (0.9, 0.99, 1.01, 1.1):
        assert useful_fraction(o, d, m, 600) >= useful_fraction(o * f, d, m, 600)


def test_first_order_is_off_in_the_spot_regime():
    # "The first-order form is off by up to 10 points once waste nears 50 %"
    d, m = 600.0, 3600.0
    tau = interval.optimal_exact(d, m)
    first = waste_first_order(tau, d, m)
    exact = 1 - useful_fraction(tau, d, m)
    assert exact > 0.4 and abs(first - exact) > 0.05
    # and small where waste is small (Llama 3 regime)
    d, m = 60.0, 3.09 * 3600
    tau = interval.optimal_exact(d, m)
    assert abs(waste_first_order(tau, d, m) - (1 - useful_fraction(tau, d, m))) < 0.01


def test_lambert_w():
    for x in (-1 / math.e + 1e-12, -0.3, -1e-8, 0.0, 1e-9, 1.0, 10.0, 1e6):
        w = lambert_w0(x)
        assert w * math.exp(w) == pytest.approx(x, rel=1e-12, abs=1e-15)
    assert lambert_w0(1.0) == pytest.approx(0.5671432904097838)
    with pytest.raises(ValueError):
        lambert_w0(-1.0)


def test_checkpoint_size_chain():
    # the brief: 16 B/param x 405B = 6.5 TB; over 100 GB/s about a minute; 3 % of a 30-min cadence
    r = size.size(405e9, 16, 16_384, 8, 16, 100e9, 1800)
    assert r.total_bytes == pytest.approx(6.48e12)
    assert r.total_bytes / 2**40 == pytest.approx(5.89, abs=0.005)  # TiB
    assert r.write_s == pytest.approx(64.8)
    assert r.overhead_fraction == pytest.approx(0.036)
    assert r.bytes_per_gpu == pytest.approx(395.5e6, rel=1e-3)
    assert r.bytes_per_replica == pytest.approx(50.6e9, rel=1e-3)
    # ZeRO (Rajbhandari et al. 2020, §3.1): GPT-2 1.5B needs 24 GB for mixed-precision Adam
    assert size.size(1.5e9, 16, 16, 1, 1).total_bytes == pytest.approx(24e9)
    with pytest.raises(ValueError, match="multiple"):
        size.size(1e9, 16, 100, 8, 16)


def test_token_stream_burst_restore():
    r = tokens.tokens(16_384, 400e12, 405e9, 4, 6.48e12, 60, 2e12)
    assert r.tokens_per_s == pytest.approx(2.7e6, rel=0.01)
    assert r.token_stream_Bps == pytest.approx(10.8e6, rel=0.01)
    assert r.burst_Bps == pytest.approx(108e9)
    assert r.restore_bytes == pytest.approx(5.67e12)
    assert r.restore_s == pytest.approx(2.8, abs=0.05)
    assert r.restore_bytes_naive == pytest.approx(108.5e12, rel=1e-3)
    assert r.restore_naive_s == pytest.approx(54, abs=0.5)


def test_activation_memory():
    # the brief: 34 x s x h per layer at s = h = 8192: 2.3 GB, 182 GB over 80 layers (no score term)
    r = activations.activations(8192, 8192, 64, 80, flash=True)
    assert r.bytes_per_layer == pytest.approx(2.28e9, rel=1e-3)
    assert r.bytes_total == pytest.approx(182.5e9, rel=1e-3)
    # Korthikanti et al. 2022: selective recompute saves 70 % for GPT-3 175B (s 2048, h 12288, a 96, t 8, SP)
    g = activations.activations(2048, 12288, 96, 96, tp=8, sp=True, recompute="selective")
    assert g.saving_fraction == pytest.approx(0.70, abs=0.005)
    # tensor parallelism without SP keeps the 10·sbh replicated part
    assert activations.per_layer(2048, 1, 12288, 96, 8) == pytest.approx(2048 * 12288 * (10 + 3 + 80 / 8))
    assert activations.per_layer(2048, 1, 12288, 96, 8, sp=True, recompute="full") == 2 * 2048 * 12288 / 8


def test_pcie_and_gdr():
    assert pcie.pcie_bandwidth(4, 16) == pytest.approx(31.5e9, rel=1e-3)
    assert pcie.pcie_bandwidth(5, 16) == pytest.approx(63.0e9, rel=1e-3)
    assert pcie.pcie_bandwidth(4, 4) == pytest.approx(7.9e9, rel=5e-3)
    assert pcie.pcie_bandwidth(5, 4) == pytest.approx(15.8e9, rel=5e-3)
    r4, r5 = pcie.pcie(4, 16), pcie.pcie(5, 16)
    assert not r4.nic_fits and r5.nic_fits and r5.nic_Bps == 50e9
    assert r5.dram_peak_Bps == pytest.approx(614.4e9)
    assert r5.dram_traffic_without_gdr_Bps == pytest.approx(1600e9)
    assert r5.dram_ratio_without_gdr == pytest.approx(2.6, abs=0.01)
    assert r5.ckpt_stall_s == pytest.approx(0.007, abs=0.0005)  # 346 MB / 50 GB/s
    assert 52.8e9 / r5.pcie_Bps_per_direction == pytest.approx(0.84, abs=0.005)  # measured H100 D2H


def test_spot_economics():
    r = spot.spot(0.6, 0.02 / 3600, 16, 1800, 600, 60)
    assert r.job_rate_per_s * 3600 == pytest.approx(0.32)
    assert r.waste_per_preemption_s == 1500
    assert r.useful_fraction == pytest.approx(useful_fraction(1800, 60, 3600 / 0.32, 600))
    assert r.break_even_discount == pytest.approx(1 - r.useful_fraction / r.useful_fraction_on_demand)
    assert r.cost_ratio == pytest.approx(0.4 * r.useful_fraction_on_demand / r.useful_fraction)
    # the largest gang keeps half the discount; one node more does not
    n = r.max_gang_nodes
    assert spot.spot(0.6, 0.02 / 3600, n, 1800, 600, 60).cost_ratio <= 0.7
    assert spot.spot(0.6, 0.02 / 3600, n + 1, 1800, 600, 60).cost_ratio > 0.7
    # first order: break-even where Λ(τ/2+R) reaches the discount
    lam = 0.6 / (1500 / 3600) / 3600
    fo = spot.spot(0.6, lam, 1, 1800, 600, 0)
    assert fo.loss_first_order == pytest.approx(0.6)
    assert len(r.cadences) == 3


def test_trace_rates_count_drops_against_time_alive():
    counts = [0, 2, 2, 1, 2, 2, 0, 2, 2, 2]
    t = spot.trace_rates(counts, 300)
    assert t.gang_size == 2 and t.nodes_lost == 3 and t.gang_interruptions == 2
    assert t.node_rate_per_s == pytest.approx(3 / (sum(counts[:-1]) * 300))
    assert t.gang_rate_per_s == pytest.approx(2 / (6 * 300))
