"""Where checkpoint bytes live: the storage seam.

The protocol (docs/FORMAT.md) is chosen so that it needs no rename of directories and no
overwrite of data: every data and metadata file carries the save's id in its name and is written
once; the manifest, written last, is the commit. On POSIX the manifest is published by
write-temp, fsync, rename, fsync-directory; an object store publishes it with one PUT, which is
atomic there. So one protocol serves both, through the few operations of :class:`Storage`:
write a file once (streamed, or whole), publish a small file atomically, read a range or a whole
small file, list a directory, remove. The save, the load, the asynchronous writer, the
Checkpointer with its retention, and the CLI reach storage only through :func:`storage_for`; a
new kind of storage is one more implementation of :class:`Storage`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


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
        from ..errors import CheckpointError, StorageError

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
        """Remove a whole directory (retention); one already gone is no error. A failure raises
        (an ``OSError``): the caller says it, since retention that stops in silence fills the disk.
        A committed checkpoint's caller removes its manifest first."""
        raise NotImplementedError

    def abort_uploads(self, directory: Path) -> int:
        """Abort the incomplete uploads under ``directory`` (an object store's multipart uploads
        of saves that never finished; they hold space but no listing shows them). Only when no
        save is in flight there. Returns how many; storage without such uploads has none."""
        return 0
