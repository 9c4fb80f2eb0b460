"""Where checkpoint bytes live: the seam (:mod:`.base`), POSIX (:mod:`.local`), S3 (:mod:`.s3`),
and which one a location picks (:mod:`.location`). ``goodput.ckpt.storage.X`` is a public path."""

from .base import Entry, Sink, Source, Storage
from .local import POSIX, PosixFile, PosixSource, PosixStorage
from .location import S3Location, as_location, checkpoint_path, display, storage_for

__all__ = [
    "POSIX",
    "Entry",
    "PosixFile",
    "PosixSource",
    "PosixStorage",
    "S3Location",
    "Sink",
    "Source",
    "Storage",
    "as_location",
    "checkpoint_path",
    "display",
    "storage_for",
]
