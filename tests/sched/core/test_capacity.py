"""The capacity index's incremental counts against brute force, over random sequences of changes.

The pass trusts two counts it never recomputes: nodes that fit outside the watched reservation,
and nodes a victim search could reach below a priority. Each is checked here after every change.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from goodput.sched.core.capacity import Capacity
from goodput.sched.core.model import Health, Pool, PoolKind

POOLS = [Pool("a", PoolKind.ON_DEMAND, 6, 8), Pool("b", PoolKind.SPOT, 3, 4)]
PRIORITIES = [0, 1, 3]

op = st.one_of(
    st.tuples(st.just("bind"), st.integers(0, 8), st.integers(1, 8), st.sampled_from(PRIORITIES), st.booleans()),
    st.tuples(st.just("unbind"), st.integers(0, 50)),
    st.tuples(st.just("claim"), st.integers(0, 8)),
    st.tuples(st.just("unclaim"), st.integers(0, 8)),
    st.tuples(st.just("health"), st.integers(0, 8), st.sampled_from(list(Health))),
    st.tuples(st.just("watch"), st.sets(st.integers(0, 8), max_size=4)),
    st.tuples(st.just("threshold"), st.sets(st.sampled_from(PRIORITIES + [2]), min_size=1)),
)


def _brute_fitting(cap: Capacity, pool: str, g: int, exclude: frozenset[str]) -> int:
    return sum(
        1 for name in cap.pool_nodes[pool] if name not in exclude and cap.offerable(name) and cap.nodes[name].free >= g
    )


def _brute_reach(cap: Capacity, pool: str, q: int, g: int, evictable: dict[str, tuple[list[str], int, int]]) -> int:
    n = 0
    for name in cap.pool_nodes[pool]:
        if not cap.offerable(name):
            continue
        below = sum(gpn for nodes, gpn, p in evictable.values() if p < q and name in nodes)
        n += cap.nodes[name].free + below >= g
    return n


@settings(max_examples=150, deadline=None)
@given(st.lists(op, max_size=40))
def test_incremental_counts_match_brute_force(ops) -> None:
    cap = Capacity(POOLS, Capacity.build_nodes(POOLS))
    names = list(cap.nodes)
    bound: dict[str, tuple[list[str], int, int]] = {}  # job -> (nodes, GPUs per node, priority)
    evictable: dict[str, tuple[list[str], int, int]] = {}
    watched: frozenset[str] = frozenset()
    thresholds = [0, 1, 3]
    cap.set_thresholds(thresholds)
    k = 0
    for o in ops:
        kind = o[0]
        if kind == "bind":
            _, i, gpn, prio, ev = o
            name = names[i]
            if cap.nodes[name].health is Health.LOST or cap.nodes[name].free < gpn:
                continue
            job = f"j{k}"
            k += 1
            cap.bind(job, [name], gpn)
            bound[job] = ([name], gpn, prio)
            if ev:
                cap.add_evictable([name], prio, gpn)
                evictable[job] = bound[job]
        elif kind == "unbind" and bound:
            job = sorted(bound)[o[1] % len(bound)]
            nodes, gpn, prio = bound.pop(job)
            if job in evictable:
                cap.add_evictable(nodes, prio, gpn, sign=-1)
                del evictable[job]
            cap.unbind(job, nodes)
        elif kind == "claim" and names[o[1]] not in cap.claimed:
            cap.claim("claimant", [names[o[1]]])
        elif kind == "unclaim":
            cap.unclaim([names[o[1]]])
        elif kind == "health":
            cap.set_health(names[o[1]], o[2])
        elif kind == "watch":
            watched = frozenset(names[i] for i in o[1])
            cap.watch(watched)
        elif kind == "threshold":
            thresholds = sorted(o[1])
            cap.set_thresholds(thresholds)
        for pool in ("a", "b"):
            for g in range(1, 9):
                assert cap.count_fitting(pool, g, watched) == _brute_fitting(cap, pool, g, watched)
                assert cap.count_fitting(pool, g, set(watched)) == _brute_fitting(cap, pool, g, watched)
                for q in thresholds:
                    assert cap.reachable(pool, q, g) == _brute_reach(cap, pool, q, g, evictable), (pool, q, g)
            assert cap.reachable(pool, 7, 1) is None  # not a threshold
