"""DCP's ``torch.distributed.checkpoint.state_dict_loader`` module, as goodput: ``load`` and
``load_state_dict`` are goodput's (``import goodput.ckpt.state_dict_loader as loader`` where code
imported DCP's)."""

from __future__ import annotations

from .loading.loader import load, load_state_dict

__all__ = ["load", "load_state_dict"]
