"""Where free GPUs are: nodes bucketed by free count per pool, so a gang is placed without a scan.

Every pool keeps, for each free-GPU count, the sorted indices of its offerable nodes (up, not
claimed by a preemptor waiting for its victims). Placing ``n`` nodes of ``g`` GPUs walks the
buckets from ``g`` upward (best fit: the fullest node that still fits, which keeps whole nodes
whole for large gangs) and takes nodes in index order, so a placement depends only on the state,
never on the history of the structure (a scheduler rebuilt from its store places identically).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from sortedcontainers import SortedList

from .model import Health, Node, Pool


class Capacity:
    __slots__ = (
        "pools",
        "nodes",
        "index",
        "names",
        "pool_nodes",
        "_buckets",
        "claimed",
        "_max_gpus",
        "_held_back",
        "_watched",
        "_watch_hist",
        "_thresholds",
        "_evictable",
        "_reach",
    )

    def __init__(self, pools: Iterable[Pool], nodes: Iterable[Node]) -> None:
        self.pools: dict[str, Pool] = {p.name: p for p in pools}
        self.nodes: dict[str, Node] = {}
        self.index: dict[str, int] = {}
        self.names: list[str] = []
        self.pool_nodes: dict[str, list[str]] = {p: [] for p in self.pools}
        self.claimed: dict[str, str] = {}  # node -> the job waiting for it
        self._held_back: dict[str, set[str]] = {p: set() for p in self.pools}  # claimed or under notice
        self._max_gpus: dict[str, int] = {p.name: p.gpus_per_node for p in self.pools.values()}
        # one watched node set (the reservation of the moment): offerable members per pool and free count
        self._watched: frozenset[str] = frozenset()
        self._watch_hist: dict[str, list[int]] = {}
        # what a victim search could reach: for each priority q of the thresholds, offerable nodes
        # by free GPUs plus GPUs of running jobs below q (an upper bound: a search passes over
        # victims that touch a held-back or reserved node), so that most searches bound to fail
        # never scan the running jobs
        self._thresholds: list[int] = []
        self._evictable: dict[str, dict[int, int]] = {}  # node -> priority -> GPUs of evictable jobs
        self._reach: dict[str, list[list[int]]] = {}
        self._buckets: dict[str, list[SortedList]] = {
            p.name: [SortedList() for _ in range(p.gpus_per_node + 1)] for p in self.pools.values()
        }
        for node in nodes:
            if node.pool not in self.pools:
                raise ValueError(f"node {node.name!r}: unknown pool {node.pool!r}")
            self.index[node.name] = len(self.names)
            self.names.append(node.name)
            self.nodes[node.name] = node
            self.pool_nodes[node.pool].append(node.name)
            self._max_gpus[node.pool] = max(self._max_gpus[node.pool], node.gpus)
            if len(self._buckets[node.pool]) <= node.gpus:
                self._buckets[node.pool] += [SortedList() for _ in range(node.gpus + 1 - len(self._buckets[node.pool]))]
        for node in self.nodes.values():
            node.used = sum(node.alloc.values())
            self._count_held(node, +1)
            self._file(node)

    @staticmethod
    def build_nodes(pools: Iterable[Pool]) -> list[Node]:
        """Node records for pools given as counts: ``pool-00000``, ``pool-00001``, ..."""
        return [
            Node(name=f"{p.name}-{i:05d}", pool=p.name, kind=p.kind, gpus=p.gpus_per_node)
            for p in pools
            for i in range(p.nodes)
        ]

    # the buckets hold exactly the offerable nodes, under their current free count

    def _offerable(self, node: Node) -> bool:
        return node.health is Health.UP and node.name not in self.claimed

    def _file(self, node: Node) -> None:
        if self._offerable(node):
            self._buckets[node.pool][node.free].add(self.index[node.name])
            if node.name in self._watched:
                self._watch_hist[node.pool][node.free] += 1
            if self._thresholds:
                self._count_reach(node, +1)

    def _unfile(self, node: Node) -> None:
        if self._offerable(node):
            self._buckets[node.pool][node.free].discard(self.index[node.name])
            if node.name in self._watched:
                self._watch_hist[node.pool][node.free] -= 1
            if self._thresholds:
                self._count_reach(node, -1)

    def _reach_levels(self, node: Node) -> list[int]:
        """The node's free GPUs plus its evictable GPUs below each threshold (at most its GPUs:
        evictable GPUs are bound ones)."""
        free = node.gpus - node.used
        ev = self._evictable.get(node.name)
        if not ev:
            return [free] * len(self._thresholds)
        if len(ev) == 1:
            ((p, g),) = ev.items()
            return [free + g if p < q else free for q in self._thresholds]
        return [free + sum(g for p, g in ev.items() if p < q) for q in self._thresholds]

    def _count_reach(self, node: Node, sign: int) -> None:
        levels = self._reach_levels(node)
        for hist, v in zip(self._reach[node.pool], levels):
            hist[v] += sign

    def set_thresholds(self, priorities: Iterable[int]) -> None:
        """The priorities victim searches ask about (every job priority): rebuilds the counts."""
        qs = sorted(set(priorities))
        if qs == self._thresholds:
            return
        self._thresholds = qs
        self._reach = {p: [[0] * len(b) for _ in qs] for p, b in self._buckets.items()}
        for node in self.nodes.values():
            if self._offerable(node):
                self._count_reach(node, +1)

    def add_evictable(self, names: Iterable[str], priority: int, gpus_per_node: int, sign: int = +1) -> None:
        """A running job at ``priority`` holds ``gpus_per_node`` on each node (``sign=-1``: no longer
        evictable, because it is leaving or gone)."""
        for name in names:
            node = self.nodes[name]
            counted = bool(self._thresholds) and self._offerable(node)
            if counted:
                self._count_reach(node, -1)
            ev = self._evictable.setdefault(name, {})
            left = ev.get(priority, 0) + sign * gpus_per_node
            if left:
                ev[priority] = left
            else:
                ev.pop(priority, None)
            if counted:
                self._count_reach(node, +1)

    def reachable(self, pool: str, priority: int, gpus: int) -> int | None:
        """At most how many nodes of the pool could have ``gpus`` free if every running job below
        ``priority`` left; None when ``priority`` is not a threshold."""
        try:
            i = self._thresholds.index(priority)
        except ValueError:
            return None
        return sum(self._reach[pool][i][gpus:])

    def watch(self, names: frozenset[str]) -> None:
        """Keep counts of these nodes by free GPUs, so that counting what fits outside them is
        O(GPUs per node) instead of O(len(names)): the reservation is excluded many times a pass."""
        if names is self._watched:
            return
        self._watched = names
        self._watch_hist = {p: [0] * len(b) for p, b in self._buckets.items()}
        for name in names:
            node = self.nodes[name]
            if self._offerable(node):
                self._watch_hist[node.pool][node.free] += 1

    def bind(
        self, job_id: str, names: Iterable[str], gpus_per_node: int, *, evictable_priority: int | None = None
    ) -> None:
        """Bind the GPUs; with ``evictable_priority``, also count them as a running job's at that
        priority (as :meth:`add_evictable`, in the same update)."""
        for name in names:
            node = self.nodes[name]
            self._unfile(node)
            node.alloc[job_id] = node.alloc.get(job_id, 0) + gpus_per_node
            node.used += gpus_per_node
            if node.used > node.gpus:
                raise RuntimeError(f"node {name!r}: {node.used} GPUs bound of {node.gpus} (job {job_id!r})")
            if evictable_priority is not None:
                ev = self._evictable.setdefault(name, {})
                ev[evictable_priority] = ev.get(evictable_priority, 0) + gpus_per_node
            self._file(node)

    def unbind(self, job_id: str, names: Iterable[str]) -> None:
        for name in names:
            node = self.nodes[name]
            if job_id not in node.alloc:
                continue
            self._unfile(node)
            node.used -= node.alloc.pop(job_id)
            self._file(node)

    def _held(self, node: Node) -> bool:
        return node.health is Health.RECLAIMING or node.name in self.claimed

    def _count_held(self, node: Node, sign: int) -> None:
        if self._held(node):
            if sign > 0:
                self._held_back[node.pool].add(node.name)
            else:
                self._held_back[node.pool].discard(node.name)

    def set_health(self, name: str, health: Health) -> None:
        node = self.nodes[name]
        self._unfile(node)
        self._count_held(node, -1)
        node.health = health
        self._count_held(node, +1)
        self._file(node)

    def claim(self, job_id: str, names: Iterable[str]) -> None:
        for name in names:
            node = self.nodes[name]
            self._unfile(node)
            self._count_held(node, -1)
            self.claimed[name] = job_id
            self._count_held(node, +1)

    def unclaim(self, names: Iterable[str]) -> None:
        for name in names:
            node = self.nodes[name]
            if name in self.claimed:
                self._count_held(node, -1)
                del self.claimed[name]
                self._count_held(node, +1)
                self._file(node)

    # queries

    def count_fitting(self, pool: str, gpus: int, exclude: set[str] | frozenset[str] = frozenset()) -> int:
        """Offerable nodes of the pool with ``gpus`` free, less those in ``exclude``."""
        buckets = self._buckets[pool]
        n = 0
        for f in range(gpus, len(buckets)):
            n += len(buckets[f])
        if not exclude:
            return n
        if exclude is self._watched:
            return n - sum(self._watch_hist[pool][gpus:])
        nodes, claimed, up = self.nodes, self.claimed, Health.UP
        for name in exclude:
            node = nodes[name]
            if node.pool == pool and node.health is up and name not in claimed and node.gpus - node.used >= gpus:
                n -= 1
        return n

    def find(
        self, pool: str, nodes: int, gpus: int, exclude: set[str] | frozenset[str] = frozenset()
    ) -> tuple[str, ...] | None:
        """``nodes`` distinct offerable nodes with ``gpus`` free each, best fit, or None."""
        if gpus > self._max_gpus.get(pool, 0):
            return None
        if self.count_fitting(pool, gpus) < nodes:
            return None
        out: list[str] = []
        buckets = self._buckets[pool]
        for f in range(gpus, len(buckets)):
            for i in buckets[f]:
                name = self.names[i]
                if name in exclude:
                    continue
                out.append(name)
                if len(out) == nodes:
                    return tuple(out)
        return None  # the excluded nodes were the ones that fit

    def equals(self, pool: str, name: str, exclude: set[str] | frozenset[str] = frozenset()) -> list[str]:
        """The offerable nodes of the pool with as many free GPUs as ``name`` (what best fit cannot
        tell apart), in index order, less ``exclude``."""
        names = self.names
        return [names[i] for i in self._buckets[pool][self.nodes[name].free] if names[i] not in exclude]

    def with_free(self, pool: str, free: int) -> Iterator[str]:
        """The offerable nodes of the pool with exactly ``free`` GPUs free, in index order (lazily:
        a caller that stops early pays for what it read)."""
        buckets = self._buckets[pool]
        if free >= len(buckets):
            return
        names = self.names
        for i in buckets[free]:
            yield names[i]

    def free_gpus(self, pool: str | None = None) -> int:
        pools = [pool] if pool else list(self.pools)
        return sum(f * len(b[f]) for p in pools for b in [self._buckets[p]] for f in range(len(b)))

    def capacity_gpus(self) -> int:
        return sum(n.gpus for n in self.nodes.values() if n.health is not Health.LOST)

    def held_back(self, pool: str) -> set[str]:
        """Nodes of the pool that are up but offered to nobody (claimed or under a reclaim notice)."""
        return set(self._held_back[pool])

    def unofferable_up(self, pool: str) -> bool:
        """Does the pool hold a node that is up but not offerable (claimed or being reclaimed)?"""
        return bool(self._held_back[pool])

    def offerable(self, name: str) -> bool:
        return self._offerable(self.nodes[name])
