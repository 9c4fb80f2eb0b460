"""Every layout change on real gloo process groups (2-4 processes), compared bitwise."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import goodput.ckpt as gc
from tests.distributed import run_ranks


def full(name: str, shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The same global tensor in every process (seeded by name)."""
    g = torch.Generator().manual_seed(sum(map(ord, name)))
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(-(2**40), 2**40, shape, generator=g, dtype=dtype)


SPECS = {
    # name: (shape, dtype)
    "w_rows": ((10, 7), torch.float32),
    "w_cols": ((9, 6), torch.bfloat16),
    "w_rep": ((5, 3), torch.int64),
    "w_2d": ((8, 6), torch.float32),
    "w_2d_rep": ((6, 10), torch.bfloat16),
}


def _save_dtensors(rank: int, world: int, path: str) -> dict:
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor, init_device_mesh

    mesh = init_device_mesh("cpu", (world,))
    mesh2 = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    place = {
        "w_rows": (mesh, [Shard(0)]),
        "w_cols": (mesh, [Shard(1)]),
        "w_rep": (mesh, [Replicate()]),
        "w_2d": (mesh2, [Shard(0), Shard(1)]),
        "w_2d_rep": (mesh2, [Replicate(), Shard(1)]),  # TP-sharded, replicated over DP
    }
    state = {"model": {n: distribute_tensor(full(n, *SPECS[n]), m, p) for n, (m, p) in place.items()}, "step": 11}
    r = gc.save(state, path, step=11)
    return {"bytes": r.bytes_per_rank, "total": r.total_bytes}


def _load_dtensors_3(rank: int, world: int, path: str) -> bool:
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor, init_device_mesh

    mesh = init_device_mesh("cpu", (world,))
    place = {
        "w_rows": [Shard(1)],
        "w_cols": [Shard(0)],
        "w_rep": [Shard(0)],
        "w_2d": [Shard(1)],
        "w_2d_rep": [Replicate()],
    }
    state = {
        "model": {n: distribute_tensor(torch.zeros(SPECS[n][0], dtype=SPECS[n][1]), mesh, p) for n, p in place.items()},
        "step": 0,
    }
    res = gc.load(state, path)
    assert state["step"] == 11 and res.step == 11
    for n, p in place.items():
        want = distribute_tensor(full(n, *SPECS[n]), mesh, p).to_local()
        got = state["model"][n].to_local()
        assert torch.equal(got, want), f"{n} differs on rank {rank}"
    return True


def test_dtensor_4_ranks_to_3_ranks_and_to_one(tmp_path: Path) -> None:
    path = str(tmp_path / "ck")
    out = run_ranks(_save_dtensors, 4, path)
    assert gc.latest(tmp_path) == Path(path)
    # replicas written once: total bytes equal the tensors' bytes
    assert out[0]["total"] == sum(full(n, *SPECS[n]).numel() * full(n, *SPECS[n]).element_size() for n in SPECS)
    assert run_ranks(_load_dtensors_3, 3, path) == [True] * 3
    # 4 ranks -> 1 process, no process group: whole tensors
    state = {"model": {n: torch.zeros(s, dtype=d) for n, (s, d) in SPECS.items()}, "step": 0}
    gc.load(state, path)
    for n, (s, d) in SPECS.items():
        assert torch.equal(state["model"][n], full(n, s, d)), n
    gc.verify(path)
    ck = gc.open(path)
    assert ck.tensors["model.w_rows"].shape == (10, 7)
    np.testing.assert_array_equal(ck.read("model.w_rows", np.s_[2:9, 1:5]), full("w_rows", (10, 7))[2:9, 1:5].numpy())


def _save_uneven_3(rank: int, world: int, path: str) -> None:
    from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh

    mesh = init_device_mesh("cpu", (world,))
    gc.save({"t": distribute_tensor(full("t", (7, 5)), mesh, [Shard(0)])}, path)


def test_three_ranks_uneven_to_one_whole(tmp_path: Path) -> None:
    run_ranks(_save_uneven_3, 3, str(tmp_path))
    ck = gc.open(tmp_path)
    sizes = sorted(c.region.sizes[0] for c in ck.tensors["t"].chunks)
    assert sizes == [1, 3, 3]  # torch.chunk semantics: uneven
    state = {"t": torch.zeros(7, 5)}
    gc.load(state, tmp_path)
    assert torch.equal(state["t"], full("t", (7, 5)))


# ---------------------------------------------------------------- Megatron TP + ZeRO flat shards
G = (8, 12)


def _flat_ranges(n: int, parts: int) -> list[tuple[int, int]]:
    edges = [0, 13, 40, 41, n] if parts == 4 else [round(n * i / parts) for i in range(parts + 1)]
    return list(zip(edges, edges[1:]))


def _save_megatron(rank: int, world: int, path: str) -> dict:
    tp, dp = rank % 2, rank // 2  # 2-way TP x 2-way DP
    w = full("w", G)
    cols = G[1] // 2
    a, b = _flat_ranges(G[0] * G[1], 4)[rank]
    state = {
        # TP shard: a column block, identical on both DP replicas -> written once
        "w": gc.LocalShard(w[:, tp * cols : (tp + 1) * cols].clone(), G, (0, tp * cols)),
        # ZeRO: each rank owns a flat range of the optimizer state (uneven on purpose)
        "exp_avg": gc.FlatShard(full("m", G).reshape(-1)[a:b].clone(), G, a),
        "dp": dp,
    }
    state.pop("dp")
    r = gc.save(state, path)
    return {"bytes": r.bytes_per_rank, "total": r.total_bytes}


def test_local_and_flat_shards_reshard(tmp_path: Path) -> None:
    out = run_ranks(_save_megatron, 4, str(tmp_path))
    assert out[0]["total"] == 2 * G[0] * G[1] * 4  # w once + exp_avg once
    w, m = full("w", G), full("m", G)
    # ZeRO over 3 ranks instead of 4 (flat ranges), TP 3 over rows, and whole
    for a, b in _flat_ranges(G[0] * G[1], 3):
        st = {"exp_avg": gc.FlatShard(torch.zeros(b - a), G, a)}
        gc.load(st, tmp_path)
        assert torch.equal(st["exp_avg"].tensor, m.reshape(-1)[a:b])
    for r0, r1 in [(0, 3), (3, 6), (6, 8)]:
        st = {
            "w": gc.LocalShard(torch.zeros(r1 - r0, G[1]), G, (r0, 0)),
            "exp_avg": gc.LocalShard(torch.zeros(r1 - r0, 5), G, (r0, 7)),
        }
        gc.load(st, tmp_path)
        assert torch.equal(st["w"].tensor, w[r0:r1])
        assert torch.equal(st["exp_avg"].tensor, m[r0:r1, 7:])
    whole = {"w": torch.zeros(G), "exp_avg": torch.zeros(G)}
    gc.load(whole, tmp_path)
    assert torch.equal(whole["w"], w) and torch.equal(whole["exp_avg"], m)


def _load_megatron_on_3(rank: int, world: int, path: str) -> bool:
    """3 ranks, each loading its part in a new layout at once: ZeRO over 3 (flat ranges), TP 3
    over rows for w, and an uneven column block of exp_avg as a box."""
    a, b = _flat_ranges(G[0] * G[1], 3)[rank]
    r0, r1 = [(0, 3), (3, 6), (6, 8)][rank]
    st = {
        "exp_avg": gc.FlatShard(torch.zeros(b - a), G, a),
        "w": gc.LocalShard(torch.zeros(r1 - r0, G[1]), G, (r0, 0)),
    }
    box = {"exp_avg": gc.LocalShard(torch.zeros(r1 - r0, 5), G, (r0, 7))}
    gc.load(st, path)
    gc.load(box, path)
    w, m = full("w", G), full("m", G)
    return (
        torch.equal(st["exp_avg"].tensor, m.reshape(-1)[a:b])
        and torch.equal(st["w"].tensor, w[r0:r1])
        and torch.equal(box["exp_avg"].tensor, m[r0:r1, 7:])
    )


def test_local_and_flat_shards_reshard_on_3_ranks(tmp_path: Path) -> None:
    """The same layout changes as above, loaded by 3 real ranks at once (4 saved them)."""
    run_ranks(_save_megatron, 4, str(tmp_path))
    assert run_ranks(_load_megatron_on_3, 3, str(tmp_path)) == [True, True, True]


# ---------------------------------------------------------------- replicas: written once, balanced
DDP = {"emb": (4096, 512), "l0": (512, 512), "l1": (512, 512), "l2": (512, 512), "l3": (512, 512), "b": (512,), "s": ()}


def _save_ddp(rank: int, world: int, path: str) -> list[int]:
    state = {k: full(k, s) for k, s in DDP.items()}
    return gc.save(state, path).bytes_per_rank


def test_replicas_written_once_and_balanced(tmp_path: Path) -> None:
    per_rank = run_ranks(_save_ddp, 4, str(tmp_path))[0]
    total = sum(int(np.prod(s)) * 4 for s in DDP.values())
    assert sum(per_rank) == total
    assert max(per_rank) <= 1.1 * total / 4, per_rank
    ck = gc.open(tmp_path)
    assert sum(ck.bytes_per_rank().values()) == total
    for k, s in DDP.items():
        np.testing.assert_array_equal(ck.read(k), full(k, s).numpy())


# ---------------------------------------------------------------- errors reach every rank
def _save_mismatch(rank: int, world: int, path: str) -> str:
    return _save_error({"ok": torch.ones(3), "w": torch.full((4,), float(rank == 1))}, path)


def _save_error(state: dict, path: str) -> str:
    """The SaveError this rank saw, as text ("no error" if the save went through)."""
    try:
        gc.save(state, path)
    except gc.SaveError as e:
        return str(e)
    return "no error"


def _save_bad_type_on_one_rank(rank: int, world: int, path: str) -> str:
    return _save_error({"w": torch.ones(3), "x": object() if rank == 1 else 1}, path)


def test_replicas_that_differ_fail_on_every_rank(tmp_path: Path) -> None:
    msgs = run_ranks(_save_mismatch, 3, str(tmp_path))
    for m in msgs:
        assert "'w'" in m and "differ" in m and "ranks [0, 2] vs ranks [1]" in m
    assert not (tmp_path / "MANIFEST.json").exists()
    assert gc.latest(tmp_path) is None


def test_an_error_on_one_rank_fails_all_without_hanging(tmp_path: Path) -> None:
    msgs = run_ranks(_save_bad_type_on_one_rank, 2, str(tmp_path))
    for m in msgs:
        assert "rank 1" in m and "'x'" in m and "object" in m
    assert gc.latest(tmp_path) is None


def _save_with_rank1_write_failing(rank: int, world: int, path: str) -> str:
    import resource
    import signal

    if rank == 1:  # its data file may not grow past 4 KiB: the write fails with EFBIG
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    t = torch.arange(4 * 8192, dtype=torch.float32).reshape(4, 8192)
    return _save_error({"w": gc.LocalShard(t[rank * 2 : rank * 2 + 2].clone(), (4, 8192), (rank * 2, 0))}, path)


def test_a_write_error_on_one_rank_fails_all_and_leaves_no_files(tmp_path: Path) -> None:
    """Only rank 0 receives the ranks' write reports; every rank still hears the verdict, and
    the ranks that wrote fine remove their files."""
    msgs = run_ranks(_save_with_rank1_write_failing, 2, str(tmp_path))
    for m in msgs:
        assert "failed while writing; nothing was committed" in m and "rank 1" in m, m
    assert gc.latest(tmp_path) is None
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(("data-", "metadata-", "MANIFEST"))]


# ---------------------------------------------------------------- read only the bytes needed
def _save_rows(rank: int, world: int, path: str) -> None:
    t = full("big", (256, 4096))
    rows = 256 // world
    gc.save({"big": gc.LocalShard(t[rank * rows : (rank + 1) * rows].clone(), (256, 4096), (rank * rows, 0))}, path)


@pytest.mark.parametrize("verify", [False, True])
def test_resharded_load_reads_only_needed_bytes(tmp_path: Path, verify: bool) -> None:
    run_ranks(_save_rows, 4, str(tmp_path))
    t = full("big", (256, 4096))
    edges = [0, 1365, 2730, 4096]  # 3 column shards: runs of ~5.4 KiB per row
    for a, b in zip(edges, edges[1:]):
        st = {"big": gc.LocalShard(torch.zeros(256, b - a), (256, 4096), (0, a))}
        stats = gc.load(st, tmp_path, verify=verify).stats
        assert torch.equal(st["big"].tensor, t[:, a:b])
        assert stats.bytes_needed == 256 * (b - a) * 4
        if not verify:
            assert stats.bytes_read <= 1.1 * stats.bytes_needed
        else:
            # verification reads whole 4 KiB checksum blocks: runs that do not start and end on
            # block boundaries cost at most one partial block each side (up to 2 x for a 4 KiB
            # run; the 1.1 x holds for verify=False, or for block-aligned runs, below)
            runs = 256
            assert stats.bytes_read <= stats.bytes_needed + runs * 2 * 4096
            assert stats.verified_blocks > 0
    if verify:  # column shards on 4 KiB boundaries (1024 fp32): verified, and within 1.1 x
        for a, b in [(0, 1024), (1024, 3072), (3072, 4096)]:
            st = {"big": gc.LocalShard(torch.zeros(256, b - a), (256, 4096), (0, a))}
            stats = gc.load(st, tmp_path).stats
            assert torch.equal(st["big"].tensor, t[:, a:b])
            assert stats.bytes_read <= 1.1 * stats.bytes_needed and stats.verified_blocks > 0


def _rank0_saves_alone(rank: int, world: int, path: str) -> bool:
    if rank == 0:  # the other rank never joins: no_dist must not wait for it
        gc.save({"w": torch.ones(4)}, path, no_dist=True)
        t = {"w": torch.zeros(4)}
        gc.load(t, path, no_dist=True)
        return bool(torch.equal(t["w"], torch.ones(4)))
    return True


def test_no_dist_saves_from_one_rank_inside_a_group(tmp_path: Path) -> None:
    assert run_ranks(_rank0_saves_alone, 2, str(tmp_path)) == [True, True]


# ---------------------------------------------------------------- a save on a sub-group
def _save_on_subgroup(rank: int, world: int, path: str) -> dict:
    """Global ranks 1 and 2 save as a group of their own (group rank 0 is global rank 1): the
    declarations, the write orders and the verdict go to and from the group's rank 0."""
    import torch.distributed as dist

    group = dist.new_group([1, 2])
    if rank == 0:
        return {}
    g = dist.get_rank(group)
    t = torch.arange(8 * 512, dtype=torch.float32).reshape(8, 512)
    state = {"w": gc.LocalShard(t[g * 4 : g * 4 + 4].clone(), (8, 512), (g * 4, 0)), "b": torch.ones(4096) * 3}
    r = gc.save(state, path, process_group=group, step=5)
    bad = {"b": torch.ones(4096) * (3 + g)}  # replicas that differ: refused on both ranks
    try:
        gc.save(bad, path + "-bad", process_group=group)
        mismatch = "no error"
    except gc.SaveError as e:
        mismatch = str(e)
    return {"bytes": r.bytes_per_rank, "mismatch": mismatch}


def test_a_save_on_a_sub_group(tmp_path: Path) -> None:
    out = run_ranks(_save_on_subgroup, 3, str(tmp_path / "ck"))
    assert out[1]["bytes"] == out[2]["bytes"] and sum(out[1]["bytes"]) == 8 * 512 * 4 + 4096 * 4
    for r in (1, 2):
        assert "replicas of 'b'" in out[r]["mismatch"] and "differ" in out[r]["mismatch"], out[r]
        assert "(ranks [0] vs ranks [1])" in out[r]["mismatch"]
        assert "its ranks 0, 1, ... are global ranks [1, 2]" in out[r]["mismatch"]  # which processes those are
    ck = gc.open(tmp_path / "ck")
    assert ck.step == 5
    np.testing.assert_array_equal(ck.read("w"), np.arange(8 * 512, dtype=np.float32).reshape(8, 512))
    np.testing.assert_array_equal(ck.read("b"), np.full(4096, 3, np.float32))


# ---------------------------------------------------------------- FSDP2 x TP: _StridedShard
STRIDED = {"wq": (16, 6), "wk": (8, 10)}  # DTensor distributes strided shards evenly only


def _strided(mesh2):
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    # FSDP2 over TP: dim 0 sharded by TP first, then by DP (right to left), as torchtitan does
    return [_StridedShard(0, split_factor=2), Shard(0)]


def _save_strided(rank: int, world: int, path: str) -> list:
    from torch.distributed.tensor import distribute_tensor, init_device_mesh

    mesh2 = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    state = {n: distribute_tensor(full(n, s), mesh2, _strided(mesh2)) for n, s in STRIDED.items()}
    gc.save(state, path)
    # the box each rank declared must be what DTensor holds locally
    return [tuple(state[n].to_local().shape) for n in STRIDED]


def _load_strided(rank: int, world: int, path: str) -> bool:
    from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh

    mesh2 = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    mesh = init_device_mesh("cpu", (world,))
    ok = True
    for n, s in STRIDED.items():
        for m, p in ((mesh2, _strided(mesh2)), (mesh, [Shard(1)])):
            t = distribute_tensor(torch.zeros(s), m, p)
            gc.load({n: t}, path)
            ok &= torch.equal(t.to_local(), distribute_tensor(full(n, s), m, p).to_local())
    return ok


def _strided_apart(rank: int, world: int, path: str) -> str:
    from torch.distributed.tensor import distribute_tensor, init_device_mesh
    from torch.distributed.tensor.placement_types import _StridedShard

    mesh = init_device_mesh("cpu", (world,))
    t = distribute_tensor(full("x", (8, 2)), mesh, [_StridedShard(0, split_factor=2)])
    try:
        gc.save({"x": t}, path)
    except gc.CheckpointError as e:
        return str(e)
    return "saved"


def test_fsdp2_over_tp_strided_shards_save_and_reshard(tmp_path: Path) -> None:
    """``[_StridedShard(0, sf=2), Shard(0)]`` on a 2 x 2 (dp, tp) mesh: saved,
    loaded back into the same placements and into Shard(1) on 4 ranks, and whole in one process."""
    shapes = run_ranks(_save_strided, 4, str(tmp_path))
    assert sum(sh[0][0] for sh in shapes) == 16 and sum(sh[1][0] for sh in shapes) == 8
    assert run_ranks(_load_strided, 4, str(tmp_path)) == [True] * 4
    whole = {n: torch.zeros(s) for n, s in STRIDED.items()}
    gc.load(whole, tmp_path)
    for n, s in STRIDED.items():
        assert torch.equal(whole[n], full(n, s)), n


def test_strided_layout_with_separate_ranges_is_refused_by_name(tmp_path: Path) -> None:
    msgs = run_ranks(_strided_apart, 2, str(tmp_path))
    for m in msgs:
        assert "'x'" in m and "separate ranges of dimension 0" in m, m
