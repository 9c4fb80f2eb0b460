"""The local executor: each job's command as its own process group on slots of this machine.

A "node" of the scheduler is a slot of the local machine; node ``i`` of a pool of ``g`` GPUs per
node owns the device indices ``i*g .. i*g+g-1``, and a job gets the lowest free ones on each of its
nodes (``CUDA_VISIBLE_DEVICES``). Each run is started through a tiny supervisor
(``python -m goodput.sched.live.local --status FILE -- CMD...``) that leads the process group, ignores the
preemption signals itself (so the group can be signalled as a whole), waits for the command and
writes its exit status to a file. That file is why a service killed with SIGKILL loses nothing: a
restarted service cannot ``waitpid`` a process it did not fork, but it can re-adopt the group from
the run record (pid, pgid, process start time) and read the exit status from the file once the
supervisor is gone.

Multi-worker runs: a gang of K slots gets one command, typically ``torchrun ...``; the environment
(:func:`launch_env`) makes a plain command rank 0 of world size 1 and gives torchrun its defaults
(one node, K workers, 127.0.0.1 and a free port). torchrun starts each worker in a session of its
own, so notices and kills go to every descendant of the supervisor, not only to its group; the
supervisor is the child subreaper, waits for every process of the run (the slots are released only
after that) and reads a launcher that died on SIGUSR1 while each of its workers left with 75 as a
preemption (:func:`exit_status`).

Isolation. The supervisor runs as the service's user (it must write the status file the job may
not forge, and signal and reap every process of the run); it starts the command as the run's
:class:`goodput.sched.live.runas.RunAs` (uid, gid, supplementary groups, umask 077) in a working
directory of its own (``STATE/work/<job>.<epoch>``, 0700, owned by that user, removed when the run
is reported), with an environment built from an allowlist of the service's variables plus the
spec's ``env`` plus the run's own ``GOODPUT_*`` values, never the service's whole environment. The
run's job token is a file in that directory, readable by that user only. The supervisor itself
starts from a clean environment (``python -I``): nothing of a tenant's reaches the process that
keeps the service's privileges.

Exit statuses reported to the scheduler: 0 → ``finished``; 75 (``goodput.ckpt.PREEMPTED_EXIT``) →
``preempted``; the group killed by us, or a command (and every worker it left) dead of the notice
signal we sent it after we sent it (a job with no handler for SIGTERM obeying a stop) → ``killed``;
any other status, a command killed by a signal we did not send included (the OOM killer's SIGKILL,
a SIGTERM it sent itself before any notice) → ``failed`` (its signal in the status file and the
job's log); a group that vanished without a status file and without our kill (its slot was lost:
something outside killed the supervisor too) → ``lost``, which the core accounts as an
infrastructure loss (``running --lost--> pending``).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import queue
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..core.model import Job
from .reaping import kill_descendants as _kill_descendants
from .reaping import reap_orphans as _reap_orphans
from .reaping import subreaper as _subreaper
from .runas import RunAs

log = logging.getLogger("goodput.sched.live.local")

PREEMPTED_EXIT = 75  # goodput.ckpt.PREEMPTED_EXIT, repeated so the executor never imports torch
DEFAULT_MAX_LOG_BYTES = 64 << 20  # the cluster's limits.max_log_bytes when it gives none
RECORD_WAIT_S = 30.0  # a supervisor whose run the service has not recorded by then does not run it
# a kill asks the supervisor (this signal, to it alone) to kill and reap its whole tree; only when it
# has not exited this long after (a process stuck in the kernel) is it SIGKILLed, as a last resort
KILL_SIGNAL = signal.SIGUSR2
KILL_WAIT_S = 30.0
# a run's working directory, once reported, is renamed aside (TRASH_PREFIX...) at once and emptied
# later by a child process as its owner (remove_tree), killed past REMOVE_TIMEOUT_S
TRASH_PREFIX = ".trash-"
REMOVE_TIMEOUT_S = 60.0
SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")

# the environment a job is started with (docs/PROTOCOL.md)
ENV_JOB_ID = "GOODPUT_JOB_ID"
ENV_EPOCH = "GOODPUT_JOB_EPOCH"
ENV_URL = "GOODPUT_SCHED_URL"
ENV_TOKEN = "GOODPUT_JOB_TOKEN"  # read by CommitReporter when set; the executor hands the token as a file
ENV_TOKEN_FILE = "GOODPUT_JOB_TOKEN_FILE"
ENV_CKPT_ROOT = "GOODPUT_CKPT_ROOT"
ENV_RESUME = "GOODPUT_RESUME_FROM_S"
ENV_NOTICE = "GOODPUT_NOTICE_FILE"
ENV_NODES = "GOODPUT_NODES"
ENV_SLOTS = "GOODPUT_SLOTS"
# what a job inherits of the service's environment (everything else it gets from its spec and its run)
ENV_ALLOW = ("PATH", "LANG", "LANGUAGE", "TZ", "TERM")
ENV_ALLOW_PREFIX = ("LC_",)
JOB_UMASK = 0o077


def default_user_procs() -> int:
    """The processes (threads included) a tenant's user may hold at once, all its jobs together, unless
    the operator says otherwise: a quarter of the kernel's pid space, so one tenant's fork bomb cannot
    take every pid of the machine (the service could then start no one's job). No cgroups here: this
    is ``RLIMIT_NPROC``, which counts per user, not per job."""
    try:
        pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    except (OSError, ValueError):
        pid_max = 32768
    return max(256, pid_max // 4)


def job_environment(base: dict[str, str], spec_env: dict[str, str], own: dict[str, str], who: RunAs | None) -> dict:
    """A run's environment: the allowlisted variables of ``base`` (the service's), the user's identity
    (HOME, USER, LOGNAME), the spec's ``env``, then the run's own values, which nothing overrides."""
    env = {k: v for k, v in base.items() if k in ENV_ALLOW or k.startswith(ENV_ALLOW_PREFIX)}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    if who is not None:
        env.update(HOME=who.home, USER=who.user, LOGNAME=who.user)
    env.update(spec_env)
    env.update(own)
    return env


def _private_dir(path: Path, mode: int = 0o700) -> None:
    """``path`` as a directory of ours with ``mode`` exactly (the umask does not decide it)."""
    path.mkdir(parents=True, exist_ok=True)
    st = path.stat()
    if st.st_uid == os.geteuid() and (st.st_mode & 0o777) != mode:
        os.chmod(path, mode)


def _write_in(dfd: int, name: str, data: bytes, *, mode: int = 0o600, owner: tuple[int, int] | None = None) -> None:
    """Write ``name`` in the directory open as ``dfd`` atomically, never following a link a job may
    have planted there: a fresh temporary file (O_EXCL | O_NOFOLLOW), then a rename over ``name``."""
    tmp = f".{name}.{secrets.token_hex(6)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dfd)
    try:
        os.write(fd, data)
        os.fsync(fd)
        if owner is not None:
            os.fchown(fd, *owner)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
    try:
        os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dfd)
        raise


@dataclass
class Run:
    """One run (job, epoch) as recorded on disk: enough to re-adopt it after the service died."""

    job: str
    epoch: int
    pid: int
    pgid: int
    create_time: float  # the supervisor's start time (psutil): a recycled pid is not our run
    nodes: list[str]
    devices: dict[str, list[int]]  # node -> device indices on it
    log: str
    status_file: str
    notice_file: str
    killed: bool = False  # we sent SIGKILL: its exit is "killed", never a lost slot
    # the notice signals we sent it (numbers) and when the first one went (time.time()): a command that
    # dies of one of them after that obeyed our stop ("killed"), not a failure of its own
    signalled: list[int] = field(default_factory=list)
    notified_t: float = 0.0
    workdir: str = ""  # its working directory (owned by the user it runs as)
    uid: int = -1  # the user it runs as (-1: as the service)
    kill_t: float = 0.0  # when we asked its supervisor to kill it (time.time()); KILL_WAIT_S counts from it
    # its supervisor kills its own subtree on KILL_SIGNAL: False for a run adopted from a record an older
    # goodput wrote, whose supervisor has no handler (SIGUSR2 would only kill it): killed the old way
    kills_subtree: bool = False
    popen: subprocess.Popen | None = field(default=None, repr=False, compare=False)


def _check_id(job_id: str) -> str:
    if not SAFE_ID.match(job_id):
        raise ValueError(f"job id {job_id!r} is not a safe file name ([A-Za-z0-9._-], at most 128)")
    return job_id


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_atomic(path: Path, obj: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _proc_create_time(pid: int) -> float | None:
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


class LocalExecutor:
    """Runs gangs as local process groups; a watcher thread reports their exits.

    ``on_exit(job_id, epoch, status)`` is called from the watcher thread, ``status`` one of
    finished, preempted, failed, killed, lost (``Scheduler.report_exit``'s words); the caller takes its
    own lock there (the service does); if it raises, the exit is reported again at a later poll.
    ``token_for(job)`` mints the run's own bearer token for commit reports; ``run_as(job)`` says
    whom to run it as (None: as this process; a :class:`RunAsError` fails the start);
    ``env_for(job)`` gives its spec's environment variables.
    """

    def __init__(
        self,
        state_dir: str | os.PathLike,
        *,
        url: str = "",
        gpus_per_node: dict[str, int] | None = None,
        token_for: Callable[[Job], str] | None = None,
        on_exit: Callable[[str, int, str], None] | None = None,
        poll_s: float = 0.1,
        run_as: Callable[[Job], RunAs | None] | None = None,
        env_for: Callable[[Job], dict[str, str]] | None = None,
        max_user_procs: int | None = None,
        max_log_bytes: int = DEFAULT_MAX_LOG_BYTES,
    ) -> None:
        self.dir = Path(state_dir).absolute()
        # a run's log is cut past this, keeping its newest half (the supervisor relays the output: _relay)
        self.max_log_bytes = max_log_bytes
        # RLIMIT_NPROC of a job run as a tenant's user (docs/SCHED.md, Security model)
        self.max_user_procs = max_user_procs if max_user_procs else default_user_procs()
        self.runs_dir = self.dir / "runs"
        self.logs_dir = self.dir / "logs"
        self.work_dir = self.dir / "work"
        # the state directory is traversable (a job reaches its own working directory and its tenant's
        # default checkpoint prefix under it) but not listable; runs and logs are the service's alone
        _private_dir(self.dir, 0o711)
        _private_dir(self.runs_dir)
        _private_dir(self.logs_dir)
        _private_dir(self.work_dir, 0o711)
        self.run_as = run_as
        self.env_for = env_for
        self.last_exit: dict[str, dict] = {}  # job id -> its last run's exit (rc, signal), for the views
        self._retry_at: dict[str, tuple[float, float]] = {}  # job id -> (next report attempt, backoff)
        self.url = url
        self.gpus_per_node = dict(gpus_per_node or {})
        self.token_for = token_for
        self.on_exit = on_exit
        self.poll_s = poll_s
        self.runs: dict[str, Run] = {}  # job id -> its current run
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._trash: queue.Queue[Path] = queue.Queue()  # working directories to remove (_cleaner)
        self._cleaner: threading.Thread | None = None
        self._last_resort: set[tuple[str, int]] = set()  # runs whose supervisor we had to SIGKILL

    # ------------------------------------------------------------------ the Executor protocol

    def start(self, job: Job, nodes: tuple[str, ...], resume_from_s: float) -> None:
        """Never raises into the scheduler's pass: a run that cannot start is recorded as failed (127)."""
        try:
            self._start(job, nodes, resume_from_s)
        except Exception as e:  # noqa: BLE001 - the pass must go on; the failure is the job's
            name = f"{job.id}.{job.epoch}" if SAFE_ID.match(job.id) else f"invalid.{job.epoch}"
            status = self.runs_dir / f"{name}.status"
            _write_atomic(status, {"rc": 127, "t": time.time(), "error": str(e)})
            run = Run(job.id, job.epoch, 0, 0, 0.0, list(nodes), {}, "", str(status), str(status) + ".notice")
            with self._lock:
                self.runs[job.id] = run

    def _start(self, job: Job, nodes: tuple[str, ...], resume_from_s: float) -> None:
        _check_id(job.id)
        if not job.command:
            raise ValueError(f"job {job.id!r}: command is empty")
        who = self.run_as(job) if self.run_as is not None else None
        with self._lock:
            old = self.runs.get(job.id)
            if old is not None:  # a run the scheduler no longer counts (an uncommitted start): never two
                self._killpg(old)
                if old.popen is not None and old.epoch == job.epoch:  # same file names: let it finish first
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        old.popen.wait(timeout=10)
            devices = self._devices(nodes, job.gpus_per_node)
            name = f"{job.id}.{job.epoch}"
            logf = self.logs_dir / f"{name}.log"
            status = self.runs_dir / f"{name}.status"
            spec_file = self.runs_dir / f"{name}.spec"
            record = self.runs_dir / f"{name}.json"  # what _save writes once the supervisor is started
            for p in (status, spec_file, record):
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()
            workdir = self._make_workdir(name, who, self.token_for(job) if self.token_for is not None else "")
            notice = workdir / "notice.json"
            own = {
                ENV_JOB_ID: job.id,
                ENV_EPOCH: str(job.epoch),
                ENV_URL: self.url,
                ENV_TOKEN_FILE: str(workdir / "token"),
                ENV_CKPT_ROOT: job.ckpt_root,
                ENV_RESUME: repr(float(resume_from_s)),
                ENV_NOTICE: str(notice),
                ENV_NODES: ",".join(nodes),
                "CUDA_VISIBLE_DEVICES": ",".join(str(d) for n in nodes for d in devices[n]),
            }
            own.update(launch_env(len(nodes) * job.gpus_per_node, free_port()))
            spec_env = self.env_for(job) if self.env_for is not None else {}
            env = job_environment(dict(os.environ), spec_env, own, who)
            sup = {
                "env": env,
                "cwd": str(workdir),
                "umask": JOB_UMASK,
                "mkdir": [job.ckpt_root] if job.ckpt_root else [],
                "user": who.to_obj() if who is not None else None,
                "nproc": self.max_user_procs,
                "max_log_bytes": self.max_log_bytes,
                "record": str(record),
                "record_wait_s": RECORD_WAIT_S,
            }
            fd = os.open(spec_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(sup, f)
            # -I: the supervisor keeps the service's privileges, so no PYTHON* variable, user site or
            # working directory of anyone else's decides what it imports; it starts from a bare environment
            argv = [sys.executable, "-I", "-m", "goodput.sched.live.local", "--status", str(status)]
            argv += ["--spec", str(spec_file), "--", *job.command]
            bare = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8"}
            out = os.open(logf, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                p = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=bare,
                    cwd=str(self.dir),
                    start_new_session=True,
                )
            finally:
                os.close(out)
            run = Run(
                job=job.id,
                epoch=job.epoch,
                pid=p.pid,
                pgid=p.pid,  # start_new_session: the supervisor leads its own group
                create_time=_proc_create_time(p.pid) or 0.0,
                nodes=list(nodes),
                devices=devices,
                log=str(logf),
                status_file=str(status),
                notice_file=str(notice),
                workdir=str(workdir),
                uid=who.uid if who is not None else -1,
                kills_subtree=True,
                popen=p,
            )
            self.runs[job.id] = run
            self._save(run)

    def _make_workdir(self, name: str, who: RunAs | None, token: str) -> Path:
        """``STATE/work/<name>``, fresh: 0700 and owned by the user the run is for, holding its token
        file (0600, that user's). Made as the service, in a directory only the service can write, the
        files before the directory is handed over, so no link planted by a job is ever followed."""
        path = self.work_dir / name
        if os.path.lexists(path):  # a start of this epoch that never committed, or a crash mid-start
            self._discard(path)  # renamed aside at once (its removal walks the job's files: not here)
        os.mkdir(path, 0o700)
        dfd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            owner = (who.uid, who.gid) if who is not None else None
            _write_in(dfd, "token", token.encode(), mode=0o600, owner=owner)
            if owner is not None:
                os.fchown(dfd, *owner)
            os.fchmod(dfd, 0o700)
        finally:
            os.close(dfd)
        return path

    def notify(self, job: Job, *, checkpoint: bool, deadline_s: float) -> None:
        with self._lock:
            run = self._current(job)
            if run is None:
                return
            self._write_notice(run, {"checkpoint": checkpoint, "deadline_s": deadline_s, "epoch": run.epoch})
            # both mean "checkpoint and leave" to goodput.ckpt.Checkpointer; SIGTERM is the plain stop.
            # A launcher's group gets SIGUSR1 either way: torchrun has no handler and dies at once, so its
            # workers are reparented to the supervisor, which reads their exits (75 after a checkpoint: a
            # stop reads as the preemption it is). On SIGTERM torchrun would wait for them and exit 1,
            # and a cancel under torchrun would read as failed.
            sig = signal.SIGUSR1 if checkpoint else signal.SIGTERM
            self._signal_tree(run, sig, launcher_sig=signal.SIGUSR1)

    def _write_notice(self, run: Run, notice: dict) -> None:
        """The notice file in the run's working directory (the job's user owns that directory: no link
        in it is followed); 0644, so the job reads it and cannot forge it in place."""
        path = Path(run.notice_file)
        try:
            if run.workdir:
                dfd = os.open(run.workdir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
                try:
                    _write_in(dfd, path.name, json.dumps(notice).encode(), mode=0o644)
                finally:
                    os.close(dfd)
            else:  # a record written before working directories existed
                _write_atomic(path, notice)
        except OSError as e:
            log.warning("job %s: cannot write its notice file %s: %s", run.job, path, e)

    def kill(self, job: Job) -> None:
        with self._lock:
            run = self._current(job)
            if run is None:
                return
            self._killpg(run)

    # ------------------------------------------------------------------ re-adoption after a restart

    def adopt(self, jobs: dict[str, Job]) -> dict[str, str]:
        """Take back the run records a previous service left: ``{job id: "adopted" | "orphan killed"}``.

        A run the scheduler still counts (running or preempting, same epoch) is adopted whether its
        group is alive or already gone (the watcher then reports its exit from the status file). Any
        other record is a start that never committed: its group is killed, so no job runs twice.
        """
        out: dict[str, str] = {}
        dying: list[Run] = []
        with self._lock:
            for path in sorted(self.runs_dir.glob("*.json")):
                try:
                    raw = json.loads(path.read_text(encoding="utf-8"))
                    run = Run(**{k: raw[k] for k in Run.__dataclass_fields__ if k != "popen" and k in raw})
                    _check_id(run.job)
                except (OSError, ValueError, TypeError, KeyError):
                    continue
                job = jobs.get(run.job)
                live = job is not None and job.epoch == run.epoch and job.state.value in ("running", "preempting")
                if live and run.job not in self.runs:
                    self.runs[run.job] = run
                    out[run.job] = "adopted"
                    if run.killed and self._alive(run):  # asked again (its kill_t counts from now on)
                        run.kill_t = 0.0
                        self._killpg(run)
                else:
                    if self._alive(run):
                        self._killpg(run)
                        dying.append(run)
                    else:
                        self._forget(run)
                    out[run.job] = "orphan killed"
            # forgotten once gone (their supervisors write a status file as they leave)
            deadline, last_resort = time.monotonic() + KILL_WAIT_S, False
            while dying:
                dying = [r for r in dying if self._alive(r) or self._forget(r)]
                if dying and time.monotonic() >= deadline:
                    if last_resort:
                        break  # left as they are, said in the log
                    for r in dying:
                        self._kill_supervisor(r)
                    deadline, last_resort = time.monotonic() + 5.0, True
                time.sleep(0.02)
        return out

    def reconcile(self, jobs: dict[str, Job]) -> dict[str, str]:
        """After the scheduler was rebuilt from its store in this process (a store write failed): kill
        every run the store does not count (a start whose commit failed), as a restart would."""
        out: dict[str, str] = {}
        with self._lock:
            for run in list(self.runs.values()):
                job = jobs.get(run.job)
                live = job is not None and job.epoch == run.epoch and job.state.value in ("running", "preempting")
                if not live and not run.killed:
                    self._killpg(run)
                    out[run.job] = "orphan killed"
        return out

    # ------------------------------------------------------------------ the watcher

    def start_watcher(self) -> None:
        with contextlib.suppress(OSError):  # what a previous service left to remove
            for name in sorted(os.listdir(self.work_dir)):
                if name.startswith(TRASH_PREFIX):
                    self._trash.put(self.work_dir / name)
                    self._start_cleaner()
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="goodput-local-executor", daemon=True)
            self._thread.start()

    def close(self) -> None:
        """Stop watching (the jobs keep running: a restarted service re-adopts them)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.poll()
            except Exception:  # noqa: BLE001 - the watcher must outlive any one bad poll; it is logged
                log.exception("executor poll failed; retrying")

    def poll(self) -> int:
        """Report every run observed gone; the number reported. A report that raises (the service's
        store refused the step) is logged and tried again later, with backoff up to 5 s."""
        now = time.monotonic()
        with self._lock:
            for r in self.runs.values():  # a kill whose supervisor has not left after KILL_WAIT_S
                if r.killed and r.kill_t > 0 and time.time() - r.kill_t > KILL_WAIT_S and self._alive(r):
                    self._kill_supervisor(r)
            done = [
                r for r in self.runs.values() if self._retry_at.get(r.job, (0.0, 0.0))[0] <= now and not self._alive(r)
            ]
        reported = 0
        for run in done:
            status, detail = self._status_detail(run)
            # before the report, so that whoever sees the job requeued also sees how its run ended
            remember_exit(self.last_exit, run.job, {"epoch": run.epoch, "status": status, **detail})
            if self.on_exit is not None:
                try:
                    self.on_exit(run.job, run.epoch, status)
                except Exception:  # noqa: BLE001 - kept, so the exit is reported again
                    wait = min(5.0, 2 * self._retry_at.get(run.job, (0.0, 0.05))[1])
                    self._retry_at[run.job] = (time.monotonic() + wait, wait)
                    log.exception("job %s: reporting its exit (%s) failed; again in %.2f s", run.job, status, wait)
                    continue
            self._retry_at.pop(run.job, None)
            reported += 1
            with self._lock:
                current = self.runs.get(run.job)
                if current is run:
                    del self.runs[run.job]
                # after the report: a crash in between re-reports, and the core ignores it. Not when a new
                # run of the same epoch replaced it (a start whose commit failed, started again): the
                # files are named by job and epoch, and are the new run's now
                if current is None or current is run or current.epoch != run.epoch:
                    self._forget(run)
        return reported

    # ------------------------------------------------------------------ helpers

    def _current(self, job: Job) -> Run | None:
        run = self.runs.get(job.id)
        return run if run is not None and run.epoch == job.epoch else None

    def _alive(self, run: Run) -> bool:
        if run.popen is not None:
            return run.popen.poll() is None
        if run.pid <= 0:
            return False
        ct = _proc_create_time(run.pid)
        if ct is None or (run.create_time and abs(ct - run.create_time) > 1.0):
            return False
        import psutil

        try:
            return psutil.Process(run.pid).status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def _status(self, run: Run) -> str:
        return self._status_detail(run)[0]

    def _status_detail(self, run: Run) -> tuple[str, dict]:
        """The run's status for the core, and what the status file says (rc, and the signal that ended
        the command if one did). A command killed by a signal we did not send (the OOM killer's SIGKILL)
        is ``failed``, with backoff and the retry budget; ``lost`` is only for a run that vanished with
        no status written at all (the supervisor went too: the slot, not the job)."""
        rc: int | None = None
        dropped = None
        st: dict = {}
        try:
            st = json.loads(Path(run.status_file).read_text(encoding="utf-8"))
            rc = int(st["rc"])
            dropped = st.get("log_dropped_bytes")
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            rc, st = None, {}
        if rc is None and run.popen is not None and run.popen.returncode not in (None, -signal.SIGKILL):
            rc = run.popen.returncode  # the supervisor itself failed
        detail: dict = {"rc": rc}
        if isinstance(dropped, int) and not isinstance(dropped, bool) and dropped > 0:
            detail["log_dropped_bytes"] = dropped  # shown in the job's last_exit: the cut is never silent
        if rc is not None and rc < 0:
            with contextlib.suppress(ValueError):
                detail["signal"] = signal.Signals(-rc).name
        if rc is None:
            return ("killed" if run.killed else "lost"), detail
        if rc == 0:
            return "finished", detail
        if rc == PREEMPTED_EXIT:
            return "preempted", detail
        if rc < 0 and run.killed:
            return "killed", detail
        if _obeyed(run, rc, st):
            return "killed", detail  # it died of our notice: a stop obeyed, as a kill at the deadline is
        return "failed", detail

    def _descendants(self, run: Run) -> list:
        """The run's processes below its supervisor (a launcher's workers may sit in sessions of their own)."""
        import psutil

        if run.pid <= 0 or not self._alive(run):
            return []
        try:
            return psutil.Process(run.pid).children(recursive=True)
        except psutil.Error:
            return []

    def _signal_tree(self, run: Run, sig: int, launcher_sig: int | None = None) -> None:
        """``sig`` to every process of the run once: each descendant outside its group, then the group.

        torchrun starts each worker in a session of its own, so a signal to the group alone would
        reach torchrun but never its workers. When such workers exist (a launcher leads them) and
        ``launcher_sig`` is given, the group gets ``launcher_sig`` instead. The supervisor ignores
        both itself.
        """
        import psutil

        if run.pgid <= 0:  # a start that failed (no process): killpg(0) would signal the service's own group
            return
        outside = []
        for p in self._descendants(run):
            try:
                if os.getpgid(p.pid) != run.pgid:
                    outside.append(p)
            except (ProcessLookupError, PermissionError):
                pass
        group_sig = launcher_sig if launcher_sig is not None and outside else sig
        # recorded before it is sent (and kept on disk for a restarted service): a command that dies of
        # it is then read as having obeyed, not failed (_obeyed)
        sent = {int(group_sig), *([int(sig)] if outside else [])}
        if not sent <= set(run.signalled) or not run.notified_t:
            run.signalled = sorted(sent | set(run.signalled))
            run.notified_t = run.notified_t or time.time()
            self._save(run)
        for p in outside:  # the workers first: the launcher may die of its signal and orphan them
            with contextlib.suppress(psutil.Error, ProcessLookupError, PermissionError):
                p.send_signal(sig)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(run.pgid, group_sig)

    def _killpg(self, run: Run) -> None:
        """Kill the run: every process of it SIGKILLed by its supervisor, which exits after (its status
        then says killed), never the supervisor first. It leads the group and is the child subreaper:
        killed first, a process of the run that escaped our snapshots (one that ``setsid()``s and keeps
        forking, so that its pid is never the same for long) would be re-parented to init and go on,
        with the GPUs of a slot given to someone else. Only a supervisor that has not left
        :data:`KILL_WAIT_S` after is SIGKILLed, as a last resort (:meth:`poll`); the core's
        ``unkillable_s`` takes the nodes out if even that brings no exit."""
        import psutil

        run.killed = True
        if run.pgid <= 0:  # a start that failed (no process): killpg(0) would kill the service's own group
            return
        if not run.kill_t:
            run.kill_t = time.time()
        self._save(run)
        if not self._alive(run) or not run.kills_subtree:
            # no supervisor (killed from outside), or one of an older goodput: the group, as before
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(run.pgid, signal.SIGKILL)
            return
        for p in self._descendants(run):  # what we see at once; the supervisor catches the rest
            with contextlib.suppress(psutil.Error):
                p.kill()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(run.pid, KILL_SIGNAL)

    def _kill_supervisor(self, run: Run) -> None:
        """The last resort of a kill: the supervisor (and its group) SIGKILLed. Whatever of the run it
        still held is re-parented to init, so it is said loudly."""
        key = (run.job, run.epoch)
        if key not in self._last_resort:
            self._last_resort.add(key)
            log.error(
                "job %s: its supervisor (pid %d) has not left %.0f s after it was asked to kill the run; "
                "SIGKILLed (a process of the run that could not be killed may survive it)",
                run.job,
                run.pid,
                KILL_WAIT_S,
            )
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(run.pgid, signal.SIGKILL)

    def _devices(self, nodes: tuple[str, ...], per_node: int) -> dict[str, list[int]]:
        used: dict[str, set[int]] = {}
        for r in self.runs.values():
            for n, ds in r.devices.items():
                used.setdefault(n, set()).update(ds)
        out: dict[str, list[int]] = {}
        for n in nodes:
            base = _node_index(n) * self.gpus_per_node.get(n, per_node)
            free = [d for d in range(base, base + self.gpus_per_node.get(n, per_node)) if d not in used.get(n, ())]
            out[n] = free[:per_node]
        return out

    def _record_path(self, run: Run) -> Path:
        return self.runs_dir / f"{run.job}.{run.epoch}.json"

    def _save(self, run: Run) -> None:
        d = {k: getattr(run, k) for k in Run.__dataclass_fields__ if k != "popen"}
        _write_atomic(self._record_path(run), d)

    def _forget(self, run: Run) -> bool:
        """Remove the run's files; False (for filters). Its working directory is only renamed aside
        here: the job's files are walked later, outside every lock (:meth:`_discard`)."""
        self._last_resort.discard((run.job, run.epoch))
        logcut = Path(run.status_file).with_suffix(".logcut")
        for p in (self._record_path(run), Path(run.status_file), Path(run.notice_file), logcut):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
        with contextlib.suppress(FileNotFoundError):
            Path(run.status_file).with_suffix(".spec").unlink()
        if run.workdir and Path(run.workdir).parent == self.work_dir:  # its token goes with it
            self._discard(Path(run.workdir))
        return False

    def _discard(self, path: Path) -> None:
        """Rename ``path`` (a working directory, an entry of the service's own ``work`` directory) aside
        at once, and have the cleaner thread remove it: the tree is the job's, so removing it is
        never done under a lock, nor by walking it as root with opens that may block (a FIFO
        swapped in for a directory would hang the walk for ever, and with it the service)."""
        trash = self.work_dir / f"{TRASH_PREFIX}{path.name}.{secrets.token_hex(6)}"
        try:
            os.rename(path, trash)
        except FileNotFoundError:
            return
        self._trash.put(trash)
        self._start_cleaner()

    def _start_cleaner(self) -> None:
        with self._lock:
            if self._cleaner is None or not self._cleaner.is_alive():
                self._cleaner = threading.Thread(target=self._clean, name="goodput-local-cleaner", daemon=True)
                self._cleaner.start()

    def _clean(self) -> None:
        while True:
            try:
                path = self._trash.get(timeout=5.0)
            except queue.Empty:
                with self._lock:
                    if self._trash.empty():
                        self._cleaner = None
                        return
                continue
            try:
                remove_workdir(path)
            except Exception:  # noqa: BLE001 - the cleaner must go on; it is logged
                log.exception("cannot remove %s", path)


_DIR_OPEN = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
REMOVE_MAX_DEPTH = 64  # deeper directories are moved up to the top, so that few descriptors are open


def remove_workdir(path: Path, timeout_s: float = REMOVE_TIMEOUT_S) -> bool:
    """Remove ``path``, an entry of the service's own directory holding a job's tree, as the user who
    owns it: a child process (``python -m goodput.sched.live.local --remove-tree``) drops to that
    user's ids and empties it with :func:`remove_tree` (so it removes only what that user could), and
    is SIGKILLed past ``timeout_s``; then the empty directory is removed here. Whether it is gone."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return True
    if not os.path.isdir(path) or os.path.islink(path):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return True
    argv = [sys.executable, "-I", "-m", "goodput.sched.live.local", "--remove-tree", str(path)]
    argv += [str(st.st_uid), str(st.st_gid), repr(float(timeout_s))]
    p = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8"},
        cwd="/",
        start_new_session=True,
    )
    try:
        p.wait(timeout=timeout_s + 30.0)  # its own walk stops at timeout_s; its start may be slow
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        log.warning("removing %s took more than %.0f s: left", path, timeout_s)
    try:
        os.rmdir(path)  # a name in the service's own directory: nothing of the job's is followed
    except FileNotFoundError:
        return True
    except OSError as e:
        log.warning("cannot remove %s (a job's working directory): %s", path, e)
        return False
    return True


def remove_tree(path: str | os.PathLike, deadline: float | None = None) -> bool:
    """Empty the directory ``path`` (kept itself) without ever following a link or opening anything
    but a directory: every entry is opened with ``O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK`` from the
    descriptor of its parent, and one that is no directory (a file, a FIFO, a socket, a link) is
    unlinked by name, never opened, so a FIFO swapped in for a directory mid-walk cannot block it and
    a link to a file outside removes only the link. Another file system mounted inside is not entered.
    Stops at ``deadline`` (``time.monotonic()``): whether the directory is empty."""
    end = deadline if deadline is not None else time.monotonic() + REMOVE_TIMEOUT_S
    try:
        top = os.open(path, _DIR_OPEN)
    except FileNotFoundError:
        return True
    try:
        _make_ours(top)
        dev = os.fstat(top).st_dev
        while time.monotonic() < end:
            if _empty(top, top, dev, 0, end):
                return True
        return False
    finally:
        os.close(top)


def _make_ours(fd: int) -> None:
    """As the directory's owner (not root), make sure we may list it and remove its entries."""
    if os.geteuid() != 0:
        with contextlib.suppress(OSError):
            st = os.fstat(fd)
            if st.st_uid == os.geteuid() and (st.st_mode & 0o700) != 0o700:
                os.fchmod(fd, 0o700)


def _open_dir(name: str, dfd: int) -> int:
    try:
        return os.open(name, _DIR_OPEN, dir_fd=dfd)
    except PermissionError:  # a directory of its own made unreadable: made readable again, by a handle
        if os.geteuid() == 0:  # that is no open of the directory itself (O_PATH), then opened
            raise
        h = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
        try:
            os.chmod(f"/proc/self/fd/{h}", 0o700)
        finally:
            os.close(h)
        return os.open(name, _DIR_OPEN, dir_fd=dfd)


def _empty(dfd: int, top: int, dev: int, depth: int, end: float) -> bool:
    """One pass over the directory open as ``dfd``: whether it was found empty."""
    names = os.listdir(dfd)
    for name in names:
        if time.monotonic() >= end:
            return False
        try:
            fd = _open_dir(name, dfd)
        except FileNotFoundError:
            continue
        except OSError as e:
            if e.errno in (errno.ENOTDIR, errno.ELOOP):  # no directory, or a link: its name, unopened
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=dfd)
            continue
        try:
            st = os.fstat(fd)
            if st.st_dev != dev:
                continue  # a mount point: never walked (its rmdir fails)
            _make_ours(fd)
            if depth >= REMOVE_MAX_DEPTH:  # moved up to the top, to be walked from there
                with contextlib.suppress(OSError):
                    os.rename(name, f".deep-{secrets.token_hex(8)}", src_dir_fd=dfd, dst_dir_fd=top)
                continue
            while time.monotonic() < end and not _empty(fd, top, dev, depth + 1, end):
                pass
        finally:
            os.close(fd)
        with contextlib.suppress(OSError):  # ENOTDIR, ENOTEMPTY: something was swapped in; next pass
            os.rmdir(name, dir_fd=dfd)
    return not names


def _remove_main(argv: list[str]) -> int:
    """``--remove-tree PATH UID GID TIMEOUT_S``: drop to UID/GID (no supplementary group), then empty PATH."""
    path, uid, gid, timeout_s = argv[0], int(argv[1]), int(argv[2]), float(argv[3])
    if os.geteuid() == 0 and uid != 0:
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
    return 0 if remove_tree(path, time.monotonic() + timeout_s) else 1


def _obeyed(run: Run, rc: int, st: dict) -> bool:
    """Whether a run that ended with ``rc`` (its status file ``st``) died of a notice we sent it, after
    we sent it: the command killed by that signal (``-n``, or ``128 + n`` from a shell that relays its
    child's death), every worker it left either checkpointed (75), done (0) or dead of such a signal
    too. A signal we did not send (the OOM killer's, one the job sent itself before any notice: its
    status written before our first notice went) is the job's own failure, as is any other exit.

    No status at all (``st`` empty) and ``rc`` the supervisor's own death by our notice: the notice
    came while it was still starting, before its handlers (they go in before the command starts),
    so nothing of the run ever ran; a cancel right after a start on a loaded machine meets that."""
    sent = {int(s) for s in run.signalled if isinstance(s, int) and not isinstance(s, bool)}
    if not sent or not run.notified_t:
        return False
    if not st:
        return rc < 0 and -rc in sent
    deaths = {-s for s in sent} | {128 + s for s in sent}
    t = st.get("t")
    if rc not in deaths or not isinstance(t, (int, float)) or isinstance(t, bool) or t < run.notified_t:
        return False
    orphans = st.get("orphans", [])
    if not isinstance(orphans, list):
        return False
    return all(isinstance(o, int) and (o in (0, PREEMPTED_EXIT) or o in deaths) for o in orphans)


def _node_index(name: str) -> int:
    tail = name.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else 0


def read_notice(path: str | os.PathLike | None = None) -> dict | None:
    """The preemption notice of this run, if one was written (the poll a job may do besides the signal)."""
    p = path or os.environ.get(ENV_NOTICE)
    if not p:
        return None
    try:
        return json.loads(Path(p).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def launch_env(slots: int, port: int) -> dict[str, str]:
    """What a run is started with for launching one or several workers (docs/SCHED.md).

    A plain command is one process: rank 0 of world size 1 (``WORLD_SIZE=1``, ``RANK=0``,
    ``LOCAL_RANK=0``, ``LOCAL_WORLD_SIZE=1``) with ``MASTER_ADDR=127.0.0.1`` and a free
    ``MASTER_PORT``, enough for ``init_process_group("gloo")`` of one. A launcher such as
    ``torchrun`` overrides RANK/WORLD_SIZE/LOCAL_RANK/MASTER_PORT in its workers itself; the
    ``PET_*`` variables are torchrun's defaults for its own flags (explicit flags win): one node
    (``PET_NNODES=1``, ``PET_NODE_RANK=0``), ``PET_NPROC_PER_NODE`` = the run's slots, and the
    same address and free port (torchrun's own default, 29500, would collide between jobs).
    ``GOODPUT_SLOTS`` is the number of slots (GPUs) the run was given.
    """
    return {
        ENV_SLOTS: str(slots),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "WORLD_SIZE": "1",
        "RANK": "0",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "PET_NNODES": "1",
        "PET_NODE_RANK": "0",
        "PET_NPROC_PER_NODE": str(max(1, slots)),
        "PET_MASTER_ADDR": "127.0.0.1",
        "PET_MASTER_PORT": str(port),
    }


def exit_status(command_rc: int, orphans: list[int]) -> int:
    """The run's status from its command's and its orphaned workers'.

    A launcher killed by the preemption signal (torchrun has no handler for SIGUSR1, and exits 1
    whenever a worker exits non-zero) leaves its workers to us: when every one of them left with 75
    after checkpointing, the run was preempted, whatever the launcher's own status.
    """
    if command_rc not in (0, PREEMPTED_EXIT) and orphans and all(c == PREEMPTED_EXIT for c in orphans):
        return PREEMPTED_EXIT
    return command_rc


def _as_user(user: dict | None, fn: Callable[[], None]) -> None:
    """``fn`` with this process's effective ids switched to ``user`` (its file-system checks are then
    the user's: a directory a tenant names is made only where that tenant could make it), then back."""
    if user is None or os.geteuid() != 0 or user["uid"] == 0:
        fn()
        return
    groups = os.getgroups()
    os.setgroups(user["groups"])
    os.setegid(user["gid"])
    os.seteuid(user["uid"])
    try:
        fn()
    finally:
        os.seteuid(0)
        os.setegid(0)
        os.setgroups(groups)


def remember_exit(last_exit: dict[str, dict], job: str, entry: dict) -> None:
    """Keep ``entry`` as ``job``'s last exit (what ``GET /jobs/{id}`` shows), the oldest of 100,000
    forgotten: recorded before the exit is reported, so whoever sees the job requeued sees how it ended."""
    last_exit[job] = entry
    if len(last_exit) > 100_000:
        last_exit.pop(next(iter(last_exit)))


def _appears(path: Path, within_s: float) -> bool:
    """Whether ``path`` exists, or comes to within ``within_s`` (the executor writes a run's record
    right after it starts the supervisor: normally before the supervisor has even started Python)."""
    deadline = time.monotonic() + within_s
    while not path.exists():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


def _supervise(argv: list[str]) -> int:
    """Lead the group, pass signals by ignoring them here, wait for the whole tree, write the status.

    ``--status FILE [--spec FILE] -- CMD...``: the spec (written by the executor, read and removed
    here) gives the command's environment, working directory, umask, the user it runs as and the
    directories to make first as that user (its checkpoint root).

    SIGUSR2 (:data:`KILL_SIGNAL`, sent by the executor's kill, to this process only) asks it to end
    the run: every process below it is SIGKILLed, again until none is left alive
    (:func:`goodput.sched.live.reaping.kill_descendants`), all are reaped, and the status file says
    ``killed``. The executor never SIGKILLs this process first: it leads the group and is the child
    subreaper, so with it gone a descendant that escaped the group (``setsid``) and every snapshot
    (by forking on, its pid never the same for long) would be re-parented to init and run on, on GPUs
    given to someone else."""
    # first, before anything is forked: SIGUSR2's default action would kill us and orphan the run
    kill_req = [False]
    ended = [False]

    def _on_kill(_signum: int, _frame: object) -> None:
        if ended[0]:
            return
        kill_req[0] = True
        left = _kill_descendants(KILL_WAIT_S / 2)
        if left:
            print(f"goodput.sched.live.local: processes {left} did not die of SIGKILL", file=sys.stderr, flush=True)

    signal.signal(KILL_SIGNAL, _on_kill)
    spec: dict = {}
    if len(argv) >= 5 and argv[0] == "--status" and argv[2] == "--spec" and argv[4] == "--":
        try:
            with open(argv[3], encoding="utf-8") as f:
                spec = json.load(f)
            os.unlink(argv[3])
        except (OSError, ValueError) as e:
            print(f"goodput.sched.live.local: cannot read the run's spec {argv[3]!r}: {e}", file=sys.stderr)
            _write_atomic(Path(argv[1]), {"rc": 127, "command_rc": 127, "orphans": [], "t": time.time()})
            return 0
        argv = [argv[0], argv[1], *argv[4:]]
    if len(argv) < 4 or argv[0] != "--status" or argv[2] != "--":
        print("usage: python -m goodput.sched.live.local --status FILE [--spec FILE] -- CMD [ARGS...]", file=sys.stderr)
        return 2
    status, cmd = Path(argv[1]), argv[3:]
    record = spec.get("record")
    if isinstance(record, str) and not _appears(Path(record), float(spec.get("record_wait_s", RECORD_WAIT_S))):
        # the service stopped between starting us and recording us: a restarted service finds no record
        # to adopt or kill and starts the job again, so this run must not run it
        print(
            "goodput.sched.live.local: the service never recorded this run (it stopped while starting it); "
            "the command is not run, so that it never runs twice",
            file=sys.stderr,
            flush=True,
        )
        _write_atomic(status, {"rc": 127, "command_rc": 127, "orphans": [], "t": time.time(), "unrecorded": True})
        return 0
    # a Python-level handler (not SIG_IGN): exec resets it to the default in the child, which then
    # installs its own (the Checkpointer's); the group's signal reaches the child directly. A notice
    # sent before the child exists (between these handlers and its exec) reaches only us: it is kept
    # and passed on once the child is started, or it would be lost and the run would go on as if never
    # asked to leave (a cancelled job running to its end, a preemption waiting for its hard deadline).
    early: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda signum, _frame: early.append(signum))
    reaper = _subreaper()
    orphans: list[int] = []
    user = spec.get("user")
    for d in spec.get("mkdir", ()):
        try:
            _as_user(user, lambda d=d: os.makedirs(d, mode=0o700, exist_ok=True))
        except OSError as e:
            print(f"goodput.sched.live.local: cannot make the directory {d!r}: {e}", file=sys.stderr, flush=True)
    kw: dict = {}
    if spec:
        kw.update(env=spec["env"], cwd=spec["cwd"], umask=int(spec.get("umask", JOB_UMASK)))
        if user is not None and os.geteuid() == 0:
            kw.update(user=user["uid"], group=user["gid"], extra_groups=list(user["groups"]))
            nproc = spec.get("nproc")
            if isinstance(nproc, int) and nproc > 0 and user["uid"] != 0:
                # inherited by the command (root, which the supervisor stays, is exempt): the tenant's
                # user holds at most this many processes and threads, so its fork bomb leaves pids to others
                import resource

                try:
                    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
                except (OSError, ValueError) as e:
                    print(
                        f"goodput.sched.live.local: cannot bound the user's processes: {e}", file=sys.stderr, flush=True
                    )
    cap = spec.get("max_log_bytes")
    relay: threading.Thread | None = None
    dropped = [0]
    pipe_w = -1
    if isinstance(cap, int) and not isinstance(cap, bool) and cap > 0:
        pipe_r, pipe_w = os.pipe()  # both close-on-exec; the child gets the write end as 1 and 2
        kw.update(stdout=pipe_w, stderr=pipe_w)
        relay = threading.Thread(
            target=_relay, args=(pipe_r, 1, cap, status.with_suffix(".logcut"), dropped), daemon=True
        )
        relay.start()
    try:
        if kill_req[0]:  # killed before it started: it never does
            raise _KilledEarly
        child = subprocess.Popen(cmd, **kw)
    except (OSError, subprocess.SubprocessError, _KilledEarly) as e:
        if not isinstance(e, _KilledEarly):
            print(f"goodput.sched.live.local: cannot start {cmd[0]!r}: {e}", file=sys.stderr, flush=True)
        crc = -signal.SIGKILL if kill_req[0] else 127
        if pipe_w >= 0:
            os.close(pipe_w)
            pipe_w = -1
    else:
        if kill_req[0]:  # the kill came while the child was being started: it may have missed it
            _kill_descendants(KILL_WAIT_S / 2)
        if pipe_w >= 0:
            os.close(pipe_w)  # the child's copies are the only writers left: EOF when the run is over
            pipe_w = -1
        # once each: a notice that came while the child was being started may also have reached it
        # through the group, and a second one changes nothing (the Checkpointer only sets a flag)
        for sig in dict.fromkeys(early):
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(sig)
        crc = child.wait()
        if reaper:  # the run is over only when every process of it is: slots are released after that
            orphans = _reap_orphans()
    ended[0] = True  # a kill asked for from now on finds nothing left to kill
    rc = exit_status(crc, orphans)
    if kill_req[0]:  # whatever the command's own status (a pid-rolling orphan's parents exit 0)
        rc = -signal.SIGKILL
    if relay is not None:
        relay.join(timeout=10)  # every writer is gone (reaped); a process that escaped keeps it no longer
    if crc < 0:
        with contextlib.suppress(ValueError):
            print(f"goodput.sched.live.local: the command was killed by {signal.Signals(-crc).name}", file=sys.stderr)
    out = {"rc": rc, "command_rc": crc, "orphans": orphans, "t": time.time()}
    if kill_req[0]:
        out["killed"] = True
    if dropped[0]:
        out["log_dropped_bytes"] = dropped[0]
    _write_atomic(status, out)
    return 0


class _KilledEarly(Exception):
    """The run was killed before its command was started."""


def _relay(src: int, out: int, cap: int, note_file: Path, dropped: list[int]) -> None:
    """Copy the run's output from ``src`` (a pipe) to ``out`` (its log, O_APPEND), keeping the log at
    most ``cap`` bytes: past it, the log is cut to its newest ``cap // 2`` bytes under a first line
    that says how many were dropped, and ``note_file`` (``<run>.logcut``) records the count for the
    service's view. The relay is the log's only writer besides this supervisor's own few lines, so
    the cut loses nothing it does not count. ``dropped[0]`` is the total, for the status file."""
    keep = max(1, cap // 2)
    # the newest `keep` bytes of output, a ring of fixed size: memory O(cap) however small the reads
    # (one object per read would cost ~40 times the bytes of a job writing one byte at a time)
    ring = bytearray(keep)
    pos = 0  # where the next byte goes; the ring holds `held` bytes, ending just before `pos`
    held = 0
    noted = 0  # the length of the first line a cut wrote, which is no output of the run's
    try:
        size = os.fstat(out).st_size
    except OSError:
        size = 0
    while True:
        try:
            data = os.read(src, 1 << 16)
        except OSError:
            break
        if not data:
            break
        n = len(data)
        if n >= keep:
            ring[:] = data[n - keep :]
            pos, held = 0, keep
        else:
            first = min(n, keep - pos)
            ring[pos : pos + first] = data[:first]
            ring[: n - first] = data[first:]
            pos, held = (pos + n) % keep, min(keep, held + n)
        try:
            if size + len(data) > cap:
                size = os.fstat(out).st_size  # this supervisor's own lines go there too
            if size + len(data) > cap:
                tail = (
                    bytes(ring[pos:] + ring[:pos]) if held == keep else bytes(ring[:held])
                )  # kept here: the log is write-only to us
                dropped[0] += size - noted + len(data) - len(tail)
                note = (
                    f"[goodput: {dropped[0]} bytes of this run's output were dropped so far (the log is kept "
                    f"under limits.max_log_bytes = {cap}); the newest follow]\n"
                ).encode()
                os.ftruncate(out, 0)
                _write_all(out, note + tail)
                size, noted = len(note) + len(tail), len(note)
                with contextlib.suppress(OSError):
                    _write_atomic(note_file, {"log_dropped_bytes": dropped[0], "t": time.time()})
            else:
                _write_all(out, data)
                size += len(data)
        except OSError as e:  # a full disk: the output is dropped, counted, and said once it can be
            dropped[0] += len(data)
            print(f"goodput.sched.live.local: cannot write the run's log: {e}", file=sys.stderr, flush=True)
    with contextlib.suppress(OSError):
        os.close(src)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


if __name__ == "__main__":
    if sys.argv[1:2] == ["--remove-tree"]:
        sys.exit(_remove_main(sys.argv[2:]))
    sys.exit(_supervise(sys.argv[1:]))
