"""The read plan: which byte runs of which saved chunks fill the regions a load requests.

Planning intersects each requested region with the saved chunks of its tensor through the
checkpoint's chunk index (:mod:`goodput.ckpt.format.chunk_index`) and turns every intersection into byte
runs, in file order, a bounded batch at a time. Executing the plan is :mod:`goodput.ckpt.loading.read_exec`.

numpy only: the torch-free reader uses it.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import chain

import numpy as np

from ..errors import CheckpointError
from ..format.format import Metadata
from ..format.geometry import Region, cut_flat_many, expand_runs, row_major_strides_many, run_shape, split_by_runs


@dataclass
class Request:
    """Fill ``region`` of tensor ``name`` into ``dest`` (raw bytes, laid out as the region)."""

    name: str
    region: Region
    dest: np.ndarray  # uint8, 1-D, writable, len == region.numel * itemsize


@dataclass
class ChunkOps:
    chunk: int
    src: np.ndarray  # byte offsets within the chunk
    dst: np.ndarray  # byte offsets within the request's dest
    req: np.ndarray  # request index of each run
    nbytes: np.ndarray


RUN_BUDGET = 1 << 16  # byte runs expanded at a time (about 20 MiB of index arrays)


class ReadPlan:
    """The intersections of a load's requested boxes with the saved chunks, ordered by (file,
    chunk offset, first source byte), expanded into byte runs a batch of at most ``budget`` runs
    at a time: what a plan holds at once is bounded whatever the layouts (a column of a tall
    row-major chunk is one run per row).

    Iterating yields :class:`ChunkOps` (the runs of one chunk within a batch, sorted by source
    offset), chunks in file order; a chunk with more runs than a batch comes in several."""

    def __init__(
        self,
        md: Metadata,
        P: np.ndarray,
        Q: np.ndarray,
        lo: np.ndarray,
        hi: np.ndarray,
        item: np.ndarray,
        budget: int,
        cols: tuple,
    ):
        _, _, ST, BASE, ID, _ = self.cols = cols
        self.budget = max(1, budget)
        _, j, nruns = run_shape(hi - lo, P[:, ST], Q[:, ST])
        owner, lo, hi = split_by_runs(lo, hi, j, nruns, self.budget)
        if len(owner) != len(P) or not np.array_equal(owner, np.arange(len(P))):
            P, Q = P[owner], Q[owner]
            _, _, nruns = run_shape(hi - lo, P[:, ST], Q[:, ST])
        chunk = P[:, ID]
        s0 = P[:, BASE] + (lo * P[:, ST]).sum(axis=1)
        order = np.lexsort((s0, md.cols["offset"][chunk], md.cols["file"][chunk]))
        self.md = md
        self.P, self.Q, self.lo, self.hi, self.nruns = P[order], Q[order], lo[order], hi[order], nruns[order]
        self.item = item
        self.candidates = 0  # (requested box, saved box) pairs the planner looked at

    @property
    def runs(self) -> int:
        return int(self.nruns.sum())

    def by_file(self) -> list[tuple[int, ReadPlan]]:
        """``(file id, the plan's part reading that file)`` for each data file it reads, in file
        order: the plan is already ordered by file, so each part is a contiguous slice and one
        reader thread can stream one file front to back. The executor only consumes these parts;
        what a plan holds (its matrices and their columns) stays this module's business."""
        fids = self.md.cols["file"][self.P[:, self.cols[4]]] if len(self.P) else np.zeros(0, np.int64)
        cuts = [0, *(np.flatnonzero(np.diff(fids)) + 1).tolist(), len(fids)]
        return [(int(fids[a]), self._part(a, b)) for a, b in zip(cuts[:-1], cuts[1:]) if a != b]

    def _part(self, a: int, b: int) -> ReadPlan:
        """The pairs ``a:b`` as a plan of their own (same metadata, budget and requests)."""
        sub = copy.copy(self)
        sub.P, sub.Q, sub.lo, sub.hi, sub.nruns = self.P[a:b], self.Q[a:b], self.lo[a:b], self.hi[a:b], self.nruns[a:b]
        return sub

    def __len__(self) -> int:
        """Saved chunks the load reads from."""
        return len(np.unique(self.P[:, self.cols[4]]))

    def batches(self) -> Iterator[tuple[int, int]]:
        """Consecutive pair ranges of at most ``budget`` runs (a pair is never cut: the planner
        already cut every pair to at most ``budget`` runs)."""
        cum = np.cumsum(self.nruns)
        a, done = 0, 0
        while a < len(cum):
            b = max(a + 1, int(np.searchsorted(cum, done + self.budget, side="right")))
            yield a, b
            done = int(cum[b - 1])
            a = b

    def __iter__(self) -> Iterator[ChunkOps]:
        _, _, ST, BASE, ID, _ = self.cols
        c = self.md.cols
        for a, b in self.batches():
            P, Q = self.P[a:b], self.Q[a:b]
            pair, src, dst, run = expand_runs(self.lo[a:b], self.hi[a:b], P[:, ST], P[:, BASE], Q[:, ST], Q[:, BASE])
            req = Q[pair, ID]
            chunk = P[pair, ID]
            order = np.lexsort((src, c["offset"][chunk], c["file"][chunk]))
            chunk, req = chunk[order], req[order]
            it = self.item[req]
            src, dst, run = src[order] * it, dst[order] * it, run[order] * it
            del pair, order, it
            bounds = np.flatnonzero(np.diff(chunk)) + 1
            edges = [0, *bounds.tolist(), len(chunk)]
            for x, y in zip(edges[:-1], edges[1:]):
                yield ChunkOps(int(chunk[x]), src[x:y], dst[x:y], req[x:y], run[x:y])


class ReadPlanner:
    """Plans any number of requests against one checkpoint's metadata, all at once.

    Every requested region becomes boxes in one matrix (tensors of any rank padded to the same
    rank; flat ranges cut into boxes, see :func:`~goodput.ckpt.format.geometry.cut_flat_many`) and is
    joined with the checkpoint's chunk index (:mod:`goodput.ckpt.format.chunk_index`, built once when the
    metadata is read): two binary searches per box find the saved boxes that can meet it, so a
    plan costs O(requests · log chunks + pieces found) in numpy, with no Python loop per chunk:
    that is what keeps a 16k-rank layout fast.
    """

    def __init__(self, md: Metadata):
        self.md = md
        self.tables = md.tables()

    def tensor_id(self, name: str) -> int:
        try:
            return self.tables.by_name[name]
        except KeyError:
            raise CheckpointError(f"tensor {name!r} is not in the checkpoint") from None

    def plan(self, requests: list[Request], run_budget: int = RUN_BUDGET) -> ReadPlan:
        tb = self.tables
        D = tb.shape.shape[1]
        nreq = len(requests)
        by_name = tb.by_name
        # one row per request: tensor, dest bytes, flat start/count, ndim, offsets, sizes (padded
        # on the right to D dims); a flat region's offsets and sizes are zeros
        zeros = [(0,) * (D - d) for d in range(D + 1)]
        ones = [(1,) * (D - d) for d in range(D + 1)]
        try:
            flat = list(
                chain.from_iterable(
                    (by_name[r.name], len(r.dest), g.flat_start, g.flat_count, len(g.sizes))
                    + g.offsets
                    + zeros[len(g.sizes)]
                    + g.sizes
                    + ones[len(g.sizes)]
                    for r in requests
                    for g in (r.region,)
                )
            )
        except KeyError:
            for r in requests:
                self.tensor_id(r.name)
            raise
        except IndexError:  # a region with more dims than any saved tensor
            flat = []
        width = 5 + 2 * D
        if len(flat) != width * nreq:
            for r in requests:
                want = int(tb.ndim[by_name[r.name]])
                if len(r.region.sizes) != want:
                    raise CheckpointError(
                        f"tensor {r.name!r}: region {r.region.describe()} has {len(r.region.sizes)} dims, "
                        f"the tensor {want}"
                    )
        head = np.array(flat, np.int64).reshape(nreq, width)
        tids, dest_len, fstart, fcount, dims = head[:, :5].T
        wrong_dims = np.flatnonzero(dims != tb.ndim[tids])
        if len(wrong_dims):
            i = int(wrong_dims[0])
            r = requests[i]
            raise CheckpointError(
                f"tensor {r.name!r}: region {r.region.describe()} has {len(r.region.sizes)} dims, "
                f"the tensor {int(tb.ndim[self.tensor_id(r.name)])}"
            )
        box_req = np.flatnonzero(fstart < 0)
        item = tb.itemsize[tids]
        q_lo, q_size = head[box_req, 5 : 5 + D], head[box_req, 5 + D :]
        # a region must lie inside its tensor (a flat range past the end would wrap around)
        outside = np.zeros(nreq, bool)
        outside[box_req] = np.any((q_lo < 0) | (q_size < 0) | (q_lo + q_size > tb.shape[tids[box_req]]), axis=1)
        outside |= (fstart >= 0) & ((fcount < 0) | (fstart + fcount > tb.numel[tids]))
        if outside.any():
            r = requests[int(np.argmax(outside))]
            shape = tuple(self.md.tensors[by_name[r.name]].shape)
            raise CheckpointError(f"tensor {r.name!r}: region {r.region.describe()} lies outside its shape {shape}")
        numel = fcount.copy()
        numel[box_req] = q_size.prod(axis=1)
        bad = np.flatnonzero(dest_len != numel * item)
        if len(bad):
            r = requests[int(bad[0])]
            raise ValueError(
                f"{r.name!r}: destination holds {len(r.dest)} bytes, region needs {int(numel[bad[0]] * item[bad[0]])}"
            )
        # Requested boxes are rows of one matrix (Q), as the saved boxes are in the checkpoint's
        # chunk index (P), so every filter and gather below is one numpy call: lo | hi | strides | base
        # | request (Q) or chunk row (P) | tensor. ``strides`` and ``base`` map global coordinates
        # to element offsets in the request's destination (Q) or the chunk's stored bytes (P).
        chunks = self.md.box_table()
        P = chunks.boxes
        LO, HI, ST, BASE, ID, TEN = chunks.cols
        Q = np.empty((len(box_req), 3 * D + 3), np.int64)
        Q[:, LO] = q_lo
        Q[:, HI] = q_lo + q_size
        Q[:, ST] = row_major_strides_many(q_size)
        Q[:, BASE] = -(q_lo * Q[:, ST]).sum(axis=1)
        Q[:, ID] = box_req
        Q[:, TEN] = tids[box_req]
        frq = np.flatnonzero(fstart >= 0)
        if len(frq):
            f_shape = tb.shape[tids[frq]]
            own, flo, fhi = cut_flat_many(fstart[frq], fcount[frq], f_shape)
            F = np.empty((len(own), 3 * D + 3), np.int64)
            F[:, LO], F[:, HI] = flo, fhi
            F[:, ST] = row_major_strides_many(f_shape)[own]
            F[:, BASE] = -fstart[frq][own]
            F[:, ID] = frq[own]
            F[:, TEN] = tids[frq][own]
            Q = np.concatenate([Q, F])
        Q = Q[np.all(Q[:, HI] > Q[:, LO], axis=1)]

        # the saved boxes that can meet each requested box: those of its tensor whose start along
        # the tensor's split dimension lies in [start - longest extent, stop)
        qt = Q[:, TEN]
        kd = chunks.split_dim[qt]
        rows = np.arange(len(Q))
        q_start, q_stop = Q[rows, kd], Q[rows, D + kd]
        base = chunks.offset[qt]
        wa = np.searchsorted(chunks.keys, base + np.maximum(q_start - chunks.reach[qt], -1), side="right")
        wb = np.searchsorted(chunks.keys, base + q_stop, side="left")
        wn = np.maximum(wb - wa, 0)
        pq = np.repeat(np.arange(len(Q), dtype=np.int64), wn)
        pp = np.repeat(wa - np.cumsum(wn) + wn, wn) + np.arange(int(wn.sum()), dtype=np.int64)
        Pp, Qq = P[pp], Q[pq]
        lo = np.maximum(Pp[:, LO], Qq[:, LO])
        hi = np.minimum(Pp[:, HI], Qq[:, HI])
        meet = np.all(hi > lo, axis=1)
        if not meet.all():
            Pp, Qq, lo, hi = Pp[meet], Qq[meet], lo[meet], hi[meet]

        # every element of every request must come from exactly one saved chunk
        # (float sums are exact here: validated tensors hold at most 2**50 elements)
        covered = np.bincount(Qq[:, ID], weights=(hi - lo).prod(axis=1), minlength=nreq).astype(np.int64)
        wrong = np.flatnonzero(covered != numel)
        if len(wrong):
            i = int(wrong[0])
            r = requests[i]
            what = "overlapping chunks" if covered[i] > numel[i] else "no saved chunk holds part of it"
            raise CheckpointError(
                f"tensor {r.name!r}: cannot fill region {r.region.describe()} "
                f"({int(covered[i])} of {int(numel[i])} elements found: {what})"
            )
        plan = ReadPlan(self.md, Pp, Qq, lo, hi, item, run_budget, chunks.cols)
        plan.candidates = len(pq)
        return plan
