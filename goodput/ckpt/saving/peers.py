"""A second channel between the ranks of an asynchronous save: the process group's key-value store.

The background of an asynchronous save talks through the storage it writes to
(:mod:`goodput.ckpt.saving.background`). When that storage fails one rank's write, it may refuse
that rank's report as well (a 503 storm on its objects), and rank 0, whose own writes went
through, would wait for the report until the save's timeout. The process group's store (the
``TCPStore`` or ``FileStore`` the group was made with) does not depend on the checkpoint's storage,
and is not a collective, so the background may use it without ever pairing with the training
loop's collectives:

- a rank whose save failed sets ``<save id>/failed`` (its error); rank 0's watcher is woken and
  tells rank 0's writer, which aborts instead of waiting out the timeout;
- rank 0 sets ``<save id>/end`` when its writer has decided (``ok`` or the reason); the other
  ranks' watchers are woken and, on an abort, tell their writers, which stop waiting for a
  manifest that will never come.

The writer (a thread, or the writer process, which has no torch) hears it through a *note*: a
small local file the watcher writes, which the writer's polling loops look for (``job["peer_note"]``).
Each watcher waits on its own connection (``Store.clone``), blocking in the store, so a save costs
no polling of the store. Where the group's store cannot be had, the saves talk through the storage
alone, as before, and a warning says so once.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Any

import torch.distributed as dist

PREFIX = "goodput-async-save"


def note_path(save_id: str) -> Path:
    return Path(tempfile.gettempdir()) / f"goodput-{os.getpid()}-{save_id}.peer"


def read_note(job: dict[str, Any]) -> str | None:
    """What the watcher heard for this job (another rank's failure, or rank 0's abort), if anything."""
    path = job.get("peer_note")
    if not path:
        return None
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"(the note of another rank's failure could not be read: {e})"


class Watch:
    """One save's watcher on one rank: wakes when the key it waits for is set, and leaves a note
    for the writer unless the save has ended first."""

    def __init__(self, store: Any, job: dict[str, Any], key: str, timeout_s: float) -> None:
        self.job = job
        self.note = Path(job["peer_note"])
        self._lock = threading.Lock()
        self._ended = False
        self._thread = threading.Thread(
            target=self._run, args=(store, key, timeout_s), name="goodput-save-peers", daemon=True
        )
        self._thread.start()

    def _run(self, store: Any, key: str, timeout_s: float) -> None:
        try:
            own = store.clone()  # a connection of its own: the wait blocks it, nobody else
            own.wait([key], datetime.timedelta(seconds=timeout_s))
            value = own.get(key).decode("utf-8", errors="replace")
        except Exception:  # noqa: BLE001 - a timeout or a closed store: the storage channel remains
            return
        if value in ("", "ok"):
            return
        with self._lock:
            if self._ended:
                return
            tmp = self.note.with_name(self.note.name + ".tmp")
            with contextlib.suppress(OSError):
                tmp.write_text(value, encoding="utf-8")
                os.replace(tmp, self.note)

    def end(self) -> None:
        """The save has ended on this rank: no note may appear after this, and none is left."""
        with self._lock:
            self._ended = True
        with contextlib.suppress(OSError):
            self.note.unlink()


class Peers:
    """The channel of one saver (one process group); None-safe: every method is a no-op when the
    group's store could not be had."""

    def __init__(self, group: Any) -> None:
        self.store: Any = None
        try:
            from torch.distributed import distributed_c10d as c10d

            self.store = c10d._get_process_group_store(group if group is not None else dist.group.WORLD)
        except Exception as e:  # noqa: BLE001 - the storage channel still works, only slower to fail
            warnings.warn(
                f"goodput.ckpt: the process group's store is out of reach ({type(e).__name__}: {e}); "
                "a rank whose asynchronous save fails can then only tell the others through the storage",
                RuntimeWarning,
                stacklevel=3,
            )

    def key(self, save_id: str, what: str) -> str:
        return f"{PREFIX}/{save_id}/{what}"

    def prepare(self, job: dict[str, Any]) -> None:
        if self.store is not None:
            job["peer_note"] = str(note_path(job["save_id"]))

    def watch(self, job: dict[str, Any]) -> Watch | None:
        """Start listening for this job: rank 0 for another rank's failure, the others for rank 0's end."""
        if self.store is None or not job.get("peer_note"):
            return None
        rank, sid = job["rank"], job["save_id"]
        # rank 0 decides within its timeout; the others wait for it as long as their writers do
        timeout = job["timeout"] if rank == 0 else 2 * job["timeout"] + 60
        return Watch(self.store, job, self.key(sid, "failed" if rank == 0 else "end"), timeout)

    def tell(self, job: dict[str, Any], ok: bool, error: str | None) -> None:
        """This rank's save has ended: rank 0 tells everyone how (and wakes its own watcher); any
        other rank tells rank 0 when it failed."""
        if self.store is None:
            return
        rank, sid = job["rank"], job["save_id"]
        with contextlib.suppress(Exception):
            if rank == 0:
                self.store.set(self.key(sid, "failed"), "")
                self.store.set(self.key(sid, "end"), "ok" if ok else (error or "unknown"))
            elif not ok:
                self.store.set(self.key(sid, "failed"), f"rank {rank}: {error or 'unknown'}")
