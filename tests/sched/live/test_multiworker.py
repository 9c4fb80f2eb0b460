"""A torchrun job of 2 gloo workers under the local executor: preempted, resumed on 1 worker.

Real processes only: torchrun (``python -m torch.distributed.run``), gloo on loopback, the sharded
Checkpointer on disk. The resumed run's final weights must equal an uninterrupted run's within
``TOLERANCE`` (relative; the arithmetic is the same on 1 and 2 workers, so it is bitwise in practice).
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path

import pytest

from goodput.sched.core.model import Job, JobState
from goodput.sched.live.local import LocalExecutor

from .test_local import Exits

TOLERANCE = 1e-6
STEPS = 24
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch.distributed.run") is None, reason="torchrun (torch.distributed.run) unavailable"
)


def _cmd() -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "-m", "goodput.demo.example_dist_job"] + [
        "--steps", str(STEPS), "--step-s", "0.05", "--interval", "4",
    ]  # fmt: skip


def _job(root: Path, nodes: int, epoch: int) -> Job:
    j = Job(id="dist.00000001", tenant="t", priority=0, nodes=nodes, gpus_per_node=1, submit_s=0.0)
    j.command, j.ckpt_root, j.epoch, j.state = tuple(_cmd()), str(root), epoch, JobState.RUNNING
    return j


def test_torchrun_job_of_two_workers_resumes_on_one_from_its_commit(tmp_path):
    import torch

    import goodput.ckpt as gc
    from goodput.demo.example_dist_job import compare, reference

    root = tmp_path / "ckpt"
    root.mkdir()
    exits = Exits()
    ex = LocalExecutor(tmp_path / "state", on_exit=exits.on_exit, poll_s=0.05)
    ex.start_watcher()
    try:
        j1 = _job(root, 2, 1)
        ex.start(j1, ("local-00000", "local-00001"), 0.0)
        deadline = time.monotonic() + 90
        while gc.latest(root) is None:  # a first committed checkpoint of the 2-worker run
            assert time.monotonic() < deadline, Path(ex.runs[j1.id].log).read_text()
            assert not exits.seen, (
                exits.seen,
                Path(ex.runs.get(j1.id, j1).log).read_text() if j1.id in ex.runs else "",
            )
            time.sleep(0.05)
        ex.notify(j1, checkpoint=True, deadline_s=time.time() + 30)
        exits.wait(1, timeout=60)
        log1 = (tmp_path / "state" / "logs" / "dist.00000001.1.log").read_text()
        assert exits.seen == [("dist.00000001", 1, "preempted")], log1
        committed = gc.open(gc.latest(root)).step
        assert committed is not None and 0 < committed < STEPS
        assert gc.open(gc.latest(root)).manifest.world_size == 2

        j2 = _job(root, 1, 2)
        ex.start(j2, ("local-00000",), 1.0)
        exits.wait(2, timeout=90)
        log2 = (tmp_path / "state" / "logs" / "dist.00000001.2.log").read_text()
        assert exits.seen[1] == ("dist.00000001", 2, "finished"), log2
    finally:
        for run in list(ex.runs.values()):
            ex._killpg(run)
        ex.close()
    starts = [json.loads(x) for x in (root / "starts.jsonl").read_text().splitlines()]
    assert [(s["epoch"], s["world"]) for s in starts] == [(1, 2), (2, 1)]
    assert starts[0]["restored_step"] == 0 and starts[1]["restored_step"] == committed
    final = torch.load(root / "final.pt")
    bitwise, worst = compare(final, reference(STEPS))
    assert bitwise or worst <= TOLERANCE, f"worst relative difference {worst:.3e}"
