"""DCP's ``torch.distributed.checkpoint.state_dict_saver`` module, as goodput.

Code that imports DCP's module (``import torch.distributed.checkpoint.state_dict_saver as
saver``, torchtitan's ``from ... import AsyncCheckpointerType``) switches by importing this one:
``save``, ``async_save`` and ``save_state_dict`` are goodput's; ``AsyncCheckpointerType`` and
``AsyncSaveResponse`` are DCP's own (what goodput's ``async_save`` takes and answers with).
"""

from __future__ import annotations

from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType, AsyncSaveResponse

from .saving.async_saver import async_save
from .saving.saver import save, save_state_dict

__all__ = ["AsyncCheckpointerType", "AsyncSaveResponse", "async_save", "save", "save_state_dict"]
