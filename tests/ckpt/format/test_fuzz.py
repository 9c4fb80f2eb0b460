"""Hostile checkpoints: damaged or forged copies of a small checkpoint, each then latest()-ed,
read, verified and loaded (tests/ckpt/format/fuzz_child.py). Every outcome must be a CheckpointError
that names what is wrong, or data equal to the original; never another exception, a hang, an
allocation past 4 GiB of address space, or a read outside the checkpoint's directory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _campaign(tmp_path: Path, seed: int, trials: int) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "tests.ckpt.format.fuzz_child", str(seed), str(trials), str(tmp_path / "work")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60 + trials * 25,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _assert_clean(res: dict, trials: int) -> None:
    assert sum(res["counts"].values()) == trials
    assert all(n > 0 for n in res["counts"].values()), res["counts"]  # every family ran
    assert res["outside"] == []
    assert res["problems"] == []


def test_hostile_checkpoints_short(tmp_path: Path) -> None:
    _assert_clean(_campaign(tmp_path, seed=20261201, trials=330), 330)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_hostile_checkpoints_long(tmp_path: Path, seed: int) -> None:
    _assert_clean(_campaign(tmp_path, seed=seed, trials=2000), 2000)
