"""Turns a state dict into named leaves (tensors with their global layout, and JSON values).

Names are dotted paths, as DCP names them (``model.layers.0.weight``, ``optim.state.0.exp_avg``).
Dicts are walked; lists and tuples are walked when they hold tensors and are JSON leaves when they
do not (``param_groups``). What a tensor *is* globally comes from its type: a DTensor knows its
mesh and placements; :class:`LocalShard` and :class:`FlatShard` declare a box or a flat range of a
global tensor (Megatron TP/PP, ZeRO/FSDP1 optimizer state); anything else is a replica.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .format.dtypes import DTYPES, from_numpy
from .format.geometry import Region


@dataclass
class LocalShard:
    """``tensor`` is the box at ``offsets`` of a global tensor of ``global_shape``."""

    tensor: torch.Tensor
    global_shape: tuple[int, ...]
    offsets: tuple[int, ...]

    def __post_init__(self) -> None:
        self.global_shape = tuple(int(s) for s in self.global_shape)
        self.offsets = tuple(int(o) for o in self.offsets)
        shape = tuple(self.tensor.shape)
        if len(shape) != len(self.global_shape) or len(self.offsets) != len(shape):
            raise ValueError(
                f"LocalShard: shard {shape}, global {self.global_shape}, offsets {self.offsets} differ in rank"
            )
        for o, s, g in zip(self.offsets, shape, self.global_shape):
            if o < 0 or o + s > g:
                raise ValueError(
                    f"LocalShard: box offsets {self.offsets} size {shape} leaves global shape {self.global_shape}"
                )


@dataclass
class FlatShard:
    """``tensor`` (1-D) holds elements ``[start, start + numel)`` of a global tensor flattened."""

    tensor: torch.Tensor
    global_shape: tuple[int, ...]
    start: int

    def __post_init__(self) -> None:
        self.global_shape = tuple(int(s) for s in self.global_shape)
        n = int(np.prod(self.global_shape, dtype=np.int64))
        if self.tensor.dim() != 1:
            raise ValueError(f"FlatShard: tensor must be 1-D, got shape {tuple(self.tensor.shape)}")
        if self.start < 0 or self.start + self.tensor.numel() > n:
            raise ValueError(
                f"FlatShard: range [{self.start}, {self.start + self.tensor.numel()}) leaves a tensor of {n} elements"
            )


@dataclass
class TensorLeaf:
    name: str
    dtype: str
    global_shape: tuple[int, ...]
    region: Region  # this rank's part, in global coordinates
    local: torch.Tensor | np.ndarray  # the data of ``region``, laid out as the region
    kind: str  # "torch" | "numpy" | "bytes" (an io.BytesIO)
    declared: bool  # True for DTensor/LocalShard/FlatShard; False for a plain replica
    parent: Any = None
    key: Any = None
    holder: Any = None  # the LocalShard/FlatShard/DTensor object, if any
    part: int = 0  # which of this rank's shards of the tensor (a ShardedTensor or LocalShardsWrapper can hold several)

    @property
    def ident(self) -> tuple[str, int]:
        """The leaf among this rank's leaves: its name alone is shared by the shards of one tensor."""
        return (self.name, self.part)


@dataclass
class ValueLeaf:
    name: str
    value: Any
    parent: Any
    key: Any


def torch_dtype_name(dt: torch.dtype, name: str) -> str:
    s = str(dt).removeprefix("torch.")
    if s not in DTYPES:
        raise TypeError(f"{name!r}: dtype {dt} cannot be checkpointed")
    return s


def _contains_array(v: Any) -> bool:
    if isinstance(v, (torch.Tensor, np.ndarray, LocalShard, FlatShard, io.BytesIO)) or _is_sharded_tensor(v):
        return True
    if isinstance(v, dict):
        return any(_contains_array(x) for x in v.values())
    if isinstance(v, (list, tuple)):
        return any(_contains_array(x) for x in v)
    return False


def is_stateful(v: Any) -> bool:
    """DCP's ``Stateful`` protocol: an object saved through its ``state_dict()`` and restored by
    ``load_state_dict()`` (a module, an optimizer, the tutorial's ``AppState``, any user object)."""
    return (
        not isinstance(v, (dict, list, tuple, torch.Tensor, np.ndarray))
        and callable(getattr(v, "state_dict", None))
        and callable(getattr(v, "load_state_dict", None))
    )


@dataclass
class Stateful:
    """A top-level Stateful value of a state dict, and the dict it gave (which a load fills)."""

    key: Any
    obj: Any
    state: dict


def expand_stateful(state: Any) -> tuple[Any, list[Stateful]]:
    """``state`` with each top-level Stateful value replaced by its ``state_dict()``, as DCP does
    (only top-level values, as DCP: a Stateful deeper in is an ordinary value). A load fills the
    dicts and then hands each to its object's ``load_state_dict``."""
    if not isinstance(state, dict) or not any(is_stateful(v) for v in state.values()):
        return state, []
    out = dict(state)
    found = []
    # in sorted key order, as DCP: a state_dict() or load_state_dict() that runs collectives
    # (FSDP's do) then runs them in the same order on every rank, whatever each dict's order
    for k, v in sorted(state.items(), key=lambda kv: str(kv[0])):
        if is_stateful(v):
            try:
                sd = v.state_dict()
            except Exception as e:
                # the caller's own exception, as raised (a loop may catch its type), named: a save
                # holds many objects, and the traceback alone does not say which one failed
                e.add_note(f"goodput: raised by the state_dict() of {str(k)!r} ({type(v).__name__}) while saving")
                raise
            if not isinstance(sd, dict):
                raise TypeError(f"{str(k)!r}: state_dict() returned a {type(sd).__name__}, not a dict")
            out[k] = sd
            found.append(Stateful(k, v, sd))
    return out, found


def materialize_meta(state: Any) -> None:
    """Replace meta-device tensors (and DTensors over meta tensors) in ``state`` by empty ones on
    the process group's device, in place, as DCP's load does before filling them: a model built
    on the meta device loads without first allocating its weights twice."""

    def device() -> torch.device:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and dist.get_backend() == "nccl":  # pragma: no cover
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def real(v: Any) -> Any:
        if not isinstance(v, torch.Tensor) or v.device.type != "meta":
            return v
        if _is_dtensor(v):
            from torch.distributed.tensor import DTensor

            local = torch.empty_like(v.to_local(), device=device())
            return DTensor.from_local(
                local, device_mesh=v.device_mesh, placements=v.placements, shape=v.size(), stride=v.stride()
            )
        return torch.empty_like(v, device=device())

    def walk(x: Any) -> None:
        items = x.items() if isinstance(x, dict) else enumerate(x) if isinstance(x, list) else ()
        for k, v in list(items):
            if isinstance(v, (dict, list)):
                walk(v)
            else:
                new = real(v)
                if new is not v:
                    x[k] = new

    walk(state)


def flatten(state: Any) -> tuple[list[TensorLeaf], list[ValueLeaf]]:
    tensors: list[TensorLeaf] = []
    values: list[ValueLeaf] = []
    if not isinstance(state, dict):
        raise TypeError(f"state_dict must be a dict, got {type(state).__name__}")
    state, _ = expand_stateful(state)
    for k, v in state.items():
        try:
            _walk(str(k), v, state, k, tensors, values)
        except RecursionError:  # deeper than any value may be (format.MAX_VALUE_DEPTH): name the key
            raise TypeError(f"{str(k)!r}: nested too deeply to checkpoint (a RecursionError); flatten it") from None
    names = [x.name for x in tensors if x.part == 0] + [x.name for x in values]
    if len(set(names)) != len(names):  # {"a": {"b": x}, "a.b": y}: one would silently replace the other
        seen: set[str] = set()
        dup = next(n for n in names if n in seen or seen.add(n))
        raise ValueError(f"{dup!r}: two entries of the state dict have this dotted name; rename one")
    return tensors, values


def _walk(name: str, v: Any, parent: Any, key: Any, tensors: list, values: list) -> None:
    if isinstance(v, dict):
        for k, x in v.items():
            if not isinstance(k, (str, int)):
                raise TypeError(f"{name!r}: dict keys must be str or int, got {type(k).__name__}")
            _walk(f"{name}.{k}", x, v, k, tensors, values)
        return
    if isinstance(v, (list, tuple)) and _contains_array(v):
        for i, x in enumerate(v):
            _walk(f"{name}.{i}", x, v, i, tensors, values)
        return
    parts = tensor_leaves(name, v)
    if parts is not None:
        for leaf in parts:
            leaf.parent, leaf.key = parent, key
            tensors.append(leaf)
        return
    from .format.format import encode_value

    encode_value(v, name)  # raises a TypeError naming the key for anything not JSON-able
    values.append(ValueLeaf(name, v, parent, key))


def tensor_leaves(name: str, v: Any) -> list[TensorLeaf] | None:
    """The leaves of one value: one, or one per local shard where a rank holds several shards of
    one tensor (a ShardedTensor, a DTensor over ``LocalShardsWrapper``); None if not a tensor."""
    if _is_sharded_tensor(v):
        return _sharded_tensor_leaves(name, v)
    if _is_dtensor(v) and _is_shards_wrapper(v._local_tensor):
        return _wrapped_dtensor_leaves(name, v)
    from .tensor_protocol import implements_protocol, protocol_boxes  # DCP's __create_write_items__

    if implements_protocol(v):
        return _shard_leaves(name, v, *protocol_boxes(name, v))
    leaf = tensor_leaf(name, v)
    return None if leaf is None else [leaf]


def tensor_leaf(name: str, v: Any) -> TensorLeaf | None:
    if isinstance(v, LocalShard):
        t = v.tensor.detach()
        region = Region.box(v.offsets, tuple(t.shape))
        return TensorLeaf(name, torch_dtype_name(t.dtype, name), v.global_shape, region, t, "torch", True, holder=v)
    if isinstance(v, FlatShard):
        t = v.tensor.detach()
        region = Region.flat(v.start, t.numel(), len(v.global_shape))
        return TensorLeaf(name, torch_dtype_name(t.dtype, name), v.global_shape, region, t, "torch", True, holder=v)
    if isinstance(v, io.BytesIO):
        # DCP saves a BytesIO as an opaque blob: here, a uint8 tensor of its bytes (kind "bytes"),
        # checksummed like every tensor, restored into the BytesIO given to load (never unpickled)
        data = np.frombuffer(v.getbuffer(), np.uint8).copy()
        return TensorLeaf(name, "uint8", (len(data),), Region.whole((len(data),)), data, "bytes", False, holder=v)
    if isinstance(v, np.ndarray):
        if v.dtype == object:
            raise TypeError(f"{name!r}: object arrays cannot be checkpointed (they would need pickle)")
        try:
            dt = from_numpy(v.dtype).name
        except TypeError as e:
            raise TypeError(f"{name!r}: {e}") from None
        return TensorLeaf(name, dt, tuple(v.shape), Region.whole(v.shape), v, "numpy", False)
    if isinstance(v, torch.Tensor):
        if _is_dtensor(v):
            return _dtensor_leaf(name, v)
        if v.is_sparse or v.layout != torch.strided:
            raise TypeError(f"{name!r}: only dense (strided) tensors can be checkpointed, got {v.layout}")
        if v.device.type == "meta":
            raise TypeError(f"{name!r}: a meta tensor has no data to checkpoint")
        t = v.detach()
        return TensorLeaf(
            name, torch_dtype_name(t.dtype, name), tuple(t.shape), Region.whole(t.shape), t, "torch", False
        )
    return None


def _is_dtensor(v: Any) -> bool:
    if not type(v).__module__.startswith("torch.distributed"):
        return False  # cheap: a plain tensor never pays for importing DTensor
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch without distributed
        return False
    return isinstance(v, DTensor)


def _is_sharded_tensor(v: Any) -> bool:
    """FSDP1's SHARDED_STATE_DICT and torchrec hold ``torch.distributed._shard`` ShardedTensors."""
    return type(v).__name__ == "ShardedTensor" and type(v).__module__.startswith("torch.distributed._shard")


def _is_shards_wrapper(t: Any) -> bool:
    """``torch.distributed.tensor._shards_wrapper.LocalShardsWrapper``: several shards of one
    DTensor on a rank (torchrec's uneven row-wise and column-wise sharding)."""
    return type(t).__name__ == "LocalShardsWrapper" and type(t).__module__.startswith("torch.distributed")


def _shard_leaves(name: str, v: Any, gshape: tuple[int, ...], dt: torch.dtype, boxes: list) -> list[TensorLeaf]:
    """One leaf per ``(tensor, offsets)`` box this rank holds of ``v``; an empty box when it holds
    none (the agreement drops it, and the rank still declares the tensor's spec)."""
    if not boxes:
        local = torch.empty((0,) * len(gshape), dtype=dt)
        zero = (0,) * len(gshape)
        return [
            TensorLeaf(name, torch_dtype_name(dt, name), gshape, Region.box(zero, zero), local, "torch", True, holder=v)
        ]
    out = []
    for part, (t, offsets) in enumerate(boxes):
        local = t.detach()
        try:
            region = Region.box(tuple(int(o) for o in offsets), tuple(local.shape))
        except ValueError as e:
            raise ValueError(f"{name!r}: local shard {part}: {e}") from None
        inside = len(region.offsets) == len(gshape) and all(
            o >= 0 and o + s <= g for o, s, g in zip(region.offsets, region.sizes, gshape)
        )
        if not inside:
            raise ValueError(
                f"{name!r}: local shard {part} at offsets {region.offsets} of size {region.sizes} "
                f"leaves the global shape {gshape}"
            )
        dname = torch_dtype_name(local.dtype, name)
        out.append(TensorLeaf(name, dname, gshape, region, local, "torch", True, holder=v, part=part))
    return out


def _sharded_tensor_leaves(name: str, v: Any) -> list[TensorLeaf]:
    gshape = tuple(int(x) for x in v.size())
    boxes = []
    for sh in v.local_shards():
        md = sh.metadata
        if tuple(sh.tensor.shape) != tuple(md.shard_sizes):
            raise ValueError(
                f"{name!r}: shard tensor {tuple(sh.tensor.shape)} differs from its metadata {tuple(md.shard_sizes)}"
            )
        boxes.append((sh.tensor, md.shard_offsets))
    return _shard_leaves(name, v, gshape, v.metadata().tensor_properties.dtype, boxes)


def _wrapped_dtensor_leaves(name: str, v: Any) -> list[TensorLeaf]:
    """A DTensor whose local tensor is a ``LocalShardsWrapper``: the wrapper's shards and their
    global offsets, as DCP reads them (``local_shards()`` / ``local_offsets()``)."""
    w = v._local_tensor
    boxes = [(t, o) for t, o in zip(w.local_shards(), w.local_offsets()) if t.numel() > 0]
    return _shard_leaves(name, v, tuple(int(x) for x in v.shape), v.dtype, boxes)


def _dtensor_leaf(name: str, v: Any) -> TensorLeaf:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    strided = False
    for p in v.placements:
        if type(p).__name__ == "_StridedShard":
            strided = True
        elif not isinstance(p, (Shard, Replicate)):
            raise TypeError(
                f"{name!r}: DTensor placement {p} is not supported (reduce Partial placements before saving)"
            )
    if strided:
        offsets, shape = _strided_box(name, v)
    else:
        shape, offsets = compute_local_shape_and_global_offset(v.shape, v.device_mesh, v.placements)
    local = v.to_local().detach()
    if tuple(local.shape) != tuple(shape):
        raise ValueError(f"{name!r}: DTensor local shape {tuple(local.shape)} differs from its layout {tuple(shape)}")
    region = Region.box(offsets, shape)
    return TensorLeaf(name, torch_dtype_name(local.dtype, name), tuple(v.shape), region, local, "torch", True, holder=v)


def _strided_box(name: str, v: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The global box a DTensor with ``_StridedShard`` placements holds (FSDP2 over TP shards one
    dimension right to left). Along each dimension the global indices this rank holds are found
    by splitting an index vector exactly as DTensor splits the data, placement by placement in
    mesh order (DTensor's own ``_split_tensor``, so uneven shards and split factors follow its
    rules). FSDP2 x TP gives every rank one contiguous range per dimension: a box. A layout that
    leaves a rank several separate ranges is refused, naming the key."""
    mesh = v.device_mesh
    coord = mesh.get_coordinate()
    if coord is None:  # this rank is outside the mesh: it holds nothing
        return (0,) * v.ndim, (0,) * v.ndim
    offsets, sizes = [], []
    for d in range(v.ndim):
        n = int(v.shape[d])
        idx = torch.arange(n).reshape([n if k == d else 1 for k in range(v.ndim)])
        for i, p in enumerate(v.placements):
            if (p.is_shard() or type(p).__name__ == "_StridedShard") and p.dim == d:  # is_shard() is False for it
                chunks, _ = p._split_tensor(idx, mesh.size(i), with_padding=False, contiguous=True)
                idx = chunks[coord[i]] if coord[i] < len(chunks) else idx.narrow(d, 0, 0)
        flat = idx.reshape(-1)
        if len(flat) and not torch.equal(flat, torch.arange(int(flat[0]), int(flat[0]) + len(flat))):
            raise TypeError(
                f"{name!r}: DTensor placements {tuple(v.placements)} leave this rank separate ranges "
                f"of dimension {d}; only layouts where each rank holds one box can be checkpointed"
            )
        offsets.append(int(flat[0]) if len(flat) else 0)
        sizes.append(len(flat))
    return tuple(offsets), tuple(sizes)


def host_bytes(x: torch.Tensor | np.ndarray) -> np.ndarray:
    """The bytes of ``x`` on the host, C-contiguous, as a flat uint8 array (a view when possible).

    CUDA tensors are copied through pinned memory on a side stream so that the copy can overlap
    compute; the caller owns the returned buffer.
    """
    if isinstance(x, np.ndarray):
        return np.ascontiguousarray(x).reshape(-1).view(np.uint8)
    if x.device.type == "cuda":  # pragma: no cover - exercised on GPU machines
        pinned = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)
        stream = torch.cuda.Stream(device=x.device)
        stream.wait_stream(torch.cuda.current_stream(x.device))
        with torch.cuda.stream(stream):
            pinned.copy_(x, non_blocking=True)
        stream.synchronize()
        x = pinned
    elif x.device.type != "cpu":
        x = x.cpu()
    if x.is_conj() or x.is_neg():  # lazy conjugate/negative views: their bytes are not their values
        x = x.resolve_conj().resolve_neg()
    x = x.contiguous()
    return x.reshape(-1).view(torch.uint8).numpy()


def dest_bytes(x: torch.Tensor | np.ndarray) -> np.ndarray | None:
    """A writable flat uint8 view of ``x``'s storage, or None when a staging copy is needed."""
    if isinstance(x, np.ndarray):
        if x.flags.c_contiguous and x.flags.writeable:
            return x.reshape(-1).view(np.uint8)
        return None
    if x.device.type != "cpu" or not x.is_contiguous() or x.is_conj() or x.is_neg():
        return None  # staged, then copy_ (which honours the lazy conjugate/negative bit)
    try:
        return x.detach().reshape(-1).view(torch.uint8).numpy()
    except RuntimeError:  # "contiguous" by torch's rule yet odd strides on size-1 dims: stage it
        return None
