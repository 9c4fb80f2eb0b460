"""Byte-string collectives over a torch.distributed group (no pickle on the wire either).

Messages are msgpack (msgspec). On NCCL groups the buffers live on the current CUDA device; on
gloo they stay on the CPU. Without an initialised process group everything is a world of one.

Every collective here returns only once the backend has let go of its tensors (:func:`released`):
otherwise the last one before the process exits could abort it (see there).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
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


RELEASE_WAIT_S = 2.0  # the longest a collective waits for gloo's worker to drop its tensors


def released(*tensors: torch.Tensor | Iterable[torch.Tensor]) -> None:
    """Return once nothing but Python holds the CPU ``tensors`` just passed to a collective.

    Gloo runs a collective on one of its worker threads (``pt_gloo_runloop``), which marks the
    work complete (and so ends ``dist.broadcast`` etc. on this thread) *before* it drops its own
    reference to the work, and with it to the tensors. If Python drops its tensors first, torch
    keeps their Python objects alive, owned by the C++ tensors, and the worker then has to take
    the interpreter lock to free them. When that moment falls into interpreter shutdown (a
    ``save`` is often a script's last call, and its last collective is a broadcast), the worker
    thread is ended by ``take_gil`` inside the work's ``noexcept`` destructor: ``terminate called
    without an active exception``, SIGABRT, and torchrun reports the job failed although the
    checkpoint committed. (A core of such a rank: ``runLoop`` -> ``~AsyncBroadcastWork`` ->
    ``TensorImpl::decref_pyobject`` -> ``PyThread_exit_thread`` -> ``std::terminate``.)

    Keeping the tensors until the worker has let go (the C++ use count falls to Python's one
    reference) means the worker frees only C++ references, with no lock to take. The worker
    does so microseconds after completing, so this rarely sleeps at all; a tensor something
    else still holds (not the case for the fresh buffers here) is given up on after
    :data:`RELEASE_WAIT_S`. CUDA tensors (NCCL) are not waited for: NCCL's watchdog keeps its
    work for a while by design, and waiting for it would slow every collective."""
    use_count = getattr(torch.Tensor, "_use_count", None)  # private: a torch without it is not waited for
    if use_count is None:
        return
    pending = [t for x in tensors for t in ((x,) if isinstance(x, torch.Tensor) else x) if t.device.type == "cpu"]
    deadline = None
    spins = 0
    for t in pending:
        while use_count(t) > 1:
            now = time.monotonic()
            if deadline is None:
                deadline = now + RELEASE_WAIT_S
            elif now > deadline:
                return
            time.sleep(0 if spins < 50 else 1e-4)  # either way the lock is released meanwhile
            spins += 1


def all_reduce(t: torch.Tensor, op: Any = None, group: Any = None) -> None:
    """``dist.all_reduce`` (SUM by default) that returns once gloo has let go of ``t`` (:func:`released`)."""
    dist.all_reduce(t, op=dist.ReduceOp.SUM if op is None else op, group=group)
    released(t)


def all_gather_bytes(payload: bytes, group: Any = None) -> list[bytes]:
    rank, size = world(group)
    if size == 1:
        return [payload]
    dev = device(group)
    n = torch.tensor([len(payload)], dtype=torch.int64, device=dev)
    sizes = [torch.zeros(1, dtype=torch.int64, device=dev) for _ in range(size)]
    dist.all_gather(sizes, n, group=group)
    released(sizes, n)
    lens = [int(s.item()) for s in sizes]
    cap = max(lens)
    buf = torch.zeros(cap, dtype=torch.uint8, device=dev)
    if payload:
        buf[: len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(dev)
    outs = [torch.empty(cap, dtype=torch.uint8, device=dev) for _ in range(size)]
    dist.all_gather(outs, buf, group=group)
    released(outs, buf)
    return [bytes(o[:n].cpu().numpy().tobytes()) for o, n in zip(outs, lens)]


def gather_bytes(payload: bytes, dst: int = 0, group: Any = None) -> list[bytes] | None:
    """Every rank's payload on ``dst`` (None elsewhere): what only one rank needs, only one rank
    receives and decodes (at 16k ranks the chunk records are megabytes)."""
    rank, size = world(group)
    if size == 1:
        return [payload]
    dev = device(group)
    cap = torch.tensor([len(payload) + 8], dtype=torch.int64, device=dev)
    all_reduce(cap, dist.ReduceOp.MAX, group)
    buf = torch.zeros(int(cap.item()), dtype=torch.uint8, device=dev)
    head = len(payload).to_bytes(8, "little") + payload
    buf[: len(head)] = torch.frombuffer(bytearray(head), dtype=torch.uint8).to(dev)
    outs = [torch.empty_like(buf) for _ in range(size)] if rank == dst else None
    global_dst = dist.get_global_rank(group, dst) if group is not None else dst
    dist.gather(buf, outs, dst=global_dst, group=group)
    released(buf, outs or ())
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
    released(cap)
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
    released(buf, parts or ())
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
    released(n)
    buf = torch.empty(int(n.item()), dtype=torch.uint8, device=dev)
    if rank == src and payload:
        buf[:] = torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(dev)
    dist.broadcast(buf, global_src, group=group)
    released(buf)
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
