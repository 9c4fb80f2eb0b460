"""``make test``'s pytest: two pytest processes side by side, the scheduler's tests (``tests/sched``:
live services, Slurm, the dashboard, mostly waiting on real processes) and the rest (checkpoints,
plans, benches, mostly computing). One pytest left one of the CI machine's two cores idle about
half the time (load average 1.1 through a whole run). Each process has its own session fixtures
(SeaweedFS for ``tests/ckpt``, PostgreSQL and Slurm for ``tests/sched``), its own temporary
directories and its own cache; every test finds its processes, ports and files by its own ids.

The first's progress shows as it runs; the second's output goes to a log, printed once it ends.
The exit status is the first non-zero one. Arguments are passed to both (``-x``, ``-k``, ``-m slow``);
``GOODPUT_TEST_SERIAL=1`` runs one pytest over everything, as before.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCHED = "tests/sched"


def main(argv: list[str]) -> int:
    pytest = [sys.executable, "-m", "pytest"]
    if os.environ.get("GOODPUT_TEST_SERIAL") == "1":
        return subprocess.call([*pytest, "-q", "tests", *argv], cwd=ROOT)
    t0 = time.monotonic()
    with tempfile.NamedTemporaryFile("w+b", prefix="goodput-sched-tests-", suffix=".log") as log:
        side = subprocess.Popen(
            [*pytest, "-q", "-o", "cache_dir=.pytest_cache/sched", SCHED, *argv],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            print(f"{SCHED} runs beside the rest; its output follows when both are done", flush=True)
            first = subprocess.call([*pytest, "-q", "tests", f"--ignore={SCHED}", *argv], cwd=ROOT)
            if side.poll() is None:
                print(f"\nwaiting for {SCHED} ...", flush=True)
            second = side.wait()
        except BaseException:
            side.kill()
            side.wait()
            raise
        log.seek(0)
        print(f"\n===== {SCHED} =====", flush=True)
        sys.stdout.buffer.write(log.read())
    wall = time.monotonic() - t0
    print(f"\nboth pytest runs: exit {first} (tests but {SCHED}) and {second} ({SCHED}), {wall:.0f} s wall", flush=True)
    return first or second


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
