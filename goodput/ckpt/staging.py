"""Host-memory staging for asynchronous saves: one reusable buffer, sized to the state, kept.

The training loop only waits for a copy of its state into host memory; the write then runs from
that copy. The buffer is allocated once (and pre-touched, so the first save does not pay for page
faults), reused by every later save of the same or a smaller state, and never duplicated: host
memory holds at most one staged copy of the state. In process mode it is POSIX shared memory,
which the writer process maps; where CUDA is present it is page-locked (cudaHostRegister) and
device-to-host copies run on a side stream so that they can overlap the training stream.
"""

from __future__ import annotations

import contextlib
import os
import re
import uuid
from dataclasses import dataclass
from multiprocessing import shared_memory
from typing import Any

import numpy as np
import torch

from .dtypes import dtype as dtype_info
from .format import ALIGN  # page-aligned slots: the writer can use O_DIRECT straight from them
from .state import TensorLeaf


@dataclass(frozen=True)
class Slot:
    name: str
    offset: int
    nbytes: int
    shape: tuple[int, ...]  # the local region's shape (flat regions: (count,))
    itemsize: int


def layout(leaves: list[TensorLeaf]) -> tuple[dict[str, Slot], int]:
    slots: dict[str, Slot] = {}
    pos = 0
    for lf in leaves:
        item = dtype_info(lf.dtype).itemsize
        n = lf.region.numel * item
        shape = (lf.region.flat_count,) if lf.region.is_flat else tuple(lf.region.sizes)
        slots[lf.name] = Slot(lf.name, pos, n, shape, item)
        pos += n + (-n) % ALIGN
    return slots, pos


_SEGMENT = re.compile(r"^goodput-(\d+)-[0-9a-f]{8}$")


def sweep_dead_segments(directory: str = "/dev/shm") -> list[str]:
    """Unlink staging segments whose creating process is gone. The name of a live segment is
    removed as soon as the writer has mapped it; a job killed in between (SIGKILL, OOM) leaves the
    name behind, and this, run when a saver starts, takes it away."""
    removed = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for n in names:
        m = _SEGMENT.match(n)
        if not m:
            continue
        try:
            os.kill(int(m.group(1)), 0)
            continue  # its creator is alive
        except ProcessLookupError:
            pass
        except PermissionError:
            continue  # alive, another user's
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(directory, n))
            removed.append(n)
    return removed


class StagingPool:
    """One host buffer, grown only when a larger state arrives."""

    def __init__(self, shared: bool):
        self.shared = shared
        self.shm: shared_memory.SharedMemory | None = None
        self.array: np.ndarray | None = None
        self.capacity = 0
        self.pinned = False
        self.fresh = False
        self.named = False
        self._stream: Any = None

    @property
    def name(self) -> str | None:
        return self.shm.name if self.shm is not None else None

    def ensure(self, size: int) -> np.ndarray:
        """The buffer, (re)allocated if too small; ``self.fresh`` says whether it is new."""
        if self.array is not None and size <= self.capacity:
            self.fresh = False
            return self.array
        self.release()
        cap = max(size, 1)
        if self.shared:
            name = f"goodput-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            self.shm = shared_memory.SharedMemory(create=True, size=cap, name=name)
            self.named = True
            self.array = np.ndarray((cap,), np.uint8, buffer=self.shm.buf)
        else:
            self.array = np.empty(cap, np.uint8)
        self.array[:] = 0  # touch every page now, not during the first stall
        self.capacity = cap
        self.fresh = True
        self._pin()
        return self.array

    def unlink_name(self) -> None:
        """Remove the segment's name once every process that needs it has mapped it."""
        if self.shm is not None:
            # unlink() also unregisters the name from this process's resource tracker (3.8+);
            # unregistering it a second time made the tracker print a KeyError at exit
            with contextlib.suppress(FileNotFoundError, OSError):
                self.shm.unlink()
            self.named = False

    def _pin(self) -> None:
        if not torch.cuda.is_available():
            return
        try:  # pragma: no cover - GPU machines
            cudart = torch.cuda.cudart()
            err = cudart.cudaHostRegister(self.array.ctypes.data, self.capacity, 0)
            self.pinned = int(err) == 0 if not isinstance(err, tuple) else int(err[0]) == 0
        except Exception:  # noqa: BLE001 - staging still works unpinned, only slower
            self.pinned = False

    def stage(self, leaves: list[TensorLeaf], slots: dict[str, Slot]) -> None:
        """Copy every leaf into its slot; returns when the copy is complete (the state may change)."""
        arr = self.array
        assert arr is not None
        cuda_leaves = []
        for lf in leaves:
            s = slots[lf.name]
            view = arr[s.offset : s.offset + s.nbytes]
            if isinstance(lf.local, np.ndarray):
                np.copyto(view.view(lf.local.dtype).reshape(s.shape), lf.local, casting="no")
                continue
            if lf.local.device.type == "cpu" and lf.local.is_contiguous():
                # numpy's copy runs at memcpy speed; torch's single-threaded copy_ at about half
                np.copyto(view, lf.local.detach().reshape(-1).view(torch.uint8).numpy())
                continue
            dst = torch.from_numpy(view).view(lf.local.dtype).view(s.shape)
            if lf.local.device.type == "cuda":  # pragma: no cover - GPU machines
                cuda_leaves.append((dst, lf.local))
            else:
                dst.copy_(lf.local)
        if cuda_leaves:  # pragma: no cover - GPU machines
            dev = cuda_leaves[0][1].device
            if self._stream is None:
                self._stream = torch.cuda.Stream(device=dev)
            self._stream.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(self._stream):
                for dst, src in cuda_leaves:
                    dst.copy_(src, non_blocking=self.pinned)
            self._stream.synchronize()

    def release(self) -> None:
        if self.pinned:  # pragma: no cover - GPU machines
            with contextlib.suppress(Exception):
                torch.cuda.cudart().cudaHostUnregister(self.array.ctypes.data)
            self.pinned = False
        self.array = None
        if self.shm is not None:
            with contextlib.suppress(BufferError, OSError):
                self.shm.close()
            if self.named:
                with contextlib.suppress(FileNotFoundError, OSError):
                    self.shm.unlink()
            self.shm = None
            self.named = False
        self.capacity = 0
