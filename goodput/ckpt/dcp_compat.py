"""DCP's call shapes, so that code written for torch.distributed.checkpoint runs unchanged.

DCP takes a checkpoint as ``checkpoint_id=`` or as a storage object (``storage_writer=
FileSystemWriter(path)``, ``storage_reader=FileSystemReader(path)``), a ``planner=``, and the
older ``save_state_dict`` / ``load_state_dict`` names (kept beside the ``save`` and ``load`` they
call). Here those become what goodput needs: a
location and a few options. Options that have no meaning here are accepted and documented as
ignored (goodput chooses its own threads, files and syncing); what would change behaviour in a
way goodput does not implement (a custom planner, storage plugins) is refused with a message
that says what to do instead. docs/DCP.md lists every difference.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from .errors import CheckpointError, SaveError


@dataclass
class FileSystemWriter:
    """DCP's ``FileSystemWriter``: where to save, and whether an existing checkpoint may be
    replaced (``overwrite=False`` refuses, as DCP does). ``single_file_per_rank``,
    ``sync_files``, ``thread_count``, ``per_thread_copy_ahead`` and ``cache_staged_state_dict``
    are accepted and ignored: goodput always fsyncs before its commit, and picks its own files
    per rank (``files_per_rank=`` on :func:`goodput.ckpt.save`) and threads."""

    path: str | os.PathLike
    single_file_per_rank: bool = True
    sync_files: bool = True
    thread_count: int = 1
    per_thread_copy_ahead: int = 10_000_000
    cache_staged_state_dict: bool = False
    overwrite: bool = True
    _extensions: Any = None
    serialization_format: Any = None

    def __post_init__(self) -> None:
        if self._extensions:
            raise ValueError(
                "FileSystemWriter(_extensions=...): DCP's storage extensions (e.g. compression) are not "
                "supported; goodput writes raw chunks with CRC-32C block checksums"
            )

    @property
    def checkpoint_id(self) -> str | os.PathLike:
        return self.path


@dataclass
class FileSystemReader:
    """DCP's ``FileSystemReader``: where to load from. ``_extension_registry`` is accepted and
    ignored: it says how to undo extensions a writer applied, and a goodput checkpoint has none."""

    path: str | os.PathLike
    _extension_registry: Any = None

    @property
    def checkpoint_id(self) -> str | os.PathLike:
        return self.path


def _storage_path(storage: Any, kind: str) -> str | os.PathLike:
    if isinstance(storage, (FileSystemWriter, FileSystemReader)):
        return storage.path
    path = getattr(storage, "path", None)  # DCP's own FileSystemWriter/Reader carry .path
    module = type(storage).__module__
    name = type(storage).__name__
    if module.startswith("torch.distributed.checkpoint") and name == "HuggingFaceStorageReader" and path:
        return path  # a Hugging Face directory: goodput's load reads it into any layout (goodput.ckpt.loading.hf)
    if module.startswith("torch.distributed.checkpoint") and name == "HuggingFaceStorageWriter":
        raise TypeError(
            f"{kind}=HuggingFaceStorageWriter: goodput saves its own format; write Hugging Face safetensors from a "
            "goodput checkpoint with goodput.ckpt.export(src, dst) (`goodput ckpt export`)"
        )
    if (
        path is not None
        and module.startswith("torch.distributed.checkpoint")
        and "FileSystem" in type(storage).__name__
    ):
        if getattr(storage, "_extensions", None) or getattr(storage, "extensions", None):
            raise ValueError(f"{kind}: DCP's storage extensions are not supported by goodput")
        return path
    raise TypeError(
        f"{kind}={type(storage).__name__}: goodput saves to and loads from paths; pass checkpoint_id=<path> "
        "or goodput.ckpt.FileSystemWriter/FileSystemReader(path)"
    )


def location(path: Any, checkpoint_id: Any, storage: Any, kind: str) -> Any:
    """The checkpoint a call names, whichever of DCP's ways it was named in."""
    if storage is None:
        return path if path is not None else checkpoint_id
    given = _storage_path(storage, kind)
    for other in (path, checkpoint_id):
        if other is not None and os.fspath(other) != os.fspath(given):
            raise TypeError(f"{kind} names {os.fspath(given)!r}, checkpoint_id {os.fspath(other)!r}: give one")
    return given


def refuses_overwrite(storage: Any) -> bool:
    return storage is not None and getattr(storage, "overwrite", True) is False


def check_planner(planner: Any, kind: str) -> bool | None:
    """Accept DCP's default planners (their behaviour is goodput's own); refuse a custom one.
    Returns ``allow_partial_load`` of a DefaultLoadPlanner, else None."""
    if planner is None:
        return None
    name = type(planner).__name__
    module = type(planner).__module__
    if module.startswith("torch.distributed.checkpoint") and name in ("DefaultSavePlanner", "DefaultLoadPlanner"):
        if name == "DefaultLoadPlanner":
            return bool(getattr(planner, "allow_partial_load", False))
        return None
    raise TypeError(
        f"planner={name}: goodput makes its own {kind} plan (replicas written once and balanced, resharding by "
        "the target's layout, bounded memory) and does not run DCP planners; drop planner=, or for a "
        "partial load pass strict=False (allow_partial_load=True)"
    )


OVERWRITE_REFUSED = "and FileSystemWriter(overwrite=False) forbids replacing it"


def overwrite_refused(path: Any) -> CheckpointError:
    return CheckpointError(f"Checkpoint already exists at {os.fspath(path)!r} {OVERWRITE_REFUSED}")


def checkpoint_exists(msg: str) -> SaveError:
    """A save refused by ``FileSystemWriter(overwrite=False)``. Every goodput error is DCP's
    ``CheckpointException`` too once DCP is imported (:mod:`goodput.ckpt.errors`), so code
    catching either catches it, as DCP's tests do."""
    return SaveError(msg)
