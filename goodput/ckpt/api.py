"""Transitional: the names async_saver.py still imports from here (removed once it moves)."""

from .errors import SaveError
from .saver import check_block_bytes, prepare
from .storage import checkpoint_path as _resolve

__all__ = ["SaveError", "_resolve", "check_block_bytes", "prepare"]
