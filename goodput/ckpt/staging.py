"""``goodput.ckpt.staging``, the path docs/ASYNC.md gives users: :mod:`goodput.ckpt.saving.staging`."""

from .saving.staging import CopyFirst, StagingPool, StaleStateError

__all__ = ["CopyFirst", "StagingPool", "StaleStateError"]
