"""A real small file system for the tests that need one to fill up (ENOSPC) or to be busy: a
tmpfs mounted where root may mount one; elsewhere the test is skipped, saying why."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def mounted_tmpfs(mnt: Path, size: str, instead: str = "") -> Iterator[Path]:
    """``mnt`` (created if missing) as a tmpfs of ``size`` (mount's ``-o size=``), unmounted after.
    ``instead``: what covers the path where none can be mounted, added to the skip's reason."""
    mnt.mkdir(parents=True, exist_ok=True)
    ok = (
        os.geteuid() == 0
        and subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], capture_output=True
        ).returncode
        == 0
    )
    if not ok:
        pytest.skip(f"cannot mount a tmpfs here (not root){instead}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
