"""An export's hold on its destination: the in-progress marker as a lock.

The marker ``.goodput-export-in-progress`` is created only where there is none (locally by
``link(2)``, with ``flock`` on the directory for as long as the export runs; on ``s3://`` by a PUT
with ``If-None-Match: *``), and names its export (pid, host, boot, PID namespace, start). A second
export into a destination being written is refused at once, naming the first; ``--overwrite``
takes over only a dead export's marker (docs/HF.md, "One export at a time into a destination").
What the export writes, and in which order, is :mod:`.exporter`'s.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ExportError
from ..loading.hf import EXPORTING
from ..storage.base import Storage
from ..storage.local import PosixStorage
from ..storage.location import display


def refuse_running(storage: Storage, dst: Path) -> None:
    """Refuse, naming it, a destination whose marker's export runs (or cannot be judged)."""
    fd, busy = _flock(dst) if isinstance(storage, PosixStorage) else (None, False)
    try:
        marker = read_marker(storage, dst)
        if marker is None:
            return
        alive = True if busy else _judge(storage, dst, marker, fd)
        if alive is not False:
            raise _running(dst, marker, alive)
    finally:
        if fd is not None:
            os.close(fd)


@dataclass
class Marker:
    note: dict[str, Any]  # as written ({} when it is not this exporter's JSON)
    stamp: float | None  # when it was written, by the storage's clock (s3: the server's)
    etag: str | None  # s3:// only


@dataclass
class Hold:
    """This export's hold on its destination: its marker (by ``token``), locally the ``flock``."""

    token: str
    fd: int | None = None  # the destination directory, flock()ed; None without flock
    etag: str | None = None  # of our marker on s3://
    since: float | None = None  # when our marker was written, by the server's clock (s3://)
    taken_from: float | None = None  # when the dead export's marker we took over was written

    def release(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)  # closing the descriptor lets the flock go
            self.fd = None


def _proc_start(pid: int) -> int | None:
    """When the process started (clock ticks after boot, /proc/<pid>/stat field 22): tells a
    reused pid from the one a marker names. None where there is no /proc."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip() or None
    except OSError:
        return None


def _pid_ns() -> str | None:
    """This process's PID namespace (``pid:[4026531836]``): a container sharing the host's name
    (host networking) numbers its processes apart, so its pids mean nothing here."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def _alive(note: dict[str, Any]) -> bool | None:
    """Whether the export a marker names still runs: True, False, or None when it cannot be told
    from here (another host or PID namespace, or a marker that names no process)."""
    pid, host = note.get("pid"), note.get("host")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0 or not isinstance(host, str):
        return None
    if host != socket.gethostname() or note.get("pidns") not in (None, _pid_ns()):
        return None
    boot = _boot_id()
    if note.get("boot") and boot and note["boot"] != boot:
        return False  # this host has rebooted since
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, under another user
    except OverflowError:
        return None
    start = note.get("pid_start")
    return start is None or _proc_start(pid) in (None, start)  # else the pid was reused: another process


def who(note: dict[str, Any]) -> str:
    """The export a marker names, for an error."""
    if not isinstance(note.get("pid"), int):
        return "a marker that names no process"
    started = note.get("started")
    when = (
        datetime.datetime.fromtimestamp(started, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        if isinstance(started, (int, float))
        else "at an unknown time"
    )
    of = f", exporting {note['export_of']!r}" if isinstance(note.get("export_of"), str) else ""
    return f"pid {note['pid']} on host {note.get('host', '(not recorded)')!r}, started {when}{of}"


def _running(dst: Path, marker: Marker, alive: bool | None) -> ExportError:
    where = display(dst)
    if alive:
        return ExportError(
            f"another export is writing into {where!r}: {who(marker.note)}; wait for it to finish (or stop it), "
            "or export somewhere else"
        )
    return ExportError(
        f"another export may be writing into {where!r}: {who(marker.note)} (its marker {EXPORTING}; whether it "
        f"still runs cannot be told from this host); if it is not running, remove {where.rstrip('/') + '/' + EXPORTING!r} "
        "and export again with --overwrite"
    )


def _judge(storage: Storage, dst: Path, marker: Marker, fd: int | None) -> bool | None:
    """Whether the marker's export runs. Locally, holding the destination's flock: an export that
    held it is dead (the kernel let it go); one that did not (an older goodput, another host on a
    file system without flock) is judged by its process."""
    if fd is not None and marker.note.get("lock") == "flock":
        return False  # it held the flock we now hold: the kernel let it go when the process ended
    return _alive(marker.note)


def _flock(dst: Path) -> tuple[int | None, bool]:
    """``(fd, held by another)``: the destination directory opened and flock()ed; fd None where
    the file system has no flock (NFS refuses it on a directory): the marker alone locks then."""
    import fcntl

    try:
        fd = os.open(dst, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return None, False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None, True
    except OSError:
        os.close(fd)
        return None, False
    return fd, False


def _s3(storage: Storage, dst: Path) -> tuple[Any, str, str]:
    """``(client, bucket, key of the marker)`` on s3://."""
    from ..storage.s3 import split

    bucket, prefix = split(dst)
    return storage.client(), bucket, (f"{prefix}/{EXPORTING}" if prefix else EXPORTING)  # type: ignore[attr-defined]


def _code(e: Exception) -> str:
    resp = getattr(e, "response", None) or {}
    return str(resp.get("Error", {}).get("Code") or resp.get("ResponseMetadata", {}).get("HTTPStatusCode") or "")


_UNSUPPORTED = ("NotImplemented", "501")


def _server_time(resp: dict[str, Any]) -> float | None:
    from email.utils import parsedate_to_datetime

    with contextlib.suppress(Exception):
        return parsedate_to_datetime(resp["ResponseMetadata"]["HTTPHeaders"]["date"]).timestamp()
    return None


def _create_marker(storage: Storage, dst: Path, data: bytes, hold: Hold) -> bool:
    """Create the marker only where there is none: False when one is there."""
    if isinstance(storage, PosixStorage):
        return storage.publish_new(dst, EXPORTING, data)  # link(2) of a written file: fails if the name exists
    if not hasattr(storage, "client"):
        if storage.exists(dst, EXPORTING):
            return False
        storage.put(dst, EXPORTING, data)
        return True
    client, bucket, key = _s3(storage, dst)
    try:
        r = client.put_object(Bucket=bucket, Key=key, Body=data, IfNoneMatch="*")
    except Exception as e:
        code = _code(e)
        if code in ("412", "PreconditionFailed", "409", "ConditionalRequestConflict"):
            return False  # the caller reads it: our own PUT whose answer was lost reads as ours
        if code not in _UNSUPPORTED:
            raise ExportError(f"s3://{bucket}/{key}: creating the export's marker failed: {code}: {e}") from None
        # a store without conditional PUTs: checked, then written; not exclusive (docs/S3.md)
        if storage.exists(dst, EXPORTING):
            return False
        r = client.put_object(Bucket=bucket, Key=key, Body=data)
    hold.etag, hold.since = r.get("ETag"), _server_time(r)
    return True


def read_marker(storage: Storage, dst: Path) -> Marker | None:
    """The marker in ``dst``, or None when there is none."""
    etag = stamp = None
    if hasattr(storage, "client") and not isinstance(storage, PosixStorage):
        client, bucket, key = _s3(storage, dst)
        try:
            r = client.get_object(Bucket=bucket, Key=key)
            raw = r["Body"].read(1 << 16)
        except Exception as e:
            if _code(e) in ("404", "NoSuchKey", "NotFound"):
                return None
            raise ExportError(f"s3://{bucket}/{key}: the export marker cannot be read: {_code(e)}: {e}") from None
        etag, stamp = r.get("ETag"), r["LastModified"].timestamp() if r.get("LastModified") else None
    else:
        raw = storage.get_if_exists(dst, EXPORTING, "export marker", 1 << 16)
        if raw is None:
            return None
        with contextlib.suppress(OSError):
            stamp = os.lstat(Path(dst) / EXPORTING).st_mtime
    try:
        note = json.loads(raw)
    except ValueError:
        note = {}
    return Marker(note if isinstance(note, dict) else {}, stamp, etag)


def remove_marker(storage: Storage, dst: Path, etag: str | None) -> bool:
    """Remove the marker; on s3:// only while its ETag is ``etag`` (a conditional DELETE): False
    when it has changed (another export took it). A store that ignores the condition deletes it."""
    if etag is None or isinstance(storage, PosixStorage) or not hasattr(storage, "client"):
        storage.remove(dst, EXPORTING)
        return True
    client, bucket, key = _s3(storage, dst)
    try:
        client.delete_object(Bucket=bucket, Key=key, IfMatch=etag)
    except Exception as e:
        code = _code(e)
        if code in ("412", "PreconditionFailed", "409", "ConditionalRequestConflict"):
            return False
        if code in ("404", "NoSuchKey", "NotFound"):
            return True
        if code not in _UNSUPPORTED:
            raise ExportError(f"s3://{bucket}/{key}: removing the export's marker failed: {code}: {e}") from None
        storage.remove(dst, EXPORTING)
    return True


def acquire(storage: Storage, dst: Path, src: Path, overwrite: bool) -> Hold:
    """Take the destination: create the marker where there is none (durable before anything in
    ``dst`` changes). A running export's marker (or one whose export cannot be judged) is refused
    at once, naming it; a dead export's is taken over with ``overwrite``."""
    hold = Hold(uuid.uuid4().hex)
    held_by_other = False
    if isinstance(storage, PosixStorage):
        hold.fd, held_by_other = _flock(dst)
    try:
        note: dict[str, Any] = {
            "export_of": display(src), "pid": os.getpid(), "host": socket.gethostname(), "boot": _boot_id(),
            "pid_start": _proc_start(os.getpid()), "pidns": _pid_ns(), "started": time.time(), "token": hold.token,
        }  # fmt: skip
        if hold.fd is not None:
            note["lock"] = "flock"
        data = (json.dumps(note) + "\n").encode()
        for _ in range(5):
            if held_by_other:
                marker = read_marker(storage, dst) or Marker({}, None, None)
                if not marker.note:
                    raise ExportError(f"another export is writing into {display(dst)!r}: it holds the directory's lock")
                raise _running(dst, marker, True)
            if _create_marker(storage, dst, data, hold):
                storage.sync(dst)
                return hold
            marker = read_marker(storage, dst)
            if marker is None:
                continue  # gone since: try again
            if marker.note.get("token") == hold.token:  # our PUT, whose answer was lost
                hold.etag = marker.etag
                return hold
            alive = _judge(storage, dst, marker, hold.fd)
            if alive is not False:
                raise _running(dst, marker, alive)
            if not overwrite:
                raise ExportError(
                    f"the destination {display(dst)!r} holds {EXPORTING}: an earlier export into it did not finish "
                    f"({who(marker.note)}, no longer running); pass overwrite=True / --overwrite to write into it"
                )
            if remove_marker(storage, dst, marker.etag) and marker.stamp is not None:  # a dead export's: taken over
                hold.taken_from = marker.stamp if hold.taken_from is None else min(hold.taken_from, marker.stamp)
        raise ExportError(
            f"the destination {display(dst)!r}: its marker {EXPORTING} could not be created in 5 tries (other exports "
            "keep creating and removing it); try again"
        )
    except BaseException:
        hold.release()
        raise
