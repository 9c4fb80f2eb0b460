"""Writers die with their trainer (issue 25, item 3): a trainer SIGKILLed while its save is being
written leaves no writer process, no shared-memory segment and no commit behind (real processes,
a real SIGKILL, the real /dev/shm)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from goodput.ckpt.format import MANIFEST

REPO = Path(__file__).resolve().parents[2]

TRAINER = r"""
import sys, time, torch
import goodput.ckpt as gc
saver = gc.AsyncSaver(mode="process")
h = saver.save({"w": torch.ones(4 << 20)}, sys.argv[1])  # 16 MiB staged in shared memory
h.staged.result()
print(saver._proc.proc.pid, saver.pool.name, flush=True)
time.sleep(600)
"""


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:  # a zombie (not yet reaped by init) is gone too
            return any(line.split() == ["State:", "Z", "(zombie)"] for line in f)
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not os.path.isdir("/dev/shm") or sys.platform != "linux", reason="needs Linux /dev/shm")
def test_sigkilled_trainer_leaves_no_writer_no_segment_no_commit(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    env = {**os.environ, "PYTHONPATH": str(REPO), "GOODPUT_CKPT_SLOW_WRITE_S": "30"}  # a write longer than the test
    trainer = subprocess.Popen(
        [sys.executable, "-c", TRAINER, str(ckpt)], env=env, stdout=subprocess.PIPE, text=True, cwd=REPO
    )
    try:
        assert trainer.stdout is not None
        line = trainer.stdout.readline().split()
        assert len(line) == 2, f"the trainer did not start its save (exit {trainer.poll()})"
        writer, segment = int(line[0]), line[1]
        assert not _gone(writer)
        time.sleep(0.5)  # the writer is inside its (slow) write
        trainer.send_signal(signal.SIGKILL)
        trainer.wait(30)
        deadline = time.monotonic() + 5.0
        while not _gone(writer) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _gone(writer), "the writer outlived its trainer by more than 5 s"
        left = [n for n in os.listdir("/dev/shm") if n.startswith(f"goodput-{trainer.pid}-")]
        assert left == [] and not os.path.exists(f"/dev/shm/{segment}")
        assert not (ckpt / MANIFEST).exists()  # aborted: nothing committed
    finally:
        if trainer.poll() is None:
            trainer.kill()
            trainer.wait(30)
        if trainer.stdout is not None:
            trainer.stdout.close()
