"""``goodput.ckpt.s3.configure(...)``, the path README.md and docs/S3.md give users: :mod:`goodput.ckpt.storage.s3`."""

from .storage.s3 import S3Options, S3Storage, configure, default_storage

__all__ = ["S3Options", "S3Storage", "configure", "default_storage"]
