"""Where checkpoint bytes live, behind the few operations the commit protocol needs.

The protocol (docs/FORMAT.md) is chosen so that it needs no rename of directories and no
overwrite of data: every data and metadata file carries the save's id in its name and is written
once; the manifest, written last, is the commit. On POSIX the manifest is published by
write-temp, fsync, rename, fsync-directory; an object store publishes it with one PUT, which is
atomic there. So one protocol serves both; this module holds the POSIX side.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def fsync_dir(path: str | os.PathLike) -> None:
    """Make a directory's entries (new names, renames) durable."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: memoryview | bytes) -> None:
    mv = memoryview(data).cast("B")
    while len(mv):
        n = os.write(fd, mv)
        mv = mv[n:]


def pread_into(fd: int, buf: memoryview, offset: int, what: str) -> None:
    """Fill ``buf`` from ``offset``; a short file is an error that names ``what``."""
    mv = memoryview(buf).cast("B")
    n = os.preadv(fd, [mv], offset)
    if n == len(mv):
        return
    from .format import CheckpointError

    mv = mv[max(n, 0) :]
    offset += max(n, 0)
    while len(mv):
        n = os.preadv(fd, [mv], offset)
        if n <= 0:
            raise CheckpointError(f"{what}: file ends early at byte {offset} (truncated)")
        mv = mv[n:]
        offset += n


def publish_atomic(directory: str | os.PathLike, name: str, data: bytes) -> None:
    """Write ``directory/name`` so that readers see the old content or the new, never a part."""
    directory = Path(directory)
    tmp = directory / f".{name}.tmp-{os.getpid()}"
    write_durable(tmp, data)
    os.replace(tmp, directory / name)
    # past the rename the new content is what readers see; a failing directory fsync cannot be
    # undone and must not be reported as "not published" (callers would delete its files)
    with contextlib.suppress(OSError):
        fsync_dir(directory)


def write_durable(path: str | os.PathLike, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_quietly(path: str | os.PathLike) -> None:
    """Best-effort removal (cleanup after a commit must never turn it into a failure)."""
    with contextlib.suppress(OSError):
        os.unlink(path)
