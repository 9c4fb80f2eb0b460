"""load: the entry point of the load path; fill a state dict in place from a checkpoint, and verify.

What each rank reads is decided by the layout of the tensors it passes, whatever layout the
checkpoint was saved with: the metadata (:mod:`goodput.ckpt.loading.reader`) is intersected with the
requested regions into a read plan (:mod:`goodput.ckpt.loading.read_plan`), which is executed with
bounded memory and every block checksum verified (:mod:`goodput.ckpt.loading.read_exec`). Targets that
cannot be read into directly go through :mod:`goodput.ckpt.loading.load_staging`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import torch

from .. import collective
from ..collective import name_ranks
from ..dcp_compat import check_planner, location
from ..errors import CheckpointError, StorageError, describe, rank_errors
from ..format.dtypes import DTYPES
from ..format.dtypes import dtype as dtype_info
from ..format.format import MAX_VALUE_DEPTH, decode_value, value_repr
from ..state import TensorLeaf, dest_bytes, expand_stateful, flatten, materialize_meta
from ..storage.base import Storage
from ..storage.location import checkpoint_path, display, storage_for
from .load_staging import default_staging, staging_like, staging_rounds
from .read_exec import DEFAULT_READ_BUFFER, ReadStats
from .read_plan import Request
from .reader import Checkpoint

log = logging.getLogger(__name__)
UNLOADED_NAMED = 10  # a warning names this many of the entries a load left in the checkpoint


@dataclass
class LoadResult:
    path: Path
    step: int | None
    stats: ReadStats
    timings: dict[str, float] = field(default_factory=dict)
    # saved entries under a dict the state dict holds (not its top level) that the dict lacks:
    # left in the checkpoint, so reported (a warning) rather than dropped in silence
    unloaded: list[str] = field(default_factory=list)
    # the other direction: entries of the state dict the checkpoint lacks, left as they were.
    # Only a non-strict load gets this far with any (a strict one raises); listed, and warned
    # of, so that ``strict=False`` for one known gap does not hide every other one. A target
    # tied to one that loaded (the same tensor under two names) was filled and is not listed.
    missing: list[str] = field(default_factory=list)


def load(
    state_dict: dict[str, Any],
    path: str | os.PathLike | None = None,
    *,
    checkpoint_id: str | os.PathLike | None = None,
    storage_reader: Any = None,
    planner: Any = None,
    process_group: Any = None,
    verify: bool = True,
    read_buffer: int = DEFAULT_READ_BUFFER,
    threads: int | None = None,
    strict: bool = True,
    allow_partial_load: bool = False,
    strict_dtype: bool = False,
    no_dist: bool = False,
    use_collectives: bool = True,
    max_amplification: float = 1.1,
    staging_bytes: int | None = None,
    storage: Storage | None = None,
) -> LoadResult:
    """Fill ``state_dict`` in place from the checkpoint at ``path``.

    What each rank reads is decided by the layout of the tensors it passes (DTensor placements,
    LocalShard/FlatShard declarations, or whole tensors), whatever layout the checkpoint was
    saved with. Reads are coalesced across gaps while the bytes read stay within
    ``max_amplification`` × the bytes needed (raise it for fewer, larger reads).

    As in DCP: the load ends in a collective on the group when one exists (code written for DCP
    removes the checkpoint right after ``load`` returns on any rank), which also makes a failure
    on one rank an error on every rank; ``no_dist=True`` or ``use_collectives=False`` skips it.
    A tensor saved in another dtype is cast into the target's unless ``strict_dtype=True``.
    Stateful values are filled through their ``state_dict()`` and handed the result by
    ``load_state_dict()``; an ``io.BytesIO`` is refilled with the saved bytes; a meta-device
    tensor is replaced in its dict by a real one, then filled (DCP does the same). ``strict=False``
    (or ``allow_partial_load=True``, or DCP's ``DefaultLoadPlanner(allow_partial_load=True)``)
    skips what the checkpoint lacks, naming it in the result's ``missing`` and a warning.
    A floating tensor is never cast into an integer or bool target, nor a complex one into a
    real target (the values would be truncated in silence): refused, naming the tensor.

    Tied weights: a target the checkpoint lacks that is the same tensor as one it holds (the
    same memory seen the same way: one Parameter under two names, as ``lm_head.weight`` and
    ``embed_tokens.weight`` with ``tie_word_embeddings``, which ``save_pretrained`` writes
    once) is filled by that one's load, and is not missing, strict or not.

    ``path`` may also be a Hugging Face checkpoint directory (``*.safetensors``, with
    ``model.safetensors.index.json`` when sharded): its tensors load into any layout the same
    way, each rank reading only the byte ranges its shards need (:mod:`goodput.ckpt.loading.hf`).

    Tensors with no writable contiguous host memory (non-contiguous views, CUDA tensors) are
    filled through one reused staging buffer of ``staging_bytes`` (default
    ``min(64 MiB, max(read_buffer // 4, 1 MiB))``), piece by piece, so that a load's host memory
    stays within the targets plus ``read_buffer`` plus ``staging_bytes``, however large they are.

    ``storage``: where the checkpoint's files are read from, when not where ``path`` says (a
    tiered restore reads each file from the fastest tier that holds it, :mod:`goodput.ckpt.saving.tiers`).
    """
    path = checkpoint_path(location(path, checkpoint_id, storage_reader, "storage_reader"), None)
    if check_planner(planner, "load") or allow_partial_load:
        strict = False
    group = collective.LOCAL if no_dist else process_group
    error: BaseException | None = None
    result: LoadResult | None = None
    expanded, statefuls = state_dict, []
    try:
        expanded, statefuls = expand_stateful(state_dict)
        if threads is None:  # the storage's own parallelism: 4 on a file system, more on S3
            threads = (storage or storage_for(path)).read_threads
        result = _load(
            expanded,
            path,
            verify,
            read_buffer,
            threads,
            strict,
            strict_dtype,
            max_amplification,
            staging_bytes,
            storage,
        )
    except Exception as e:  # every rank hears of it below, or this rank raises it alone
        error = e
    if use_collectives and collective.world(group)[1] > 1:
        rank, _ = collective.world(group)
        mine = msgspec.msgpack.encode({"rank": rank, "error": describe(error) if error else None})
        reports = [msgspec.msgpack.decode(b) for b in collective.all_gather_bytes(mine, group)]
        if error is None:
            errs = rank_errors(reports)
            if errs:
                raise CheckpointError(name_ranks(f"load from {display(path)!r} failed on other ranks: {errs}", group))
    if error is not None:
        raise error
    assert result is not None
    # as DCP, once every rank has read: each top-level value goes back into the caller's dict
    # (filled in place, or replaced where a value was), and each Stateful gets its filled dict
    # through its own load_state_dict, in key order (they may run collectives)
    stateful_keys = {id(s.obj) for s in statefuls}
    for k in list(state_dict):
        if id(state_dict[k]) not in stateful_keys:
            state_dict[k] = expanded[k]
    for s in statefuls:
        try:
            s.obj.load_state_dict(s.state)
        except Exception as e:  # its own exception, as raised, named (see expand_stateful)
            e.add_note(f"goodput: raised by the load_state_dict() of {str(s.key)!r} ({type(s.obj).__name__})")
            raise
    return result


def _load(
    state_dict: dict[str, Any],
    path: Path,
    verify: bool,
    read_buffer: int,
    threads: int,
    strict: bool,
    strict_dtype: bool,
    max_amplification: float,
    staging_bytes: int | None,
    storage: Storage | None = None,
) -> LoadResult:
    t0 = time.perf_counter()
    if staging_bytes is not None and not (isinstance(staging_bytes, int) and staging_bytes > 0):
        raise ValueError(f"staging_bytes must be a positive int, got {staging_bytes!r}")
    piece_cap = staging_bytes if staging_bytes is not None else default_staging(read_buffer)
    ck = open_for_load(path, storage)
    materialize_meta(state_dict)
    leaves, value_leaves = flatten(state_dict)
    saved = {t.name: t for t in ck.metadata.tensors}
    requests: list[Request] = []
    staged: list[TensorLeaf] = []
    blobs: list[TensorLeaf] = []
    absent: list[TensorLeaf] = []  # targets the checkpoint lacks: tied to a loaded one, or missing
    present: list[TensorLeaf] = []  # targets a saved tensor fills
    for lf in leaves:
        t = saved.get(lf.name)
        if t is None:
            if lf.name in ck.metadata.values:
                raise CheckpointError(
                    f"{lf.name!r} was saved as a value ({value_repr(ck.metadata.values[lf.name])}), not a tensor"
                )
            absent.append(lf)
            continue
        present.append(lf)
        if lf.kind == "bytes":
            if t.kind != "bytes":
                raise CheckpointError(f"{lf.name!r} was saved as a tensor, the state dict holds an io.BytesIO")
            blobs.append(lf)
            continue
        if tuple(t.shape) != tuple(lf.global_shape):
            raise CheckpointError(
                f"tensor {lf.name!r}: saved with global shape {tuple(t.shape)}, loading into {tuple(lf.global_shape)}"
            )
        if lf.region.numel == 0:
            continue
        if t.dtype != lf.dtype:
            why = "strict_dtype=True" if strict_dtype else cast_refusal(t.dtype, lf)
            if why is not None:
                raise CheckpointError(f"tensor {lf.name!r}: saved as {t.dtype}, loading into {lf.dtype} ({why})")
            staged.append(dataclasses.replace(lf, dtype=t.dtype))  # read as saved, cast into the target
            continue
        dest = dest_bytes(lf.local)
        if dest is None:
            staged.append(lf)
        else:
            requests.append(Request(lf.name, lf.region, dest))
    missing: set[str] = set()
    filled = {alias_key(lf) for lf in present} - {None} if absent else set()
    for lf in absent:
        if lf.kind != "bytes" and alias_key(lf) in filled:
            continue  # tied: the same memory, seen the same way, as a target that loads
        if strict:
            raise CheckpointError(
                f"tensor {lf.name!r} is not in the checkpoint at {display(path)!r} ({_near(lf.name, saved)})"
            )
        missing.add(lf.name)
    in_tuples: dict[int, tuple[str, dict[int, Any]]] = {}  # id(tuple) -> (its name, {index: new value})
    for v in value_leaves:
        if v.name not in ck.metadata.values:
            if v.name in saved:
                raise CheckpointError(
                    f"{v.name!r} was saved as a tensor, the state dict holds a {type(v.value).__name__}"
                )
            if strict:
                raise CheckpointError(f"value {v.name!r} is not in the checkpoint at {display(path)!r}")
            missing.add(v.name)
            continue
        new = restore_like(decode_value(ck.metadata.values[v.name], v.name, ck.metadata.version), v.value)
        if isinstance(v.parent, tuple):  # immutable: the whole tuple is rebuilt in its parent, below
            in_tuples.setdefault(id(v.parent), (v.name.rpartition(".")[0], {}))[1][v.key] = new
            continue
        v.parent[v.key] = new
    if in_tuples:
        _rebuild_tuples(state_dict, in_tuples)
    rounds = staging_rounds(staged, piece_cap)
    buf = staging_like(staged, max((p.end for r in rounds for p in r), default=0))
    stats = ReadStats()
    for i, pieces in enumerate(rounds or [[]]):  # direct requests ride with the first round
        reqs = (requests if i == 0 else []) + [
            Request(p.leaf.name, p.region, buf.bytes[p.offset : p.end]) for p in pieces
        ]
        got = ck.read_into(
            reqs, verify=verify, read_buffer=read_buffer, threads=threads, max_amplification=max_amplification
        )
        stats.add(**got.as_dict())
        buf.copy_out(pieces)
    for lf in blobs:
        data = ck.read(lf.name, raw=True, verify=verify, read_buffer=read_buffer, threads=threads)
        holder = lf.holder
        holder.seek(0)
        holder.truncate()
        holder.write(data.tobytes())
        holder.seek(0)
    loaded = {lf.name for lf in leaves} | {v.name for v in value_leaves}
    # the Checkpointer's own entries (its reserved key, per saved rank) are left by design on a
    # resume with fewer ranks: the other ranks' RNG and loader state, which no rank here takes
    unloaded = unloaded_entries(
        state_dict, loaded, [n for n in (*saved, *ck.metadata.values) if not n.startswith(CHECKPOINTER_KEY + ".")]
    )
    if unloaded:
        log.warning(
            "load from %r left %d saved entr%s that the state dict's dicts lack: %s%s (as DCP, a load fills "
            "only what the state dict holds: add the keys to load them)",
            display(path),
            len(unloaded),
            "y" if len(unloaded) == 1 else "ies",
            ", ".join(unloaded[:UNLOADED_NAMED]),
            ", ..." if len(unloaded) > UNLOADED_NAMED else "",
        )
    if missing:
        log.warning(
            "load from %r (strict=False) left %d entr%s of the state dict that the checkpoint lacks as they were: "
            "%s%s (listed in the result's missing)",
            display(path),
            len(missing),
            "y" if len(missing) == 1 else "ies",
            ", ".join(sorted(missing)[:UNLOADED_NAMED]),
            ", ..." if len(missing) > UNLOADED_NAMED else "",
        )
    return LoadResult(path, ck.step, stats, {"total_s": time.perf_counter() - t0}, unloaded, sorted(missing))


def alias_key(lf: TensorLeaf) -> tuple | None:
    """What makes two targets one tensor (tied weights): the same memory, seen the same way
    (address, storage offset, shape, strides, dtype, conjugate/negative bits: for a DTensor,
    its local tensor), holding the same part of the same global shape. Filling one then fills
    the other. ``module.state_dict()`` detaches each name separately, so one Parameter under
    two names is two tensor objects there: identity would not see the tie, the memory does.
    Sharing storage is not enough (a transposed view, a row of it is another tensor), and
    equal values are not either. None where no memory can be named (no storage, a wrapper
    subclass): such a target is never taken for tied."""
    if lf.kind == "bytes":
        return None  # the leaf holds a copy of the BytesIO's bytes, not its memory
    x = lf.local
    if isinstance(x, np.ndarray):
        ptr = int(x.__array_interface__["data"][0])
        view: tuple = ("numpy", ptr, x.shape, x.strides, x.dtype.str)
    else:
        try:
            ptr = x.untyped_storage().data_ptr()
            view = (
                str(x.device),
                ptr,
                x.storage_offset(),
                tuple(x.shape),
                x.stride(),
                x.dtype,
                x.is_conj(),
                x.is_neg(),
            )
        except (RuntimeError, NotImplementedError, TypeError):
            return None
    if not ptr:
        return None  # no memory at all: two empty tensors are not one
    return (tuple(lf.global_shape), lf.region, view)


CHECKPOINTER_KEY = "_goodput"  # the Checkpointer's reserved top-level key (its per-rank RNG and loader state)


def unloaded_entries(state_dict: dict[str, Any], loaded: set[str], saved: list[str]) -> list[str]:
    """Saved names below a dict of the state dict, other than the top level, that no leaf took.

    Left out at the top level is a partial load (the model alone from a checkpoint that also
    holds the optimizer) and is not reported. Left out below, in a dict the caller passed, is
    state the caller's dict did not know of: a Stateful data loader's state built fresh with no
    entries for the shards it had read, a counter keyed by name. DCP drops those in silence."""
    dicts: set[str] = set()
    stack: list[tuple[str, Any, int]] = [(str(k), v, 1) for k, v in state_dict.items()]
    while stack:
        name, v, depth = stack.pop()
        if isinstance(v, dict) and depth <= MAX_VALUE_DEPTH:
            dicts.add(name)
            stack.extend((f"{name}.{k}", x, depth + 1) for k, x in v.items())
    if not dicts:
        return []
    out = []
    for n in saved:
        if n in loaded:
            continue
        i = n.find(".")
        while i > 0:
            if n[:i] in dicts:
                out.append(n)
                break
            i = n.find(".", i + 1)
    return sorted(out)


def restore_like(new: Any, old: Any) -> Any:
    """``new`` (a value as the checkpoint decodes it) in the type of ``old`` (what the state dict
    held) where the format does not record the type but the target does: a namedtuple (saved as
    a tuple), an ``np.str_`` or ``np.bytes_`` (saved as str, bytes), a ``bytearray``; inside
    lists, tuples and dicts of the same shape too. Anything else is ``new`` as decoded."""
    if isinstance(old, np.str_) and type(new) is str:
        return np.str_(new)
    if isinstance(old, np.bytes_) and type(new) is bytes:
        return np.bytes_(new)
    if isinstance(old, bytearray) and type(new) is bytes:
        return bytearray(new)
    if isinstance(old, tuple) and type(new) is tuple and len(old) == len(new):
        items = [restore_like(n, o) for n, o in zip(new, old)]
        return type(old)._make(items) if _is_namedtuple(old) else tuple(items)
    if isinstance(old, list) and type(new) is list and len(old) == len(new):
        return [restore_like(n, o) for n, o in zip(new, old)]
    if isinstance(old, dict) and type(new) is dict:
        return {k: restore_like(x, old[k]) if k in old else x for k, x in new.items()}
    return new


def _is_namedtuple(x: Any) -> bool:
    return isinstance(x, tuple) and hasattr(type(x), "_fields") and hasattr(type(x), "_make")


def _rebuild_tuples(root: dict[str, Any], pending: dict[int, tuple[str, dict[int, Any]]]) -> None:
    """Put loaded values into the tuples that hold them (a tuple beside an array, as
    ``np.random.get_state()``: the array is filled in place, its scalars are values): each such
    tuple, and every tuple above it, is replaced by a new one of the same type in the nearest
    mutable container, as DCP's load replaces what it cannot fill in place."""

    def rebuilt(x: Any) -> Any:
        if isinstance(x, dict):
            for k, v in list(x.items()):
                new = rebuilt(v)
                if new is not v:
                    x[k] = new
            return x
        if isinstance(x, list):
            for i, v in enumerate(x):
                new = rebuilt(v)
                if new is not v:
                    x[i] = new
            return x
        if not isinstance(x, tuple):
            return x
        name, repl = pending.get(id(x), ("", {}))
        items = [repl[i] if i in repl else rebuilt(v) for i, v in enumerate(x)]
        if all(a is b for a, b in zip(items, x)):
            return x
        if type(x) is tuple:
            return tuple(items)
        if _is_namedtuple(x):
            return type(x)._make(items)
        raise CheckpointError(
            f"{name!r}: a {type(x).__qualname__} (a tuple subclass) holds loaded values and cannot be rebuilt; "
            "hold them in a tuple, list or dict"
        )

    rebuilt(root)


def open_for_load(path: Path, storage: Storage | None = None) -> Any:
    """The checkpoint at ``path``: goodput's, or a Hugging Face safetensors directory (read
    through the same plan: each rank reads the byte ranges its layout needs,
    :mod:`goodput.ckpt.loading.hf`)."""
    try:
        return Checkpoint(path, storage)
    except StorageError:
        raise  # the storage did not answer: no reason to think it holds anything else
    except CheckpointError:
        from .hf import HFCheckpoint, is_hf_dir

        if storage is None and is_hf_dir(path):
            return HFCheckpoint(path)
        raise


#: element kinds by the format's dtype name: a cast from a later kind into an earlier one loses
#: what makes the later one (a fraction, an imaginary part)
_KIND = {"bool": 0, **{n: 1 for n in DTYPES if "int" in n}, **{n: 3 for n in DTYPES if n.startswith("complex")}}


def _kind(name: str) -> int:
    """0 bool, 1 integer, 2 floating (float*, bfloat16, the float8 family), 3 complex."""
    return _KIND.get(name, 2)


def cast_refusal(saved: str, lf: TensorLeaf) -> str | None:
    """Why a tensor saved as ``saved`` must not be cast into this target, None when it may be.

    Allowed, as DCP's ``copy_`` does: any cast that keeps the kind of number or widens it (float
    widths, bf16 <-> fp32, int widths, bool or int into float, real into complex). Refused: a
    floating tensor into an integer or bool target (``copy_`` truncates toward zero: float64
    ``randn`` becomes int64 zeros, in silence), and a complex one into a real target (the
    imaginary part dropped). Into a numpy target, also any dtype numpy lacks."""
    if isinstance(lf.local, np.ndarray) and dtype_info(saved).numpy is None:
        return f"numpy has no {saved}"
    if not isinstance(lf.local, np.ndarray) and not hasattr(torch, saved):
        return f"torch has no {saved}"
    src, dst = _kind(saved), _kind(lf.dtype)
    if src == 3 and dst < 3:
        return "a complex tensor does not load into a real target: its imaginary part would be dropped"
    if src == 2 and dst < 2:
        target = "an integer" if dst == 1 else "a bool"
        return f"a floating tensor does not load into {target} target: its values would be truncated"
    return None


def castable(saved: str, lf: TensorLeaf) -> bool:
    """Whether a tensor saved as ``saved`` may be cast into this target (:func:`cast_refusal`)."""
    return cast_refusal(saved, lf) is None


def _near(name: str, saved: dict) -> str:
    import difflib

    close = difflib.get_close_matches(name, list(saved), n=3)
    return f"did you mean {', '.join(map(repr, close))}?" if close else f"it holds {len(saved)} tensors"


def verify(path: str | os.PathLike, progress: Any = None) -> int:
    """Check every chunk and block checksum of a committed checkpoint; returns bytes checked."""
    return Checkpoint(path).verify(progress)


def load_state_dict(
    state_dict: dict[str, Any],
    storage_reader: Any,
    process_group: Any = None,
    coordinator_rank: int = 0,
    no_dist: bool = False,
    planner: Any = None,
) -> Any:
    """DCP's deprecated ``load_state_dict``: :func:`goodput.ckpt.load` (``coordinator_rank`` has
    no meaning here: every rank reads the metadata itself)."""
    return load(
        state_dict, storage_reader=storage_reader, process_group=process_group, no_dist=no_dist, planner=planner
    )
