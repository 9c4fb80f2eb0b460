"""Where checkpoint bytes live: the storage seam, and its POSIX implementation.

The protocol (docs/FORMAT.md) is chosen so that it needs no rename of directories and no
overwrite of data: every data and metadata file carries the save's id in its name and is written
once; the manifest, written last, is the commit. On POSIX the manifest is published by
write-temp, fsync, rename, fsync-directory; an object store publishes it with one PUT, which is
atomic there. So one protocol serves both, through the few operations of :class:`Storage`:
write a file once (streamed, or whole), publish a small file atomically, read a range or a whole
small file, list a directory, remove. The save, the load, the asynchronous writer, the
Checkpointer with its retention, and the CLI reach storage only through :func:`storage_for`; a
new kind of storage is one more implementation of :class:`Storage`.

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
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

ALIGN = 4096  # O_DIRECT's unit here; the format's page alignment (format.ALIGN) is the same


def checkpoint_path(path: Any, checkpoint_id: Any) -> Path:
    """The checkpoint a call names, given as ``path`` or as DCP's ``checkpoint_id=``."""
    if path is None and checkpoint_id is None:
        raise TypeError("give the checkpoint's path (or checkpoint_id=)")
    if path is not None and checkpoint_id is not None and Path(path) != Path(checkpoint_id):
        raise TypeError("give either path or checkpoint_id, not two different ones")
    given = path if path is not None else checkpoint_id
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
    from .errors import CheckpointError

    try:
        # O_NONBLOCK: a FIFO planted under the name must not hang the open; only files are read
        fd = os.open(path, os.O_RDONLY | NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise CheckpointError(f"{what} {str(path)!r} is missing") from None
    except OSError as e:
        if NOFOLLOW and os.path.islink(path):
            raise CheckpointError(f"{what} {str(path)!r} is a symbolic link; refusing to follow it") from None
        from .errors import StorageError

        raise StorageError(f"{what} {str(path)!r} cannot be opened: {e.strerror or e}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise CheckpointError(f"{what} {str(path)!r} is not a regular file; refusing to read it")
    if hasattr(os, "O_NONBLOCK"):
        os.set_blocking(fd, True)
    return fd


def read_inside(path: str | os.PathLike, what: str, limit: int) -> bytes:
    """The whole file at ``path`` (see :func:`open_inside`), refusing one over ``limit`` bytes."""
    from .errors import CheckpointError

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
        from .errors import CheckpointError

        raise CheckpointError(f"{what}: read failed at byte {offset}: {e.strerror or e}") from None
    if len(mv):
        from .errors import CheckpointError

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


# --------------------------------------------------------------------------- the seam


@dataclass(frozen=True)
class Entry:
    """One name in a listing. ``kind``: "file", "dir", "link" (never followed) or "other"."""

    name: str
    kind: str
    mtime: float
    size: int


class Sink:
    """A file being written once, sequentially; durable after :meth:`finish`."""

    pos: int

    def write(self, data: memoryview) -> None:
        raise NotImplementedError

    def align(self, to: int) -> None:
        """Pad with zeros to a multiple of ``to`` bytes."""
        raise NotImplementedError

    def finish(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class Source:
    """A file opened for reading by ranges. ``fd`` is set where the storage has descriptors
    (POSIX), so the hot read loop can call ``os.preadv`` without a method call per read."""

    size: int
    name: str
    fd: int | None = None

    def read_into(self, buf: memoryview, offset: int, what: str | None = None) -> None:
        """Fill ``buf`` from ``offset``; a short file is a CheckpointError naming it (or ``what``)."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class Storage:
    """The operations the commit protocol and its readers need; ``directory`` is a checkpoint
    (or a root of checkpoints), ``name`` a plain file name in it."""

    read_threads = 4  # a load's reader threads by default: each waits on one read at a time

    def prepare(self, directory: Path) -> None:
        """Make ``directory`` exist (durably), so that files can be written into it."""
        raise NotImplementedError

    def create(self, directory: Path, name: str, direct: bool = False) -> Sink:
        """A new file, written once; ``direct`` asks to bypass caches where the storage can."""
        raise NotImplementedError

    def put(self, directory: Path, name: str, data: bytes) -> None:
        """Write a small file once, durably."""
        raise NotImplementedError

    def publish(self, directory: Path, name: str, data: bytes) -> None:
        """Replace a small file atomically: readers see the old content or the new, never a part."""
        raise NotImplementedError

    def publish_new(self, directory: Path, name: str, data: bytes) -> bool:
        """Create a small file atomically only if no file has the name: False if one has. Two
        writers racing to commit one checkpoint: exactly one wins."""
        raise NotImplementedError

    def sync(self, directory: Path) -> None:
        """Make the names written into ``directory`` durable (before a commit names them)."""
        raise NotImplementedError

    def open(self, directory: Path, name: str, what: str, size: int | None = None) -> Source:
        """A file for reading by ranges. ``size`` is what the checkpoint records for it: a
        storage where learning the size costs a round trip (an object store) takes it on trust
        here and checks it on every read instead, so a load's first byte waits on one request
        fewer per file; the caller still compares ``Source.size`` as if it had been measured."""
        raise NotImplementedError

    def get(self, directory: Path, name: str, what: str, limit: int) -> bytes:
        """A whole small file, refusing one over ``limit`` bytes; CheckpointError if missing."""
        raise NotImplementedError

    def get_if_exists(self, directory: Path, name: str, what: str, limit: int) -> bytes | None:
        """The file, or None when it is missing (gone between the check and the read included);
        a storage failure raises (:class:`StorageError`): it never reads as "missing"."""
        from .errors import CheckpointError, StorageError

        if not self.exists(directory, name):
            return None
        try:
            return self.get(directory, name, what, limit)
        except StorageError:
            raise
        except CheckpointError:
            if self.exists(directory, name):
                raise
            return None

    def exists(self, directory: Path, name: str) -> bool:
        raise NotImplementedError

    def list(self, directory: Path) -> list[Entry]:
        """The names in ``directory``, sorted; OSError if it cannot be listed."""
        raise NotImplementedError

    def remove(self, directory: Path, name: str) -> None:
        """Best effort: cleanup must never turn a commit into a failure."""
        raise NotImplementedError

    def remove_tree(self, directory: Path) -> None:
        """Remove a whole checkpoint directory (retention), best effort."""
        raise NotImplementedError

    def abort_uploads(self, directory: Path) -> int:
        """Abort the incomplete uploads under ``directory`` (an object store's multipart uploads
        of saves that never finished; they hold space but no listing shows them). Only when no
        save is in flight there. Returns how many; storage without such uploads has none."""
        return 0


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
        from .errors import StorageError

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
        shutil.rmtree(directory, ignore_errors=True)


POSIX = PosixStorage()


def display(location: str | os.PathLike) -> str:
    """A location as its user wrote it: ``s3://b/k`` for the ``Path("s3:/b/k")`` the code joins on."""
    s = os.fspath(location)
    return "s3://" + s[len("s3:/") :].lstrip("/") if isinstance(s, str) and s.startswith("s3:/") else str(s)


def storage_for(location: str | os.PathLike) -> Storage:
    """The storage a checkpoint location lives on. Plain paths are POSIX, ``s3://bucket/prefix``
    an S3-compatible object store (:mod:`goodput.ckpt.s3`); a URL scheme this build does not
    implement is refused, never taken for a directory name."""
    s = os.fspath(location)
    if isinstance(s, str) and s.startswith("s3:/"):  # ``Path("s3://b/k")`` is ``s3:/b/k``
        from . import s3

        return s3.default_storage()
    if isinstance(s, str) and "://" in s:
        scheme = s.split("://", 1)[0]
        raise ValueError(f"{s!r}: storage scheme {scheme + '://'!r} is not supported (plain paths are)")
    return POSIX
