"""Choosing victims: the set of whole gangs that frees a need at the least expected lost work.

A victim's price is GPU-seconds: its GPUs × (work since its last commit that it will lose + its
restart + the time it will hold its GPUs while leaving). A victim whose grace period fits its
checkpoint write is asked to checkpoint first and loses no work, only the write and the restart;
one that cannot loses everything since its last commit. Kueue's rule (lowest priority, then the
shortest running) is kept as the baseline and ignores all of that.

Victims come from the lowest priority tier that can free the need (as Slurm and Kueue do: a
higher-priority victim would come back and evict the lower one); within the tiers allowed, the
set is the cheapest. Exact for up to ``EXACT_MAX`` candidates (every subset is tried); greedy beyond that (cheapest per
GPU first until the need fits, then drop the costliest ones that are not needed), which is what
Kueue does with its own order.

The scheduler never prices every running job for a search: :class:`VictimOrder` keeps them in the
order a search takes them, as they start, commit and leave, and :func:`greedy_fit` reads that
order lazily and stops as soon as the need fits.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Sequence
from itertools import combinations
from typing import NamedTuple

from sortedcontainers import SortedList

EXACT_MAX = 10


class Candidate(NamedTuple):
    job: str
    priority: int
    started_s: float
    gpus: int
    per_node: tuple[tuple[str, int], ...]  # (node, GPUs it holds there)
    lost_s: float  # work it will lose
    drain_s: float  # how long it will hold its GPUs while leaving
    restart_s: float
    checkpoint: bool  # asked to checkpoint first

    @property
    def cost(self) -> float:
        return self.gpus * (self.lost_s + self.restart_s + self.drain_s)


def _fits(need_nodes: int, need_gpus: int, free: dict[str, int], chosen: Sequence[Candidate], base_ok: int) -> bool:
    freed: dict[str, int] = {}
    for c in chosen:
        for node, g in c.per_node:
            freed[node] = freed.get(node, 0) + g
    ok = base_ok + sum(1 for node, f in free.items() if f >= need_gpus and node not in freed)
    ok += sum(1 for node, g in freed.items() if free.get(node, -(10**9)) + g >= need_gpus)
    return ok >= need_nodes


def choose(
    need_nodes: int,
    need_gpus: int,
    free: dict[str, int],
    candidates: Sequence[Candidate],
    rule: str = "checkpoint-aware",
    base_ok: int = 0,
) -> list[Candidate] | None:
    """Victims whose going lets ``need_nodes`` nodes with ``need_gpus`` free each appear, or None.

    ``free`` maps every node the need may use (offerable or held by candidates) to its free GPUs
    now; a node absent from it cannot be used even if freed. ``base_ok`` counts the nodes outside
    ``free`` that already fit the need.
    """
    if not candidates:
        return None
    if rule == "oblivious":
        order = sorted(candidates, key=lambda c: (c.priority, -c.started_s, c.job))
    elif rule == "checkpoint-aware":
        # cheapest per GPU first; lowest priority tier first: a victim of a higher tier would come
        # back and evict the lower one, a cascade that pays every restart twice
        order = sorted(candidates, key=lambda c: (c.cost / max(c.gpus, 1), -c.started_s, c.job))
        ok0 = base_ok + sum(1 for f in free.values() if f >= need_gpus)
        for tier in sorted({c.priority for c in candidates}):
            allowed = [c for c in order if c.priority <= tier]
            got, _ = greedy_fit(need_nodes, need_gpus, free, allowed, ok0, rule)
            if got is not None and len(allowed) <= EXACT_MAX:
                got = exact_fit(need_nodes, need_gpus, free, allowed, base_ok)
            if got is not None:
                return got
        return None
    else:
        raise ValueError(f"unknown victim rule {rule!r}")
    ok0 = base_ok + sum(1 for f in free.values() if f >= need_gpus)
    return greedy_fit(need_nodes, need_gpus, free, order, ok0, rule)[0]


def greedy_fit(
    need_nodes: int, need_gpus: int, free: dict[str, int], order: Iterable[Candidate], ok: int, rule: str
) -> tuple[list[Candidate] | None, int]:
    """Take candidates in ``order`` until ``need_nodes`` nodes have ``need_gpus`` free, then drop
    the ones the need can do without. ``ok`` counts the nodes that fit already; ``free`` must hold
    each candidate's nodes by the time it is drawn from ``order`` (which may fill it lazily).

    Returns the victims (None when all of ``order`` is not enough) and how many nodes would fit
    with every candidate drawn gone: on a failure, that is all a search can reach."""
    chosen: list[Candidate] = []
    freed: dict[str, int] = {}
    for c in order:
        chosen.append(c)
        for node, g in c.per_node:
            if node not in free:
                continue
            before = free[node] + freed.get(node, 0) >= need_gpus
            freed[node] = freed.get(node, 0) + g
            ok += (not before) and free[node] + freed[node] >= need_gpus
        if ok >= need_nodes:
            break
    else:
        return None, ok
    # drop any victim the need can do without, costliest (or, for Kueue, latest in its order) first
    drop_order = sorted(chosen, key=lambda c: -c.cost) if rule == "checkpoint-aware" else list(reversed(chosen))
    keep = {id(c) for c in chosen}
    for c in drop_order:
        lose = 0
        for node, g in c.per_node:
            if node in free:
                f = free[node] + freed[node]
                lose += f >= need_gpus > f - g
        if ok - lose >= need_nodes:
            ok -= lose
            for node, g in c.per_node:
                if node in free:
                    freed[node] -= g
            keep.discard(id(c))
    chosen = [c for c in chosen if id(c) in keep]
    return chosen, ok


def exact_fit(
    need_nodes: int, need_gpus: int, free: dict[str, int], cands: list[Candidate], base_ok: int
) -> list[Candidate] | None:
    best: tuple[float, int, list[Candidate]] | None = None
    for k in range(1, len(cands) + 1):
        for combo in combinations(cands, k):
            cost = sum(c.cost for c in combo)
            if best is not None and cost >= best[0]:
                continue
            if _fits(need_nodes, need_gpus, free, combo, base_ok):
                best = (cost, k, list(combo))
    return best[2] if best else None


class VictimOrder:
    """Running jobs of every pool in the order a victim search draws them, kept as jobs start,
    commit and leave, so that a search prices only what it draws.

    Checkpoint-aware, a job's price per GPU at time t is ``t + a`` when it would lose its work since
    its last commit or start ``s`` (``a`` = restart + drain − ``s``), a constant ``b`` when it is
    asked to checkpoint and its restart is sunk, and ``min(t + a, b)`` inside that restart. So one
    list sorted by ``a`` and one sorted by ``b`` per (pool, priority) hold the order at every t, and
    a search merges them. Oblivious (Kueue): one list per pool by (priority, latest started first).
    Ties break by the later start first, then the submission order (``seq``): never by the job's
    id, so that no eviction depends on what a job is called.
    """

    __slots__ = ("rule", "_lists", "_of")

    def __init__(self, rule: str) -> None:
        if rule not in ("checkpoint-aware", "oblivious"):
            raise ValueError(f"unknown victim rule {rule!r}")
        self.rule = rule
        self._lists: dict[tuple[str, int, str], SortedList] = {}
        self._of: dict[str, list[tuple[tuple[str, int, str], tuple[float, float, int, str]]]] = {}

    def add(
        self,
        job_id: str,
        pool: str,
        priority: int,
        started_s: float,
        *,
        linear: float | None,
        const: float | None,
        seq: int = 0,
    ) -> None:
        """Index a running job; ``linear`` is its ``a`` and ``const`` its ``b`` (None: not that kind)."""
        self.remove(job_id)
        if self.rule == "oblivious":
            entries = [((pool, 0, "o"), (float(priority), -started_s, seq, job_id))]
        else:
            entries = [
                ((pool, priority, k), (v, -started_s, seq, job_id))
                for k, v in (("t", linear), ("c", const))
                if v is not None
            ]
        for key, entry in entries:
            lst = self._lists.get(key)
            if lst is None:
                lst = self._lists[key] = SortedList()
            lst.add(entry)
        self._of[job_id] = entries

    def remove(self, job_id: str) -> None:
        for key, entry in self._of.pop(job_id, ()):
            self._lists[key].discard(entry)

    def __contains__(self, job_id: str) -> bool:
        return job_id in self._of

    def draw(self, pool: str, priorities: Iterable[int], now: float) -> Iterator[str]:
        """Job ids of the pool at these priorities, cheapest per GPU first (each once)."""
        allowed = set(priorities)
        if self.rule == "oblivious":
            top = max(allowed, default=None)
            for prio, _, _, jid in self._lists.get((pool, 0, "o"), ()):
                if top is None or prio > top:
                    return
                if int(prio) in allowed:
                    yield jid
            return
        streams: list[Iterator[tuple[float, float, int, str]]] = []
        for p in allowed:
            lin = self._lists.get((pool, p, "t"))
            if lin:
                streams.append((now + a, ns, sq, jid) for a, ns, sq, jid in lin)
            const = self._lists.get((pool, p, "c"))
            if const:
                streams.append(iter(const))
        seen: set[str] = set()
        for _, _, _, jid in heapq.merge(*streams):
            if jid not in seen:
                seen.add(jid)
                yield jid
