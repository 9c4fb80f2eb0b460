"""goodput.ckpt: sharded, reshardable, atomic, checksummed checkpoints.

Switch from DCP by changing one import::

    import goodput.ckpt as dcp
    dcp.save(state_dict, checkpoint_id=path)
    dcp.load(state_dict, checkpoint_id=path)

The numpy-only reader (:func:`open`, :func:`latest`, :func:`list_checkpoints`) is importable
without torch; the names that need torch are imported lazily on first use. ``_LAZY`` below is
the public map: each public name and the module that holds it.

How the modules fit, for a reader of the code (each module's first line says what it holds):

- the save path, from :mod:`.saver` down: :mod:`.state` (a state dict as leaves; tensor
  subclasses that describe their shards through DCP's protocol: :mod:`.tensor_protocol`),
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
- :mod:`.errors`, :mod:`.collective`, :mod:`.rng`; :mod:`.dcp_compat` (DCP's call shapes, with
  :mod:`.state_dict_saver`, :mod:`.state_dict_loader` and :mod:`.filesystem` standing for DCP's
  modules of those names), :mod:`.dcp_import` (DCP's format in), :mod:`.hf` (Hugging Face
  safetensors in, into any layout) and :mod:`.exporter` (consolidated safetensors or torch out).

A public name never shares a submodule's name (importing the submodule would replace it).
"""

from __future__ import annotations

from typing import Any

from .errors import CheckpointError
from .loading.reader import Checkpoint, TensorInfo, latest, list_checkpoints, open

_LAZY = {
    "save": ".saving.saver",
    "SaveResult": ".saving.saver",
    "load": ".loading.loader",
    "LoadResult": ".loading.loader",
    "verify": ".loading.loader",
    "SaveError": ".errors",
    "async_save": ".saving.async_saver",
    "AsyncSaver": ".saving.async_saver",
    "AsyncSave": ".saving.async_saver",
    "Checkpointer": ".checkpointer",
    "CommitEvent": ".checkpointer",
    "PREEMPTED_EXIT": ".checkpointer",
    "LocalShard": ".state",
    "FlatShard": ".state",
    "FileSystemWriter": ".dcp_compat",
    "FileSystemReader": ".dcp_compat",
    "save_state_dict": ".saving.saver",
    "load_state_dict": ".loading.loader",
    "export": ".compat.exporter",
    "ExportResult": ".compat.exporter",
}

# DCP's own objects, for code written against torch.distributed.checkpoint: goodput's save and
# load accept DCP's default planners, async_save takes AsyncCheckpointerType and answers with
# AsyncSaveResponse when DCP's stager asks for it. Imported from DCP on first use.
_FROM_DCP = {
    "DefaultSavePlanner": "torch.distributed.checkpoint.default_planner",
    "DefaultLoadPlanner": "torch.distributed.checkpoint.default_planner",
    "AsyncCheckpointerType": "torch.distributed.checkpoint.state_dict_saver",
    "AsyncSaveResponse": "torch.distributed.checkpoint.state_dict_saver",
}

# DCP's modules that goodput mirrors under the same names (``import goodput.ckpt.state_dict_saver
# as saver`` where code had DCP's): submodules, imported on first attribute access as DCP's are.
_SUBMODULES = ("state_dict_saver", "state_dict_loader", "filesystem")

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "CheckpointException",
    "TensorInfo",
    "latest",
    "list_checkpoints",
    "open",
    *_LAZY,
    *_FROM_DCP,
]


def __getattr__(name: str) -> Any:
    import importlib

    if name == "CheckpointException":
        # DCP's exception class, which every goodput error is a subclass of once DCP is
        # imported (:mod:`.errors`); goodput's own CheckpointError where torch is absent
        try:
            return importlib.import_module("torch.distributed.checkpoint.api").CheckpointException
        except ImportError:
            return CheckpointError
    if name in _FROM_DCP:
        return getattr(importlib.import_module(_FROM_DCP[name]), name)
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'goodput.ckpt' has no attribute {name!r}")
    return getattr(importlib.import_module(mod, __name__), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | set(_SUBMODULES))
