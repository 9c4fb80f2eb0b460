"""The errors of goodput.ckpt, and how errors from several ranks become one message.

Every failure a user sees is one of two types: :class:`CheckpointError` (a checkpoint is missing,
corrupt, foreign or malformed, or cannot be read into what was given) and its subclass
:class:`SaveError` (a save failed and committed nothing). Collectives carry errors as data, so a
failure on one rank makes every rank raise the same message, naming the rank at fault; the
functions here are the one way those messages are joined, for the collective save and for the
file-based commit of an asynchronous one alike. numpy-free and torch-free.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterable
from typing import Any

_DCP_API = "torch.distributed.checkpoint.api"


class CheckpointError(Exception):
    """A checkpoint is missing, corrupt, foreign or malformed. The message names what is wrong.

    It is also DCP's ``CheckpointException`` as soon as DCP is imported (see :func:`_adopt_dcp`),
    so that code written for DCP (``except dcp.CheckpointException:``) catches goodput's errors;
    unlike DCP's it stays an ``Exception``. ``failures`` is DCP's per-rank map, empty here: the
    message already names the ranks at fault."""

    def __init__(self, *args: Any) -> None:
        Exception.__init__(self, *args)
        self._failures: dict[int, Any] = {}

    @property
    def failures(self) -> dict[int, Any]:
        return self._failures

    def __str__(self) -> str:
        return Exception.__str__(self)


class ExportError(CheckpointError):
    """An export (``goodput ckpt export``) could not be done; the message names the tensor, file or
    destination."""


class SaveError(CheckpointError):
    """A save failed; nothing was committed. The message names the rank, key or file at fault."""


class StorageError(CheckpointError, OSError):
    """The storage did not answer as storage should (wrong credentials, unreachable, a 5xx after
    the store's retries, a listing that failed): nothing can be said about what it holds. Never
    taken for "no checkpoint there". The message names the location. Also an ``OSError``, as the
    file system's own failures are."""


class StorageSaveError(SaveError, StorageError):
    """A save failed because the storage did not answer (a 503 storm longer than the retries, an
    unreachable store, ...): nothing was committed, and the message names the object at fault.
    Caught as either: ``except SaveError`` (the save failed) or ``except StorageError`` (the
    storage did; retry later)."""


#: how :func:`describe` writes a storage failure into a message carried between ranks
_STORAGE_MARKS = ("StorageError: ", "StorageSaveError: ")


def save_error(msg: str) -> SaveError:
    """The error to raise for a save that failed with ``msg`` (joined from ranks' reports, which
    carry errors as text): a :class:`StorageSaveError` when any rank's failure was the storage's,
    so that the type survives the trip through a collective; else a :class:`SaveError`."""
    return StorageSaveError(msg) if any(m in msg for m in _STORAGE_MARKS) else SaveError(msg)


def describe(e: BaseException) -> str:
    """An exception as one line of a message carried to other ranks, with its notes (what goodput
    added on the way: which object of the state raised)."""
    notes = "".join(f" ({n})" for n in getattr(e, "__notes__", ()) if isinstance(n, str))
    return f"{type(e).__name__}: {e}{notes}"


def rank_errors(reports: Iterable[dict[str, Any]]) -> str | None:
    """``"rank 1: ...; rank 3: ..."`` from per-rank reports (``{"rank": r, "error": str | None}``),
    or None when no rank failed."""
    errs = [f"rank {m['rank']}: {m['error']}" for m in reports if m.get("error")]
    return "; ".join(errs) if errs else None


def raise_rank_errors(reports: Iterable[dict[str, Any]], what: str) -> None:
    """Raise :class:`SaveError` ``"<what>; nothing was committed. rank r: ..."`` if any rank failed
    (a :class:`StorageSaveError` when a rank's failure was the storage's)."""
    errs = rank_errors(reports)
    if errs:
        raise save_error(f"{what}; nothing was committed. {errs}")


def _adopt_dcp() -> None:
    """Make :class:`CheckpointError` a subclass of DCP's ``CheckpointException`` once DCP's
    ``api`` module exists. Nobody can catch DCP's class before DCP is imported, so linking at
    that moment (through the import hook below) is enough, and the numpy-only reader never pays
    for importing torch."""
    api = sys.modules.get(_DCP_API)
    base = getattr(api, "CheckpointException", None)
    if isinstance(base, type) and not issubclass(CheckpointError, base):
        CheckpointError.__bases__ = (Exception, base)


class _AdoptWhenDCPLoads:
    """A meta-path finder that lets the real finders find DCP's ``api`` module and links
    :class:`CheckpointError` right after that module has run. It removes itself once used."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != _DCP_API:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)
        loader = spec.loader
        run = getattr(loader, "exec_module", None)
        if run is None:
            return spec

        def exec_module(module: Any) -> None:
            run(module)
            _adopt_dcp()

        loader.exec_module = exec_module
        return spec


if _DCP_API in sys.modules:
    _adopt_dcp()
else:
    sys.meta_path.insert(0, _AdoptWhenDCPLoads())  # type: ignore[arg-type]
