"""The simulator's input files: the job CSV and the cluster JSON, read and written.

The CSV and JSON shapes are contracts that tools outside this repository read and write, so their
column and key names never change; what is ours beyond the contract (``ckpt_stall_s``,
``max_failures``, an event's ``return_s`` and ``seed_key``, the ``job_failure`` event kind) is
optional and an outside tool may ignore it. Every reader fails on the first bad value with a
:class:`WorkloadError` naming the file, the line and the column (or the JSON key path), because a
simulation that silently drops a malformed job answers a different question.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.governance import Governance, GovernanceError, SubmissionRejected
from ..core.ids import check_id
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


def read_workload_csv(path: str | Path, governance: Governance | None = None) -> list[Job]:
    """Jobs of a workload CSV, in file order (``seq`` is the row index, the queue's last tie-break).

    Unknown columns are ignored so that a trace exporter may carry its own; an empty optional cell
    takes the default, an empty required one is an error. With ``governance`` (the cluster's
    ``tenants`` and ``limits``) a row its operator would refuse (a priority above the tenant's
    ``max_priority``, a ``grace_s`` or ``restart_s`` above the caps) is an error naming the file,
    the line and the column, as a malformed cell is.
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
            line = reader.line_num + 1  # where the record starts: a quoted cell may span lines
            try:
                row = next(reader)
            except StopIteration:
                break
            except csv.Error as e:
                raise WorkloadError(f"{name}:{reader.line_num}: not CSV ({e})") from None
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
            if governance is not None:
                try:
                    governance.check(jobs[-1])
                except SubmissionRejected as e:
                    raise WorkloadError(f"{name}:{line}: column {e.field!r}: {e.message}") from None
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
