"""A tenant's job against the local executor's own cleanup and kill (the hostile review's findings):
a FIFO where the root cleanup expects a directory, a process that rolls its pid to survive a kill,
a log written one byte at a time against the supervisor's memory."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from goodput.sched.live import local
from goodput.sched.live.local import LocalExecutor, remove_tree, remove_workdir
from goodput.sched.live.runas import RunAs, resolve

from .test_local import Exits, _job

PY = sys.executable
# what a tenant's user may run (the test's own interpreter may live where only root reaches)
TENANT_PY = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable
ROOT = os.geteuid() == 0 and shutil.which("useradd") is not None and shutil.which("userdel") is not None


@pytest.fixture
def base():
    """World-traversable (0755), unlike pytest's tmp: a tenant's job reaches its working directory."""
    d = Path(tempfile.mkdtemp(prefix="gp-esc-"))
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def tenant():
    """A fresh Unix user to run jobs as (None where the tests do not run as root)."""
    if not ROOT:
        yield None
        return
    name = f"gpe{uuid.uuid4().hex[:6]}"
    r = subprocess.run(
        ["useradd", "--no-create-home", "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", name],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        pytest.skip(f"useradd failed: {r.stderr.strip()}")
    try:
        yield resolve(name)
    finally:
        subprocess.run(["pkill", "-KILL", "-u", name], capture_output=True)
        subprocess.run(["userdel", name], capture_output=True)


def _executor(base: Path, exits: Exits, who: RunAs | None, env: dict | None = None, **kw) -> LocalExecutor:  # noqa: ANN003
    ckpt = base / "ckpt"  # the job's checkpoint root, its user's
    ckpt.mkdir(exist_ok=True)
    if who is not None:
        os.chown(ckpt, who.uid, who.gid)
    ex = LocalExecutor(
        base / "state",
        url="http://127.0.0.1:9",
        on_exit=exits.on_exit,
        poll_s=0.05,
        run_as=lambda _job: who,
        env_for=lambda _job: dict(env or {}),
        **kw,
    )
    ex.start_watcher()
    return ex


def _wait(pred, timeout: float, what: str) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


# ---------------------------------------------------------------- 1. the working directory's removal


def _outside(base: Path) -> Path:
    victim = base / "victim"
    victim.mkdir()
    (victim / "keep").write_text("root's")
    return victim


def test_remove_tree_unlinks_a_fifo_named_like_a_directory_and_follows_no_link(base):
    victim = _outside(base)
    tree = base / "tree"
    (tree / "d" / "e").mkdir(parents=True)
    os.mkfifo(tree / "x")  # where a directory would be expected
    os.mkfifo(tree / "d" / "e" / "f")
    (tree / "link").symlink_to(victim / "keep")
    (tree / "dlink").symlink_to(victim)
    deep = tree
    for i in range(local.REMOVE_MAX_DEPTH + 10):  # deeper than the walk keeps open: moved up and done
        deep = deep / f"l{i}"
    deep.mkdir(parents=True)
    (deep / "leaf").write_text("x")
    done: list[bool] = []
    t = threading.Thread(target=lambda: done.append(remove_tree(tree)), daemon=True)
    t.start()
    t.join(20)
    assert done == [True], "remove_tree blocked (a FIFO opened?)"
    assert os.listdir(tree) == []
    assert (victim / "keep").read_text() == "root's"


def test_remove_tree_never_blocks_on_a_fifo_swapped_in_for_a_directory_mid_walk(base, monkeypatch):
    """The race of the review (renameat2 RENAME_EXCHANGE of a directory and a FIFO), made
    deterministic: the directory is replaced by a FIFO exactly after it was listed as one and
    before the walk opens it. shutil.rmtree as root opened it O_RDONLY and blocked for ever."""
    victim = _outside(base)
    tree = base / "tree"
    (tree / "x" / "y").mkdir(parents=True)
    (tree / "x" / "y" / "z").symlink_to(victim / "keep")
    real = local._open_dir
    swapped: list[str] = []

    def swap_then_open(name: str, dfd: int) -> int:
        if name in ("x", "y") and name not in swapped:
            swapped.append(name)
            os.rename(name, f"moved-{name}", src_dir_fd=dfd, dst_dir_fd=dfd)
            os.mkfifo(name, dir_fd=dfd)
        return real(name, dfd)

    monkeypatch.setattr(local, "_open_dir", swap_then_open)
    done: list[bool] = []
    t = threading.Thread(target=lambda: done.append(remove_tree(tree)), daemon=True)
    t.start()
    t.join(20)
    assert done == [True], "remove_tree blocked on the FIFO swapped in"
    assert swapped == ["x", "y"] and os.listdir(tree) == []
    assert (victim / "keep").read_text() == "root's"


JOB_LEAVES = r"""
mkdir -p d/e && mkfifo x d/e/x && ln -s "$VICTIM/keep" link && ln -s "$VICTIM" dlink
mkdir locked && touch locked/f && chmod 000 locked
echo done > "$GOODPUT_CKPT_ROOT/left"
"""


def test_a_jobs_fifos_and_links_are_removed_as_its_user_outside_the_lock(base, tenant):
    victim = _outside(base)
    os.chmod(victim, 0o755)
    exits = Exits()
    ex = _executor(base, exits, tenant, env={"VICTIM": str(victim)})
    work = ex.work_dir
    # the cleaner is held for a while on its first directory: the exit is reported and the executor's
    # lock is free meanwhile, whatever the removal does
    gate = threading.Event()
    real = local.remove_workdir
    held: list[bool] = []

    def slow_remove(path: Path, timeout_s: float = local.REMOVE_TIMEOUT_S) -> bool:
        held.append(ex._lock.acquire(timeout=1))
        ex._lock.release()
        gate.wait(10)
        return real(path, timeout_s)

    local.remove_workdir = slow_remove
    try:
        job = _job("leave.00000001", ["/bin/sh", "-c", JOB_LEAVES], base / "ckpt")
        ex.start(job, ("local-00000",), 0.0)
        exits.wait(1)
        assert exits.seen == [("leave.00000001", 1, "finished")], Path(ex.logs_dir / "leave.00000001.1.log").read_text()
        assert (base / "ckpt" / "left").exists()
        _wait(lambda: not (work / "leave.00000001.1").exists(), 5, "not renamed aside after its report")
        _wait(lambda: held, 10, "the cleaner never started")
        assert held == [True]
        assert ex._lock.acquire(timeout=1)  # nothing holds the executor meanwhile
        ex._lock.release()
        gate.set()
        _wait(lambda: not os.listdir(work), 60, f"the working directory was not removed: {os.listdir(work)}")
    finally:
        local.remove_workdir = real
        gate.set()
        ex.close()
    assert (victim / "keep").read_text() == "root's"


@pytest.mark.skipif(not ROOT, reason="needs root and useradd to make a tenant's user")
def test_remove_workdir_removes_only_what_the_owner_could(base, tenant):
    """As the directory's owner: a root-owned directory swapped into the tree keeps its files."""
    root_dir = base / "rootdir"
    root_dir.mkdir()
    (root_dir / "keep").write_text("root's")
    tree = base / "tree"
    tree.mkdir()
    os.rename(root_dir, tree / "rootdir")  # what a tenant could do with a root-owned dir in its own dir
    os.mkfifo(tree / "x")
    os.chown(tree / "x", tenant.uid, tenant.gid)
    os.chown(tree, tenant.uid, tenant.gid)
    os.chmod(tree, 0o700)
    assert remove_workdir(tree, timeout_s=20) is False  # not empty: the root-owned file stays
    assert (tree / "rootdir" / "keep").read_text() == "root's" and not (tree / "x").exists()


# ---------------------------------------------------------------- 2. a kill that leaves nothing behind

ROLLER = r"""
import os, signal, sys, time
root = os.environ["GOODPUT_CKPT_ROOT"]
for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)
if os.fork():
    os._exit(0)  # the command leaves at once; its child rolls on as an orphan of the supervisor
os.setsid()
n = 0
while True:
    try:
        pid = os.fork()
    except OSError:
        time.sleep(0.001)
        continue
    if pid:
        os._exit(0)
    n += 1
    if n == 50:
        open(root + "/rolling", "w").close()
"""


def _marked(mark: str) -> list[int]:
    out = []
    needle = f"ESCAPE_MARK={mark}".encode()
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError), open(f"/proc/{name}/environ", "rb") as f:
                if needle in f.read():
                    out.append(int(name))
    return out


def test_a_pid_rolling_setsid_signal_ignoring_job_dies_with_its_kill(base, tenant):
    mark = uuid.uuid4().hex
    left_at_report: list[list[int]] = []
    exits = Exits()
    real_on_exit = exits.on_exit

    def on_exit(jid: str, epoch: int, status: str) -> None:
        left_at_report.append(_marked(mark))
        real_on_exit(jid, epoch, status)

    ex = _executor(base, exits, tenant, env={"ESCAPE_MARK": mark})
    ex.on_exit = on_exit
    try:
        job = _job("roll.00000001", [TENANT_PY, "-c", ROLLER], base / "ckpt")
        ex.start(job, ("local-00000",), 0.0)
        logf = ex.logs_dir / "roll.00000001.1.log"
        # generous: on a loaded machine (the suite beside other work) fifty forks took seconds
        _wait(lambda: (base / "ckpt" / "rolling").exists() or exits.seen, 180, "the roller never rolled")
        assert not exits.seen, (exits.seen, logf.read_text())
        ex.notify(job, checkpoint=False, deadline_s=1.0)  # ignored, as is every catchable signal
        time.sleep(0.3)
        ex.kill(job)
        exits.wait(1, timeout=local.KILL_WAIT_S + 10)
        assert exits.seen == [("roll.00000001", 1, "killed")], exits.seen
        assert left_at_report == [[]], left_at_report  # reported only once nothing of it was left
        time.sleep(1.0)
        assert _marked(mark) == []
    finally:
        ex.close()
        for pid in _marked(mark):
            with contextlib.suppress(OSError):
                os.kill(pid, 9)


# ---------------------------------------------------------------- 3. the log relay's memory

WRITER = r"""
import os, time
n = int(os.environ["N"])
pat = b"abcdefghijklmnopqrstuvwxyz"
open(os.environ["GOODPUT_CKPT_ROOT"] + "/started", "w").close()
time.sleep(0.5)
for i in range(n):
    os.write(1, pat[i % 26 : i % 26 + 1])
open(os.environ["GOODPUT_CKPT_ROOT"] + "/written", "w").close()
time.sleep(60)
"""


def test_one_byte_writes_keep_the_supervisors_memory_bounded_and_the_newest_half(base):
    import psutil

    cap, n = 4 << 20, 6 << 20
    exits = Exits()
    ex = _executor(base, exits, None, env={"N": str(n)}, max_log_bytes=cap)
    job = _job("tiny.00000001", [PY, "-c", WRITER], base / "ckpt")
    try:
        ex.start(job, ("local-00000",), 0.0)
        _wait(lambda: (base / "ckpt" / "started").exists(), 30, "the writer never started")
        sup = psutil.Process(ex.runs[job.id].pid)
        before = sup.memory_info().rss
        _wait(lambda: (base / "ckpt" / "written").exists(), 120, "the writer never finished")
        logf = Path(ex.runs[job.id].log)
        _wait(lambda: logf.stat().st_size >= (n % (cap // 2)) + cap // 2, 30, "the relay is behind")
        time.sleep(0.5)
        grown = sup.memory_info().rss - before
        assert grown < cap + (32 << 20), f"the supervisor grew by {grown >> 20} MiB for a {cap >> 20} MiB cap"
        ex.kill(job)
        exits.wait(1, timeout=60)
    finally:
        ex.close()
    raw = logf.read_bytes()
    head, _, tail = raw.partition(b"\n")
    assert b"bytes of this run's output were dropped" in head and len(raw) <= cap
    # the newest output, in order, then the supervisor's own line about the kill
    body = tail.split(b"goodput.sched.live.local:")[0]
    pat = b"abcdefghijklmnopqrstuvwxyz"
    want = bytes(pat[i % 26] for i in range(n - len(body), n))
    assert len(body) >= cap // 2 and body == want, (len(body), body[-40:], want[-40:])
