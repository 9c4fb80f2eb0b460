"""What the S3 tests share besides the fixtures of ``tests/ckpt/conftest.py``: pointing this
process (and the ranks and writer processes it spawns, through the environment) at a server,
and listing what a test left in its bucket."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from goodput.ckpt.storage import s3
from goodput.demo.seaweed import Weed


@contextmanager
def serving(w: Weed) -> Iterator[Weed]:
    """``w`` is where ``s3://`` goes, through the standard AWS chain, until the block ends; then
    whatever was there before (another server, or none) is back, and so is a fresh default
    storage (a test's ``s3.configure`` never outlives its server)."""
    old = {k: os.environ.get(k) for k in w.env()}
    os.environ.update(w.env())
    s3._default = None
    try:
        yield w
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        s3._default = None


def keys(bucket: str, prefix: str = "") -> list[str]:
    """Keys under ``bucket`` (a bucket name, or ``name/test prefix`` as the ``bucket`` fixture
    gives) + ``prefix``, relative to the test's prefix."""
    name, _, base = bucket.partition("/")
    full = f"{base}/{prefix}" if base else prefix
    c = s3.default_storage().client()
    out = []
    for page in c.get_paginator("list_objects_v2").paginate(Bucket=name, Prefix=full):
        out += [o["Key"][len(base) + 1 if base else 0 :] for o in page.get("Contents", [])]
    return sorted(out)
