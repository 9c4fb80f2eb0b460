"""The POSIX implementation of the storage seam (:class:`~goodput.ckpt.storage.base.Storage`).

Everything read is named by checkpoint metadata or a listing and so is not trusted: no
operation follows a symbolic link, only regular files are read, and every whole-file read is
bounded.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import shutil
import stat
import threading
from pathlib import Path

from .base import Entry, Sink, Source, Storage

ALIGN = 4096  # O_DIRECT's unit here; the format's page alignment (format.ALIGN) is the same


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
    from ..errors import CheckpointError

    try:
        # O_NONBLOCK: a FIFO planted under the name must not hang the open; only files are read
        fd = os.open(path, os.O_RDONLY | NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise CheckpointError(f"{what} {str(path)!r} is missing") from None
    except OSError as e:
        if NOFOLLOW and os.path.islink(path):
            raise CheckpointError(f"{what} {str(path)!r} is a symbolic link; refusing to follow it") from None
        from ..errors import StorageError

        raise StorageError(f"{what} {str(path)!r} cannot be opened: {e.strerror or e}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise CheckpointError(f"{what} {str(path)!r} is not a regular file; refusing to read it")
    if hasattr(os, "O_NONBLOCK"):
        os.set_blocking(fd, True)
    return fd


def read_inside(path: str | os.PathLike, what: str, limit: int) -> bytes:
    """The whole file at ``path`` (see :func:`open_inside`), refusing one over ``limit`` bytes."""
    from ..errors import CheckpointError

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
        from ..errors import CheckpointError

        raise CheckpointError(f"{what}: read failed at byte {offset}: {e.strerror or e}") from None
    if len(mv):
        from ..errors import CheckpointError

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


class PosixFile(Sink):
    """Sequential writes to a file, buffered or O_DIRECT (whole aligned blocks, tails bounced)."""

    def __init__(self, path: str, direct: bool):
        self.direct = direct
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | (os.O_DIRECT if direct else 0), 0o644)
        self.pos = 0
        self._bounce: mmap.mmap | None = None

    def write(self, data: memoryview) -> None:
        """Write ``data`` at the current position; in direct mode a ragged tail is padded with
        zeros to the next page (the padding the format puts before the next chunk anyway)."""
        n = len(data)
        if not self.direct:
            write_all(self.fd, data)
            self.pos += n
            return
        whole = n - n % ALIGN
        if whole:
            write_all(self.fd, data[:whole])
        tail = n - whole
        if tail:
            if self._bounce is None:
                self._bounce = mmap.mmap(-1, ALIGN)
            b = memoryview(self._bounce)
            b[:tail] = data[whole:]
            b[tail:] = bytes(ALIGN - tail)
            write_all(self.fd, b)
            b.release()
        self.pos += n

    def align(self, to: int) -> None:
        pad = (-self.pos) % to
        if pad and not self.direct:
            write_all(self.fd, bytes(pad))
        self.pos += pad  # in direct mode the bounced tail already wrote these zeros

    def finish(self) -> None:
        if self.direct:
            os.ftruncate(self.fd, self.pos)
        os.fsync(self.fd)

    def close(self) -> None:
        os.close(self.fd)
        if self._bounce is not None:
            self._bounce.close()


class PosixSource(Source):
    def __init__(self, fd: int, name: str):
        self.fd = fd
        self.name = name
        self.size = os.fstat(fd).st_size

    def read_into(self, buf: memoryview, offset: int, what: str | None = None) -> None:
        assert self.fd is not None
        pread_into(self.fd, buf, offset, what or self.name)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class PosixStorage(Storage):
    """Local and parallel file systems (anything with POSIX semantics)."""

    def prepare(self, directory: Path) -> None:
        make_dirs(directory)

    def create(self, directory: Path, name: str, direct: bool = False) -> Sink:
        path = os.path.join(directory, name)
        if direct and hasattr(os, "O_DIRECT"):
            try:
                return PosixFile(path, True)
            except OSError as e:  # a file system that refuses O_DIRECT gets buffered writes
                if e.errno != errno.EINVAL:
                    raise
        return PosixFile(path, False)

    def put(self, directory: Path, name: str, data: bytes) -> None:
        write_durable(Path(directory) / name, data)

    def publish(self, directory: Path, name: str, data: bytes) -> None:
        publish_atomic(directory, name, data)

    def publish_new(self, directory: Path, name: str, data: bytes) -> bool:
        directory = Path(directory)
        tmp = directory / f".{name}.tmp-{os.getpid()}-{threading.get_ident()}"
        write_durable(tmp, data)
        try:
            os.link(tmp, directory / name)  # link(2) fails if the name exists: create-if-absent
        except FileExistsError:
            return False
        finally:
            remove_quietly(tmp)
        with contextlib.suppress(OSError):
            fsync_dir(directory)
        return True

    def sync(self, directory: Path) -> None:
        fsync_dir(directory)

    def open(self, directory: Path, name: str, what: str, size: int | None = None) -> Source:
        path = Path(directory) / name
        return PosixSource(open_inside(path, what), str(path))

    def get(self, directory: Path, name: str, what: str, limit: int) -> bytes:
        return read_inside(Path(directory) / name, what, limit)

    def exists(self, directory: Path, name: str) -> bool:
        """Not ``os.path.lexists``, which answers False when the file cannot be looked at
        (a directory without search permission): "no manifest" where there may be one."""
        from ..errors import StorageError

        path = Path(directory) / name
        try:
            os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            return False
        except OSError as e:
            raise StorageError(f"{str(path)!r} cannot be looked at: {e.strerror or e}") from None
        return True

    def list(self, directory: Path) -> list[Entry]:
        out = []
        with os.scandir(directory) as it:
            for e in it:
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                kind = (
                    "link"
                    if stat.S_ISLNK(st.st_mode)
                    else "dir"
                    if stat.S_ISDIR(st.st_mode)
                    else "file"
                    if stat.S_ISREG(st.st_mode)
                    else "other"
                )
                out.append(Entry(e.name, kind, st.st_mtime, st.st_size))
        out.sort(key=lambda x: x.name)
        return out

    def remove(self, directory: Path, name: str) -> None:
        remove_quietly(Path(directory) / name)

    def remove_tree(self, directory: Path) -> None:
        try:
            shutil.rmtree(directory)
        except FileNotFoundError:
            return  # gone already (another rank's retention, a person)


POSIX = PosixStorage()
