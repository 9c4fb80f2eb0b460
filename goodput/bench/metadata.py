"""``goodput bench ckpt-metadata``: global metadata and one rank's load plan at 16k ranks.

No processes and no data: the layout of a Llama-405B-like job is computed, and only the metadata
side of a checkpoint is built and timed, for goodput and for DCP.

The saving job is TP 8 x PP 16 x DP (ranks/128), rank = tp + TP*(dp + DP*pp) (Megatron's order).
Parameters (bf16; hidden 16384, ffn 53248, vocab 128256, 8 KV heads of 128) per layer: q/k/v,
gate/up projections column-parallel (TP shards dim 0), o/down row-parallel (dim 1), two RMS
norms replicated across TP; embedding and lm_head vocab-parallel (dim 0) on the first and last
stage. Every TP shard is replicated across DP and written once (writer: DP ranks round robin).

Optimizer state (fp32 master weights, exp_avg, exp_avg_sq) is laid out as Megatron's
distributed optimizer lays it out: for each (tp, pp) the stage's local parameter shards are
concatenated into one flat buffer (padded to a multiple of DP), cut into DP equal contiguous
ranges, and DP rank d owns range d. A range covers a flat range of one or a few *TP-local*
shards. A flat range of a local shard is not a flat range (nor one box) of the global tensor
when TP shards dim 1, so each TP-local shard's state is its own global tensor:
``optim.{state}.{param}.tp{t}``, of the local shard's shape; the DP ranges are goodput
``FlatShard`` chunks of it. Norms are replicated across TP and so are their optimizer states
(every TP rank's buffer has the same layout, so the ranges coincide): ``optim.{state}.{param}``,
written once. (Loading into another TP degree would need the states as global tensors cut into
<= 3 boxes per range; this benchmark reshards PP and DP, not TP.)

The load goes to TP 8 x PP 8 x DP (ranks/64) by default: each new stage holds two old stages'
layers and each new DP range straddles the old ones, so every optimizer request is a flat range
that meets several saved flat ranges.

DCP gets the same layout: its metadata (``state_dict_metadata`` chunks + ``storage_data``,
pickled as DCP pickles it) holds each flat range as the <= 3 row-major boxes it is made of (DCP
chunks are boxes), and its load plan is ``DefaultLoadPlanner.create_local_plan`` for one rank.
"""

from __future__ import annotations

import math
import os
import pickle
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from goodput.ckpt.format.format import (
    ALIGN,
    COLUMNS,
    DEFAULT_BLOCK,
    FileEntry,
    Metadata,
    TensorEntry,
    decode_metadata,
    encode_metadata,
)
from goodput.ckpt.format.geometry import Region, flat_to_boxes
from goodput.ckpt.loading.read_plan import ReadPlanner, Request
from goodput.ckpt.saving.agreement import Declaration
from goodput.plan.units import fmt_bytes

HIDDEN = 16384
FFN = 53248
VOCAB = 128256
KV = 8 * 128
TP = 8
STATES = ("param", "exp_avg", "exp_avg_sq")  # fp32 master weights and Adam's moments
SAVE_ID = "0123456789abcdef"
GOAL_SECONDS = 2.0
GOAL_RATIO = 10.0


# --------------------------------------------------------------------------- the model


@dataclass(frozen=True)
class Param:
    name: str
    shape: tuple[int, ...]
    dim: int | None  # TP-sharded dimension; None: replicated across TP
    layer: int  # -1: first stage (embedding); num_layers: last stage (final norm, lm_head)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


_LAYER = (
    ("self_attn.q_proj.weight", (HIDDEN, HIDDEN), 0),
    ("self_attn.k_proj.weight", (KV, HIDDEN), 0),
    ("self_attn.v_proj.weight", (KV, HIDDEN), 0),
    ("self_attn.o_proj.weight", (HIDDEN, HIDDEN), 1),
    ("mlp.gate_proj.weight", (FFN, HIDDEN), 0),
    ("mlp.up_proj.weight", (FFN, HIDDEN), 0),
    ("mlp.down_proj.weight", (HIDDEN, FFN), 1),
    ("input_layernorm.weight", (HIDDEN,), None),
    ("post_attention_layernorm.weight", (HIDDEN,), None),
)


def model(ntensors: int) -> tuple[list[Param], int]:
    """``ntensors`` parameters: embedding, then layers of 9, then final norm and lm_head."""
    if ntensors < 4:
        raise ValueError("--tensors must be at least 4")
    layers = math.ceil((ntensors - 3) / len(_LAYER))
    params = [Param("model.embed_tokens.weight", (VOCAB, HIDDEN), 0, -1)]
    for i in range(layers):
        for suffix, shape, dim in _LAYER:
            if len(params) < ntensors - 2:
                params.append(Param(f"model.layers.{i}.{suffix}", shape, dim, i))
    params.append(Param("model.norm.weight", (HIDDEN,), None, layers))
    params.append(Param("lm_head.weight", (VOCAB, HIDDEN), 0, layers))
    return params, layers


@dataclass(frozen=True)
class Parallel:
    tp: int
    pp: int
    dp: int

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    def rank(self, t: Any, d: Any, p: Any) -> Any:
        return t + self.tp * (d + self.dp * p)

    def coords(self, rank: int) -> tuple[int, int, int]:
        return rank % self.tp, (rank // self.tp) % self.dp, rank // (self.tp * self.dp)

    def describe(self) -> str:
        return f"TP {self.tp} x PP {self.pp} x DP {self.dp}"


def parallel_for(ranks: int, pp: int, tp: int = TP) -> Parallel:
    if ranks <= 0 or ranks % (tp * pp):
        raise ValueError(f"--ranks {ranks} must be a positive multiple of TP*PP = {tp * pp}")
    return Parallel(tp, pp, ranks // (tp * pp))


def stage_of(p: Param, layers: int, pp: int) -> int:
    if p.layer < 0:
        return 0
    if p.layer >= layers:
        return pp - 1
    return p.layer * pp // layers


def local_box(p: Param, tp: int, t: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The box of ``p`` held by TP rank ``t``."""
    if p.dim is None:
        return (0,) * len(p.shape), p.shape
    offs = [0] * len(p.shape)
    sizes = list(p.shape)
    if p.shape[p.dim] % tp:
        raise ValueError(f"{p.name}: dim {p.dim} of {p.shape} is not divisible by TP {tp}")
    sizes[p.dim] //= tp
    offs[p.dim] = t * sizes[p.dim]
    return tuple(offs), tuple(sizes)


def optim_name(state: str, p: Param, t: int) -> str:
    return f"optim.{state}.{p.name}" if p.dim is None else f"optim.{state}.{p.name}.tp{t}"


def optim_segments(stage_params: list[Param], tp: int, dp: int) -> tuple[np.ndarray, ...]:
    """Megatron's distributed-optimizer cut of one (tp, pp) flat buffer.

    Returns ``(param_index, dp_rank, flat_start, flat_count)`` per piece: the intersections of
    the DP ranges with the local shards, ``flat_start`` within the local shard.
    """
    n = np.array([math.prod(local_box(p, tp, 0)[1]) for p in stage_params], np.int64)
    if len(n) == 0:
        e = np.zeros(0, np.int64)
        return e, e, e, e
    starts = np.concatenate([[0], np.cumsum(n)])
    total = int(starts[-1])
    per = -(-total // dp)
    bounds = np.arange(dp + 1, dtype=np.int64) * per
    cuts = np.unique(np.concatenate([starts, bounds[bounds < total], [total]]))
    a, b = cuts[:-1], cuts[1:]
    pi = np.searchsorted(starts, a, side="right") - 1
    return pi, a // per, a - starts[pi], b - a


# --------------------------------------------------------------------------- the saved chunks


@dataclass
class Layout:
    """Every chunk the saving job writes, before files and offsets are assigned."""

    par: Parallel
    params: list[Param]
    layers: int
    tensors: list[tuple[str, str, tuple[int, ...]]]  # (name, dtype, global shape), sorted by name
    tid: dict[str, int]
    tensor: np.ndarray  # int64 per chunk
    writer: np.ndarray  # rank
    flat_start: np.ndarray  # -1 for a box
    flat_count: np.ndarray
    offsets: np.ndarray  # (n, 2)
    sizes: np.ndarray  # (n, 2)
    length: np.ndarray  # bytes

    @property
    def num_chunks(self) -> int:
        return len(self.tensor)


def saved_layout(ranks: int, ntensors: int, pp: int = 16) -> Layout:
    par = parallel_for(ranks, pp)
    params, layers = model(ntensors)
    tensors: list[tuple[str, str, tuple[int, ...]]] = []
    for p in params:
        tensors.append((p.name, "bfloat16", p.shape))
        for s in STATES:
            if p.dim is None:
                tensors.append((optim_name(s, p, 0), "float32", p.shape))
            else:
                shape = local_box(p, par.tp, 0)[1]
                tensors.extend((optim_name(s, p, t), "float32", shape) for t in range(par.tp))
    tensors.sort(key=lambda x: x[0])
    tid = {name: i for i, (name, _, _) in enumerate(tensors)}
    itemsize = {"bfloat16": 2, "float32": 4}

    parts: dict[str, list[np.ndarray]] = {k: [] for k in ("tensor", "writer", "fs", "fc", "offs", "sizes", "length")}

    def add(tensor, writer, fs, fc, offs, sizes, length) -> None:
        n = len(tensor)
        parts["tensor"].append(np.asarray(tensor, np.int64).reshape(n))
        parts["writer"].append(np.asarray(writer, np.int64).reshape(n))
        parts["fs"].append(np.asarray(fs, np.int64).reshape(n))
        parts["fc"].append(np.asarray(fc, np.int64).reshape(n))
        parts["offs"].append(np.asarray(offs, np.int64).reshape(n, 2))
        parts["sizes"].append(np.asarray(sizes, np.int64).reshape(n, 2))
        parts["length"].append(np.asarray(length, np.int64).reshape(n))

    def pad2(x: tuple[int, ...]) -> tuple[int, int]:
        return (tuple(x) + (0, 0))[:2]

    for s in range(par.pp):
        stage = [p for p in params if stage_of(p, layers, par.pp) == s]
        # parameters: each TP box once, by the DP ranks in turn
        rows = []
        for k, p in enumerate(stage):
            if p.dim is None:
                offs, sizes = local_box(p, par.tp, 0)
                rows.append((tid[p.name], par.rank(k % par.tp, k % par.dp, s), offs, sizes, p.numel * 2))
                continue
            for t in range(par.tp):
                offs, sizes = local_box(p, par.tp, t)
                rows.append((tid[p.name], par.rank(t, (k + t) % par.dp, s), offs, sizes, math.prod(sizes) * 2))
        if rows:
            add(
                [r[0] for r in rows],
                [r[1] for r in rows],
                np.full(len(rows), -1),
                np.zeros(len(rows)),
                [pad2(r[2]) for r in rows],
                [pad2(r[3]) for r in rows],
                [r[4] for r in rows],
            )
        # optimizer states: the DP ranges of each (tp, pp) buffer
        pi, d, fs, fc = optim_segments(stage, par.tp, par.dp)
        if len(pi) == 0:
            continue
        replicated = np.array([p.dim is None for p in stage], bool)[pi]
        for state in STATES:
            for t in range(par.tp):
                keep = ~replicated | (t == 0)  # TP-replicated states: written once
                ids = np.array([tid[optim_name(state, p, t)] for p in stage], np.int64)[pi]
                m = int(keep.sum())
                add(
                    ids[keep],
                    par.rank(t, d[keep], s),
                    fs[keep],
                    fc[keep],
                    np.zeros((m, 2)),
                    np.zeros((m, 2)),
                    fc[keep] * itemsize["float32"],
                )
    cat = {k: np.concatenate(v) for k, v in parts.items()}
    return Layout(
        par,
        params,
        layers,
        tensors,
        tid,
        cat["tensor"],
        cat["writer"],
        cat["fs"],
        cat["fc"],
        cat["offs"],
        cat["sizes"],
        cat["length"],
    )


# --------------------------------------------------------------------------- goodput metadata


def build_metadata(lay: Layout, block_bytes: int = DEFAULT_BLOCK, seed: int = 0) -> Metadata:
    """The global metadata a save of ``lay`` commits: one data file per writing rank, chunks on
    page boundaries in write order, then the block-checksum table (checksums are random)."""
    writers, fid = np.unique(lay.writer, return_inverse=True)
    # write order inside each file: by tensor, then position
    order = np.lexsort((lay.offsets[:, 1], lay.offsets[:, 0], lay.flat_start, lay.tensor, fid))
    f_sorted = fid[order]
    length = lay.length[order]
    aligned = -(-length // ALIGN) * ALIGN
    nblocks = -(-length // block_bytes)
    first = np.flatnonzero(np.r_[True, f_sorted[1:] != f_sorted[:-1]])  # first row of each file
    run_id = np.cumsum(np.r_[True, f_sorted[1:] != f_sorted[:-1]]) - 1
    ca = np.cumsum(aligned)
    cb = np.cumsum(nblocks)
    offset = ca - aligned - (ca - aligned)[first][run_id]
    block0 = cb - nblocks - (cb - nblocks)[first][run_id]
    last = np.r_[first[1:] - 1, len(order) - 1]
    data_end = offset[last] + length[last]
    crc_offset = -(-data_end // 8) * 8
    crc_count = (cb[last] - cb[first] + nblocks[first]).astype(np.int64)
    fbytes = crc_offset + 4 * crc_count
    files = [
        FileEntry(f"data-{SAVE_ID}-r{int(r):05d}.bin", int(b), int(co), int(cc), int(r))
        for r, b, co, cc in zip(writers.tolist(), fbytes.tolist(), crc_offset.tolist(), crc_count.tolist())
    ]
    # rows of the metadata: by tensor, then flat start, then box offsets (as a save commits them)
    inv = np.empty_like(order)
    inv[order] = np.arange(len(order))
    rows = np.lexsort((lay.offsets[:, 1], lay.offsets[:, 0], lay.flat_start, lay.tensor))
    rng = np.random.default_rng(seed)
    cols = {
        "tensor": lay.tensor[rows].astype(np.uint32),
        "file": fid[rows].astype(np.uint32),
        "offset": offset[inv[rows]],
        "length": lay.length[rows],
        "crc32c": rng.integers(0, 1 << 32, len(rows), dtype=np.uint32),
        "block0": block0[inv[rows]],
        "flat_start": lay.flat_start[rows],
        "flat_count": lay.flat_count[rows],
        "offsets": np.ascontiguousarray(lay.offsets[rows]),
        "sizes": np.ascontiguousarray(lay.sizes[rows]),
    }
    for name, (dt, two_d) in COLUMNS.items():  # columns this benchmark does not know yet
        if name not in cols:
            shape = (len(rows), 2) if two_d else (len(rows),)
            if "crc" in name:
                cols[name] = rng.integers(0, 1 << 32, shape, dtype=np.uint64).astype(dt)
            else:
                cols[name] = np.zeros(shape, dt)
    tensors = [TensorEntry(n, dt, list(shape)) for n, dt, shape in lay.tensors]
    return Metadata(SAVE_ID, block_bytes, tensors, files, {}, cols)


# --------------------------------------------------------------------------- one rank's load


@dataclass(frozen=True)
class Want:
    """One piece a loading rank asks for: a box, or a flat range when ``flat_start >= 0``."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    flat_start: int = -1
    flat_count: int = 0

    @property
    def region(self) -> Region:
        if self.flat_start >= 0:
            return Region.flat(self.flat_start, self.flat_count, len(self.shape))
        return Region.box(self.offsets, self.sizes)

    @property
    def nbytes(self) -> int:
        return self.region.numel * (2 if self.dtype == "bfloat16" else 4)


def load_wants(lay: Layout, new: Parallel, rank: int) -> list[Want]:
    """What rank ``rank`` of the new layout loads: its stage's TP boxes and its DP ranges."""
    if new.tp != lay.par.tp:
        raise ValueError("per-TP-rank optimizer tensors: the load layout must keep TP (reshard PP and DP)")
    t, d, s = new.coords(rank)
    stage = [p for p in lay.params if stage_of(p, lay.layers, new.pp) == s]
    wants = []
    for p in stage:
        offs, sizes = local_box(p, new.tp, t)
        wants.append(Want(p.name, "bfloat16", p.shape, offs, sizes))
    pi, dd, fs, fc = optim_segments(stage, new.tp, new.dp)
    mine = dd == d
    for i, a, n in zip(pi[mine].tolist(), fs[mine].tolist(), fc[mine].tolist()):
        p = stage[i]
        shape = local_box(p, new.tp, t)[1]
        for state in STATES:
            wants.append(Want(optim_name(state, p, t), "float32", shape, (), (), a, n))
    return wants


def plan_ours(md: Metadata, wants: list[Want]) -> tuple[float, dict]:
    """Time ``ReadPlanner(md).plan`` for one rank's requests. Planning only checks a destination's
    length, so each is a zero-stride view of one byte: no memory, and no mapping of gigabytes
    for the kernel to set up and tear down around the timed call."""
    one = np.zeros(1, np.uint8)
    reqs = [Request(w.name, w.region, np.lib.stride_tricks.as_strided(one, (w.nbytes,), (0,))) for w in wants]
    t0 = time.perf_counter()
    ops = ReadPlanner(md).plan(reqs)
    secs = time.perf_counter() - t0
    # the byte runs are expanded batch by batch as the load consumes the plan (DCP, likewise,
    # works out each read item's byte range as it reads): reported apart, not in the goal
    runs = nbytes = 0
    t1 = time.perf_counter()
    for o in ops:
        runs += len(o.src)
        nbytes += int(o.nbytes.sum())
    expand = time.perf_counter() - t1
    return secs, {"requests": len(reqs), "chunks_read": len(ops), "runs": runs, "bytes": nbytes, "expand_s": expand}


# --------------------------------------------------------------------------- DCP


def build_dcp_metadata(lay: Layout, md: Metadata) -> Any:
    """DCP's ``Metadata`` for the same chunks: flat ranges become the boxes they are made of."""
    import torch
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        MetadataIndex,
        StorageMeta,
        TensorProperties,
        TensorStorageMetadata,
    )
    from torch.distributed.checkpoint.metadata import (
        Metadata as DcpMetadata,
    )

    c = md.cols
    dtypes = {"bfloat16": torch.bfloat16, "float32": torch.float32}
    paths = [f"__{f.rank}_0.distcp" for f in md.files]
    sdm: dict[str, Any] = {}
    storage: dict[Any, Any] = {}
    tensor_col = c["tensor"].astype(np.int64)
    bounds = np.searchsorted(tensor_col, np.arange(len(md.tensors) + 1))
    fs_col, fc_col = c["flat_start"].tolist(), c["flat_count"].tolist()
    off_col, len_col, file_col = c["offset"].tolist(), c["length"].tolist(), c["file"].tolist()
    boxo, boxs = c["offsets"].tolist(), c["sizes"].tolist()
    for ti, t in enumerate(md.tensors):
        shape = tuple(t.shape)
        d = len(shape)
        item = 2 if t.dtype == "bfloat16" else 4
        chunks = []
        for row in range(int(bounds[ti]), int(bounds[ti + 1])):
            path = paths[file_col[row]]
            if fs_col[row] >= 0:
                pos = off_col[row]
                for offs, sizes in flat_to_boxes(fs_col[row], fc_col[row], shape):
                    nb = math.prod(sizes) * item
                    storage[MetadataIndex(t.name, offs, len(chunks))] = _StorageInfo(path, pos, nb)
                    chunks.append(ChunkStorageMetadata(torch.Size(offs), torch.Size(sizes)))
                    pos += nb
            else:
                offs, sizes = tuple(boxo[row][:d]), tuple(boxs[row][:d])
                storage[MetadataIndex(t.name, offs, len(chunks))] = _StorageInfo(path, off_col[row], len_col[row])
                chunks.append(ChunkStorageMetadata(torch.Size(offs), torch.Size(sizes)))
        sdm[t.name] = TensorStorageMetadata(TensorProperties(dtype=dtypes[t.dtype]), torch.Size(shape), chunks)
    return DcpMetadata(
        state_dict_metadata=sdm,
        planner_data={t.name: (t.name,) for t in md.tensors},
        storage_data=storage,
        storage_meta=StorageMeta(checkpoint_id="/ckpt", save_id=SAVE_ID),
        version="1.0.0",
    )


class _DcpWant:
    """Stands in for a DTensor in DCP's load planner: its global size and local chunks (what
    DCP asks of a DTensor through ``__create_chunk_list__``)."""

    def __init__(self, size: Any, chunks: list[Any]):
        self._size = size
        self._chunks = chunks

    def size(self) -> Any:
        return self._size

    def __create_chunk_list__(self) -> list[Any]:
        return self._chunks


def plan_dcp(dmd: Any, wants: list[Want]) -> tuple[float, dict]:
    import torch
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

    per: dict[str, list] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    for w in wants:
        shapes[w.name] = w.shape
        boxes = flat_to_boxes(w.flat_start, w.flat_count, w.shape) if w.flat_start >= 0 else [(w.offsets, w.sizes)]
        per.setdefault(w.name, []).extend(ChunkStorageMetadata(torch.Size(o), torch.Size(s)) for o, s in boxes)
    sd = {n: _DcpWant(torch.Size(shapes[n]), ch) for n, ch in per.items()}
    t0 = time.perf_counter()
    planner = DefaultLoadPlanner()
    # set_up_planner minus _init_state_dict (which only materialises meta tensors and would
    # drop these stand-ins): flatten, then the local plan as dcp.load makes it
    planner.original_state_dict = sd
    planner.state_dict, planner.mappings = flatten_state_dict(sd)
    planner.metadata = dmd
    planner.is_coordinator = False
    plan = planner.create_local_plan()
    secs = time.perf_counter() - t0
    # dcp.load then sends this plan to the coordinator and gets it back (gather + scatter)
    raw = pickle.dumps(plan)
    t1 = time.perf_counter()
    pickle.loads(raw)
    unpickle = time.perf_counter() - t1
    info = {"requests": sum(len(v) for v in per.values()), "read_items": len(plan.items)}
    return secs, {**info, "plan_pickle_bytes": len(raw), "plan_unpickle_s": unpickle}


# --------------------------------------------------------------------------- driver


def _timed(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    secs = []
    out = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        secs.append(time.perf_counter() - t0)
    return statistics.median(secs), out


def sample_ranks(new: Parallel) -> list[int]:
    """First, last, and two in the middle of the new layout (middle stages, odd DP ranks)."""
    picks = [0, new.world - 1, new.rank(new.tp // 2, new.dp // 2 + 1, new.pp // 2), new.rank(1, new.dp - 3, 1)]
    return sorted({r for r in picks if 0 <= r < new.world})


def measure_ours(lay: Layout, new: Parallel, repeat: int) -> dict:
    build_s, md = _timed(lambda: build_metadata(lay), 1)  # the benchmark's fixture, not goodput code
    encode_s, raw = _timed(lambda: encode_metadata(md), repeat)
    decode_s, md2 = _timed(lambda: decode_metadata(raw, "bench"), repeat)
    plans = {}
    for r in sample_ranks(new):
        wants = load_wants(lay, new, r)
        secs = []
        for _ in range(repeat):
            s, info = plan_ours(md2, wants)
            secs.append(s)
        plans[r] = {"seconds": statistics.median(secs), **info}
    worst = max(plans, key=lambda r: plans[r]["seconds"])
    return {
        "chunks": md.num_chunks,
        "tensors": len(md.tensors),
        "files": len(md.files),
        "metadata_bytes": len(raw),
        "fixture_build_s": build_s,
        "encode_s": encode_s,
        "decode_validate_s": decode_s,
        "plan_s": plans[worst]["seconds"],
        "load_side_s": decode_s + plans[worst]["seconds"],
        "plan_rank": worst,
        "plans": plans,
        "_md": md,
    }


def measure_commit(lay: Layout, md: Metadata) -> dict:
    """The real rank-0 commit path (``goodput.ckpt.saving.commit.commit``: columns from the gathered chunk
    records, encode, durable write, manifest), then ``Checkpoint(path)`` as every loader opens it."""
    try:
        from goodput.ckpt.loading.reader import Checkpoint
        from goodput.ckpt.saving.commit import commit
        from goodput.ckpt.storage.local import POSIX
    except ImportError as e:  # pragma: no cover - torch missing
        return {"error": str(e)}
    import dataclasses

    from goodput.ckpt.saving.writer import ChunkRecord

    c = md.cols
    names = [t.name for t in md.tensors]
    ndims = [len(t.shape) for t in md.tensors]
    # a save gathers each rank's ChunkRecord fields in order, the region encoded as a list
    fields = [f.name for f in dataclasses.fields(ChunkRecord)]
    lists = {k: c[k].tolist() for k in fields if k in c}
    recs: list[list] = [[] for _ in md.files]
    for row in range(md.num_chunks):
        ti = int(c["tensor"][row])
        d = ndims[ti]
        fs = int(c["flat_start"][row])
        if fs >= 0:
            reg = [[0] * d, [0] * d, fs, int(c["flat_count"][row])]
        else:
            reg = [c["offsets"][row, :d].tolist(), c["sizes"][row, :d].tolist(), -1, 0]
        rec = []
        for k in fields:
            if k == "name":
                rec.append(names[ti])
            elif k == "region":
                rec.append(reg)
            else:
                rec.append(lists[k][row] if k in lists else 0)
        recs[int(c["file"][row])].append(rec)
    # what each rank sends after writing (one data file per writing rank here), as msgpack;
    # rank 0, which commits, decodes all of them (gather_obj); the other ranks decode nothing
    import msgspec

    msgs = []
    for f, r in zip(md.files, recs):
        fentry = [f.name, f.bytes, f.crc_offset, f.crc_count]
        msgs.append(msgspec.msgpack.encode({"rank": f.rank, "error": None, "files": [[fentry, r]]}))
    t0 = time.perf_counter()
    written = [msgspec.msgpack.decode(m) for m in msgs]
    gather_s = time.perf_counter() - t0
    for m in written:  # the one-file-per-rank message of earlier versions, too
        m["file"], m["records"] = m["files"][0]
    meta = {t.name: (t.dtype, list(t.shape), "torch") for t in md.tensors}
    with tempfile.TemporaryDirectory(prefix="goodput-bench-md-") as tmp:
        path = Path(tmp)
        t0 = time.perf_counter()
        try:
            commit(POSIX, path, SAVE_ID, None, lay.par.world, meta, {}, written, md.block_bytes, {})
        except Exception as e:  # noqa: BLE001 - reported, not fatal to the rest of the bench
            return {"error": f"{type(e).__name__}: {e}"}
        commit_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        ck = Checkpoint(path)
        open_s = time.perf_counter() - t0
        same = ck.metadata.num_chunks == md.num_chunks
        size = sum(os.path.getsize(p) for p in path.iterdir())
    return {
        "gather_decode_s": gather_s,
        "gathered_bytes": sum(len(m) for m in msgs),
        "commit_s": commit_s,
        "open_s": open_s,
        "bytes_on_disk": size,
        "same_chunks": same,
    }


def rank_leaves(lay: Layout, rank: int, _cache: dict | None = None) -> list[Declaration]:
    """The tensors rank ``rank`` of the saving job holds: its TP box of every parameter of its
    stage (replicated over DP) and its DP ranges of the optimizer states (norms' states
    replicated over TP)."""
    par = lay.par
    t, d, s = par.coords(rank)
    cache = _cache if _cache is not None else {}
    if s not in cache:
        stage = [p for p in lay.params if stage_of(p, lay.layers, par.pp) == s]
        cache[s] = (stage, optim_segments(stage, par.tp, par.dp))
    stage, (pi, dd, fs, fc) = cache[s]
    out = [Declaration(p.name, "bfloat16", p.shape, Region.box(*local_box(p, par.tp, t))) for p in stage]
    sel = np.flatnonzero(dd == d)
    for state in STATES:
        for i in sel:
            p = stage[int(pi[i])]
            shape = p.shape if p.dim is None else local_box(p, par.tp, t)[1]
            out.append(
                Declaration(optim_name(state, p, t), "float32", shape, Region.flat(int(fs[i]), int(fc[i]), len(shape)))
            )
    return out


def measure_agreement(lay: Layout) -> dict:
    """The save side's planning on rank 0, through the save's own code
    (``goodput.ckpt.saving.agreement``): every rank's declarations as that rank encodes them, decoded
    and agreed on by rank 0 (checks, tiling, the replica-once balanced write plan, each rank's
    orders); and the cached path of a save whose declarations did not change."""
    try:
        import msgspec

        from goodput.ckpt.saving.agreement import agree, agree_values, declare, digest
    except ImportError as e:  # pragma: no cover - torch missing
        return {"error": str(e)}
    world = lay.par.world
    cache: dict = {}
    t0 = time.perf_counter()
    leaves = [rank_leaves(lay, r, cache) for r in range(world)]
    build_s = time.perf_counter() - t0
    values = msgspec.msgpack.encode({"step": 1000})
    t0 = time.perf_counter()
    decl0 = declare(leaves[0])
    dg0 = digest(decl0)
    declare_s = time.perf_counter() - t0
    wire = [msgspec.msgpack.encode({"rank": r, **declare(ls)}) for r, ls in enumerate(leaves)]
    digests = [dg0] + [b"\0" * 16] * (world - 1)
    t0 = time.perf_counter()
    msgs = [msgspec.msgpack.decode(w) for w in wire]  # rank 0's side of gather_obj
    for m in msgs:
        m["values"] = values
    ag = agree(msgs, world, "bench")
    agree_s = time.perf_counter() - t0
    first = [{"rank": r, "digest": digests[r], "cached": b"x", "values": values} for r in range(world)]
    t0 = time.perf_counter()
    hit = [m["digest"] for m in first] == digests and all(m["cached"] == b"x" for m in first)
    agree_values(first, ag.meta)
    cached_s = time.perf_counter() - t0
    per_rank = np.asarray(ag.bytes_per_rank, np.float64)
    stage = np.array([lay.par.coords(r)[2] for r in range(world)])
    in_stage = max(float(x.max() / x.mean()) for x in (per_rank[stage == s] for s in range(lay.par.pp)) if len(x))
    return {
        "declarations": sum(len(ls) for ls in leaves),
        "gathered_bytes": sum(len(w) for w in wire),
        "fixture_build_s": build_s,
        "declare_s": declare_s,
        "agree_s": agree_s,
        "cached_s": cached_s,
        "cache_hit": hit,
        "replica_groups": len(ag.replica_keys),
        "max_over_mean_bytes": float(per_rank.max() / per_rank.mean()),
        "max_over_mean_in_stage": in_stage,
        "planned_bytes": int(per_rank.sum()),
        "layout_bytes": int(lay.length.sum()),  # what the metadata side of this bench saves
    }


def build_dcp_save_plans(lay: Layout) -> list[Any]:
    """Every rank's DCP ``SavePlan`` for the same state: a SHARD write item per box (a flat range
    becomes the boxes it is made of; DCP chunks are boxes), replicas with the same index on every
    holder, which DCP's dedup writes once."""
    import torch
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex, TensorProperties
    from torch.distributed.checkpoint.planner import SavePlan, TensorWriteData, WriteItem, WriteItemType

    props = {"bfloat16": TensorProperties(dtype=torch.bfloat16), "float32": TensorProperties(dtype=torch.float32)}
    cache: dict = {}
    plans = []
    for r in range(lay.par.world):
        items = []
        for lf in rank_leaves(lay, r, cache):
            size = torch.Size(lf.global_shape)
            reg = lf.region
            boxes = (
                flat_to_boxes(reg.flat_start, reg.flat_count, lf.global_shape)
                if reg.is_flat
                else [(reg.offsets, reg.sizes)]
            )
            for offs, sizes in boxes:
                o = torch.Size(offs)
                chunk = ChunkStorageMetadata(offsets=o, sizes=torch.Size(sizes))
                items.append(
                    WriteItem(
                        index=MetadataIndex(lf.name, o),
                        type=WriteItemType.SHARD,
                        tensor_data=TensorWriteData(chunk=chunk, properties=props[lf.dtype], size=size),
                    )
                )
        plans.append(SavePlan(items, planner_data={}))
    return plans


def measure_dcp_save(lay: Layout) -> dict:
    """DCP's save planning on its coordinator for the same state: unpickle every rank's local
    plan (DCP gathers them pickled), then ``DefaultSavePlanner.create_global_plan`` (dedup of
    replicas, global metadata, validation). Compare with goodput's decode + agree."""
    import gc

    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

    build_s, plans = _timed(lambda: build_dcp_save_plans(lay), 1)
    wire = [pickle.dumps(p, protocol=pickle.DEFAULT_PROTOCOL) for p in plans]
    items = sum(len(p.items) for p in plans)
    plans = None
    gc.collect()
    unpickle_s, got = _timed(lambda: [pickle.loads(w) for w in wire], 1)
    plan_s, (global_plan, _) = _timed(lambda: DefaultSavePlanner().create_global_plan(got), 1)
    return {
        "write_items": items,
        "gathered_bytes": sum(len(w) for w in wire),
        "fixture_build_s": build_s,
        "unpickle_s": unpickle_s,
        "global_plan_s": plan_s,
        "coordinator_s": unpickle_s + plan_s,
        "items_written": sum(len(p.items) for p in global_plan),
    }


def measure_dcp(lay: Layout, md: Metadata, new: Parallel, repeat: int) -> dict:
    import gc

    build_s, dmd = _timed(lambda: build_dcp_metadata(lay, md), 1)  # fixture, not DCP code
    pickle_s, raw = _timed(lambda: pickle.dumps(dmd, protocol=pickle.DEFAULT_PROTOCOL), repeat)
    unpickle_s, dmd2 = _timed(lambda: pickle.loads(raw), repeat)
    dmd = None  # only the unpickled copy is used from here
    gc.collect()
    plans = {}
    for r in sample_ranks(new):
        wants = load_wants(lay, new, r)
        secs = []
        for _ in range(repeat):
            s, info = plan_dcp(dmd2, wants)
            secs.append(s)
        plans[r] = {"seconds": statistics.median(secs), **info}
    worst = max(plans, key=lambda r: plans[r]["seconds"])
    world = lay.par.world
    per_plan_bytes = statistics.mean(p["plan_pickle_bytes"] for p in plans.values())
    per_plan_s = statistics.mean(p["plan_unpickle_s"] for p in plans.values())
    return {
        "chunks": sum(len(v.chunks) for v in dmd2.state_dict_metadata.values()),
        "load_side_s": unpickle_s + plans[worst]["seconds"],
        "coordinator_plans_bytes_est": per_plan_bytes * world,
        "coordinator_unpickle_s_est": per_plan_s * world,
        "metadata_bytes": len(raw),
        "fixture_build_s": build_s,
        "pickle_s": pickle_s,
        "unpickle_s": unpickle_s,
        "plan_s": plans[worst]["seconds"],
        "plan_rank": worst,
        "plans": plans,
    }


def _strip(d: dict) -> dict:
    return {k: v for k, v in d.items() if not k.startswith("_")}


def parse_layout(text: str | None, ranks: int, src: Parallel) -> Parallel:
    if not text:
        return parallel_for(ranks, max(1, src.pp // 2), src.tp)
    import re

    m = re.fullmatch(r"tp(\d+)pp(\d+)", text.strip().lower())
    if not m:
        raise ValueError(f"--load-layout {text!r}: expected e.g. tp8pp8")
    tp, pp = int(m.group(1)), int(m.group(2))
    if ranks % (tp * pp):
        raise ValueError(f"--load-layout {text}: {ranks} ranks are not a multiple of TP*PP = {tp * pp}")
    return Parallel(tp, pp, ranks // (tp * pp))


def run(
    ranks: int,
    ntensors: int,
    *,
    dcp_ranks: int | None = None,
    load_layout: str | None = None,
    repeat: int = 3,
    commit: bool = True,
    save_plan: bool = True,
    on_step: Callable[[str], None] | None = None,
) -> dict:
    step = on_step or (lambda s: None)
    if dcp_ranks is None:
        dcp_ranks = ranks  # 0: no DCP
    out: dict[str, Any] = {"config": {"ranks": ranks, "tensors": ntensors, "dcp_ranks": dcp_ranks, "repeat": repeat}}
    scales = [ranks] + ([dcp_ranks] if dcp_ranks and dcp_ranks != ranks else [])
    results: dict[int, dict] = {}
    for n in scales:
        step(f"layout at {n} ranks")
        lay = saved_layout(n, ntensors)
        new = parse_layout(load_layout, n, lay.par)
        step(f"goodput metadata and plan at {n} ranks")
        ours = measure_ours(lay, new, repeat)
        res: dict[str, Any] = {
            "save_layout": lay.par.describe(),
            "load_layout": new.describe(),
            "params": len(lay.params),
            "layers": lay.layers,
            "model_params_billion": sum(p.numel for p in lay.params) / 1e9,
            "ours": _strip(ours),
        }
        if commit and n == ranks:
            step(f"goodput commit path at {n} ranks")
            res["ours_commit"] = measure_commit(lay, ours["_md"])
            step(f"goodput save agreement at {n} ranks")
            res["ours_agree"] = measure_agreement(lay)
        if dcp_ranks and n == dcp_ranks:
            step(f"DCP metadata and plan at {n} ranks")
            dcp = measure_dcp(lay, ours["_md"], new, repeat)
            res["dcp"] = dcp
            if save_plan:
                if "ours_agree" not in res:
                    step(f"goodput save agreement at {n} ranks")
                    res["ours_agree"] = measure_agreement(lay)
                step(f"DCP save planning at {n} ranks")
                res["dcp_save"] = measure_dcp_save(lay)
            o = res["ours"]
            res["ratios"] = {
                **(
                    {"save_plan": res["dcp_save"]["coordinator_s"] / res["ours_agree"]["agree_s"]}
                    if "dcp_save" in res and "agree_s" in res.get("ours_agree", {})
                    else {}
                ),
                "metadata_bytes": dcp["metadata_bytes"] / o["metadata_bytes"],
                "write_metadata": dcp["pickle_s"] / o["encode_s"],
                "read_metadata": dcp["unpickle_s"] / o["decode_validate_s"],
                "plan": dcp["plan_s"] / o["plan_s"],
                "load_side": dcp["load_side_s"] / o["load_side_s"],
            }
        results[n] = res
    out["scales"] = {str(k): v for k, v in results.items()}
    full = results[ranks]
    ours = full["ours"]
    commit_res = full.get("ours_commit") or {}
    goals = []
    if "commit_s" in commit_res:
        goals.append(
            _goal(
                f"rank-0 commit: metadata built from records, encoded, written < {GOAL_SECONDS:g} s @ {ranks}",
                commit_res["commit_s"],
            )
        )
    else:
        goals.append(_goal(f"encode metadata < {GOAL_SECONDS:g} s @ {ranks}", ours["encode_s"]))
    agree_res = full.get("ours_agree") or {}
    if "agree_s" in agree_res:
        goals.append(
            _goal(
                f"rank-0 save agreement (checks, tiling, write plan, orders), first save < {GOAL_SECONDS:g} s @ {ranks}",
                agree_res["agree_s"],
            )
        )
    goals.append(_goal(f"decode + validate metadata < {GOAL_SECONDS:g} s @ {ranks}", ours["decode_validate_s"]))
    goals.append(_goal(f"plan one rank's resharded load < {GOAL_SECONDS:g} s @ {ranks}", ours["plan_s"]))
    if dcp_ranks:
        r = results[dcp_ranks]["ratios"]
        for key, what in (
            ("save_plan", "rank 0's save planning (DCP: unpickle plans + create_global_plan)"),
            ("write_metadata", "serialise metadata"),
            ("read_metadata", "read metadata"),
            ("plan", "plan one rank's load"),
            ("load_side", "read metadata + plan, per loading rank"),
        ):
            if key not in r:
                continue
            goals.append(
                {
                    "goal": f"{what}: DCP/goodput ≥ {GOAL_RATIO:g}× @ {dcp_ranks}",
                    "value": r[key],
                    "pass": r[key] >= GOAL_RATIO,
                    "ratio": True,
                }
            )
    out["goals"] = goals
    out["pass"] = all(g["pass"] for g in goals)
    return out


def _goal(text: str, secs: float) -> dict:
    return {"goal": text, "value": secs, "pass": secs < GOAL_SECONDS}


def render(res: dict, console: Any) -> None:
    from rich.table import Table

    cfg = res["config"]
    scales = res["scales"]
    full = scales[str(cfg["ranks"])]
    console.print(
        f"[bold]goodput bench ckpt-metadata[/bold]: {cfg['tensors']} parameter tensors "
        f"({full['layers']} layers, {full['model_params_billion']:.0f}B params), saved as {full['save_layout']}, "
        f"loaded as {full['load_layout']}; median of {cfg['repeat']}; plan = slowest of ranks {sorted(int(r) for r in full['ours']['plans'])}"
    )
    t = Table(title="checkpoint metadata and load planning")
    t.add_column("step")
    cols = []
    for n, sc in scales.items():
        t.add_column(f"goodput @ {n} ranks", justify="right")
        cols.append(("ours", n))
        if "dcp" in sc:
            t.add_column(f"DCP @ {n} ranks", justify="right")
            t.add_column(f"DCP/goodput @ {n}", justify="right")
            cols.append(("dcp", n))
            cols.append(("ratio", n))

    def cell(kind: str, n: str, key_ours: str, key_dcp: str, ratio_key: str | None, fmt: Callable[[float], str]) -> str:
        sc = scales[n]
        if kind == "ours":
            v = sc["ours"].get(key_ours)
            return fmt(v) if v is not None else ""
        if kind == "dcp":
            v = sc["dcp"].get(key_dcp)
            return fmt(v) if v is not None else ""
        return f"{sc['ratios'][ratio_key]:.1f}×" if ratio_key else ""

    def secs(v: float) -> str:
        return f"{v * 1e3:.2f} ms" if v < 0.01 else f"{v:.3f} s"

    def count(v: float) -> str:
        return f"{int(v):,}"

    rows = [
        ("chunks in metadata (DCP: flat ranges as boxes)", "chunks", "chunks", None, count),
        ("metadata size", "metadata_bytes", "metadata_bytes", "metadata_bytes", fmt_bytes),
        ("serialise (encode_metadata | pickle.dumps)", "encode_s", "pickle_s", "write_metadata", secs),
        ("read (decode + validate | pickle.loads)", "decode_validate_s", "unpickle_s", "read_metadata", secs),
        ("plan one rank's resharded load (slowest sampled)", "plan_s", "plan_s", "plan", secs),
        ("per loading rank: read + plan", "load_side_s", "load_side_s", "load_side", secs),
        ("fixture: build the metadata object (bench code)", "fixture_build_s", "fixture_build_s", None, secs),
    ]
    for label, ko, kd, kr, fmt in rows:
        t.add_row(label, *[cell(kind, n, ko, kd, kr, fmt) for kind, n in cols])
    console.print(t)

    def commit_line(c: dict) -> str:
        return (
            f"goodput @ {cfg['ranks']} ranks through its own save/load code: msgpack decode of every rank's chunk "
            f"records ({fmt_bytes(c['gathered_bytes'])}, decoded by rank 0 only, after gather_obj) "
            f"{c['gather_decode_s']:.3f} s; rank-0 commit (commit.commit: columns from the records, encode, "
            f"durable write, manifest) {c['commit_s']:.3f} s; Checkpoint(path) (manifest, metadata, decode, "
            f"validate) {c['open_s']:.3f} s; {fmt_bytes(c['bytes_on_disk'])} on disk"
        )

    def agree_line(ag: dict) -> str:
        return (
            f"goodput save agreement @ {cfg['ranks']} ranks through agreement.agree: "
            f"{ag['declarations']:,} declarations ({fmt_bytes(ag['gathered_bytes'])} gathered), "
            f"{ag['replica_groups']:,} replica groups; one rank's declare + digest {ag['declare_s'] * 1e3:.2f} ms; "
            f"rank 0's decode + agree on a first save {ag['agree_s']:.3f} s; the largest rank writes "
            f"{ag['max_over_mean_bytes']:.3f} × the mean (stages hold unequal bytes: the embedding, lm_head), and "
            f"{ag['max_over_mean_in_stage']:.3f} × its pipeline stage's mean (the ranks that share its replicas); "
            f"a save with unchanged declarations (plan cache hit: digests compared, values checked) "
            f"{ag['cached_s'] * 1e3:.2f} ms and gathers 16 bytes a rank"
        )

    for key, what, line in (("ours_commit", "commit path", commit_line), ("ours_agree", "save agreement", agree_line)):
        part = full.get(key)
        if part:
            console.print(f"goodput {what}: not measured ({part['error']})" if "error" in part else line(part))
    for n, sc in scales.items():
        o = sc.get("ours", {})
        if o.get("plans"):
            p = o["plans"][o["plan_rank"]]
            console.print(
                f"goodput @ {n} ranks: the slowest sampled rank's plan meets {p['chunks_read']:,} saved chunks in "
                f"{p['runs']:,} byte runs, expanded as the load consumes them in {p['expand_s'] * 1e3:.2f} ms more "
                "(not in the table: DCP's planner stops at read items too)"
            )
        if "dcp" in sc:
            d = sc["dcp"]
            console.print(
                f"DCP @ {n} ranks, not in the table: dcp.load also gathers every rank's load plan on the coordinator "
                f"and scatters it back; unpickling them there would take ≈ {d['coordinator_unpickle_s_est']:.2f} s for "
                f"≈ {fmt_bytes(d['coordinator_plans_bytes_est'])} (the sampled ranks' plans × {n}, an estimate). "
                "goodput's load has no collective."
            )
    g = Table(title="goals")
    g.add_column("goal")
    g.add_column("measured", justify="right")
    g.add_column("result", justify="center")
    for x in res["goals"]:
        v = (
            f"{x['value']:.1f}×"
            if x.get("ratio")
            else (f"{x['value'] * 1e3:.2f} ms" if x["value"] < 0.01 else f"{x['value']:.3f} s")
        )
        g.add_row(x["goal"], v, "[green]PASS[/green]" if x["pass"] else "[red]MISS[/red]")
    console.print(g)
