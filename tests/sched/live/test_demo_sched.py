"""``goodput demo --sched`` end to end: real torchrun jobs, a real service SIGKILLed and restarted.

About 45 s on 2 cores, hence slow (run with ``-m slow`` or ``GOODPUT_SLOW=1``).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("torch.distributed.run") is None, reason="torchrun unavailable")
def test_goodput_demo_sched_passes_every_check(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "goodput.cli.main", "demo", "--sched", "--workdir", str(tmp_path / "demo")],
        capture_output=True,
        text=True,
        timeout=240,
    )
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    assert "all checks passed" in out
    assert "FAILED" not in out
