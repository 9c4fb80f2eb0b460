"""goodput.ckpt: sharded, reshardable, atomic, checksummed checkpoints.

Switch from DCP by changing one import::

    import goodput.ckpt as dcp
    dcp.save(state_dict, checkpoint_id=path)
    dcp.load(state_dict, checkpoint_id=path)

The numpy-only reader (:func:`open`, :func:`latest`, :func:`list_checkpoints`) is importable
without torch; the names that need torch are imported lazily on first use. ``_LAZY`` below is
the public map: each public name and the module that holds it.

How the modules fit, for a reader of the code (each module's first line says what it holds):

- the save path, from :mod:`.saver` down: :mod:`.state` (a state dict as leaves),
  :mod:`.agreement` (rank 0's verdict and the save plan), :mod:`.writer` (data files),
  :mod:`.commit` (metadata, manifest, the commit round); asynchronous saves add
  :mod:`.async_saver`, :mod:`.staging` (the host copy), :mod:`.background` (the file-based
  commit) and :mod:`.writer_process`; :mod:`.checkpointer` drives it all from a training loop;
- the load path, from :mod:`.loader` down: :mod:`.reader` (a committed checkpoint opened),
  :mod:`.read_plan` (which byte runs fill the requested regions), :mod:`.read_exec` (reading and
  verifying them), :mod:`.load_staging` (targets that cannot be read into directly);
- the format: :mod:`.format` (names, manifest, metadata, validation), :mod:`.chunk_index`,
  :mod:`.geometry`, :mod:`.crc`, :mod:`.dtypes`;
- storage: :mod:`.storage`, the one seam through which every byte is read or written;
- :mod:`.errors`, :mod:`.collective`, :mod:`.rng`; :mod:`.dcp_compat` (DCP's call shapes) and
  :mod:`.dcp_import` (DCP's format in).

A public name never shares a submodule's name (importing the submodule would replace it).
"""

from __future__ import annotations

from typing import Any

from .errors import CheckpointError
from .reader import Checkpoint, TensorInfo, latest, list_checkpoints, open

_LAZY = {
    "save": ".saver",
    "SaveResult": ".saver",
    "load": ".loader",
    "LoadResult": ".loader",
    "verify": ".loader",
    "SaveError": ".errors",
    "async_save": ".async_saver",
    "AsyncSaver": ".async_saver",
    "AsyncSave": ".async_saver",
    "Checkpointer": ".checkpointer",
    "CommitEvent": ".checkpointer",
    "PREEMPTED_EXIT": ".checkpointer",
    "LocalShard": ".state",
    "FlatShard": ".state",
    "FileSystemWriter": ".dcp_compat",
    "FileSystemReader": ".dcp_compat",
    "save_state_dict": ".dcp_compat",
    "load_state_dict": ".dcp_compat",
}

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "TensorInfo",
    "latest",
    "list_checkpoints",
    "open",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'goodput.ckpt' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(mod, __name__), name)
