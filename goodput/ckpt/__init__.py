"""goodput.ckpt: sharded, reshardable, atomic, checksummed checkpoints.

Switch from DCP by changing one import::

    import goodput.ckpt as dcp
    dcp.save(state_dict, checkpoint_id=path)
    dcp.load(state_dict, checkpoint_id=path)

The numpy-only reader (:func:`open`, :func:`latest`, :func:`list_checkpoints`) is importable
without torch; the names that need torch are imported lazily on first use.
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
