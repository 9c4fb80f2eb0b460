"""A full disk: a clear error, the previous checkpoint intact and loadable.

A real small file system (tmpfs) where root may mount one; otherwise a real kernel-enforced write
limit (RLIMIT_FSIZE, EFBIG) in a child process: either way the writes really fail.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import goodput.ckpt as gc
from goodput.ckpt.format.format import MANIFEST
from tests.ckpt.tmpfs import mounted_tmpfs

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def small_fs(tmp_path: Path):
    with mounted_tmpfs(tmp_path / "small", "6m", "; the RLIMIT_FSIZE test covers the full-disk path") as mnt:
        yield mnt


def test_enospc_sync_and_async_keep_the_previous_checkpoint(small_fs: Path) -> None:
    small = {"w": torch.arange(256 * 1024, dtype=torch.float32)}  # 1 MiB
    gc.save(small, small_fs / "ck", step=1)
    big = {"w": torch.ones(2 * 1024 * 1024)}  # 8 MiB: does not fit
    with pytest.raises(gc.SaveError, match=r"No space left|Errno 28"):
        gc.save(big, small_fs / "ck", step=2)
    t = {"w": torch.zeros(256 * 1024)}
    assert gc.load(t, small_fs / "ck").step == 1 and torch.equal(t["w"], small["w"])
    gc.verify(small_fs / "ck")
    assert not [p for p in (small_fs / "ck").iterdir() if p.name.startswith("data-") and p.stat().st_size > 2 << 20]
    # the same through the Checkpointer's background writer
    ck = gc.Checkpointer(small_fs / "run", interval=1, mode="process")
    ck.save(1, small).result()
    h = ck.save(2, big)
    with pytest.raises(gc.SaveError, match=r"No space left|Errno 28"):
        h.result()
    with pytest.raises(gc.SaveError, match="previous asynchronous save failed"):
        ck.save(3, small)
    ck.close()
    assert gc.latest(small_fs / "run").name == "step_000000001"
    t = {"w": torch.zeros(256 * 1024)}
    gc.load(t, gc.latest(small_fs / "run"))
    assert torch.equal(t["w"], small["w"])
    assert not (small_fs / "run" / "step_000000002" / MANIFEST).exists()


def test_write_limit_error_keeps_the_previous_checkpoint(tmp_path: Path) -> None:
    code = textwrap.dedent(f"""
        import json, resource, signal, torch, goodput.ckpt as gc
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # get EFBIG instead of being killed
        gc.save({{"w": torch.arange(1024, dtype=torch.float32)}}, {str(tmp_path / "ck")!r}, step=1)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
        try:
            gc.save({{"w": torch.ones(1 << 20)}}, {str(tmp_path / "ck")!r}, step=2)
            err = None
        except gc.SaveError as e:
            err = str(e)
        print(json.dumps({{"err": err}}))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stderr
    err = json.loads(out.stdout.strip().splitlines()[-1])["err"]
    assert err is not None and ("File too large" in err or "Errno 27" in err), err
    t = {"w": torch.zeros(1024)}
    assert gc.load(t, tmp_path / "ck").step == 1 and torch.equal(t["w"], torch.arange(1024, dtype=torch.float32))
    gc.verify(tmp_path / "ck")
