"""Box geometry against a brute-force oracle (hypothesis): element sets, not formulas."""

from __future__ import annotations

import itertools
from math import prod

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from goodput.ckpt.geometry import Region, build_index, flat_to_boxes, runs
from goodput.ckpt.plan_save import split_region

shapes = st.lists(st.integers(1, 6), min_size=0, max_size=4).map(tuple)


def box_elems(shape, offs, sizes):
    strides = [prod(shape[j + 1 :]) for j in range(len(shape))]
    ranges = [range(o, o + s) for o, s in zip(offs, sizes)]
    return {sum(i * st_ for i, st_ in zip(idx, strides)) for idx in itertools.product(*ranges)}


@given(shapes, st.data())
def test_flat_to_boxes_tiles_exactly_the_range(shape, data):
    n = prod(shape)
    a = data.draw(st.integers(0, n))
    b = data.draw(st.integers(a, n))
    boxes = flat_to_boxes(a, b - a, shape)
    seen: list[int] = []
    for offs, sizes in boxes:
        seen.extend(box_elems(shape, offs, sizes))
    assert sorted(seen) == list(range(a, b))  # covers, and no element twice
    assert len(boxes) <= max(1, 2 * len(shape) - 1)


@st.composite
def layouts(draw, shape):
    """A random tiling of the tensor: a grid of boxes, or flat ranges."""
    n = prod(shape)
    if draw(st.booleans()) or len(shape) == 0:
        cuts = sorted(set(draw(st.lists(st.integers(0, n), max_size=5))) | {0, n})
        return [Region.flat(a, b - a, len(shape)) for a, b in zip(cuts, cuts[1:]) if b > a]
    edges = []
    for s in shape:
        c = sorted(set(draw(st.lists(st.integers(0, s), max_size=3))) | {0, s})
        edges.append([(a, b - a) for a, b in zip(c, c[1:]) if b > a])
    return [Region.box([o for o, _ in combo], [s for _, s in combo]) for combo in itertools.product(*edges)]


@st.composite
def queries(draw, shape):
    n = prod(shape)
    if draw(st.booleans()):
        a = draw(st.integers(0, n))
        b = draw(st.integers(a, n))
        return Region.flat(a, b - a, len(shape))
    offs, sizes = [], []
    for s in shape:
        o = draw(st.integers(0, s))
        offs.append(o)
        sizes.append(draw(st.integers(0, s - o)))
    return Region.box(offs, sizes)


def stored(arr: np.ndarray, r: Region) -> np.ndarray:
    """What a region's storage holds: row-major box contents, or a flat slice."""
    if r.is_flat:
        return arr.reshape(-1)[r.flat_start : r.flat_start + r.flat_count].copy()
    return arr[tuple(slice(o, o + s) for o, s in zip(r.offsets, r.sizes))].reshape(-1).copy()


@settings(max_examples=300, deadline=None)
@given(shapes, st.data())
def test_resharding_copies_exactly_the_oracle(shape, data):
    glob = np.arange(prod(shape), dtype=np.int64).reshape(shape) + 1
    saved = data.draw(layouts(shape))
    query = data.draw(queries(shape))
    storage = [stored(glob, r) for r in saved]
    idx = build_index(shape, saved, list(range(len(saved))))
    dest = np.zeros(query.numel, np.int64)
    covered = 0
    for offs, sizes in query.boxes(shape):
        lo = np.asarray(offs, np.int64)
        owners, ilo, ihi = idx.query(lo, lo + np.asarray(sizes, np.int64))
        for k, ch in enumerate(owners.tolist()):
            s, d, n = runs(ilo[k], ihi[k], saved[ch].affine(shape), query.affine(shape))
            for s0, d0 in zip(s.tolist(), d.tolist()):
                assert s0 >= 0 and s0 + n <= len(storage[ch]), "run leaves its source chunk"
                assert d0 >= 0 and d0 + n <= len(dest), "run leaves its destination"
                assert not dest[d0 : d0 + n].any(), "an element is written twice"
                dest[d0 : d0 + n] = storage[ch][s0 : s0 + n]
                covered += n
    assert covered == query.numel
    np.testing.assert_array_equal(dest, stored(glob, query))


@given(shapes, st.integers(1, 9), st.data())
def test_split_region_partitions(shape, k, data):
    r = data.draw(queries(shape))
    parts = split_region(r, k)
    assert sum(p.numel for p in parts) == r.numel
    elems: list[int] = []
    for p in parts:
        for offs, sizes in p.boxes(shape):
            elems.extend(box_elems(shape, offs, sizes))
    want: list[int] = []
    for offs, sizes in r.boxes(shape):
        want.extend(box_elems(shape, offs, sizes))
    assert sorted(elems) == sorted(want)


def test_whole_chunk_is_one_run():
    shape = (64, 32)
    r = Region.box((16, 0), (16, 32))
    s, d, n = runs(np.array([16, 0]), np.array([32, 32]), r.affine(shape), r.affine(shape))
    assert len(s) == 1 and n == 16 * 32


def test_index_query_looks_at_a_window_only():
    # 16k row shards: a query for one shard's rows meets exactly that shard
    n = 16384
    shape = (n * 4, 8)
    regions = [Region.box((4 * i, 0), (4, 8)) for i in range(n)]
    idx = build_index(shape, regions, list(range(n)))
    owners, lo, hi = idx.query(np.array([4 * 1000 + 1, 0]), np.array([4 * 1002, 8]))
    assert owners.tolist() == [1000, 1001]
