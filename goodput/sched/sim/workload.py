"""The simulator's inputs: the job CSV, the cluster JSON, and the workloads that fill them.

The CSV and JSON shapes are contracts that tools outside this repository read and write, so their
column and key names never change; what is ours beyond the contract (``ckpt_stall_s``,
``max_failures``, an event's ``return_s`` and ``seed_key``, the ``job_failure`` event kind) is
optional and an outside tool may ignore it. Every reader fails on the first bad value with a
:class:`WorkloadError` naming the file, the line and the column (or the JSON key path), because a
simulation that silently drops a malformed job answers a different question.

Sources: the synthetic workload is calibrated to Acme (Hu et al., "Characterization of Large
Language Model Development in the Datacenter", NSDI'24; github.com/InternLM/AcmeTrace,
data/cluster_summary.csv). The Alibaba reader takes cluster-trace-gpu-v2023 (Weng et al., "Beware of
Fragmentation", USENIX ATC'23; github.com/alibaba/clusterdata). Spot reclaims replay the SkyPilot
preemption traces (Wu et al., "Can't Be Late", NSDI'24; github.com/skypilot-org/spot-traces).
Failures follow Llama 3's interruption rate (:mod:`goodput.plan.failures`). None of these traces
records checkpoint behaviour, so every workload here draws it, seeded, as :func:`synthetic` says.
"""

from __future__ import annotations

import csv
import heapq
import json
import math
import re
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ...plan.failures import LLAMA3_GPUS, gpu_mtbf_from_job, job_mtbi
from ...plan.spot import trace_rates
from ..core.governance import Governance, GovernanceError
from ..core.model import Checkpointing, Job, Pool, PoolKind, RetryPolicy


class WorkloadError(ValueError):
    """A bad input; the message names the file, the line and the column or key at fault."""


# ---------------------------------------------------------------------------------------------
# The job CSV
# ---------------------------------------------------------------------------------------------

REQUIRED_COLUMNS = ("id", "tenant", "submit_s", "nodes", "gpus_per_node", "priority", "duration_s")
OPTIONAL_COLUMNS = (
    "limit_s",
    "ckpt_interval_s",
    "ckpt_write_s",
    "ckpt_stall_s",
    "restart_s",
    "grace_s",
    "spot",
    "max_failures",
)
COLUMNS = REQUIRED_COLUMNS + OPTIONAL_COLUMNS


def _as_int(text: str, lo: int | None, what: str) -> int:
    """An int from its text; "3.0" reads as 3, since pandas writes an int column with gaps as floats."""
    s = text.strip()
    try:
        v = int(s)
    except ValueError:
        try:
            f = float(s)
        except ValueError:
            raise ValueError(f"expected {what}, got {text!r}") from None
        if not math.isfinite(f) or f != int(f):
            raise ValueError(f"expected {what}, got {text!r}") from None
        v = int(f)
    if lo is not None and v < lo:
        raise ValueError(f"expected {what}, got {text!r}")
    return v


def _as_float(text: str, lo: float, strict: bool, what: str) -> float:
    try:
        v = float(text.strip())
    except ValueError:
        raise ValueError(f"expected {what}, got {text!r}") from None
    if not math.isfinite(v) or v < lo or (strict and v == lo):
        raise ValueError(f"expected {what}, got {text!r}")
    return v


def _int_ge(lo: int):
    return lambda s: _as_int(s, lo, f"an int >= {lo}")


def _float_ge0(s: str) -> float:
    return _as_float(s, 0.0, False, "a finite float >= 0")


def _float_gt0(s: str) -> float:
    return _as_float(s, 0.0, True, "a finite float > 0")


# Job ids and tenant names: what a log, a URL path and a shell may carry without quoting. A space
# around an id (" a " beside "a") made two jobs that read as one; a leading "-" reads as a flag.
ID_CHARS = "A-Za-z0-9._:@-"
ID_MAX = 128
ID_RE = re.compile(rf"[A-Za-z0-9][{ID_CHARS}]{{0,{ID_MAX - 1}}}")
ID_RULE = f"1-{ID_MAX} of [{ID_CHARS}], starting with a letter or digit"


def check_id(s: str) -> str:
    """``s`` if it is a valid job id or tenant name (:data:`ID_RULE`), else a ValueError saying why."""
    if not isinstance(s, str) or not s:
        raise ValueError(f"expected an id ({ID_RULE}), got {s!r}")
    if s != s.strip():
        raise ValueError(f"{s!r} has surrounding spaces (ids are {ID_RULE})")
    if ID_RE.fullmatch(s) is None:
        bad = sorted({c for c in s if not re.fullmatch(f"[{ID_CHARS}]", c)})
        why = f"characters {''.join(bad)!r} are not allowed" if bad else "wrong length or first character"
        raise ValueError(f"{s!r}: {why} (ids are {ID_RULE})")
    return s


def _bit(s: str) -> bool:
    v = _as_int(s, None, "0 or 1")
    if v not in (0, 1):
        raise ValueError(f"expected 0 or 1, got {s!r}")
    return bool(v)


# column -> parser; a parser raises ValueError with the reason, the reader adds file, line and column
_PARSE = {
    "id": check_id,
    "tenant": check_id,
    "submit_s": _float_ge0,
    "nodes": _int_ge(1),
    "gpus_per_node": _int_ge(1),
    "priority": lambda s: _as_int(s, None, "an int"),
    "duration_s": _float_gt0,
    "limit_s": _float_gt0,
    "ckpt_interval_s": _float_ge0,
    "ckpt_write_s": _float_ge0,
    "ckpt_stall_s": _float_ge0,
    "restart_s": _float_ge0,
    "grace_s": _float_ge0,
    "spot": _bit,
    "max_failures": _int_ge(0),
}
_DEFAULTS: dict[str, Any] = {
    "ckpt_interval_s": 0.0,
    "ckpt_write_s": 0.0,
    "ckpt_stall_s": 0.0,
    "restart_s": 0.0,
    "grace_s": 30.0,
    "spot": False,
    "max_failures": 3,
}  # limit_s defaults to the row's duration_s


def read_workload_csv(path: str | Path) -> list[Job]:
    """Jobs of a workload CSV, in file order (``seq`` is the row index, the queue's last tie-break).

    Unknown columns are ignored so that a trace exporter may carry its own; an empty optional cell
    takes the default, an empty required one is an error.
    """
    name = str(path)
    jobs: list[Job] = []
    first_line: dict[str, int] = {}
    with open(path, encoding="utf-8-sig", newline="") as f:
        reader = csv.reader(f)
        try:
            header = next(reader)
        except StopIteration:
            raise WorkloadError(f"{name}:1: empty file, expected a header with {', '.join(REQUIRED_COLUMNS)}") from None
        except csv.Error as e:
            raise WorkloadError(f"{name}:{reader.line_num}: not CSV ({e})") from None
        header = [h.strip() for h in header]
        where: dict[str, int] = {}
        for i, h in enumerate(header):
            if h in where and h in _PARSE:
                raise WorkloadError(f"{name}:1: column {h!r} appears twice")
            where.setdefault(h, i)
        missing = [c for c in REQUIRED_COLUMNS if c not in where]
        if missing:
            raise WorkloadError(f"{name}:1: missing required column {missing[0]!r} (all missing: {', '.join(missing)})")
        known = [(c, where[c]) for c in COLUMNS if c in where]
        width = len(header)
        while True:
            try:
                row = next(reader)
            except StopIteration:
                break
            except csv.Error as e:
                raise WorkloadError(f"{name}:{reader.line_num}: not CSV ({e})") from None
            line = reader.line_num
            if not any(cell.strip() for cell in row):
                continue
            if len(row) > width and any(cell.strip() for cell in row[width:]):
                raise WorkloadError(f"{name}:{line}: {len(row)} cells but the header has {width}")
            vals: dict[str, Any] = {}
            for col, idx in known:
                cell = row[idx] if idx < len(row) else ""
                if not cell.strip():
                    if col in REQUIRED_COLUMNS:
                        raise WorkloadError(f"{name}:{line}: column {col!r}: required, but the cell is empty")
                    continue
                try:
                    vals[col] = _PARSE[col](cell)
                except ValueError as e:
                    raise WorkloadError(f"{name}:{line}: column {col!r}: {e}") from None
            jid = vals["id"]
            if jid in first_line:
                raise WorkloadError(
                    f"{name}:{line}: column 'id': duplicate id {jid!r} (first on line {first_line[jid]})"
                )
            first_line[jid] = line
            for col, default in _DEFAULTS.items():
                vals.setdefault(col, default)
            submit = vals["submit_s"]
            jobs.append(
                Job(
                    id=jid,
                    tenant=vals["tenant"],
                    priority=vals["priority"],
                    nodes=vals["nodes"],
                    gpus_per_node=vals["gpus_per_node"],
                    submit_s=submit,
                    duration_s=vals["duration_s"],
                    limit_s=vals.get("limit_s", vals["duration_s"]),
                    spot=vals["spot"],
                    ckpt=Checkpointing(
                        interval_s=vals["ckpt_interval_s"],
                        write_s=vals["ckpt_write_s"],
                        stall_s=vals["ckpt_stall_s"],
                        restart_s=vals["restart_s"],
                        grace_s=vals["grace_s"],
                    ),
                    retry=RetryPolicy(max_failures=vals["max_failures"]),
                    seq=len(jobs),
                    eligible_s=submit,
                )
            )
    return jobs


def _num(x: float | int) -> str:
    return repr(float(x))


def write_workload_csv(jobs: Iterable[Job], path: str | Path) -> None:
    """Every column :func:`read_workload_csv` knows; floats as ``repr`` so a round trip is exact.

    A ``limit_s`` of 0 (the model's "none declared") is written empty and reads back as the
    duration, which is what the model's backfill means by it.
    """
    with open(path, "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(COLUMNS)
        for j in jobs:
            c = j.ckpt
            w.writerow(
                (
                    j.id,
                    j.tenant,
                    _num(j.submit_s),
                    j.nodes,
                    j.gpus_per_node,
                    j.priority,
                    _num(j.duration_s),
                    _num(j.limit_s) if j.limit_s > 0 else "",
                    _num(c.interval_s),
                    _num(c.write_s),
                    _num(c.stall_s),
                    _num(c.restart_s),
                    _num(c.grace_s),
                    int(bool(j.spot)),
                    j.retry.max_failures,
                )
            )


# ---------------------------------------------------------------------------------------------
# The cluster JSON
# ---------------------------------------------------------------------------------------------

EVENT_KINDS = ("reclaim", "node_loss", "job_failure")  # job_failure: ours, from failure injection


@dataclass(frozen=True)
class ClusterEvent:
    """Something the cluster does to nodes at time ``t``.

    ``reclaim``: a spot provider takes ``nodes`` nodes of ``pool``; the notice arrives at ``t`` and
    they are gone at ``t + notice_s``. ``node_loss``: nodes die at ``t`` without notice.
    ``job_failure`` (ours): the job running on the node fails by its own fault; the node stays up.
    ``return_s`` is how long lost nodes stay gone, counted from the moment they are lost
    (``t + notice_s``), so a trace's downtime is kept whatever the notice; None means never.
    ``seed_key`` names the node when the event is about one node (its index in the pool), so that
    every policy simulated over the same events loses the same node; 0 otherwise.
    """

    t: float
    kind: str
    pool: str
    nodes: int
    notice_s: float = 0.0
    return_s: float | None = None
    seed_key: int = 0


@dataclass(frozen=True)
class Cluster:
    pools: list[Pool]
    events: list[ClusterEvent] = field(default_factory=list)
    governance: Governance = field(default_factory=Governance)  # the file's "tenants" and "limits"

    def pool(self, name: str) -> Pool:
        for p in self.pools:
            if p.name == name:
                return p
        raise KeyError(f"no pool {name!r} (pools: {', '.join(p.name for p in self.pools)})")

    def node_names(self, pool_name: str) -> list[str]:
        """Deterministic names, so that two runs (and ``seed_key``) agree on which node is which."""
        p = self.pool(pool_name)
        return [f"{p.name}-{i:05d}" for i in range(p.nodes)]

    def capacity(self) -> dict[str, int]:
        return {n: p.gpus_per_node for p in self.pools for n in self.node_names(p.name)}

    @property
    def gpus(self) -> int:
        return sum(p.nodes * p.gpus_per_node for p in self.pools)


class _Keys:
    """Validates JSON values and names the key path of the one at fault."""

    def __init__(self, name: str) -> None:
        self.name = name

    def fail(self, key: str, msg: str) -> WorkloadError:
        return WorkloadError(f"{self.name}: {key}: {msg}")

    def get(self, obj: dict, key: str, at: str, default: Any = ..., *, nullable: bool = False) -> Any:
        if key not in obj or (obj[key] is None and not nullable):
            if default is ...:
                raise self.fail(at, "required key is missing")
            return default
        return obj[key]

    def int_(self, v: Any, at: str, lo: int) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise self.fail(at, f"expected an int >= {lo}, got {v!r}")
        return v

    def num(self, v: Any, at: str, lo: float = 0.0, strict: bool = False) -> float:
        bad = isinstance(v, bool) or not isinstance(v, (int, float))
        if bad or not math.isfinite(v) or v < lo or (strict and v == lo):
            raise self.fail(at, f"expected a finite number {'>' if strict else '>='} {lo:g}, got {v!r}")
        return float(v)

    def str_(self, v: Any, at: str) -> str:
        if not isinstance(v, str) or not v:
            raise self.fail(at, f"expected a non-empty string, got {v!r}")
        return v


def _cluster_from_obj(obj: Any, name: str) -> Cluster:
    k = _Keys(name)
    if not isinstance(obj, dict):
        raise k.fail("(top)", f"expected an object with 'pools', got {type(obj).__name__}")
    raw_pools = k.get(obj, "pools", "pools")
    if not isinstance(raw_pools, list) or not raw_pools:
        raise k.fail("pools", "expected a non-empty list")
    pools: list[Pool] = []
    seen: dict[str, int] = {}
    for i, rp in enumerate(raw_pools):
        at = f"pools[{i}]"
        if not isinstance(rp, dict):
            raise k.fail(at, f"expected an object, got {type(rp).__name__}")
        pname = k.str_(k.get(rp, "name", f"{at}.name"), f"{at}.name")
        if pname in seen:
            raise k.fail(f"{at}.name", f"duplicate pool name {pname!r} (also pools[{seen[pname]}])")
        seen[pname] = i
        kind = k.get(rp, "kind", f"{at}.kind")
        if kind not in (PoolKind.ON_DEMAND.value, PoolKind.SPOT.value):
            raise k.fail(f"{at}.kind", f"expected 'on-demand' or 'spot', got {kind!r}")
        pools.append(
            Pool(
                name=pname,
                kind=PoolKind(kind),
                nodes=k.int_(k.get(rp, "nodes", f"{at}.nodes"), f"{at}.nodes", 1),
                gpus_per_node=k.int_(k.get(rp, "gpus_per_node", f"{at}.gpus_per_node"), f"{at}.gpus_per_node", 1),
                price_per_gpu_hour=k.num(
                    k.get(rp, "price_per_gpu_hour", f"{at}.price_per_gpu_hour"), f"{at}.price_per_gpu_hour"
                ),
                reclaim_per_node_hour=k.num(k.get(rp, "reclaim_per_node_hour", "", 0.0), f"{at}.reclaim_per_node_hour"),
            )
        )
    by_name = {p.name: p for p in pools}
    raw_events = k.get(obj, "events", "events", [])
    if not isinstance(raw_events, list):
        raise k.fail("events", "expected a list")
    events: list[ClusterEvent] = []
    for i, re_ in enumerate(raw_events):
        at = f"events[{i}]"
        if not isinstance(re_, dict):
            raise k.fail(at, f"expected an object, got {type(re_).__name__}")
        t = k.num(k.get(re_, "t", f"{at}.t"), f"{at}.t")
        kind = k.get(re_, "kind", f"{at}.kind")
        if kind not in EVENT_KINDS:
            raise k.fail(f"{at}.kind", f"expected one of {', '.join(map(repr, EVENT_KINDS))}, got {kind!r}")
        pname = k.get(re_, "pool", f"{at}.pool")
        if pname not in by_name:
            raise k.fail(f"{at}.pool", f"no pool named {pname!r} (pools: {', '.join(by_name)})")
        n = k.int_(k.get(re_, "nodes", f"{at}.nodes"), f"{at}.nodes", 1)
        if n > by_name[pname].nodes:
            raise k.fail(f"{at}.nodes", f"{n} nodes, but pool {pname!r} has {by_name[pname].nodes}")
        ret = k.get(re_, "return_s", "", None, nullable=True)
        events.append(
            ClusterEvent(
                t=t,
                kind=kind,
                pool=pname,
                nodes=n,
                notice_s=k.num(k.get(re_, "notice_s", "", 0.0), f"{at}.notice_s"),
                return_s=None if ret is None else k.num(ret, f"{at}.return_s", strict=True),
                seed_key=k.int_(k.get(re_, "seed_key", "", 0), f"{at}.seed_key", 0),
            )
        )
    events.sort(key=lambda e: e.t)  # stable: same-time events keep file order
    try:
        governance = Governance.from_obj(obj.get("tenants"), obj.get("limits"))
    except GovernanceError as e:
        raise k.fail(e.field, e.message) from None
    return Cluster(pools=pools, events=events, governance=governance)


def _read_json(path: str | Path) -> Any:
    name = str(path)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        return json.loads(text, parse_constant=lambda c: float(c))
    except json.JSONDecodeError as e:
        raise WorkloadError(f"{name}:{e.lineno}: not JSON ({e.msg}, column {e.colno})") from None


def read_cluster_json(path: str | Path) -> Cluster:
    """A cluster file; unknown keys are ignored, events come back sorted by ``t`` (stable)."""
    name = str(path)
    obj = _read_json(path)
    return _cluster_from_obj(obj, name)


def cluster_to_obj(cluster: Cluster) -> dict[str, Any]:
    pools = []
    for p in cluster.pools:
        d: dict[str, Any] = {
            "name": p.name,
            "kind": PoolKind(p.kind).value,
            "nodes": p.nodes,
            "gpus_per_node": p.gpus_per_node,
            "price_per_gpu_hour": p.price_per_gpu_hour,
        }
        if p.kind is PoolKind.SPOT or p.reclaim_per_node_hour:
            d["reclaim_per_node_hour"] = p.reclaim_per_node_hour
        pools.append(d)
    events = []
    for e in cluster.events:
        d = {"t": e.t, "kind": e.kind, "pool": e.pool, "nodes": e.nodes, "notice_s": e.notice_s, "return_s": e.return_s}
        if e.seed_key:
            d["seed_key"] = e.seed_key
        events.append(d)
    out: dict[str, Any] = {"pools": pools, "events": events}
    if cluster.governance != Governance():
        out["tenants"], out["limits"] = cluster.governance.to_obj()
    return out


def write_cluster_json(cluster: Cluster, path: str | Path) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(cluster_to_obj(cluster), f, indent=1)
        f.write("\n")


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
