"""``make test``'s pytest: two pytest processes side by side, the scheduler's tests (``tests/sched``:
live services, Slurm, the dashboard, mostly waiting on real processes) and the rest (checkpoints,
plans, benches, mostly computing). One pytest left one of the CI machine's two cores idle about
half the time (load average 1.1 through a whole run). Each process has its own session fixtures
(SeaweedFS for ``tests/ckpt``, PostgreSQL and Slurm for ``tests/sched``), its own temporary
directories and its own cache; every test finds its processes, ports and files by its own ids.

The first's progress shows as it runs; the second's output goes to ``.pytest_cache/sched.log``
(named at the start, kept), printed once it ends. Options are passed to both (``-x``, ``-k``,
``-m slow``); a half that collects nothing (exit 5) counts as passed when the other ran tests.
Given paths or test ids, or with ``GOODPUT_TEST_SERIAL=1``, one pytest runs, as before. Ctrl-C or
SIGTERM reaches both, and both are waited for, so their fixtures' servers are torn down.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCHED = "tests/sched"
LOG = ROOT / ".pytest_cache" / "sched.log"
NO_TESTS = 5  # pytest's exit status when it collected nothing


def _names_tests(argv: list[str]) -> bool:
    """Whether an argument is a path or a test id (which then decides what runs, not the split)."""
    return any(not a.startswith("-") and ("::" in a or (ROOT / a).exists() or Path(a).exists()) for a in argv)


def _stop(procs: list[subprocess.Popen], grace_s: float = 60.0) -> None:
    """Let interrupted pytests tear their fixtures down; then terminate, then kill."""
    deadline = time.monotonic() + grace_s
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.poll() is None:
            p.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(10)
        if p.poll() is None:
            p.kill()
            p.wait()


def main(argv: list[str]) -> int:
    pytest = [sys.executable, "-m", "pytest", "-q"]
    if os.environ.get("GOODPUT_TEST_SERIAL") == "1" or _names_tests(argv):
        return subprocess.call([*pytest, *(argv if _names_tests(argv) else ["tests", *argv])], cwd=ROOT)
    t0 = time.monotonic()
    LOG.parent.mkdir(exist_ok=True)
    procs: list[subprocess.Popen] = []

    def forward(_signum: int, _frame: object) -> None:
        for p in procs:  # as SIGINT: pytest tears its fixtures down on it, not on SIGTERM
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, forward)
    # a handler, not an inherited SIG_IGN (a shell's background job): the pytests start with SIGINT's
    # default, so Python gives them KeyboardInterrupt and they tear their servers down
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with open(LOG, "wb") as log:
        print(f"{SCHED} runs beside the rest; its output ({LOG}) follows when both are done", flush=True)
        try:
            procs.append(subprocess.Popen([*pytest, "-o", "cache_dir=.pytest_cache/sched", SCHED, *argv], cwd=ROOT,
                                          stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))  # fmt: skip
            procs.append(subprocess.Popen([*pytest, "tests", f"--ignore={SCHED}", *argv], cwd=ROOT))
            first = procs[1].wait()
            if procs[0].poll() is None:
                print(f"\nwaiting for {SCHED} ...", flush=True)
            second = procs[0].wait()
        except KeyboardInterrupt:
            print("\ninterrupted: waiting for both pytest runs to tear down", flush=True)
            _stop(procs)
            return 130
        finally:
            log.flush()
            print(f"\n===== {SCHED} =====", flush=True)
            sys.stdout.buffer.write(LOG.read_bytes())
            sys.stdout.flush()
    wall = time.monotonic() - t0
    print(f"\nboth pytest runs: exit {first} (tests but {SCHED}) and {second} ({SCHED}), {wall:.0f} s wall", flush=True)
    ran = [c for c in (first, second) if c != NO_TESTS]
    return next((c for c in ran if c), 0) if ran else NO_TESTS


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
