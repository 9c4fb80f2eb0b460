"""goodput.ckpt: sharded, reshardable, atomic, checksummed checkpoints.

Switch from DCP by changing one import::

    import goodput.ckpt as dcp
    dcp.save(state_dict, checkpoint_id=path)
    dcp.load(state_dict, checkpoint_id=path)

The numpy-only reader (:func:`open`, :func:`latest`, :func:`list_checkpoints`,
:func:`scan_checkpoints`, :class:`DamagedCheckpointWarning`) is importable without torch; the names that need torch are imported lazily on first use. ``_LAZY`` below is
the public map: each public name and the module that holds it.

How the modules fit, for a reader of the code: each folder is one stretch of the data's path,
each imports only those below it, and each module's first line says what it holds.

- here, the public API: :mod:`.checkpointer` (drives saves and restores from a training loop),
  :mod:`.state` (a state dict as leaves; tensor subclasses that describe their shards through
  DCP's protocol: :mod:`.tensor_protocol`), :mod:`.errors`, :mod:`.collective`, :mod:`.rng`, and
  :mod:`.dcp_compat` (DCP's call shapes: ``FileSystemWriter``/``Reader``, ``checkpoint_id=``,
  planners), which save and load accept;
- :mod:`.compat`: other formats in and out: :mod:`.compat.dcp_import` (DCP's format in),
  :mod:`.compat.exporter` (consolidated safetensors or torch out);
- :mod:`.saving`: the save path, from :mod:`.saving.saver` down: :mod:`.saving.agreement` (rank
  0's verdict and the save plan), :mod:`.saving.writer` (data files), :mod:`.saving.commit`
  (metadata, manifest, the commit round); asynchronous saves add :mod:`.saving.async_saver`,
  :mod:`.saving.staging` (the host copy), :mod:`.saving.background` (the file-based commit) and
  :mod:`.saving.writer_process`; :mod:`.saving.tiers` drains a fast tier's commit to a durable one;
- :mod:`.loading`: the load path, from :mod:`.loading.loader` down: :mod:`.loading.reader` (a
  committed checkpoint opened), :mod:`.loading.read_plan` (which byte runs fill the requested
  regions), :mod:`.loading.read_exec` (reading and verifying them), :mod:`.loading.load_staging`
  (targets that cannot be read into directly), :mod:`.loading.hf` (Hugging Face safetensors in,
  into any layout);
- :mod:`.storage`: the one seam through which every byte is read or written
  (:mod:`.storage.base`), POSIX (:mod:`.storage.local`), S3 (:mod:`.storage.s3`), and the storage
  a location picks (:mod:`.storage.location`);
- :mod:`.format`: what is on disk: :mod:`.format.format` (names, manifest, metadata, validation),
  :mod:`.format.chunk_index`, :mod:`.format.geometry`, :mod:`.format.crc`, :mod:`.format.dtypes`.

Public paths that stand here for a module below: :mod:`.state_dict_saver`,
:mod:`.state_dict_loader` and :mod:`.filesystem` (DCP's modules of those names), :mod:`.staging`
and :mod:`.s3` (paths the docs give users).

A public name never shares a submodule's name (importing the submodule would replace it): hence
``saving`` and ``loading`` beside ``save`` and ``load``.
"""

from __future__ import annotations

from typing import Any

from .errors import CheckpointError
from .loading.reader import (
    Checkpoint,
    DamagedCheckpointWarning,
    TensorInfo,
    latest,
    list_checkpoints,
    open,
    scan_checkpoints,
)

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
    "DamagedCheckpointWarning",
    "TensorInfo",
    "latest",
    "list_checkpoints",
    "open",
    "scan_checkpoints",
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
