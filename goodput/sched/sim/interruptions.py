"""What the cluster does to running jobs: spot reclaims replayed from the SkyPilot traces, and
failures at Llama 3's interruption rate, as the cluster JSON's events.

SkyPilot: Wu et al., "Can't Be Late", NSDI'24; github.com/skypilot-org/spot-traces. Llama 3's rate:
:mod:`goodput.plan.failures`.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from ...plan.failures import LLAMA3_GPUS, gpu_mtbf_from_job, job_mtbi
from ...plan.spot import trace_rates
from .formats import Cluster, ClusterEvent, _Keys, _read_json

# ---------------------------------------------------------------------------------------------
# SkyPilot spot traces
# ---------------------------------------------------------------------------------------------


def read_skypilot(path: str | Path) -> tuple[list[int], float]:
    """(counts, gap_s) of a SkyPilot spot trace: ``counts[i]`` instances alive at tick i."""
    name = str(path)
    obj = _read_json(path)
    k = _Keys(name)
    if not isinstance(obj, dict):
        raise k.fail("(top)", f"expected an object with 'metadata' and 'data', got {type(obj).__name__}")
    meta = k.get(obj, "metadata", "metadata")
    if not isinstance(meta, dict):
        raise k.fail("metadata", "expected an object")
    gap = k.num(k.get(meta, "gap_seconds", "metadata.gap_seconds"), "metadata.gap_seconds", strict=True)
    data = k.get(obj, "data", "data")
    if not isinstance(data, list) or not data:
        raise k.fail("data", "expected a non-empty list of counts")
    counts = [k.int_(v, f"data[{i}]", 0) for i, v in enumerate(data)]
    return counts, gap


def trace_reclaim_rate(counts: list[int], gap_s: float) -> float:
    """Reclaims per node-hour alive, the unit of ``Pool.reclaim_per_node_hour``."""
    return trace_rates(list(counts), gap_s).node_rate_per_s * 3600.0


def _pair_changes(changes: Iterable[tuple[int, int]], seam: int = -1) -> list[tuple[int, int, int | None]]:
    """(tick, nodes, ticks until they rise back or None) for each drop, pairing rises FIFO.

    ``changes`` are (tick, count delta), ticks ascending. A rise with no outstanding drop is an
    instance the trace launched that this group never lost; it is ignored. A drop whose nodes come
    back at different ticks is split into one record per return, so each record has one return
    time. ``seam`` is the tick where a rotated series joins the trace's end to its start: a drop
    there is no reclaim (traces start at 0 before the first launch), but a rise there still
    returns nodes, so a group never has more out than it holds.
    """
    out: list[tuple[int, int, int | None]] = []
    pending: deque[list[int]] = deque()  # [tick, nodes still out], oldest first
    for i, delta in changes:
        if delta < 0 and i != seam:
            pending.append([i, -delta])
        while delta > 0 and pending:
            head = pending[0]
            take = min(delta, head[1])
            out.append((head[0], take, i - head[0]))
            head[1] -= take
            delta -= take
            if head[1] == 0:
                pending.popleft()
    out.extend((tick, left, None) for tick, left in pending)
    out.sort(key=lambda r: r[0])  # stable: at one tick, earlier returns first
    return out


def _pair_drops(series: list[int], seam: int = -1) -> list[tuple[int, int, int | None]]:
    d = np.diff(np.asarray(series, dtype=np.int64))
    at = np.flatnonzero(d)
    return _pair_changes(zip((at + 1).tolist(), d[at].tolist()), seam)


def reclaims_from_trace(
    counts: list[int],
    gap_s: float,
    *,
    pool: str,
    pool_nodes: int,
    notice_s: float = 120.0,
    seed: int = 0,
) -> list[ClusterEvent]:
    """Reclaim events for a pool of ``pool_nodes`` by replaying a trace in groups of its size.

    A trace follows max(counts) instances; the pool is cut into groups of that many, each replaying
    the series rotated by its own seeded offset, so groups do not lose nodes in lockstep (real
    reclaims are correlated within a group, which the replay keeps, and less so across zones).
    Every drop of k at tick i is a reclaim of k nodes at t = i x gap whose nodes return when the
    group's count rises back by as many (FIFO), ``return_s`` after they are lost, or never.
    Nodes under notice count as taken: a reclaim that would take more nodes than the pool has
    free at that moment is cut to what is free (or dropped), so the pool never goes below zero.
    """
    if gap_s <= 0 or not math.isfinite(gap_s):
        raise ValueError("gap_s must be a positive finite number")
    if pool_nodes < 1 or notice_s < 0:
        raise ValueError("pool_nodes >= 1 and notice_s >= 0 are required")
    if any(isinstance(c, bool) or not isinstance(c, int) or c < 0 for c in counts):
        raise ValueError("trace counts must be non-negative integers")
    size = max(counts, default=0)
    if size == 0 or len(counts) < 2:
        return []
    rng = np.random.default_rng(seed)
    groups = max(1, pool_nodes // size)
    n = len(counts)
    offsets = rng.integers(0, n, groups).tolist()
    # the series as a cycle: delta[i] is the change into tick i, delta[0] the seam (end to start)
    c = np.asarray(counts, dtype=np.int64)
    delta = c - np.roll(c, 1)
    at = np.flatnonzero(delta)
    cands: list[tuple[float, int, int, float | None]] = []  # t, group, nodes, return_s
    for gi, off in enumerate(offsets):
        ticks = (at - off) % n  # tick of each change in the series rotated to start at ``off``
        order = np.argsort(ticks, kind="stable")
        ticks, deltas = ticks[order], delta[at][order]
        keep = ticks > 0  # the change into the rotated series' first tick does not happen in it
        changes = zip(ticks[keep].tolist(), deltas[keep].tolist())
        for tick, k, back in _pair_changes(changes, seam=(n - off) % n):
            cands.append((tick * gap_s, gi, k, None if back is None else back * gap_s))
    cands.sort(key=lambda c: (c[0], c[1]))
    held: list[tuple[float, int]] = []  # (time the nodes are free again, nodes)
    taken = 0
    events: list[ClusterEvent] = []
    for t, _, k, back in cands:
        while held and held[0][0] <= t:
            taken -= heapq.heappop(held)[1]
        k = min(k, pool_nodes - taken)
        if k <= 0:
            continue
        taken += k
        heapq.heappush(held, (math.inf if back is None else t + notice_s + back, k))
        events.append(ClusterEvent(t=t, kind="reclaim", pool=pool, nodes=k, notice_s=notice_s, return_s=back))
    return events


# ---------------------------------------------------------------------------------------------
# Failures at the Llama 3 rate
# ---------------------------------------------------------------------------------------------


def llama3_gpu_mtbf_s() -> float:
    """Per-GPU MTBF implied by Llama 3: 16,384 GPUs x (54 days / 419 interruptions), 5.8 years."""
    return gpu_mtbf_from_job(job_mtbi(), LLAMA3_GPUS)


def llama3_failures(
    cluster: Cluster,
    horizon_s: float,
    *,
    seed: int = 0,
    hardware_share: float = 0.78,
    repair_s: float | None = 4 * 3600.0,
) -> list[ClusterEvent]:
    """Node failures over [0, horizon_s) at Llama 3's per-GPU rate, for every node of every pool.

    Each node fails as a Poisson process at gpus / MTBF (one interruption per 3.09 h on 16,384
    GPUs). A failure is hardware with probability ``hardware_share`` (Llama 3 §3.3.4 puts about
    78 % of its 419 down to confirmed or suspected hardware), a ``node_loss`` whose node is back
    ``repair_s`` later (None: never); otherwise it is software, a ``job_failure`` of whatever job
    runs there. ``seed_key`` is the node's index in its pool, so every policy simulated on these
    events loses the same node at the same time. The processes do not know about repairs: a node
    may draw a failure while it is still down, and that event finds nothing to take.
    """
    if not horizon_s >= 0 or not math.isfinite(horizon_s):
        raise ValueError("horizon_s must be a finite number >= 0")
    if not 0 <= hardware_share <= 1:
        raise ValueError("hardware_share must be in [0, 1]")
    if repair_s is not None and not repair_s > 0:
        raise ValueError("repair_s must be positive (or None: never repaired)")
    rng = np.random.default_rng(seed)
    m = llama3_gpu_mtbf_s()
    out: list[tuple[float, int, int, ClusterEvent]] = []
    for pi, p in enumerate(cluster.pools):
        counts = rng.poisson(p.gpus_per_node / m * horizon_s, p.nodes)
        node = np.repeat(np.arange(p.nodes), counts)
        t = rng.uniform(0.0, horizon_s, len(node))
        hw = rng.random(len(node)) < hardware_share
        for tt, nn, h in zip(t.tolist(), node.tolist(), hw.tolist()):
            if h:
                e = ClusterEvent(tt, "node_loss", p.name, 1, 0.0, repair_s, nn)
            else:
                e = ClusterEvent(tt, "job_failure", p.name, 1, 0.0, None, nn)
            out.append((tt, pi, nn, e))
    out.sort(key=lambda r: r[:3])
    return [r[3] for r in out]
