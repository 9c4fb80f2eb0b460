"""Locations: a path or an ``s3://`` URL, as the code joins on it and as its user wrote it, and
the storage it lives on (:func:`storage_for`, the one place a location picks its storage)."""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath
from typing import Any

from .base import Storage
from .local import POSIX


def checkpoint_path(path: Any, checkpoint_id: Any) -> Path:
    """The checkpoint a call names, given as ``path`` or as DCP's ``checkpoint_id=``."""
    if path is None and checkpoint_id is None:
        raise TypeError("give the checkpoint's path (or checkpoint_id=)")
    if path is not None and checkpoint_id is not None and Path(path) != Path(checkpoint_id):
        raise TypeError("give either path or checkpoint_id, not two different ones")
    given = path if path is not None else checkpoint_id
    if isinstance(given, (str, bytes)) and not given.strip():
        # Path("") is the working directory: an empty setting must not save into wherever the job ran
        raise ValueError(f"the checkpoint's path is empty ({given!r}): name a directory")
    storage_for(given)  # an unsupported scheme is refused here, not made a directory
    return as_location(given)


class S3Location(PurePosixPath):
    """An ``s3://bucket/key`` location: joins and splits like a path (``loc / "step_1"``,
    ``.name``, ``.parent``) and prints, formats and ``os.fspath``-s as the URL, which any S3 tool
    accepts (a plain ``Path`` folds it to ``s3:/bucket/key``)."""

    def __str__(self) -> str:
        s = super().__str__()
        return "s3://" + s[len("s3:/") :].lstrip("/") if s.startswith("s3:/") else s

    def __fspath__(self) -> str:
        return str(self)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self)!r})"


def as_location(location: str | os.PathLike) -> Path:
    """A location as the code joins on it: an :class:`S3Location` for ``s3://`` (in either
    spelling), else a ``Path``. Typed ``Path``: an S3 location is never opened as a file."""
    if isinstance(location, S3Location):
        return location  # type: ignore[return-value]
    s = os.fspath(location)
    if isinstance(s, str) and s.startswith("s3:/"):
        return S3Location(s)  # type: ignore[return-value]
    return Path(location)


def display(location: str | os.PathLike) -> str:
    """A location as its user wrote it: ``s3://b/k`` for the ``Path("s3:/b/k")`` the code joins on."""
    s = os.fspath(location)
    return "s3://" + s[len("s3:/") :].lstrip("/") if isinstance(s, str) and s.startswith("s3:/") else str(s)


def storage_for(location: str | os.PathLike) -> Storage:
    """The storage a checkpoint location lives on. Plain paths are POSIX, ``s3://bucket/prefix``
    an S3-compatible object store (:mod:`goodput.ckpt.storage.s3`); a URL scheme this build does not
    implement is refused, never taken for a directory name."""
    s = os.fspath(location)
    if isinstance(s, str) and s.startswith("s3:/"):  # ``Path("s3://b/k")`` is ``s3:/b/k``
        from . import s3

        return s3.default_storage()
    if isinstance(s, str) and "://" in s:
        scheme = s.split("://", 1)[0]
        raise ValueError(f"{s!r}: storage scheme {scheme + '://'!r} is not supported (plain paths are)")
    return POSIX
