"""The pending queue keeps nothing for jobs that left it (a live service runs for months)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from goodput.sched.core.queue import PendingQueue


def test_queue_keeps_nothing_for_jobs_that_left() -> None:
    q = PendingQueue()
    classes = [(1, 8, ("od",)), (2, 8, ("od", "spot")), (1, 1, ("od",))]
    for i in range(3000):
        q.push(f"j{i}", i % 3, f"t{i % 5}", classes[i % 3], submit_s=float(i), seq=i, limit_s=float(i % 7))
        if i % 2:
            q.remove(f"j{i - 1}")
            q.remove(f"j{i}")
    assert len(q) == 0 and q.classes() == 0 and q.priorities() == []
    assert q.class_shortest(0, classes[0]) is None
    assert not q._class_short and not q._class_count and not q._fifo and not q._short
    assert not q._tenant_fifo and not q._tenant_count


def test_a_head_that_waits_does_not_make_its_heaps_keep_every_job_that_passed() -> None:
    """One job waits at the head of its tenant's and its class's order while 20,000 later ones of
    the same tenant and class come and go (started by backfill, out of queue order): the heaps hold
    about what is queued, not all 20,000 (removal is lazy; dead entries are compacted away)."""
    q = PendingQueue()
    cls = (1, 8, ("od",))
    q.push("old", 0, "t", cls, submit_s=0.0, seq=0, limit_s=1e9)
    for i in range(1, 20_001):
        q.push(f"j{i}", 0, "t", cls, submit_s=float(i), seq=i, limit_s=1e9 + i)
        q.remove(f"j{i}")
    sizes = [
        len(h) for h in (*q._fifo.values(), *q._short.values(), *q._tenant_fifo.values(), *q._class_short.values())
    ]
    assert max(sizes) <= 2 * 1 + 64 + 1, sizes
    assert q.head((0, "t", cls)) == (0.0, 0, "old") and q.tenant_head(0, "t") == (0.0, 0)


_CLASSES = [(1, 8, ("od",)), (2, 8, ("od", "spot")), (1, 1, ("od",))]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 399), st.integers(0, 2), st.integers(0, 3)), max_size=1500))
def test_heads_are_those_of_the_live_jobs_whatever_was_compacted(ops) -> None:  # noqa: ANN001
    """Every head the queue answers is the one computed from the jobs queued now."""
    q = PendingQueue()
    live: dict[str, tuple[int, str, tuple, float, int, float]] = {}
    seq = 0
    for add, n, c, t in ops:
        jid = f"j{n}"
        if add and jid not in live:
            seq += 1
            prio, tenant, cls = c % 2, f"t{t}", _CLASSES[c]
            submit, limit = float(n % 17), float((n * 7) % 13)
            q.push(jid, prio, tenant, cls, submit_s=submit, seq=seq, limit_s=limit)
            live[jid] = (prio, tenant, cls, submit, seq, limit)
        elif not add and jid in live:
            assert q.remove(jid)
            del live[jid]
    for prio in (0, 1):
        for tenant in (f"t{t}" for t in range(4)):
            mine = [v for v in live.values() if v[0] == prio and v[1] == tenant]
            want = min(((v[3], v[4]) for v in mine), default=None)
            assert q.tenant_head(prio, tenant) == want
            for cls in _CLASSES:
                of = [(v[3], v[4], j) for j, v in live.items() if v[:3] == (prio, tenant, cls)]
                assert q.head((prio, tenant, cls)) == (min(of) if of else None)
                short = [(v[5], j) for j, v in live.items() if v[:3] == (prio, tenant, cls)]
                got = q.shortest((prio, tenant, cls))
                assert (got[0] if got else None) == (min(short)[0] if short else None)
        for cls in _CLASSES:
            limits = [v[5] for v in live.values() if v[0] == prio and v[2] == cls]
            assert q.class_shortest(prio, cls) == (min(limits) if limits else None)


def test_class_shortest_spans_tenants() -> None:
    q = PendingQueue()
    cls = (1, 8, ("od",))
    q.push("a", 0, "t1", cls, submit_s=0.0, seq=0, limit_s=50.0)
    q.push("b", 0, "t2", cls, submit_s=1.0, seq=1, limit_s=20.0)
    q.push("c", 1, "t2", cls, submit_s=2.0, seq=2, limit_s=5.0)
    assert q.class_shortest(0, cls) == 20.0 and q.class_shortest(1, cls) == 5.0
    q.remove("b")
    assert q.class_shortest(0, cls) == 50.0
