"""The pending queue keeps nothing for jobs that left it (a live service runs for months)."""

from __future__ import annotations

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


def test_class_shortest_spans_tenants() -> None:
    q = PendingQueue()
    cls = (1, 8, ("od",))
    q.push("a", 0, "t1", cls, submit_s=0.0, seq=0, limit_s=50.0)
    q.push("b", 0, "t2", cls, submit_s=1.0, seq=1, limit_s=20.0)
    q.push("c", 1, "t2", cls, submit_s=2.0, seq=2, limit_s=5.0)
    assert q.class_shortest(0, cls) == 20.0 and q.class_shortest(1, cls) == 5.0
    q.remove("b")
    assert q.class_shortest(0, cls) == 50.0
