"""DCP's ``torch.distributed.checkpoint.filesystem`` module, as goodput: ``FileSystemWriter`` and
``FileSystemReader`` are goodput's (:mod:`goodput.ckpt.dcp_compat`). DCP's storage-layer classes
(``FileSystem``, stream transforms) have no counterpart: goodput's format has no such layer."""

from __future__ import annotations

from .dcp_compat import FileSystemReader, FileSystemWriter

__all__ = ["FileSystemReader", "FileSystemWriter"]
