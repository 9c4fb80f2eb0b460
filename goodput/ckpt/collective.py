"""Byte-string collectives over a torch.distributed group (no pickle on the wire either).

Messages are msgpack (msgspec). On NCCL groups the buffers live on the current CUDA device; on
gloo they stay on the CPU. Without an initialised process group everything is a world of one.
"""

from __future__ import annotations

from typing import Any

import msgspec
import torch
import torch.distributed as dist

LOCAL = object()  # a "group" of this process alone: DCP's no_dist=True


def world(group: Any = None) -> tuple[int, int]:
    if group is LOCAL or not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def device(group: Any) -> torch.device:
    """Where the buffers of a collective on ``group`` live: the current CUDA device on NCCL, else the CPU."""
    if dist.get_backend(group) == "nccl":  # pragma: no cover - GPU machines
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_gather_bytes(payload: bytes, group: Any = None) -> list[bytes]:
    rank, size = world(group)
    if size == 1:
        return [payload]
    dev = device(group)
    n = torch.tensor([len(payload)], dtype=torch.int64, device=dev)
    sizes = [torch.zeros(1, dtype=torch.int64, device=dev) for _ in range(size)]
    dist.all_gather(sizes, n, group=group)
    lens = [int(s.item()) for s in sizes]
    cap = max(lens)
    buf = torch.zeros(cap, dtype=torch.uint8, device=dev)
    if payload:
        buf[: len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(dev)
    outs = [torch.empty(cap, dtype=torch.uint8, device=dev) for _ in range(size)]
    dist.all_gather(outs, buf, group=group)
    return [bytes(o[:n].cpu().numpy().tobytes()) for o, n in zip(outs, lens)]


def gather_bytes(payload: bytes, dst: int = 0, group: Any = None) -> list[bytes] | None:
    """Every rank's payload on ``dst`` (None elsewhere): what only one rank needs, only one rank
    receives and decodes (at 16k ranks the chunk records are megabytes)."""
    rank, size = world(group)
    if size == 1:
        return [payload]
    dev = device(group)
    cap = torch.tensor([len(payload) + 8], dtype=torch.int64, device=dev)
    dist.all_reduce(cap, op=dist.ReduceOp.MAX, group=group)
    buf = torch.zeros(int(cap.item()), dtype=torch.uint8, device=dev)
    head = len(payload).to_bytes(8, "little") + payload
    buf[: len(head)] = torch.frombuffer(bytearray(head), dtype=torch.uint8).to(dev)
    outs = [torch.empty_like(buf) for _ in range(size)] if rank == dst else None
    global_dst = dist.get_global_rank(group, dst) if group is not None else dst
    dist.gather(buf, outs, dst=global_dst, group=group)
    if outs is None:
        return None
    got = []
    for o in outs:
        raw = o.cpu().numpy().tobytes()
        n = int.from_bytes(raw[:8], "little")
        got.append(raw[8 : 8 + n])
    return got


def scatter_bytes(payloads: list[bytes] | None, src: int = 0, group: Any = None) -> bytes:
    """``payloads[r]`` from ``src`` to rank r: each rank receives only its own part."""
    rank, size = world(group)
    if size == 1:
        assert payloads is not None
        return payloads[0]
    dev = device(group)
    global_src = dist.get_global_rank(group, src) if group is not None else src
    cap = torch.tensor([max(len(p) for p in payloads) + 8 if rank == src and payloads else 0], dtype=torch.int64)
    cap = cap.to(dev)
    dist.broadcast(cap, global_src, group=group)
    buf = torch.empty(int(cap.item()), dtype=torch.uint8, device=dev)
    parts = None
    if rank == src:
        assert payloads is not None and len(payloads) == size
        parts = []
        for p in payloads:
            t = torch.zeros(int(cap.item()), dtype=torch.uint8, device=dev)
            head = len(p).to_bytes(8, "little") + p
            t[: len(head)] = torch.frombuffer(bytearray(head), dtype=torch.uint8).to(dev)
            parts.append(t)
    dist.scatter(buf, parts, src=global_src, group=group)
    raw = buf.cpu().numpy().tobytes()
    return raw[8 : 8 + int.from_bytes(raw[:8], "little")]


def broadcast_bytes(payload: bytes | None, src: int = 0, group: Any = None) -> bytes:
    rank, size = world(group)
    if size == 1:
        assert payload is not None
        return payload
    dev = device(group)
    global_src = dist.get_global_rank(group, src) if group is not None else src
    n = torch.tensor([len(payload) if rank == src and payload is not None else 0], dtype=torch.int64, device=dev)
    dist.broadcast(n, global_src, group=group)
    buf = torch.empty(int(n.item()), dtype=torch.uint8, device=dev)
    if rank == src and payload:
        buf[:] = torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(dev)
    dist.broadcast(buf, global_src, group=group)
    return bytes(buf.cpu().numpy().tobytes())


def gather_obj(obj: Any, dst: int = 0, group: Any = None) -> list[Any] | None:
    got = gather_bytes(msgspec.msgpack.encode(obj), dst, group)
    return None if got is None else [msgspec.msgpack.decode(b) for b in got]


def scatter_obj(objs: list[Any] | None, src: int = 0, group: Any = None) -> Any:
    payloads = [msgspec.msgpack.encode(o) for o in objs] if objs is not None else None
    return msgspec.msgpack.decode(scatter_bytes(payloads, src, group))


def broadcast_obj(obj: Any, src: int = 0, group: Any = None) -> Any:
    rank, _ = world(group)
    raw = msgspec.msgpack.encode(obj) if rank == src else None
    return msgspec.msgpack.decode(broadcast_bytes(raw, src, group))


def name_ranks(msg: str, group: Any) -> str:
    """Ranks in messages are positions in the save's group; on a sub-group, say which processes
    those are (global ranks), so the message names the process at fault."""
    if group is None or group is LOCAL or not dist.is_initialized():
        return msg
    members = dist.get_process_group_ranks(group)
    if members == list(range(dist.get_world_size())):
        return msg
    shown = str(members) if len(members) <= 16 else f"[{members[0]}, {members[1]}, ..., {members[-1]}] ({len(members)})"
    return f"{msg} [ranks are numbered within the save's process group; its ranks 0, 1, ... are global ranks {shown}]"
