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
import stat
from pathlib import Path
from typing import Any


def checkpoint_path(path: Any, checkpoint_id: Any) -> Path:
    """The checkpoint a call names, given as ``path`` or as DCP's ``checkpoint_id=``."""
    if path is None and checkpoint_id is None:
        raise TypeError("give the checkpoint's path (or checkpoint_id=)")
    if path is not None and checkpoint_id is not None and Path(path) != Path(checkpoint_id):
        raise TypeError("give either path or checkpoint_id, not two different ones")
    return Path(path if path is not None else checkpoint_id)


def fsync_dir(path: str | os.PathLike) -> None:
    """Make a directory's entries (new names, renames) durable."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_dirs(path: str | os.PathLike) -> None:
    """``mkdir -p`` whose new entries survive a crash: each directory created is fsynced into its
    parent, so a checkpoint committed inside a new ``root/step_N`` cannot vanish with its name."""
    path = Path(path)
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another rank made it first
            d.mkdir()
        fsync_dir(d.parent)
    if not path.is_dir():
        raise NotADirectoryError(f"{str(path)!r} is not a directory")


NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def open_inside(path: str | os.PathLike, what: str) -> int:
    """Open a file named by checkpoint metadata for reading, refusing a symbolic link: a name
    that passed the plain-name check must not lead out of the checkpoint directory through a
    link planted there. Any failure is a CheckpointError naming the file and what it holds."""
    from .format import CheckpointError

    try:
        # O_NONBLOCK: a FIFO planted under the name must not hang the open; only files are read
        fd = os.open(path, os.O_RDONLY | NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise CheckpointError(f"{what} {str(path)!r} is missing") from None
    except OSError as e:
        if NOFOLLOW and os.path.islink(path):
            raise CheckpointError(f"{what} {str(path)!r} is a symbolic link; refusing to follow it") from None
        raise CheckpointError(f"{what} {str(path)!r} cannot be opened: {e.strerror or e}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise CheckpointError(f"{what} {str(path)!r} is not a regular file; refusing to read it")
    if hasattr(os, "O_NONBLOCK"):
        os.set_blocking(fd, True)
    return fd


def read_inside(path: str | os.PathLike, what: str, limit: int) -> bytes:
    """The whole file at ``path`` (see :func:`open_inside`), refusing one over ``limit`` bytes."""
    from .format import CheckpointError

    fd = open_inside(path, what)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise CheckpointError(f"{what} {str(path)!r} is {size} bytes, more than the {limit} it may be")
        buf = bytearray(size)
        pread_into(fd, memoryview(buf), 0, f"{what} {str(path)!r}")
        return bytes(buf)
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
    try:
        n = os.preadv(fd, [mv], offset)
        if n == len(mv):
            return
        mv = mv[max(n, 0) :]
        offset += max(n, 0)
        while len(mv):
            n = os.preadv(fd, [mv], offset)
            if n <= 0:
                break
            mv = mv[n:]
            offset += n
    except OSError as e:  # EIO and the like: name the file, never a bare traceback
        from .format import CheckpointError

        raise CheckpointError(f"{what}: read failed at byte {offset}: {e.strerror or e}") from None
    if len(mv):
        from .format import CheckpointError

        raise CheckpointError(f"{what}: file ends early at byte {offset} (truncated)")


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
