"""The synthetic workload and cluster, calibrated to Acme.

Acme: Hu et al., "Characterization of Large Language Model Development in the Datacenter", NSDI'24;
github.com/InternLM/AcmeTrace, data/cluster_summary.csv. No trace records checkpoint behaviour, so
every workload (the trace readers' too, :mod:`.traces`) draws it, seeded, as :func:`synthetic` says.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..core.model import Checkpointing, Job, Pool, PoolKind, RetryPolicy
from .formats import Cluster

# ---------------------------------------------------------------------------------------------
# Acme calibration and the synthetic workload
# ---------------------------------------------------------------------------------------------

# Acme (NSDI'24), github.com/InternLM/AcmeTrace data/cluster_summary.csv, GPU jobs only
# (columns *_gpu). Seren and Kalos are Shanghai AI Lab's LLM clusters; times in seconds.
ACME_SEREN_GPU_JOBS = 663_813
ACME_SEREN_AVG_RUN_S = 1414.335
ACME_SEREN_MED_RUN_S = 122.0
ACME_SEREN_AVG_GPUS = 5.68
ACME_SEREN_MED_GPUS = 1.0
ACME_SEREN_MAX_GPUS = 1024.0
ACME_SEREN_FAIL_RATE = 0.429
ACME_KALOS_GPU_JOBS = 19_907
ACME_KALOS_AVG_RUN_S = 1259.689
ACME_KALOS_MED_RUN_S = 124.0
ACME_KALOS_AVG_GPUS = 26.77
ACME_KALOS_MED_GPUS = 1.0
ACME_KALOS_MAX_GPUS = 1024.0
ACME_KALOS_FAIL_RATE = 0.397

# The synthetic targets weigh the two clusters equally: by job count Seren's 664k jobs would
# drown Kalos's 20k, and Kalos (the pre-training cluster) is where the large gangs live.
TARGET_MED_RUN_S = (ACME_SEREN_MED_RUN_S + ACME_KALOS_MED_RUN_S) / 2  # 123 s
TARGET_AVG_RUN_S = (ACME_SEREN_AVG_RUN_S + ACME_KALOS_AVG_RUN_S) / 2  # 1337.0 s
TARGET_MED_GPUS = 1.0
TARGET_AVG_GPUS = (ACME_SEREN_AVG_GPUS + ACME_KALOS_AVG_GPUS) / 2  # 16.2
RUN_CAP_S = 3 * 86400.0  # Acme's longest jobs run 7-14 days; a simulated horizon does not need them
RUN_FLOOR_S = 1.0

# Synthetic cluster prices ($/GPU-hour) and spot reclaim rate. The on-demand price is an
# H100-class list-price order of magnitude; spot is the 60 % discount goodput.plan.spot works at.
ON_DEMAND_PRICE = 4.0
SPOT_PRICE = 1.6
# 0.3 reclaims per node-hour alive: the low end of what the SkyPilot 1-node V100 preemption traces
# measure (0.31-0.74 per node-hour, AWS, April 2023, see trace_reclaim_rate), so that the default
# comparison prices spot as a real market does; replay a trace with reclaims_from_trace for more.
SPOT_RECLAIM_PER_NODE_HOUR = 0.3

# GPU-count shape: single-node requests and multi-node gangs of 8-GPU nodes, weighted so the
# median is 1 GPU; the gang share is solved so the mean hits TARGET_AVG_GPUS.
_SINGLE_GPUS = np.array([1, 2, 4, 8])
_SINGLE_P = np.array([0.70, 0.10, 0.08, 0.12])
_GANG_NODES = np.array([2, 4, 8, 16, 32, 64, 128])  # 128 x 8 = 1024 GPUs, Acme's max_gpu
_GANG_P = _GANG_NODES**-0.5 / np.sum(_GANG_NODES**-0.5)
_GANG_SHARE_MAX = 0.25  # keeps P(1 GPU) = 0.70 x (1 - share) above 1/2, so the median stays 1
_PRIO_SMALL = np.array([0.55, 0.30, 0.10, 0.05])
_PRIO_GANG = np.array([0.15, 0.25, 0.35, 0.25])


def acme_targets() -> dict[str, dict[str, float]]:
    """The Acme numbers embedded here, keyed like cluster_summary.csv so a test can compare."""
    return {
        "Seren": {
            "gpu_job_num": ACME_SEREN_GPU_JOBS,
            "avg_run_time_gpu": ACME_SEREN_AVG_RUN_S,
            "med_run_time_gpu": ACME_SEREN_MED_RUN_S,
            "avg_gpu_num": ACME_SEREN_AVG_GPUS,
            "med_gpu_num": ACME_SEREN_MED_GPUS,
            "max_gpu": ACME_SEREN_MAX_GPUS,
            "fail_rate_gpu": ACME_SEREN_FAIL_RATE,
        },
        "Kalos": {
            "gpu_job_num": ACME_KALOS_GPU_JOBS,
            "avg_run_time_gpu": ACME_KALOS_AVG_RUN_S,
            "med_run_time_gpu": ACME_KALOS_MED_RUN_S,
            "avg_gpu_num": ACME_KALOS_AVG_GPUS,
            "med_gpu_num": ACME_KALOS_MED_GPUS,
            "max_gpu": ACME_KALOS_MAX_GPUS,
            "fail_rate_gpu": ACME_KALOS_FAIL_RATE,
        },
    }


def synthetic_targets() -> dict[str, float]:
    """What :func:`synthetic` claims to match at its default shape (8-GPU nodes, >= 128 nodes)."""
    return {
        "med_run_s": TARGET_MED_RUN_S,
        "avg_run_s": TARGET_AVG_RUN_S,
        "med_gpus": TARGET_MED_GPUS,
        "avg_gpus": TARGET_AVG_GPUS,
    }


def _phi(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def _capped_lognormal_mean(mu: float, sigma: float, cap: float) -> float:
    lc = math.log(cap)
    return math.exp(mu + sigma * sigma / 2) * _phi((lc - mu - sigma * sigma) / sigma) + cap * (
        1 - _phi((lc - mu) / sigma)
    )


def lognormal_fit(median: float, mean: float, cap: float = RUN_CAP_S) -> tuple[float, float]:
    """(mu, sigma) of a lognormal with this median whose mean AFTER capping at ``cap`` is ``mean``.

    Starts from the uncapped fit sigma = sqrt(2 ln(mean/median)); the cap cuts the heavy tail that
    carries much of the mean (5 % at Acme's numbers), so sigma is raised until the capped mean
    matches. Falls back to the uncapped fit if the cap makes the mean unreachable.
    """
    if not 0 < median < mean:
        raise ValueError("a lognormal fit needs 0 < median < mean")
    mu = math.log(median)
    s0 = math.sqrt(2 * math.log(mean / median))
    if math.isinf(cap) or _capped_lognormal_mean(mu, s0, cap) >= mean:
        return mu, s0
    # the capped mean rises with sigma up to a peak; bisect on the rising side
    lo, hi = s0, s0
    while hi < 10 and _capped_lognormal_mean(mu, hi, cap) < mean:
        nxt = hi + 0.25
        if _capped_lognormal_mean(mu, nxt, cap) <= _capped_lognormal_mean(mu, hi, cap):
            return mu, s0
        lo, hi = hi, nxt
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _capped_lognormal_mean(mu, mid, cap) < mean else (lo, mid)
    return mu, (lo + hi) / 2


@dataclass(frozen=True)
class _Drawn:
    """Per-job arrays the traces do not record, drawn as :func:`synthetic` documents."""

    limit_s: np.ndarray
    interval_s: np.ndarray
    write_s: np.ndarray
    stall_s: np.ndarray
    restart_s: np.ndarray
    grace_s: np.ndarray
    spot: np.ndarray


_GRACE_CHOICES = np.array([30.0, 60.0, 120.0, 300.0])
_GRACE_P = np.array([0.40, 0.25, 0.20, 0.15])


def _draw_unrecorded(rng: np.random.Generator, duration: np.ndarray, nodes: np.ndarray, gpus: np.ndarray) -> _Drawn:
    n = len(duration)
    long_ = duration >= 1800.0
    ckpt = rng.random(n) < np.where(long_, 0.90, 0.10)
    interval = np.where(ckpt, 60.0 * rng.integers(10, 61, n), 0.0)
    g = gpus.astype(float)
    write = np.clip(10.0 * g**0.42 * rng.uniform(0.8, 1.25, n), 10.0, 180.0).round(1)
    stall = (write * rng.uniform(0.01, 0.10, n)).round(2)
    restart = np.clip(60.0 * g**0.33 * rng.uniform(0.8, 1.25, n), 60.0, 600.0).round(0)
    grace = _pick(rng, _GRACE_CHOICES, _GRACE_P, n)
    spot = rng.random(n) < np.where(ckpt, 0.40, 0.20)
    factor = np.minimum(1.0 + rng.exponential(1.0, n), 5.0)
    limit = np.maximum(np.ceil(duration * factor / 60.0) * 60.0, duration)
    return _Drawn(limit, interval, write, stall, restart, grace, spot)


def _pick(rng: np.random.Generator, values: np.ndarray, p: np.ndarray, n: int) -> np.ndarray:
    idx = np.searchsorted(np.cumsum(p), rng.random(n), side="right")
    return values[np.minimum(idx, len(values) - 1)]


def synthetic(
    n_jobs: int = 100_000,
    *,
    nodes: int = 2048,
    gpus_per_node: int = 8,
    tenants: int = 16,
    load: float = 0.9,
    seed: int = 0,
) -> list[Job]:
    """The simulator's default workload: Acme-calibrated sizes and run times, Poisson arrivals.

    Calibration (see :func:`synthetic_targets`): run times are lognormal with Acme's median (123 s)
    and, after a 3-day cap, its mean (1337 s), floored at 1 s; GPU counts are 1/2/4/8 GPUs on one
    node (70/10/8/12 %) or, for the tail, gangs of 2..128 whole nodes (weights ~ nodes^-0.5), with
    the gang share (about 11 %) solved so the mean is 16.2 GPUs and the median 1. Size and run
    time are drawn independently. Arrivals are Poisson at the rate that makes the drawn jobs'
    GPU-seconds offer ``load`` of the cluster's GPUs. Tenants ``t00``.. are Zipf (s = 1); priority
    is 0-3, mostly 0-1 for small jobs and mostly 2-3 for gangs. Gangs are capped at ``nodes`` and
    single-node requests at ``gpus_per_node``, so the calibration holds at the default shape only.

    Checkpoint facts are in no trace, so they are drawn: a job under 30 min checkpoints with
    probability 0.1, a longer one 0.9; the interval is 10-60 min (whole minutes, uniform); the
    write takes 10 s x GPUs^0.42 (x0.8-1.25 jitter, within 10-180 s: 10 s at 1 GPU, ~180 s at 1024),
    the stall 1-10 % of the write; restart 60 s x GPUs^0.33 (jitter, within 60-600 s); grace is
    30/60/120/300 s (40/25/20/15 %), so small gangs fit their write in grace and big ones often do
    not. 40 % of the checkpointing jobs and 20 % of the others allow spot, whatever their size:
    the permission is the user's, the placement the scheduler's (goodput.sched.core.placement). The
    declared limit over-states the run by a factor 1 + Exp(1) (at most 5), rounded up to a minute, because users
    over-request and backfill has to live with it. ``max_failures`` is the model's default.
    """
    if n_jobs < 0 or nodes < 1 or gpus_per_node < 1 or tenants < 1 or load <= 0:
        raise ValueError("n_jobs >= 0, nodes >= 1, gpus_per_node >= 1, tenants >= 1 and load > 0 are required")
    rng = np.random.default_rng(seed)
    n = n_jobs
    mu, sigma = lognormal_fit(TARGET_MED_RUN_S, TARGET_AVG_RUN_S, RUN_CAP_S)
    duration = np.clip(np.round(rng.lognormal(mu, sigma, n)), RUN_FLOOR_S, RUN_CAP_S)

    single = np.minimum(_SINGLE_GPUS, gpus_per_node)
    gang_nodes = np.minimum(_GANG_NODES, nodes)
    m_single = float(single @ _SINGLE_P)
    m_gang = float((gang_nodes * gpus_per_node) @ _GANG_P)
    share = 0.0 if nodes < 2 or m_gang <= m_single else (TARGET_AVG_GPUS - m_single) / (m_gang - m_single)
    share = min(max(share, 0.0), _GANG_SHARE_MAX)
    is_gang = rng.random(n) < share
    n_single = _pick(rng, single, _SINGLE_P, n)
    n_gang = _pick(rng, gang_nodes, _GANG_P, n)
    job_nodes = np.where(is_gang, n_gang, 1)
    job_gpn = np.where(is_gang, gpus_per_node, n_single)
    gpus = job_nodes * job_gpn

    work = float(np.sum(gpus * duration))
    if n:
        rate = load * nodes * gpus_per_node * n / work  # jobs per second
        gaps = rng.exponential(1.0 / rate, n)
        submit = np.round(np.concatenate(([0.0], np.cumsum(gaps[:-1]))), 3)
    else:
        submit = np.zeros(0)
    zipf = 1.0 / np.arange(1, tenants + 1)
    tenant_idx = _pick(rng, np.arange(tenants), zipf / zipf.sum(), n)
    prio = np.where(job_nodes > 1, _pick(rng, np.arange(4), _PRIO_GANG, n), _pick(rng, np.arange(4), _PRIO_SMALL, n))
    d = _draw_unrecorded(rng, duration, job_nodes, gpus)
    names = [f"t{k:02d}" for k in range(tenants)]
    width = max(6, len(str(max(n - 1, 0))))
    return _jobs(
        [f"j{i:0{width}d}" for i in range(n)],
        [names[k] for k in tenant_idx.tolist()],
        submit,
        job_nodes,
        job_gpn,
        prio,
        duration,
        d,
    )


def _jobs(ids, tenants, submit, nodes, gpn, prio, duration, d: _Drawn) -> list[Job]:
    cols = zip(
        ids,
        tenants,
        submit.tolist(),
        nodes.tolist(),
        gpn.tolist(),
        prio.tolist(),
        duration.tolist(),
        d.limit_s.tolist(),
        d.interval_s.tolist(),
        d.write_s.tolist(),
        d.stall_s.tolist(),
        d.restart_s.tolist(),
        d.grace_s.tolist(),
        d.spot.tolist(),
    )
    return [
        Job(
            id=jid,
            tenant=ten,
            priority=int(pr),
            nodes=int(nn),
            gpus_per_node=int(gg),
            submit_s=sub,
            duration_s=dur,
            limit_s=lim,
            spot=bool(sp),
            ckpt=Checkpointing(interval_s=iv, write_s=wr, stall_s=st, restart_s=rs, grace_s=gr),
            retry=RetryPolicy(),
            seq=i,
            eligible_s=sub,
        )
        for i, (jid, ten, sub, nn, gg, pr, dur, lim, iv, wr, st, rs, gr, sp) in enumerate(cols)
    ]


def synthetic_cluster(nodes: int = 2048, gpus_per_node: int = 8, spot_share: float = 0.25) -> Cluster:
    """Pool "od" (on-demand, $4.0/GPU-h) and pool "spot" ($1.6, 60 % off); an empty pool is left out.

    The spot pool's ``reclaim_per_node_hour`` is :data:`SPOT_RECLAIM_PER_NODE_HOUR` (0.3), a
    rate at the low end of what the SkyPilot V100 traces measure (see the constant). No events:
    add :func:`reclaims_from_trace` or :func:`llama3_failures` for them.
    """
    if nodes < 1 or gpus_per_node < 1 or not 0 <= spot_share <= 1:
        raise ValueError("nodes >= 1, gpus_per_node >= 1 and 0 <= spot_share <= 1 are required")
    n_spot = round(nodes * spot_share)
    pools = []
    if nodes - n_spot > 0:
        pools.append(Pool("od", PoolKind.ON_DEMAND, nodes - n_spot, gpus_per_node, ON_DEMAND_PRICE, 0.0))
    if n_spot > 0:
        pools.append(Pool("spot", PoolKind.SPOT, n_spot, gpus_per_node, SPOT_PRICE, SPOT_RECLAIM_PER_NODE_HOUR))
    return Cluster(pools=pools, events=[])
