"""Job traces of real clusters read as the simulator's jobs and cluster: Alibaba and Microsoft Philly.

Alibaba: cluster-trace-gpu-v2023 (Weng et al., "Beware of Fragmentation", USENIX ATC'23;
github.com/alibaba/clusterdata). Philly: the 2017 trace as the Pollux artifact ships it. Neither
records checkpoint behaviour: it is drawn, seeded, as :func:`.synthetic.synthetic` says.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core.ids import check_id
from ..core.model import Job, Pool, PoolKind
from .formats import Cluster, WorkloadError, _as_float, _as_int
from .synthetic import _PRIO_GANG, _PRIO_SMALL, ON_DEMAND_PRICE, _draw_unrecorded, _jobs, _pick

# ---------------------------------------------------------------------------------------------
# Alibaba cluster-trace-gpu-v2023
# ---------------------------------------------------------------------------------------------

ALIBABA_PODS = "openb_pod_list_default.csv"
ALIBABA_NODES = "openb_node_list_gpu_node.csv"
ALIBABA_QOS_PRIORITY = {"LS": 2, "Guaranteed": 2, "Burstable": 1, "BE": 0}


def _csv_rows(path: Path, need: tuple[str, ...]) -> Iterable[tuple[int, dict[str, str]]]:
    with open(path, encoding="utf-8-sig", newline="") as f:
        r = csv.DictReader(f)
        missing = [c for c in need if c not in (r.fieldnames or ())]
        if missing:
            raise WorkloadError(f"{path}:1: missing required column {missing[0]!r}")
        for row in r:
            yield r.line_num, row


def _cell_int(path: Path, line: int, row: dict[str, str], col: str, lo: int | None = None) -> int | None:
    """The cell as an int, None if empty."""
    cell = row.get(col) or ""
    if not cell.strip():
        return None
    try:
        return _as_int(cell, lo, "an int" if lo is None else f"an int >= {lo}")
    except ValueError as e:
        raise WorkloadError(f"{path}:{line}: column {col!r}: {e}") from None


def read_alibaba(directory: str | Path, *, limit: int | None = None, seed: int = 0) -> tuple[list[Job], Cluster]:
    """GPU tasks of the Alibaba trace and its GPU nodes, one on-demand pool per GPUs-per-node.

    What it is: a *pod list for packing studies* (the ATC'23 paper's fragmentation experiments),
    not an arrival stream. Its GPU tasks offer about 14 busy GPUs to a 6,212-GPU cluster
    (utilization 0.0027), so every policy schedules it identically; use it to test packing and
    the readers, and :func:`read_philly` (a real arrival stream) to compare policies.

    Kept: tasks with GPUs, a scheduled time and a positive run (deletion - scheduled); a GPU-sharing
    task (one GPU, gpu_milli < 1000) takes a whole GPU, since the simulator does not share GPUs.
    Jobs are in creation order (``limit`` keeps the first ones); ``submit_s`` counts from the first
    kept creation. Every task is one node of ``num_gpu`` GPUs; tenant is the QoS class and priority
    follows it (LS, Guaranteed 2; Burstable 1; BE 0). The trace has mixed GPU models and node
    sizes: pool "alibaba-{g}gpu" holds the nodes with g GPUs, and a job may be placed only on a
    pool whose ``gpus_per_node`` is at least its own (the scheduler enforces that, not this
    reader). Checkpoint facts, spot eligibility and declared limits are drawn from ``seed`` as
    :func:`synthetic` documents, since the trace records none; prices are the synthetic
    on-demand price, since it records none either.
    """
    d = Path(directory)
    pods_path, nodes_path = d / ALIBABA_PODS, d / ALIBABA_NODES
    for p in (pods_path, nodes_path):
        if not p.is_file():
            raise WorkloadError(f"{p}: no such file (expected the Alibaba cluster-trace-gpu-v2023 csv folder)")
    kept: list[tuple[int, int, str, int, int, str]] = []  # creation, seq, name, gpus, duration, qos
    seen: dict[str, int] = {}
    need = ("name", "num_gpu", "gpu_milli", "qos", "creation_time", "deletion_time", "scheduled_time")
    for line, row in _csv_rows(pods_path, need):
        ngpu = _cell_int(pods_path, line, row, "num_gpu", 0)
        if not ngpu:
            continue
        created = _cell_int(pods_path, line, row, "creation_time", 0)
        scheduled = _cell_int(pods_path, line, row, "scheduled_time")
        deleted = _cell_int(pods_path, line, row, "deletion_time")
        if created is None or scheduled is None or deleted is None or deleted - scheduled <= 0:
            continue
        qos = (row.get("qos") or "").strip()
        if qos not in ALIBABA_QOS_PRIORITY:
            raise WorkloadError(
                f"{pods_path}:{line}: column 'qos': expected one of {', '.join(ALIBABA_QOS_PRIORITY)}, got {qos!r}"
            )
        name = row["name"]
        if name in seen:
            raise WorkloadError(
                f"{pods_path}:{line}: column 'name': duplicate task {name!r} (first on line {seen[name]})"
            )
        seen[name] = line
        kept.append((created, len(kept), name, ngpu, deleted - scheduled, qos))
    kept.sort()

    by_size: dict[int, int] = {}
    for line, row in _csv_rows(nodes_path, ("sn", "gpu")):
        g = _cell_int(nodes_path, line, row, "gpu", 0)
        if g:
            by_size[g] = by_size.get(g, 0) + 1
    if not by_size:
        raise WorkloadError(f"{nodes_path}: no node with GPUs")
    pools = [Pool(f"alibaba-{g}gpu", PoolKind.ON_DEMAND, by_size[g], g, ON_DEMAND_PRICE, 0.0) for g in sorted(by_size)]

    rng = np.random.default_rng(seed)
    t0 = kept[0][0] if kept else 0
    submit = np.array([k[0] - t0 for k in kept], dtype=float)
    gpn = np.array([k[3] for k in kept], dtype=np.int64)
    duration = np.array([k[4] for k in kept], dtype=float)
    ones = np.ones(len(kept), dtype=np.int64)
    drawn = _draw_unrecorded(rng, duration, ones, gpn)
    prio = np.array([ALIBABA_QOS_PRIORITY[k[5]] for k in kept], dtype=np.int64)
    jobs = _jobs([k[2] for k in kept], [k[5] for k in kept], submit, ones, gpn, prio, duration, drawn)
    if limit is not None:  # after the draws, so a job's drawn facts do not depend on the limit
        jobs = jobs[: max(0, limit)]
    return jobs, Cluster(pools=pools, events=[])


# ---------------------------------------------------------------------------------------------
# Microsoft Philly (2017), as the Pollux artifact ships it
# ---------------------------------------------------------------------------------------------

PHILLY_CSV = "philly.csv"
PHILLY_FROM = "2017-10-01"  # the plateau of the trace: Oct 1 - Nov 30 (SOURCE.md beside the csv)
PHILLY_DAYS = 61.0
PHILLY_GPUS = 640  # 80 x 8: about 80 % offered load over Oct - Nov (SOURCE.md)
PHILLY_GPUS_PER_NODE = 8  # Philly's largest machines; a gang of more GPUs spans whole nodes
_PHILLY_TIME = "%Y-%m-%d %H:%M:%S"


@dataclass(frozen=True)
class PhillyReplay:
    """What :func:`read_philly` replays, for the run's notes: the window, the load, what it changed."""

    start: str
    days: float
    jobs: int
    gpus: int
    offered_load: float  # the window's jobs' GPU-seconds over the cluster's GPU-seconds in the window
    tenants: int

    def describe(self) -> str:
        return (
            f"Philly 2017 replay: {self.jobs} jobs submitted in {self.days:g} days from {self.start}, "
            f"{self.tenants} virtual clusters as tenants, on {self.gpus} GPUs "
            f"({self.gpus // PHILLY_GPUS_PER_NODE} x {PHILLY_GPUS_PER_NODE}), offered load {self.offered_load:.2f} "
            f"(the jobs' GPU-seconds over the window's); checkpoints, limits, grace, spot and priority drawn as "
            f"the synthetic workload draws them"
        )


def philly_shape(gpus: int) -> tuple[int, int]:
    """(nodes, GPUs per node) of a Philly job: one node up to 8 GPUs, else the fewest whole nodes
    of at most 8 GPUs that divide its GPUs evenly (12 -> 2 x 6, 24 -> 3 x 8, 128 -> 16 x 8)."""
    if gpus <= PHILLY_GPUS_PER_NODE:
        return 1, gpus
    n = -(-gpus // PHILLY_GPUS_PER_NODE)
    while gpus % n:
        n += 1
    return n, gpus // n


def read_philly(
    directory: str | Path,
    *,
    gpus: int = PHILLY_GPUS,
    start: str = PHILLY_FROM,
    days: float = PHILLY_DAYS,
    seed: int = 0,
) -> tuple[list[Job], Cluster, PhillyReplay]:
    """Jobs of the Philly trace submitted in ``[start, start + days)`` on one on-demand pool.

    The trace (Jeon et al., ATC'19; the per-job CSV of the Pollux artifact, ``SOURCE.md`` beside
    it) records per job its submission time, run time (the sum of its attempts), GPUs and virtual
    cluster. Each virtual cluster is a tenant; ``submit_s`` counts from ``start``; a job of up to 8
    GPUs is one node, a bigger one a gang (:func:`philly_shape`); run times are the trace's, up to
    its 53 days (the 1 % of runs over 3 days hold a quarter of the GPU-hours). The cluster is
    ``gpus / 8`` nodes of 8 GPUs ("philly", on-demand, the synthetic on-demand price): the machine
    list's 2,490 GPUs would be loaded 15-20 %, while 640 GPUs over Oct - Nov are offered 74 % of
    their GPU-seconds (SOURCE.md's time-average of busy GPUs says 79 %). The trace records
    no checkpoints, declared limits, grace, spot permission or priority: they are drawn from
    ``seed`` exactly as :func:`synthetic` draws them (priority 0-3, gangs mostly 2-3).
    """
    from datetime import datetime, timedelta

    path = Path(directory) / PHILLY_CSV
    if not path.is_file():
        raise WorkloadError(f"{path}: no such file (expected the Philly trace folder with {PHILLY_CSV})")
    if gpus < PHILLY_GPUS_PER_NODE or gpus % PHILLY_GPUS_PER_NODE:
        raise WorkloadError(f"--gpus: expected a multiple of {PHILLY_GPUS_PER_NODE}, got {gpus}")
    if not (math.isfinite(days) and days > 0):
        raise WorkloadError(f"--philly-days: expected a number > 0, got {days!r}")
    try:
        t0 = datetime.strptime(start, "%Y-%m-%d")
    except ValueError:
        raise WorkloadError(f"--philly-from: expected a date YYYY-MM-DD, got {start!r}") from None
    t1 = t0 + timedelta(days=days)
    rows: list[tuple[float, int, str, float, int]] = []  # submit_s, line, tenant, duration, gpus
    need = ("timestamp", "duration", "num_gpus", "cluster")
    for line, row in _csv_rows(path, need):
        cols = list(need)
        try:
            col = cols[0]
            ts = datetime.strptime((row.get(col) or "").strip(), _PHILLY_TIME)
            col = cols[1]
            dur = _as_float(row.get(col) or "", 0.0, True, "a finite float > 0")
            col = cols[2]
            g = _as_int(row.get(col) or "", 1, "an int >= 1")
            col = cols[3]
            tenant = check_id((row.get(col) or "").strip())
        except ValueError as e:
            raise WorkloadError(f"{path}:{line}: column {col!r}: {e}") from None
        if not t0 <= ts < t1:
            continue
        n, gpn = philly_shape(g)
        if gpn > PHILLY_GPUS_PER_NODE or n * PHILLY_GPUS_PER_NODE > gpus:
            raise WorkloadError(
                f"{path}:{line}: column 'num_gpus': {g} GPUs do not fit {gpus} GPUs of 8-GPU nodes (raise --gpus)"
            )
        rows.append(((ts - t0).total_seconds(), line, tenant, dur, g))
    rows.sort()
    n_jobs = len(rows)
    if not n_jobs:
        raise WorkloadError(
            f"{path}: no job submitted in {days:g} days from {start} (the trace spans 2017-09-04 to 2017-12-22)"
        )
    rng = np.random.default_rng(seed)
    submit = np.array([r[0] for r in rows], dtype=float)
    duration = np.array([r[3] for r in rows], dtype=float)
    shapes = [philly_shape(r[4]) for r in rows]
    nodes = np.array([s[0] for s in shapes], dtype=np.int64)
    gpn = np.array([s[1] for s in shapes], dtype=np.int64)
    total = nodes * gpn
    prio = np.where(
        nodes > 1, _pick(rng, np.arange(4), _PRIO_GANG, n_jobs), _pick(rng, np.arange(4), _PRIO_SMALL, n_jobs)
    )
    drawn = _draw_unrecorded(rng, duration, nodes, total)
    ids = [f"philly-{r[1]:06d}" for r in rows]  # the csv line: a job is found in the trace by its id
    jobs = _jobs(ids, [r[2] for r in rows], submit, nodes, gpn, prio, duration, drawn)
    nn = gpus // PHILLY_GPUS_PER_NODE
    cluster = Cluster(pools=[Pool("philly", PoolKind.ON_DEMAND, nn, PHILLY_GPUS_PER_NODE, ON_DEMAND_PRICE, 0.0)])
    load = float(np.sum(total * duration)) / (gpus * days * 86400.0)
    replay = PhillyReplay(
        start=start,
        days=days,
        jobs=n_jobs,
        gpus=gpus,
        offered_load=load,
        tenants=len({r[2] for r in rows}),
    )
    return jobs, cluster, replay
