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
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations
from typing import NamedTuple

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
        for tier in sorted({c.priority for c in candidates}):
            allowed = [c for c in order if c.priority <= tier]
            if len(allowed) <= EXACT_MAX:
                got = _exact(need_nodes, need_gpus, free, allowed, base_ok)
            else:
                got = _greedy(need_nodes, need_gpus, free, allowed, base_ok, rule)
            if got is not None:
                return got
        return None
    else:
        raise ValueError(f"unknown victim rule {rule!r}")
    return _greedy(need_nodes, need_gpus, free, order, base_ok, rule)


def _greedy(
    need_nodes: int, need_gpus: int, free: dict[str, int], order: list[Candidate], base_ok: int, rule: str
) -> list[Candidate] | None:
    chosen: list[Candidate] = []
    freed: dict[str, int] = {}
    ok = base_ok + sum(1 for f in free.values() if f >= need_gpus)
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
        return None
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
    return chosen


def _exact(
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
