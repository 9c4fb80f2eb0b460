"""The pending queue, indexed so that a pass never scans it.

Jobs live in one heap per (priority, tenant, class), where a class is a gang shape and the pools
it may go to: everything in a class fits or fails to fit together, so one failure blocks the class
for the rest of a pass without touching its other jobs. Each heap orders by the ORIGINAL submit
time then submission order, and a second heap per class orders by declared limit, which is how
backfill finds the shortest job of a blocked class in O(log n). Removal is lazy: an entry whose
token no longer matches the job's membership is dropped when it reaches the top.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from dataclasses import dataclass

Class = tuple[int, int, tuple[str, ...]]  # (nodes, gpus per node, pools in preference order)
Key = tuple[int, str, Class]  # (priority, tenant, class)


@dataclass(slots=True)
class _Entry:
    key: Key
    token: int


class PendingQueue:
    __slots__ = (
        "_fifo",
        "_short",
        "_class_short",
        "_class_count",
        "_count",
        "_member",
        "_levels",
        "_token",
        "_prios",
        "_tenant_fifo",
        "_tenant_count",
    )

    def __init__(self) -> None:
        self._fifo: dict[Key, list[tuple[float, int, str, int]]] = {}
        self._short: dict[Key, list[tuple[float, float, int, str, int]]] = {}
        # the same across tenants, per (priority, class): when even its shortest job is too long to
        # backfill, every tenant's key of the class is, and a pass skips them all at once
        self._class_short: dict[tuple[int, Class], list[tuple[float, float, int, str, int]]] = {}
        self._class_count: dict[tuple[int, Class], int] = {}
        self._count: dict[Key, int] = {}
        self._member: dict[str, _Entry] = {}
        self._levels: dict[int, dict[str, set[Class]]] = {}  # priority -> tenant -> non-empty classes
        self._prios: list[int] = []  # sorted descending
        self._token = 0
        # every class of one tenant at one priority in queue order: its first job breaks fair-share
        # ties, found without looking at each class's head
        self._tenant_fifo: dict[tuple[int, str], list[tuple[float, int, str, int]]] = {}
        self._tenant_count: dict[tuple[int, str], int] = {}

    def __len__(self) -> int:
        return len(self._member)

    def __contains__(self, job_id: str) -> bool:
        return job_id in self._member

    def push(self, job_id: str, priority: int, tenant: str, cls: Class, submit_s: float, seq: int, limit_s: float):
        if job_id in self._member:
            raise RuntimeError(f"job {job_id!r} is queued twice")
        key = (priority, tenant, cls)
        self._token += 1
        self._member[job_id] = _Entry(key, self._token)
        if key not in self._fifo:
            self._fifo[key], self._short[key], self._count[key] = [], [], 0
        pt, pc = (priority, tenant), (priority, cls)
        heapq.heappush(self._fifo[key], (submit_s, seq, job_id, self._token))
        heapq.heappush(self._tenant_fifo.setdefault(pt, []), (submit_s, seq, job_id, self._token))
        heapq.heappush(self._short[key], (limit_s, submit_s, seq, job_id, self._token))
        heapq.heappush(self._class_short.setdefault(pc, []), (limit_s, submit_s, seq, job_id, self._token))
        self._class_count[pc] = self._class_count.get(pc, 0) + 1
        self._tenant_count[pt] = self._tenant_count.get(pt, 0) + 1
        self._count[key] += 1
        self._compact(self._fifo[key], self._count[key])
        self._compact(self._short[key], self._count[key])
        self._compact(self._tenant_fifo[pt], self._tenant_count[pt])
        self._compact(self._class_short[pc], self._class_count[pc])
        if self._count[key] == 1:
            level = self._levels.get(priority)
            if level is None:
                level = self._levels[priority] = {}
                self._prios = sorted(self._levels, reverse=True)
            level.setdefault(tenant, set()).add(cls)

    def remove(self, job_id: str) -> bool:
        entry = self._member.pop(job_id, None)
        if entry is None:
            return False
        key = entry.key
        self._count[key] -= 1
        self._tenant_count[(key[0], key[1])] -= 1
        pc = (key[0], key[2])
        self._class_count[pc] -= 1
        if not self._class_count[pc]:  # the class is empty at this priority: its heap goes with it
            del self._class_count[pc], self._class_short[pc]
        if self._count[key] == 0:
            prio, tenant, cls = key
            del self._fifo[key], self._short[key], self._count[key]
            level = self._levels[prio]
            level[tenant].discard(cls)
            if not level[tenant]:
                del level[tenant], self._tenant_fifo[(prio, tenant)], self._tenant_count[(prio, tenant)]
            if not level:
                del self._levels[prio]
                self._prios = sorted(self._levels, reverse=True)
        return True

    def _compact(self, heap: list, live: int) -> None:
        """Removal is lazy: an entry whose job left while another held the top stays until it
        surfaces. Once such entries outnumber the live ones twice over, they go, so a heap holds
        about what is queued, not every job that passed while its head waited (a live service's
        queue runs for months). The live entries keep their order: no decision changes."""
        if len(heap) > 2 * live + 64:
            heap[:] = [e for e in heap if self._live(e[-2], e[-1])]
            heapq.heapify(heap)

    def _live(self, job_id: str, token: int) -> bool:
        e = self._member.get(job_id)
        return e is not None and e.token == token

    def head(self, key: Key) -> tuple[float, int, str] | None:
        """(submit_s, seq, job id) of the class's first job in queue order."""
        heap = self._fifo.get(key)
        while heap:
            submit_s, seq, job_id, token = heap[0]
            if self._live(job_id, token):
                return submit_s, seq, job_id
            heapq.heappop(heap)
        return None

    def tenant_head(self, priority: int, tenant: str) -> tuple[float, int] | None:
        """(submit_s, seq) of the tenant's first job at this priority, whatever its class."""
        heap = self._tenant_fifo.get((priority, tenant))
        while heap:
            submit_s, seq, job_id, token = heap[0]
            if self._live(job_id, token):
                return submit_s, seq
            heapq.heappop(heap)
        return None

    def shortest(self, key: Key) -> tuple[float, str] | None:
        """(limit_s, job id) of the class's job with the shortest declared limit."""
        heap = self._short.get(key)
        while heap:
            limit_s, _, _, job_id, token = heap[0]
            if self._live(job_id, token):
                return limit_s, job_id
            heapq.heappop(heap)
        return None

    def class_shortest(self, priority: int, cls: Class) -> float | None:
        """The shortest declared limit of any tenant's job of the class at this priority."""
        heap = self._class_short.get((priority, cls))
        while heap:
            limit_s, _, _, job_id, token = heap[0]
            if self._live(job_id, token):
                return limit_s
            heapq.heappop(heap)
        return None

    def priorities(self) -> list[int]:
        return list(self._prios)

    def tenants(self, priority: int) -> dict[str, set[Class]]:
        return self._levels.get(priority, {})

    def jobs(self) -> Iterator[str]:
        return iter(self._member)

    def classes(self) -> int:
        return len(self._count)
