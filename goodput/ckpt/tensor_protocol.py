"""Tensor subclasses that describe their own sharding through DCP's protocol.

DCP lets a ``torch.Tensor`` subclass say which parts of a global tensor it holds:
``__create_write_items__(fqn, obj)`` returns ``WriteItem``\\ s (a chunk's offsets and sizes, the
global size, the dtype) and ``__get_tensor_shard__(index)`` the plain tensor holding that chunk;
a load may ask ``__create_chunk_list__()`` for the chunks instead. FP8 and quantized optimizer
state, and wrappers such as torch's test ``CheckpointableDistTensor``, use it; they often support
no tensor operation at all (not even ``detach()``), so goodput touches only the shards they hand
out. Each chunk becomes one leaf, as a ShardedTensor's shards do: saved as its box of the global
tensor, and filled in place on load whatever layout the checkpoint was saved in.
"""

from __future__ import annotations

from typing import Any

import torch


def implements_protocol(v: Any) -> bool:
    """A tensor subclass (not a DTensor: goodput reads those directly) with DCP's protocol."""
    cls = type(v)
    return (
        isinstance(v, torch.Tensor)
        and cls is not torch.Tensor
        and cls is not torch.nn.Parameter
        and callable(getattr(cls, "__get_tensor_shard__", None))
        and (
            callable(getattr(cls, "__create_write_items__", None))
            or callable(getattr(cls, "__create_chunk_list__", None))
        )
        and not cls.__module__.startswith("torch.distributed.tensor")
    )


def protocol_boxes(
    name: str, v: Any
) -> tuple[tuple[int, ...], torch.dtype, list[tuple[torch.Tensor, tuple[int, ...]]]]:
    """(global shape, dtype, [(shard tensor, offsets)]) as the object describes itself."""
    cls = type(v)
    boxes: list[tuple[torch.Tensor, tuple[int, ...]]] = []
    if callable(getattr(cls, "__create_write_items__", None)):
        items = v.__create_write_items__(name, v)
        if not items:
            raise TypeError(f"{name!r}: {cls.__name__}.__create_write_items__ returned no item")
        gshape: tuple[int, ...] | None = None
        dt: torch.dtype | None = None
        for it in items:
            td = getattr(it, "tensor_data", None)
            if td is None:
                raise TypeError(f"{name!r}: {cls.__name__}.__create_write_items__ returned an item without tensor data")
            size = tuple(int(s) for s in td.size)
            if gshape is not None and size != gshape:
                raise ValueError(f"{name!r}: {cls.__name__}'s items disagree on the global size ({gshape} vs {size})")
            gshape, dt = size, td.properties.dtype
            boxes.append(_shard(name, v, it.index, tuple(td.chunk.offsets), tuple(td.chunk.sizes)))
        assert gshape is not None and dt is not None
        return gshape, dt, boxes
    from torch.distributed.checkpoint.metadata import MetadataIndex

    for ch in v.__create_chunk_list__():
        offsets = tuple(int(o) for o in ch.offsets)
        boxes.append(_shard(name, v, MetadataIndex(name, offsets), offsets, tuple(ch.sizes)))
    return tuple(int(s) for s in v.size()), v.dtype, boxes


def _shard(name: str, v: Any, index: Any, offsets: tuple, sizes: tuple) -> tuple[torch.Tensor, tuple[int, ...]]:
    t = v.__get_tensor_shard__(index)
    if not isinstance(t, torch.Tensor) or implements_protocol(t):
        raise TypeError(
            f"{name!r}: {type(v).__name__}.__get_tensor_shard__ returned a {type(t).__name__}, not a tensor"
        )
    if tuple(t.shape) != tuple(int(s) for s in sizes):
        raise ValueError(
            f"{name!r}: {type(v).__name__}'s shard at {tuple(offsets)} is {tuple(t.shape)}, its chunk says {tuple(sizes)}"
        )
    return t, tuple(int(o) for o in offsets)
