"""Box geometry against a brute-force oracle (hypothesis): element sets, not formulas."""

from __future__ import annotations

import itertools
from math import prod

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from goodput.ckpt.format.format import FileEntry, Metadata, TensorEntry
from goodput.ckpt.format.geometry import Region, cut_flat_many, expand_runs, flat_to_boxes, runs
from goodput.ckpt.loading.read_plan import ReadPlanner, Request
from goodput.ckpt.saving.agreement import split_region
from tests.ckpt.format.geometry_oracle import build_index

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


D_PAD = 4


def left_pad(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Padding on either side keeps row-major addresses; the planner pads on the right, this
    test pads on the left so the cut is checked both ways."""
    return (1,) * (D_PAD - len(shape)) + tuple(shape)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(shapes, st.floats(0, 1), st.floats(0, 1)), min_size=1, max_size=6))
def test_cut_flat_many_tiles_each_range(rows):
    """The vectorised cut covers each range exactly, in left-padded coordinates."""
    shape = np.array([left_pad(s) for s, _, _ in rows], np.int64)
    starts, counts = [], []
    for s, fa, fb in rows:
        n = prod(s)
        a = int(fa * n)
        starts.append(a)
        counts.append(int(fb * (n - a)))
    own, lo, hi = cut_flat_many(np.array(starts), np.array(counts), shape)
    for i, (s, _, _) in enumerate(rows):
        mine = own == i
        seen: list[int] = []
        for offs, his in zip(lo[mine].tolist(), hi[mine].tolist()):
            seen.extend(box_elems(left_pad(s), offs, [h - o for o, h in zip(offs, his)]))
        assert sorted(seen) == list(range(starts[i], starts[i] + counts[i]))
        assert mine.sum() <= 2 * D_PAD - 1


@settings(max_examples=200, deadline=None)
@given(shapes, st.data())
def test_expand_runs_matches_runs(shape, data):
    saved = data.draw(layouts(shape))
    query = data.draw(queries(shape))
    idx = build_index(shape, saved, list(range(len(saved))))
    want: list[tuple[int, int, int, int]] = []
    rows = []
    for offs, sizes in query.boxes(shape):
        lo = np.asarray(offs, np.int64)
        owners, ilo, ihi = idx.query(lo, lo + np.asarray(sizes, np.int64))
        for k, ch in enumerate(owners.tolist()):
            s, d, n = runs(ilo[k], ihi[k], saved[ch].affine(shape), query.affine(shape))
            want.extend((len(rows), a, b, n) for a, b in zip(s.tolist(), d.tolist()))
            rows.append((ilo[k], ihi[k], saved[ch].affine(shape), query.affine(shape)))
    if not rows:
        return
    d = len(shape)
    pair, src, dst, n = expand_runs(
        np.array([r[0] for r in rows], np.int64).reshape(len(rows), d),
        np.array([r[1] for r in rows], np.int64).reshape(len(rows), d),
        np.array([r[2][0] for r in rows], np.int64).reshape(len(rows), d),
        np.array([r[2][1] for r in rows], np.int64),
        np.array([r[3][0] for r in rows], np.int64).reshape(len(rows), d),
        np.array([r[3][1] for r in rows], np.int64),
    )
    got = sorted(zip(pair.tolist(), src.tolist(), dst.tolist(), n.tolist()))
    assert got == sorted(want)


def metadata_for(tensors: list[tuple[str, tuple[int, ...], list[Region]]]) -> Metadata:
    """Metadata whose chunks are the given regions, laid out back to back in one file."""
    width = max([len(s) for _, s, _ in tensors], default=0)
    cols: dict[str, list] = {k: [] for k in ("tensor", "offset", "length", "flat_start", "flat_count")}
    offs_col: list[list[int]] = []
    sizes_col: list[list[int]] = []
    pos = 0
    for ti, (_, shape, regions) in enumerate(tensors):
        for r in regions:
            cols["tensor"].append(ti)
            cols["offset"].append(pos)
            cols["length"].append(8 * r.numel)
            cols["flat_start"].append(r.flat_start)
            cols["flat_count"].append(r.flat_count)
            pad = [0] * (width - len(shape))
            offs_col.append(([0] * len(shape) if r.is_flat else list(r.offsets)) + pad)
            sizes_col.append(([0] * len(shape) if r.is_flat else list(r.sizes)) + pad)
            pos += 8 * r.numel
    n = len(cols["tensor"])
    nblocks = [-(-length // 4096) for length in cols["length"]]
    block0 = np.concatenate([[0], np.cumsum(nblocks)[:-1]]).astype("<i8") if n else np.zeros(0, "<i8")
    arrays = {
        "tensor": np.array(cols["tensor"], "<u4"),
        "file": np.zeros(n, "<u4"),
        "offset": np.array(cols["offset"], "<i8"),
        "length": np.array(cols["length"], "<i8"),
        "crc32c": np.zeros(n, "<u4"),
        "block0": block0,
        "blocks_crc32c": np.zeros(n, "<u4"),
        "flat_start": np.array(cols["flat_start"], "<i8"),
        "flat_count": np.array(cols["flat_count"], "<i8"),
        "offsets": np.array(offs_col, "<i8").reshape(n, width),
        "sizes": np.array(sizes_col, "<i8").reshape(n, width),
    }
    entries = [TensorEntry(name, "int64", list(shape)) for name, shape, _ in tensors]
    table = sum(nblocks)
    return Metadata("s", 4096, entries, [FileEntry("data.bin", pos + 4 * table, pos, table, 0)], {}, arrays)


@settings(max_examples=150, deadline=None)
@given(st.lists(shapes, min_size=1, max_size=4), st.data())
def test_planner_fills_many_requests_at_once_like_the_oracle(tensor_shapes, data):
    """One vectorised plan over tensors of different ranks and mixed box/flat layouts, executed
    run by run from in-memory chunk storage, equals slicing the global arrays."""
    tensors, globs, storage = [], [], []
    for i, shape in enumerate(tensor_shapes):
        glob = np.arange(prod(shape), dtype=np.int64).reshape(shape) + 1000 * i
        saved = data.draw(layouts(shape))
        tensors.append((f"t{i}", shape, saved))
        globs.append(glob)
        storage.extend(stored(glob, r) for r in saved)
    md = metadata_for(tensors)
    asks = data.draw(st.lists(st.integers(0, len(tensors) - 1), min_size=1, max_size=6))
    qs = [data.draw(queries(tensor_shapes[t])) for t in asks]
    dests = [np.zeros(q.numel, np.int64) for q in qs]
    reqs = [Request(f"t{t}", q, d.view(np.uint8)) for t, q, d in zip(asks, qs, dests)]
    # a small run budget cuts boxes and batches: the plan must still be exact
    budget = data.draw(st.sampled_from([1, 2, 3, 7, 1 << 18]))
    plan = ReadPlanner(md).plan(reqs, run_budget=budget)
    written = [np.zeros(q.numel, bool) for q in qs]
    last = (-1, -1)
    for ops in plan:
        key = (0, int(md.cols["offset"][ops.chunk]))
        if budget == 1 << 18:
            assert key > last, "chunks come in file order, each once"
        assert len(ops.src) <= max(budget, 1) or budget == 1 << 18, "a batch holds at most the budget"
        last = key
        assert np.all(np.diff(ops.src) >= 0), "runs follow the chunk's byte order"
        for s, d, n, r in zip(ops.src.tolist(), ops.dst.tolist(), ops.nbytes.tolist(), ops.req.tolist()):
            assert s % 8 == 0 and d % 8 == 0 and n % 8 == 0
            s, d, n = s // 8, d // 8, n // 8
            src = storage[ops.chunk]
            assert s >= 0 and s + n <= len(src), "run leaves its source chunk"
            assert not written[r][d : d + n].any(), "an element is written twice"
            dests[r][d : d + n] = src[s : s + n]
            written[r][d : d + n] = True
    for t, q, dest, w in zip(asks, qs, dests, written):
        assert w.all()
        np.testing.assert_array_equal(dest, stored(globs[t], q))


def test_planner_names_the_tensor_it_cannot_fill():
    import pytest

    from goodput.ckpt.format.format import CheckpointError

    md = metadata_for([("a", (8, 4), [Region.box((0, 0), (4, 4))]), ("b", (6,), [Region.flat(0, 6, 1)])])
    with pytest.raises(CheckpointError, match=r"tensor 'a'.*\[2:6, 0:4\].*8 of 16"):
        ReadPlanner(md).plan(
            [
                Request("b", Region.flat(0, 6, 1), np.zeros(48, np.uint8)),
                Request("a", Region.box((2, 0), (4, 4)), np.zeros(128, np.uint8)),
            ]
        )
    with pytest.raises(CheckpointError, match="'c' is not in the checkpoint"):
        ReadPlanner(md).plan([Request("c", Region.flat(0, 1, 1), np.zeros(8, np.uint8))])
    with pytest.raises(CheckpointError, match=r"'b': region flat\[4:8\] lies outside its shape \(6,\)"):
        ReadPlanner(md).plan([Request("b", Region.flat(4, 4, 1), np.zeros(32, np.uint8))])
    with pytest.raises(CheckpointError, match=r"'a': region \[-1:3, 0:4\] lies outside"):
        ReadPlanner(md).plan([Request("a", Region.box((-1, 0), (4, 4)), np.zeros(128, np.uint8))])
    with pytest.raises(CheckpointError, match="'a': region .* has 1 dims, the tensor 2"):
        ReadPlanner(md).plan([Request("a", Region.box((0,), (4,)), np.zeros(32, np.uint8))])
    with pytest.raises(CheckpointError, match="'b': region .* has 3 dims, the tensor 1"):
        ReadPlanner(md).plan([Request("b", Region.box((0, 0, 0), (1, 1, 6)), np.zeros(48, np.uint8))])
    with pytest.raises(ValueError, match="'b': destination holds 40 bytes"):
        ReadPlanner(md).plan([Request("b", Region.flat(0, 6, 1), np.zeros(40, np.uint8))])


def test_validation_refuses_overlaps_even_when_counts_add_up():
    """Chunk [0:2] stored twice and [2:4] nowhere: element counts match the tensor, yet a reader
    trusting counts would fill [2:4] from the wrong bytes. Validation names both chunks."""
    import pytest

    from goodput.ckpt.format.format import CheckpointError, validate_metadata

    twice = metadata_for([("w", (4, 3), [Region.box((0, 0), (2, 3)), Region.box((0, 0), (2, 3))])])
    with pytest.raises(CheckpointError, match=r"chunk \[0:2, 0:3\] of tensor 'w'.* overlaps \[0:2, 0:3\]"):
        validate_metadata(twice, "t")
    flat = metadata_for([("v", (10,), [Region.flat(0, 6, 1), Region.flat(5, 5, 1)])])
    with pytest.raises(CheckpointError, match="tensor 'v'.* overlaps flat"):
        validate_metadata(flat, "t")
    cols = metadata_for([("c", (4, 4096), [Region.box((0, 64 * i), (4, 64)) for i in range(64)])])
    validate_metadata(cols, "t")  # 64 column shards: disjoint, accepted
    narrow = metadata_for([("w", (4, 3), [Region.box((0, 0), (4, 3))])])
    narrow.cols["offsets"] = narrow.cols["offsets"][:, :1]
    narrow.cols["sizes"] = narrow.cols["sizes"][:, :1]
    with pytest.raises(CheckpointError, match="box columns are 1 wide, the highest tensor rank is 2"):
        validate_metadata(narrow, "t")


def test_split_dims_picks_the_dimension_shards_are_cut_along():
    from goodput.ckpt.format.geometry import split_dims

    rows = np.array([[4 * i, 0] for i in range(8)], np.int64)
    cols = np.array([[0, 4 * i] for i in range(8)], np.int64)
    lo = np.concatenate([rows, cols])
    group = np.repeat([0, 1], 8)
    assert split_dims(group, lo, 2).tolist() == [0, 1]


def test_planner_on_many_column_shards_stays_linear():
    """4096 column shards of one tensor, each loaded back as itself: with the window on the
    split dimension each request meets one chunk (not all 4096)."""
    n = 4096
    md = metadata_for([("c", (2, n), [Region.box((0, i), (2, 1)) for i in range(n)])])
    reqs = [Request("c", Region.box((0, i), (2, 1)), np.zeros(16, np.uint8)) for i in range(n)]
    plan = ReadPlanner(md).plan(reqs)
    assert len(plan) == n and plan.runs == n
    assert plan.candidates <= 2 * n  # not n * n


@settings(max_examples=200, deadline=None)
@given(st.lists(shapes, min_size=1, max_size=3), st.data())
def test_tiling_errors_agrees_with_the_per_tensor_check(tensor_shapes, data):
    """The vectorised all-tensor check (save path) gives the same verdict as the reference
    per-tensor one, on tilings with a piece dropped or an extra piece added."""
    from tests.ckpt.format.geometry_oracle import tiling_error, tiling_errors

    regions: list[tuple[int, Region]] = []
    want = None
    for t, shape in enumerate(tensor_shapes):
        regs = data.draw(layouts(shape))
        edit = data.draw(st.sampled_from(["keep", "drop", "add"]))
        if edit == "drop" and regs:
            regs = regs[1:]
        elif edit == "add":  # an extra piece: usually an overlap
            regs = regs + [data.draw(queries(shape))]
        regs = [r for r in regs if r.numel]
        unique = list(dict.fromkeys(regs))
        if want is None and tiling_error(shape, unique):
            want = t
        regions.extend((t, r) for r in unique)
    got = tiling_errors(list(tensor_shapes), regions)
    if want is None:
        assert got is None, got
    else:
        assert got is not None


def test_index_scans_the_dimension_with_the_fewest_comparisons():
    """Row 0 one box, row 1 cut into unit cells: counting starts past 0 would pick rows and
    compare every pair of cells; the index picks columns and compares next to nothing."""
    from goodput.ckpt.format.chunk_index import overlapping_chunks
    from goodput.ckpt.format.format import validate_metadata

    m = 3000
    regions = [Region.box((0, 0), (1, m))] + [Region.box((1, j), (1, 1)) for j in range(m)]
    md = metadata_for([("w", (2, m), regions)])
    validate_metadata(md, "t")
    table = md.box_table()
    assert table.split_dim.tolist() == [1]
    assert overlapping_chunks(table, batch=7) is None  # tiny batches walk the same pairs


def test_index_refuses_extents_that_would_wrap_its_keys():
    import pytest

    from goodput.ckpt.format.chunk_index import build_box_table_from

    T = (1 << 14) + 1  # sum of extents 2**48 each: past 2**62
    shapes = np.full((T, 1), 1 << 48, np.int64)
    one = np.array([T - 1], np.int64)
    with pytest.raises(ValueError, match="too large to index together"):
        build_box_table_from(
            shapes, np.ones(T, np.int64), one, np.array([-1]), np.array([0]), np.array([[0]]), np.array([[8]])
        )


def test_index_refuses_layouts_too_irregular_to_check():
    """Identical chunks need n^2/2 comparisons: refused by the comparison cap, in bounded time."""
    import pytest

    from goodput.ckpt.format.format import CheckpointError, validate_metadata

    n = 20000
    md = metadata_for([("w", (4,), [Region.box((0,), (4,))] * n)])
    with pytest.raises(CheckpointError, match="comparisons to prove them disjoint"):
        validate_metadata(md, "t")


def test_a_plan_holds_at_most_its_run_budget():
    """A whole tall matrix saved as 4 column shards, loaded whole: one 8-byte run per row per
    chunk. Planned with a budget, no batch expands more runs than it, and the runs cover the
    destination exactly once."""
    rows = 10_000
    md = metadata_for([("w", (rows, 4), [Region.box((0, i), (rows, 1)) for i in range(4)])])
    dest = np.zeros(rows * 4 * 8, np.uint8)
    plan = ReadPlanner(md).plan([Request("w", Region.box((0, 0), (rows, 4)), dest)], run_budget=1000)
    assert plan.runs == 4 * rows
    seen = np.zeros(rows * 4, np.int64)
    batches = list(plan.batches())
    assert len(batches) == 40
    for ops in plan:
        assert len(ops.src) <= 1000
        np.add.at(seen, ops.dst // 8, 1)
    assert (seen == 1).all()
