"""Host-memory staging for asynchronous saves: one reusable buffer, sized to the state, kept.

The training loop only waits for a copy of its state into host memory; the write then runs from
that copy. The buffer is allocated once (and pre-touched, so the first save does not pay for page
faults), reused by every later save of the same or a smaller state, and never duplicated: host
memory holds at most one staged copy of the state. In process mode it is POSIX shared memory,
which the writer process maps; where CUDA is present it is page-locked (cudaHostRegister) and
device-to-host copies run on a side stream so that they can overlap the training stream.

Host copies run on every usable core: one copy thread cannot saturate memory bandwidth, and the
training loop (which often runs torch on one thread) is waiting anyway. The copy is cut into
chunks that a small persistent pool of threads and the calling thread take in turn; numpy and
torch release the interpreter lock while they copy, so the threads really run in parallel.
Torch's own thread count is left alone: it belongs to the training loop.

Lazy staging (:meth:`StagingPool.job` with ``versions`` and a ``guard``) copies while the
training loop goes on. What it guarantees (docs/ASYNC.md says it in full): a change made on the
thread that asked for the save, through any torch call, is either made after the copy or fails
the save naming the tensor; never a torn commit.

- copy first (:class:`CopyFirst`): until the copy is complete, that thread runs every torch call
  through a torch function mode, and a call that may change the data of a tensor it is given
  (every tensor in its arguments, keywords and lists included: an in-place name, ``inplace=``,
  ``out=``, ``max_norm=``, a mutable schema, batch norm's running statistics) or that hands its
  memory to code torch cannot see (``.data``, ``.numpy()``, ``data_ptr()``, DLPack...) first
  waits for the copy when one of those tensors shares memory with a leaf being copied.
- watch: any other call given such a tensor goes on, and the version counters of its tensors
  whose copy had not ended are compared across it (for ``backward``, whose hooks may change
  what it was not given: every leaf still copying). A change fails the save. The copy waits for
  the watched calls still running before it lets the write start, so a kernel that bumps the
  counter only when it returns, after the copy's own check, is still seen.
- collectives: ``torch.distributed``'s collectives write in C++, seen by neither the mode nor the
  counter; wrappers (:func:`guard_collectives`, put on by the first lazy save) make one that
  would write memory still being copied wait for the copy first, on the saving thread.
- detect and fail: torch's version counter, which every in-place operation bumps when it returns
  and which views and ``detach()`` share, is read at the request and after each leaf's copy: a
  leaf changed by another thread fails the save, naming it. Against another thread this races
  (an operation still running when the copy ends is seen too late): a net, not a guarantee.

What none sees: writes through an alias taken *before* the save (a numpy view, a pointer, a
``.data`` tensor kept from earlier), writes from another thread (other than a protected
optimizer's step), writes by code that bumps no counter inside a watched call. Code that does
any of these must call ``handle.wait_staged()`` first or use eager staging.
"""

from __future__ import annotations

import contextlib
import functools
import mmap
import os
import re
import threading
import uuid
from dataclasses import dataclass
from multiprocessing import shared_memory
from typing import Any

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

from ..format.dtypes import dtype as dtype_info
from ..format.format import ALIGN  # page-aligned slots: the writer can use O_DIRECT straight from them
from ..state import TensorLeaf

# Big enough that taking a chunk (a lock and two slices) costs under 1 % of copying it, small
# enough that every thread stays busy to the end of a state of a few large tensors.
CHUNK = 4 << 20

# Lazy staging copies smaller leaves at once, in the foreground: they cost microseconds, and they
# are where state changes without a version bump (BatchNorm's running statistics are updated
# inside its kernel; the counter does not move). On CUDA "at once" means queued on the side
# stream with the training stream made to wait for them: no host wait.
LAZY_MIN_BYTES = 64 << 10

THP_SHMEM = "/sys/kernel/mm/transparent_hugepage/shmem_enabled"


@dataclass(frozen=True)
class Slot:
    name: str
    offset: int
    nbytes: int
    shape: tuple[int, ...]  # the local region's shape (flat regions: (count,))
    itemsize: int


def layout(leaves: list[TensorLeaf]) -> tuple[dict[tuple[str, int], Slot], int]:
    """Each leaf's place in the staging buffer, by :attr:`TensorLeaf.ident`, and the total size."""
    slots: dict[tuple[str, int], Slot] = {}
    pos = 0
    for lf in leaves:
        item = dtype_info(lf.dtype).itemsize
        n = lf.region.numel * item
        shape = (lf.region.flat_count,) if lf.region.is_flat else tuple(lf.region.sizes)
        slots[lf.ident] = Slot(lf.name, pos, n, shape, item)
        pos += n + (-n) % ALIGN
    return slots, pos


_SEGMENT = re.compile(r"^goodput-(\d+)-[0-9a-f]{8}\Z")


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


def usable_cpus() -> int:
    """Cores this process may run on (a job pinned to some cores must not oversubscribe them)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def shmem_hugepages() -> str:
    """The kernel's transparent-huge-page policy for shared memory ("never", "advise", ...)."""
    try:
        with open(THP_SHMEM) as f:  # noqa: PTH123 - one short read
            text = f.read()
    except OSError:
        return "unknown"
    m = re.search(r"\[(\w[\w-]*)\]", text)
    return m.group(1) if m else text.strip()


def tensor_version(t: torch.Tensor) -> int | None:
    """The in-place version counter, or None where torch keeps none (inference-mode tensors, and
    views of them, which read a constant 0)."""
    if t.is_inference():
        return None
    try:
        return int(t._version)
    except RuntimeError:
        return None


class StaleStateError(RuntimeError):
    """A leaf changed in place between the save request and the end of its lazy copy."""

    def __init__(self, name: str, before: int, after: int):
        super().__init__(
            f"{name!r} was changed in place (version {before} -> {after}) before its lazy staging copy "
            "was complete, so the checkpoint would not hold the state of its step; make the optimizer "
            "wait with saver.protect(optimizer), or call handle.wait_staged() before changing the state"
        )
        self.name = name


def leaf_version(lf: TensorLeaf) -> int | None:
    """A number that moves whenever the leaf's data is changed in place, or None if none does.

    A DTensor's in-place operations bump the DTensor's own counter, not that of the local tensor
    its data lives in, while an in-place change through ``to_local()`` bumps only the latter: the
    sum of both moves with either (each counter only grows)."""
    if isinstance(lf.local, np.ndarray):
        return None
    v = tensor_version(lf.local)
    if v is None:
        return None
    if isinstance(lf.holder, torch.Tensor):  # a DTensor
        h = tensor_version(lf.holder)
        if h is None:
            return None
        v += h
    return v


def split_lazy(leaves: list[TensorLeaf]) -> tuple[list[TensorLeaf], list[TensorLeaf], dict[tuple[str, int], int]]:
    """(copied now, copied behind the loop, version of each of the latter at the request).

    A leaf goes behind the loop only when a change to it can be seen: a torch tensor with a
    version counter; numpy arrays and inference-mode tensors are copied now, and so are small
    leaves (see :data:`LAZY_MIN_BYTES`)."""
    now: list[TensorLeaf] = []
    later: list[TensorLeaf] = []
    versions: dict[tuple[str, int], int] = {}
    for lf in leaves:
        x = lf.local
        v = leaf_version(lf)
        if v is None or x.numel() * x.element_size() < LAZY_MIN_BYTES:
            now.append(lf)
        else:
            later.append(lf)
            versions[lf.ident] = v
    return now, later, versions


def unguarded() -> str | None:
    """Why the copy-first guard could not see a change on this thread after the save returns, or
    None when it can. Where it cannot, a lazy save copies every leaf before returning (eager),
    since a change it cannot see would tear the checkpoint."""
    if not torch._C._is_torch_function_enabled():
        return "torch functions are disabled on this thread (torch._C.DisableTorchFunction)"
    compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    if compiling is not None and compiling():
        return "the save is being traced by torch.compile"
    return None


IN_PLACE_DUNDERS = frozenset(
    {"__setitem__", "__set__", "__iadd__", "__isub__", "__imul__", "__idiv__", "__itruediv__", "__ifloordiv__",
     "__imod__", "__ipow__", "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__", "__imatmul__"}
)  # fmt: skip
# in-place without a trailing underscore: batch norm's running statistics change inside its kernel
MUTATING_NAMES = frozenset(
    {"batch_norm", "instance_norm", "native_batch_norm", "_native_batch_norm_legit", "_batch_norm_impl_index",
     "set_", "share_memory_", "copy_", "resize_", "put_"}
)  # fmt: skip
ESCAPING_NAMES = frozenset({"numpy", "__array__", "data_ptr", "untyped_storage", "storage", "_typed_storage",
                            "__dlpack__", "__array_interface__", "to_dlpack"})  # fmt: skip
# keywords that make a torch function write its tensor arguments (``F.relu(x, inplace=True)``,
# ``F.embedding(..., max_norm=1.0)`` renormalises the weight rows it reads)
MUTATING_KWARGS = ("inplace", "max_norm")
# calls that run code the mode cannot see (autograd hooks, an optimizer stepped in backward) on
# tensors they are not given: every leaf still being copied is watched across them
OPAQUE_NAMES = frozenset({"backward", "grad", "_engine_run_backward"})


# torch.distributed's collectives write their tensors in C++: no torch function sees the call and
# no version counter moves. Copy-first covers them by name (the argument each one writes: a
# position and a keyword), through wrappers put on ``torch.distributed`` by the first lazy save.
C10D_WRITES: dict[str, tuple[int, str]] = {
    "all_reduce": (0, "tensor"),
    "all_reduce_coalesced": (0, "tensors"),
    "broadcast": (0, "tensor"),
    "reduce": (0, "tensor"),
    "all_gather": (0, "tensor_list"),
    "all_gather_into_tensor": (0, "output_tensor"),
    "_all_gather_base": (0, "output_tensor"),
    "all_gather_coalesced": (0, "output_tensor_lists"),
    "reduce_scatter": (0, "output"),
    "reduce_scatter_tensor": (0, "output"),
    "_reduce_scatter_base": (0, "output"),
    "all_to_all": (0, "output_tensor_list"),
    "all_to_all_single": (0, "output"),
    "scatter": (0, "tensor"),
    "gather": (1, "gather_list"),
    "recv": (0, "tensor"),
    # irecv stays unwrapped: P2POp accepts only the function object torch.distributed defines
    "batch_isend_irecv": (0, "p2p_op_list"),  # the receiving ops' tensors
    "_broadcast_coalesced": (1, "tensors"),  # DDP's buffer broadcast
}
_c10d_lock = threading.Lock()
_c10d_guarded = False


def _written_by_c10d(name: str, args: tuple, kwargs: dict) -> list:
    pos, key = C10D_WRITES[name]
    arg = args[pos] if len(args) > pos else kwargs.get(key)
    if name == "batch_isend_irecv":
        recv = getattr(torch.distributed, "irecv", None)
        return [op.tensor for op in arg or () if getattr(op, "op", None) is recv]
    return _tensors(arg, [])


@torch.compiler.disable
def _copy_first_c10d(name: str, args: tuple, kwargs: dict) -> None:
    me = threading.get_ident()
    modes = [torch._C._get_function_stack_at(i) for i in range(torch._C._len_torch_function_stack())]
    for m in modes:
        if isinstance(m, CopyFirst) and m.thread == me:
            m.before_write(_written_by_c10d(name, args, kwargs))


def _c10d_wrapper(name: str, fn: Any) -> Any:
    # wraps: the original's module and name, so it pickles by reference as the original did (a
    # partial of it sent to mp.spawn): the lookup finds the wrapper
    @functools.wraps(fn)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        if torch._C._len_torch_function_stack():
            _copy_first_c10d(name, args, kwargs)
        return fn(*args, **kwargs)

    guarded._goodput_copy_first = True  # type: ignore[attr-defined]
    return guarded


def guard_collectives() -> None:
    """Put copy-first in front of ``torch.distributed``'s collectives that write a tensor (once a
    process; a call that no lazy copy concerns costs a look at the mode stack). Code that bound a
    collective's name before (``from torch.distributed import all_reduce``) calls it unguarded."""
    global _c10d_guarded
    if not torch.distributed.is_available():
        return
    with _c10d_lock:
        if _c10d_guarded:
            return
        import torch.distributed.distributed_c10d as c10d

        for name in C10D_WRITES:
            fn = getattr(torch.distributed, name, None)
            if fn is None or getattr(fn, "_goodput_copy_first", False):
                continue
            wrapped = _c10d_wrapper(name, fn)
            setattr(torch.distributed, name, wrapped)
            if getattr(c10d, name, None) is fn:
                setattr(c10d, name, wrapped)
        _c10d_guarded = True


def storage_key(t: Any) -> int | None:
    """The address of the memory ``t``'s data lives in (a DTensor's: its local tensor's), or None."""
    t = getattr(t, "_local_tensor", t)
    if not isinstance(t, torch.Tensor):
        return None
    try:
        st = t.untyped_storage()
        return st.data_ptr() if st.nbytes() else None
    except (RuntimeError, NotImplementedError):  # meta, fake or functional tensors hold no memory
        return None


def _tensors(x: Any, out: list) -> list:
    if isinstance(x, torch.Tensor):
        out.append(x)
    elif isinstance(x, (list, tuple)):
        for y in x:
            _tensors(y, out)
    elif isinstance(x, dict):
        for y in x.values():
            _tensors(y, out)
    return out


def mutates(func: Any, kwargs: dict) -> bool:
    """Whether a torch call may change (or hand out the memory of) any tensor it is given.

    Torch functions arrive here as the Python-level callables the user called, not as aten
    overloads: a method (``w.add_``), a ``torch.*`` builtin, or a Python function that forwards
    its tensors by keyword (``torch.nn.init.normal_(tensor=w)``, ``F.relu(w, inplace=True)``).
    The tensor a call writes is not always its first argument (``x.copy_(src)`` reads ``src``;
    ``torch._foreach_add_(params, grads)`` writes a list; ``out=`` writes a keyword), so a
    mutating call counts every tensor it was given: erring towards waiting for the copy costs a
    wait, erring the other way costs a torn checkpoint."""
    name = getattr(func, "__name__", "")
    if name == "__get__":  # a property: only ``.data`` is an alias with a counter of its own
        return getattr(func, "__self__", None) is torch.Tensor.data
    if kwargs.get("out") is not None or any(kwargs.get(k) not in (None, False) for k in MUTATING_KWARGS):
        return True
    if name in IN_PLACE_DUNDERS or name in ESCAPING_NAMES or name in MUTATING_NAMES:
        return True
    base = name.split(".")[0]
    if base.endswith("_") and not base.endswith("__"):
        return True
    schema = getattr(func, "_schema", None)  # an aten overload (torch.ops.aten.add_.Tensor)
    return bool(getattr(schema, "is_mutable", False))


def touched(func: Any, args: tuple, kwargs: dict) -> list:
    """The tensors a torch call may change or hand out (empty when it only reads), from its
    positional and keyword arguments, lists included: the calls copy-first staging makes wait
    when one of them shares memory with a leaf being copied."""
    if not mutates(func, kwargs):
        return []
    if getattr(func, "__name__", "") == "__get__":
        return _tensors(args[:1], [])
    return _tensors(args, _tensors(kwargs, []))


class CopyFirst(TorchFunctionMode):
    """Until ``copy`` is done, a torch call on this thread that may change the data of a tensor
    being copied (or hand its memory out) waits for it first (see the module's doc). Any other
    call given such a tensor (a forward pass reading a weight) goes on at once, watched: when
    it returns, each of its tensors whose copy had not ended when it started is checked
    against its version counter, and a change fails the save naming the leaf (:meth:`settle`,
    which the copy runs before the write, waits for watched calls still running). Calls on
    other tensors (activations changed in place, small leaves already copied) go on at once.

    Pushed by the lazy save on the thread that asked for it, under every mode of the caller's
    (the default device's excepted, which insists on the bottom), so that leaving a
    ``with`` block of the caller's pops the caller's mode; inert once the copy is done;
    removed by :meth:`retire` on that thread (the saver's next call, a protected optimizer
    step, ``wait_staged``) wherever it is in the stack."""

    def __init__(self, wait: Any, done: threading.Event, leaves: list[TensorLeaf]) -> None:
        super().__init__()
        self._wait = wait
        self._done = done
        self._leaves = leaves
        self._by_key: dict[int, list[int]] = {}
        # known before the copy starts: the copy's side must not make torch calls this mode sees
        self._leaf_keys = [storage_key(lf.local) for lf in leaves]
        for i, k in enumerate(self._leaf_keys):
            if k is not None:
                self._by_key.setdefault(k, []).append(i)
        self._keys = set(self._by_key)
        self._open: dict[int, int] = {k: len(v) for k, v in self._by_key.items()}  # leaves still copying
        self._cv = threading.Condition()
        self._watching: list[list] = []  # the watches of the calls in progress
        self._closed = False
        self._torn: StaleStateError | None = None
        self.thread = threading.get_ident()
        self.waited = 0  # calls that waited for the copy (tests, the bench)
        self.watched = 0  # calls that went on, watched

    # -- the copy's side
    def leaf_done(self, i: int) -> None:
        """Leaf ``i`` of the save is copied: a call that starts from now on cannot tear it."""
        k = self._leaf_keys[i]
        with self._cv:
            if k in self._open:
                self._open[k] -= 1
                if self._open[k] <= 0:
                    del self._open[k]

    def copied(self) -> None:
        """The copy is complete: nothing waits for it any longer."""
        self._done.set()

    def close(self) -> None:
        """No call is watched from now on (the copy ended, or failed)."""
        with self._cv:
            self._closed = True
            self._open.clear()

    def settle(self) -> None:
        """Once the copy is complete: wait for the watched calls still running (each started
        before a copy it may have changed ended), then fail if one changed a leaf."""
        with self._cv:
            self._closed = True
            self._open.clear()
            while self._watching:
                self._cv.wait()
            if self._torn is not None:
                raise self._torn

    # -- the training thread's side
    # Dynamo must not trace the guard: its branches follow the copy's progress on another thread, so a
    # re-trace diverged (SpeculationLogDivergence in the user's compiled step); each torch call a
    # compiled region makes during the copy goes through it eagerly instead (a graph break)
    @torch.compiler.disable
    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if self._done.is_set() or self._closed:
            return func(*args, **kwargs)
        given = _tensors(args, _tensors(kwargs, []))
        name = getattr(func, "__name__", "")
        opaque = name in OPAQUE_NAMES
        hits = [(t, k) for t in given if (k := storage_key(t)) in self._keys]
        if not hits and not opaque:
            return func(*args, **kwargs)
        if hits and (mutates(func, kwargs) or any(tensor_version(t) is None for t, _ in hits)):
            if any(k in self._open for _, k in hits):  # a leaf whose copy has ended cannot tear
                self.waited += 1
                self._wait()
            return func(*args, **kwargs)
        with self._cv:  # func runs outside: it may take long, or wait for another rank
            watch = [] if self._closed else [(t, k, tensor_version(t)) for t, k in hits if k in self._open]
            if opaque and not self._closed:  # every leaf still being copied, by its own counter
                watch += [(lf, k, leaf_version(lf)) for k, idx in self._by_key.items() if k in self._open
                          for lf in (self._leaves[i] for i in idx)]  # fmt: skip
            if watch:
                self._watching.append(watch)
                self.watched += 1
        if not watch:
            return func(*args, **kwargs)
        try:
            return func(*args, **kwargs)
        finally:
            self._after(watch)

    def before_write(self, tensors: list) -> None:
        """A call torch functions do not see is about to write ``tensors`` (a collective): wait
        for the copy first when one of them shares memory with a leaf still being copied."""
        if self._done.is_set() or self._closed:
            return
        if any(storage_key(t) in self._open for t in tensors):
            self.waited += 1
            self._wait()

    def _after(self, watch: list) -> None:
        with self._cv:
            if any(w is watch for w in self._watching):  # else judged by caught_up already
                self._judge([watch])

    def _judge(self, watches: list[list]) -> None:
        """Compare each watched tensor's counter now with the one before its call; end those watches."""
        try:
            for watch in watches:
                for x, k, before in watch:
                    after = leaf_version(x) if isinstance(x, TensorLeaf) else tensor_version(x)
                    if after != before and self._torn is None:
                        name = self._leaves[self._by_key[k][0]].name
                        self._torn = StaleStateError(
                            name, -1 if before is None else before, -1 if after is None else after
                        )
        finally:
            ids = {id(w) for w in watches}
            self._watching = [w for w in self._watching if id(w) not in ids]
            self._cv.notify_all()

    def caught_up(self) -> None:
        """This thread has waited for the copy, which is complete, from inside watched calls (an
        optimizer stepped in ``backward`` whose ``protect`` hook waited): a change they made
        before now may have met the copy and fails the save; one this thread makes from now on
        comes after it. So they are judged now and watched no longer, and a protected step in
        backward does not fail the save."""
        if threading.get_ident() != self.thread or not self._done.is_set():
            return
        with self._cv:
            if self._watching:
                self._judge(list(self._watching))

    # -- the mode stack
    def push(self) -> None:
        """Put this mode under the caller's modes: a mode the caller entered before the save and
        leaves after it must still be the one its ``__exit__`` pops (torch's
        ``set_default_device`` moves its mode to the bottom the same way)."""
        guard_collectives()
        above = [torch._C._pop_torch_function_stack() for _ in range(torch._C._len_torch_function_stack())]
        above.reverse()  # bottom first
        # the default device's context (set_default_device) must stay at the bottom: its exit
        # checks that it is; ``with torch.device(...)`` pushes and pops at the top like any mode
        keep = 1 if above and above[0] is getattr(torch._GLOBAL_DEVICE_CONTEXT, "device_context", None) else 0
        for m in above[:keep]:
            torch._C._push_on_torch_function_stack(m)
        torch._C._push_on_torch_function_stack(self)
        for m in above[keep:]:
            torch._C._push_on_torch_function_stack(m)

    def retire(self) -> bool:
        """Take this mode out of this thread's stack, wherever it is, if the copy is done;
        whether it is gone. Every other mode keeps its place."""
        if threading.get_ident() != self.thread or not self._done.is_set():
            return False
        self.caught_up()
        n = torch._C._len_torch_function_stack()
        if not any(torch._C._get_function_stack_at(i) is self for i in range(n)):
            # not there: called from inside this mode's own call (torch takes a mode off the
            # stack while it handles one, and puts it back after): the next retire takes it
            return False
        above = []
        while True:
            m = torch._C._pop_torch_function_stack()
            if m is self:
                break
            above.append(m)
        for m in reversed(above):
            torch._C._push_on_torch_function_stack(m)
        return True


class _Unit:
    """One leaf's copy, cut along its first dimension (flat bytes when it is contiguous)."""

    __slots__ = ("dst", "index", "n", "src", "step", "torch_copy", "total")

    def __init__(self, index: int, dst: Any, src: Any, step: int, total: int, torch_copy: bool):
        self.index, self.dst, self.src, self.step, self.total = index, dst, src, max(1, step), total
        self.torch_copy = torch_copy
        self.n = -(-total // self.step)

    def copy(self, k: int) -> None:
        a = k * self.step
        b = min(a + self.step, self.total)
        if self.torch_copy:
            self.dst[a:b].copy_(self.src[a:b])
        else:
            np.copyto(self.dst[a:b], self.src[a:b], casting="no")


class CopyJob:
    """Chunks that any number of threads work through together; the first error stops the rest."""

    def __init__(self, units: list[_Unit], on_leaf: Any = None):
        self._units = [u for u in units if u.n > 0]
        self._on_leaf = on_leaf
        self._lock = threading.Lock()
        self._u = 0
        self._k = 0
        self._left = [u.n for u in self._units]
        self._total = self.chunks = sum(self._left)
        self._copied = 0
        self._running = 0
        self._done = threading.Event()
        self.error: BaseException | None = None
        if not self._units:
            self._done.set()

    def _take(self) -> tuple[_Unit, int, int] | None:
        with self._lock:
            if self.error is not None:
                return None
            while self._u < len(self._units) and self._k >= self._units[self._u].n:
                self._u += 1
                self._k = 0
            if self._u == len(self._units):
                return None
            t = (self._units[self._u], self._u, self._k)
            self._k += 1
            self._running += 1
            return t

    def work(self) -> None:
        """Copy chunks until none is left (any thread may call it, any number of times)."""
        while (t := self._take()) is not None:
            unit, u, k = t
            err = None
            try:
                unit.copy(k)
                with self._lock:
                    self._left[u] -= 1
                    self._copied += 1
                    last = self._left[u] == 0
                if last and self._on_leaf is not None:
                    self._on_leaf(unit.index)
            except BaseException as e:  # noqa: BLE001 - handed to the waiter
                err = e
            with self._lock:
                if err is not None and self.error is None:
                    self.error = err
                self._running -= 1
                finished = self._running == 0 and (self.error is not None or self._copied == self._total)
            if finished:
                self._done.set()
            if err is not None and not isinstance(err, Exception):
                # a Ctrl-C (KeyboardInterrupt, SystemExit) on a thread lending itself to the copy
                # (a protected step waiting for a lazy copy) fails the copy, and must also stop
                # that thread as itself: recorded only, it was swallowed and training went on.
                # The other threads' chunks end first, so nothing writes into the buffer after
                self._done.wait()
                raise err

    def wait(self) -> None:
        self._done.wait()
        if self.error is not None:
            raise self.error


class _Copier:
    """Persistent helper threads: starting threads per save would cost more than small copies."""

    def __init__(self, threads: int):
        self.threads = threads
        self._cv = threading.Condition()
        self._queue: list[list[Any]] = []  # [job, helpers still wanted]
        for i in range(threads - 1):
            threading.Thread(target=self._serve, name=f"goodput-stage-{i}", daemon=True).start()

    def submit(self, job: CopyJob, helpers: int) -> None:
        helpers = min(helpers, self.threads - 1)
        if helpers <= 0:
            return
        with self._cv:
            self._queue.append([job, helpers])
            self._cv.notify(helpers)

    def _serve(self) -> None:
        while True:
            with self._cv:
                while not self._queue:
                    self._cv.wait()
                entry = self._queue[0]
                entry[1] -= 1
                if entry[1] == 0:
                    self._queue.pop(0)
            entry[0].work()


_copier: _Copier | None = None
_copier_lock = threading.Lock()


def copier() -> _Copier:
    global _copier
    with _copier_lock:
        if _copier is None:
            _copier = _Copier(usable_cpus())
        return _copier


def _forget_copier() -> None:
    global _copier, _copier_lock
    _copier, _copier_lock = None, threading.Lock()  # a forked child has the object, not the threads


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_copier)


def _host_unit(index: int, view: np.ndarray, x: torch.Tensor | np.ndarray, s: Slot) -> _Unit:
    """How one host (or non-CUDA device) leaf is copied into its slot ``view``."""
    if isinstance(x, np.ndarray):
        if x.flags.c_contiguous:
            return _Unit(index, view, x.reshape(-1).view(np.uint8), CHUNK, s.nbytes, False)
        dst = view.view(x.dtype).reshape(s.shape)
        return _Unit(index, dst, x, CHUNK // max(1, s.nbytes // x.shape[0]), x.shape[0], False)
    if x.device.type == "cpu" and x.is_contiguous() and not (x.is_conj() or x.is_neg()):
        with contextlib.suppress(RuntimeError):  # odd strides on size-1 dims: copy_ below
            return _Unit(index, view, x.reshape(-1).view(torch.uint8).numpy(), CHUNK, s.nbytes, False)
    dst = torch.from_numpy(view).view(x.dtype).view(s.shape)
    src = x
    if x.dim() == 0:
        dst, src = dst.reshape(1), x.reshape(1)
    rows = src.shape[0]
    step = CHUNK // max(1, s.nbytes // rows) if x.device.type == "cpu" else rows
    return _Unit(index, dst, src, step, rows, True)


class StageJob:
    """One save's copy into the buffer; :meth:`run` does it, :meth:`help` lends it a thread."""

    def __init__(
        self,
        pool: StagingPool,
        leaves: list[TensorLeaf],
        slots: dict[tuple[str, int], Slot],
        versions: dict[tuple[str, int], int] | None = None,
        ready: Any = None,
        guard: CopyFirst | None = None,
    ):
        arr = pool.array
        assert arr is not None
        self._pool = pool
        self._leaves = leaves
        self._versions = versions
        self._ready = ready
        self._guard = guard
        self._cuda: list[tuple[torch.Tensor, TensorLeaf]] = []
        units = []
        for i, lf in enumerate(leaves):
            s = slots[lf.ident]
            if s.nbytes == 0:
                continue
            view = arr[s.offset : s.offset + s.nbytes]
            x = lf.local
            if isinstance(x, torch.Tensor) and x.device.type == "cuda":  # pragma: no cover - GPU machines
                self._cuda.append((torch.from_numpy(view).view(x.dtype).view(s.shape), lf))
                continue
            units.append(_host_unit(i, view, x, s))
        watched = versions is not None or guard is not None
        self.host = CopyJob(units, self._leaf_copied if watched else None)

    def _check(self, lf: TensorLeaf) -> None:
        assert self._versions is not None
        before = self._versions[lf.ident]
        after = leaf_version(lf)
        if after != before:
            raise StaleStateError(lf.name, before, -1 if after is None else after)

    def _leaf_copied(self, i: int) -> None:
        try:
            if self._versions is not None:
                self._check(self._leaves[i])
        finally:
            if self._guard is not None:
                self._guard.leaf_done(i)

    def help(self) -> None:
        """Copy on the calling thread until nothing is left. The caller is the training thread,
        where this save's :class:`CopyFirst` is pushed: the copy's own torch calls (slicing a
        leaf, ``copy_`` from it) must not meet it, or the copy would wait for itself."""
        with torch._C.DisableTorchFunction():
            self.host.work()

    def run(self, helpers: int | None = None, sync: bool = True) -> None:
        """Copy everything; returns when the copy is complete (the state may change then).
        ``helpers``: pool threads besides the caller (default: one per other usable core).
        ``sync=False``: device-to-host copies are only queued, with the training stream made to
        wait for them, so that no later kernel can change what they read; a later ``run`` (or
        :meth:`StagingPool.synchronize`) waits for them before the buffer is read."""
        try:
            self._run(helpers, sync)
        except BaseException:
            if self._guard is not None:
                self._guard.close()
            raise
        if self._guard is not None:
            # the copy is complete: the state may change from here on (a wait for the copy
            # inside a watched call returns), then the watched calls still running end
            self._guard.copied()
            self._guard.settle()

    def _run(self, helpers: int | None, sync: bool) -> None:
        if self._versions is not None:
            for lf in self._leaves:  # changed already: fail before copying anything
                self._check(lf)
        stream = None
        if self._cuda:  # pragma: no cover - GPU machines
            stream = self._issue_cuda()
        try:
            if self.host.chunks > 1:  # one chunk: waking a helper would cost more than it saves
                c = copier()
                c.submit(self.host, c.threads - 1 if helpers is None else helpers)
            self.host.work()
            self.host.wait()
        finally:
            if stream is not None and not sync:  # pragma: no cover - GPU machines
                torch.cuda.current_stream(self._cuda[0][1].local.device).wait_stream(stream)
            elif sync:
                self._pool.synchronize()
        if self._versions is not None:  # pragma: no cover - GPU machines
            for _, lf in self._cuda:
                self._check(lf)
        if self._guard is not None and sync:  # pragma: no cover - GPU machines
            for i, lf in enumerate(self._leaves):  # synchronized: their copies have ended
                if isinstance(lf.local, torch.Tensor) and lf.local.device.type == "cuda":
                    self._guard.leaf_done(i)

    def _issue_cuda(self) -> Any:  # pragma: no cover - GPU machines
        pool = self._pool
        dev = self._cuda[0][1].local.device
        if pool._stream is None:
            pool._stream = torch.cuda.Stream(device=dev)
        stream = pool._stream
        if self._ready is not None:
            stream.wait_event(self._ready)  # the training stream's work up to the request
        else:
            stream.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(stream):
            for dst, lf in self._cuda:
                dst.copy_(lf.local, non_blocking=pool.pinned)
        return stream


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
        self.hugepages = False
        self._stream: Any = None  # the side stream of device-to-host copies

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
            self.hugepages = self._advise_hugepages()
            self.array = np.ndarray((cap,), np.uint8, buffer=self.shm.buf)
        else:
            self.array = np.empty(cap, np.uint8)  # numpy itself asks for huge pages when this large
        self.array[:] = 0  # touch every page now, not during the first stall
        self.capacity = cap
        self.fresh = True
        self._pin()
        return self.array

    def _advise_hugepages(self) -> bool:
        """Ask for 2 MiB pages before the first touch: with 4 KiB pages a copy into shared memory
        walks page tables far more often than one into private memory (which numpy already backs
        with huge pages). The kernel honours it only where its shmem policy is not "never"."""
        m = getattr(self.shm, "_mmap", None)
        advice = getattr(mmap, "MADV_HUGEPAGE", None)
        if m is None or advice is None or shmem_hugepages() in ("never", "deny"):
            return False
        try:
            m.madvise(advice)
        except (OSError, ValueError):
            return False
        return True

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

    def job(
        self,
        leaves: list[TensorLeaf],
        slots: dict[tuple[str, int], Slot],
        versions: dict[tuple[str, int], int] | None = None,
        ready: Any = None,
        guard: CopyFirst | None = None,
    ) -> StageJob:
        """A copy to run later, possibly on another thread. With ``versions`` (leaf name -> version
        at the request) every leaf is checked after its copy and :class:`StaleStateError` raised if
        it changed; ``ready``: a CUDA event recorded on the requester's stream at the request."""
        return StageJob(self, leaves, slots, versions, ready, guard)

    def stage(self, leaves: list[TensorLeaf], slots: dict[tuple[str, int], Slot], sync: bool = True) -> None:
        """Copy every leaf into its slot; returns when the copy is complete (the state may change;
        with ``sync=False`` device-to-host copies may still run, see :meth:`StageJob.run`)."""
        self.job(leaves, slots).run(sync=sync)

    def synchronize(self) -> None:
        """Wait for device-to-host copies queued by ``stage(..., sync=False)``."""
        if self._stream is not None:  # pragma: no cover - GPU machines
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
