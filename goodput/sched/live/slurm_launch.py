"""What runs inside a Slurm job of the Slurm executor: the batch step, then one task per node.

``python -m goodput.sched.live.slurm_launch batch -- CMD...`` is the batch script's one line. It runs
on the allocation's first node as the job's user, picks the gang's rendezvous (``MASTER_ADDR``:
this node's address as Slurm lists it, ``GOODPUT_NODE_ADDRS``; ``MASTER_PORT``: a port free here)
and starts ``srun`` with one task per node, each ``python -m goodput.sched.live.slurm_launch task --
CMD...``, which sets the rank variables from Slurm's (and torchrun's ``PET_*`` defaults: a gang's
command ``torchrun -m train`` is one torchrun per node, rendezvous at the first node) and runs the
command (:func:`task`: when the command dies of a signal, its workers are waited for, at most the
grace; whatever is left is killed before the task ends).

The checkpoint signal reaches the batch step only (``scancel -b --signal=USR1``, or
``sbatch --signal=B:USR1@grace`` before a time limit): the batch step passes USR1 or TERM on to
srun, which forwards it to every task. A signal that comes before srun exists is kept and passed
on once it starts. The exit status is the gang's, from each node's own status (each task writes
``GOODPUT_STATUS_FILE.node<N>``; srun's status is only the highest, which lets a node at 75 hide
another's crash: :func:`gang_status`), written to ``GOODPUT_STATUS_FILE`` too, so that the executor
can still read it once Slurm has forgotten the job (``MinJobAge``) and no accounting is kept.

Standard library only (and ``reaping``, which is too): it starts before the job's own imports.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time

from .reaping import children, kill_orphans, subreaper, wait_for

ENV_NODE_ADDRS = "GOODPUT_NODE_ADDRS"  # "n1=10.0.0.1,n2=10.0.0.2": each node's address as Slurm has it
ENV_STATUS_FILE = "GOODPUT_STATUS_FILE"
ENV_GPUS_PER_NODE = "GOODPUT_GPUS_PER_NODE"
PREEMPTED_EXIT = 75  # goodput.sched.live.local.PREEMPTED_EXIT: the job left after its checkpoint
ENV_GRACE = "GOODPUT_GRACE_S"  # the run's grace_s: how long a dead launcher's workers are waited for
DEFAULT_GRACE_S = 30.0


def _addr() -> str:
    me = os.environ.get("SLURMD_NODENAME", "")
    for pair in os.environ.get(ENV_NODE_ADDRS, "").split(","):
        name, _, addr = pair.partition("=")
        if name == me and addr:
            return addr
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def _free_port(addr: str) -> int:
    with socket.socket() as s:
        try:
            s.bind((addr, 0))
        except OSError:
            s.bind(("", 0))
        return s.getsockname()[1]


def _write_status(rc: int, path: str | None = None) -> None:
    path = path or os.environ.get(ENV_STATUS_FILE)
    if not path:
        return
    tmp = path + ".tmp"
    with contextlib.suppress(OSError):
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"rc": rc, "t": time.time(), "job": os.environ.get("SLURM_JOB_ID", "")}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)


def _pass_on(srun: subprocess.Popen, signum: int) -> None:
    """A notice the batch step got, passed on to the job's tasks. srun forwards SIGUSR1 to its step, but
    takes a SIGTERM as its own end: it SIGKILLs the whole step at once ("srun: forcing job
    termination"), so that no task ever saw the TERM, a handler never ran, and the gang read as
    killed by a signal goodput never sent (137: ``failed``). TERM goes to the job's steps through
    Slurm instead (``scancel --signal=TERM JOBID``, the job's user signalling its own job: every step
    but this batch step, each of its processes), srun left alone; srun's forced end only where
    Slurm cannot be asked (the core's deadline kills the run anyway)."""
    if signum == signal.SIGTERM:
        jid = os.environ.get("SLURM_JOB_ID", "")
        if jid.isdigit():
            try:
                r = subprocess.run(
                    ["scancel", "--quiet", "--signal=TERM", jid], stdin=subprocess.DEVNULL,
                    capture_output=True, text=True, timeout=10, check=False,
                )  # fmt: skip
            except (OSError, subprocess.SubprocessError) as e:
                print(f"goodput.sched.live.slurm_launch: cannot pass SIGTERM on to job {jid}: {e}",
                      file=sys.stderr, flush=True)  # fmt: skip
            else:
                if r.returncode == 0:
                    return
                print(f"goodput.sched.live.slurm_launch: scancel --signal=TERM {jid}: exit {r.returncode}: "
                      f"{r.stderr.strip()[:300]}; srun ends the step instead", file=sys.stderr, flush=True)  # fmt: skip
    with contextlib.suppress(ProcessLookupError):
        srun.send_signal(signum)


def batch(cmd: list[str]) -> int:
    early: list[int] = []
    child: list[subprocess.Popen] = []
    received: list[int] = []  # every notice this step got: a node dead of one of them did not fail

    def forward(signum: int, _frame: object) -> None:
        received.append(signum)
        if child:
            _pass_on(child[0], signum)
        else:
            early.append(signum)

    for sig in (signal.SIGUSR1, signal.SIGTERM):
        signal.signal(sig, forward)
    root = os.environ.get("GOODPUT_CKPT_ROOT", "")
    if root:  # made by the job's own user, as the local executor's supervisor does
        with contextlib.suppress(OSError):
            os.makedirs(root, exist_ok=True)
    addr = _addr()
    env = dict(os.environ)
    env["MASTER_ADDR"] = addr
    env["MASTER_PORT"] = str(_free_port(addr))
    nodes = env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or "1"
    argv = [
        "srun", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=0",
        "--export=ALL", sys.executable, "-m", "goodput.sched.live.slurm_launch", "task", "--", *cmd,
    ]  # fmt: skip
    try:
        p = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL)
    except OSError as e:
        print(f"goodput.sched.live.slurm_launch: cannot start srun: {e}", file=sys.stderr)
        _write_status(127)
        return 127
    child.append(p)
    for sig in dict.fromkeys(early):  # before the command could start: srun's own end is the stop
        with contextlib.suppress(ProcessLookupError):
            p.send_signal(sig)
    while True:
        try:
            srun_rc = p.wait()
            break
        except InterruptedError:
            continue
    if srun_rc < 0:
        srun_rc = 128 - srun_rc
    rc = srun_rc
    status = env.get(ENV_STATUS_FILE)
    if status and nodes.isdigit():
        words = [_read_node_status(_node_status_path(status, i)) for i in range(int(nodes))]
        rc = gang_status(words, srun_rc, tuple(dict.fromkeys(received)))
        if rc != srun_rc:
            print(f"goodput.sched.live.slurm_launch: the nodes' statuses {words} make the job's {rc} "
                  f"(srun's: {srun_rc})", file=sys.stderr, flush=True)  # fmt: skip
    _write_status(rc)
    return rc


def task_status(command_rc: int, workers: list[int], notice: tuple[int, ...] = ()) -> int:
    """A node's status from its command's and its workers' (as Popen's: negative, a signal).

    Slurm signals every process of the step, the launcher too: torchrun has no handler for SIGUSR1 and
    dies of it (138) while its workers checkpoint and leave with 75, orphaned to this task. The node
    was preempted when at least one worker left with 75 and every other one either did too or died of
    the notice itself (``notice``: the signals this task received; a process with no handler for it had
    nothing to save, a helper the launcher started), whatever the launcher's own status. A worker that
    exited non-zero otherwise (1-74, another signal, killed for outliving the grace) makes the node's
    status that worker's (``128 + n`` for a signal): a launcher dead of the notice must not hide a
    worker's crash, since the executor reads a death by its own notice as a stop obeyed. Processes
    that were not workers (see :func:`task`) are not read at all."""
    if command_rc < 0:
        command_rc = 128 - command_rc
    if command_rc in (0, PREEMPTED_EXIT) or not workers:
        return command_rc
    own = [c for c in workers if c not in (0, PREEMPTED_EXIT) and not (c < 0 and -c in notice)]
    if own:
        return 128 - own[0] if own[0] < 0 else own[0]
    if PREEMPTED_EXIT in workers:
        return PREEMPTED_EXIT
    return command_rc


def gang_status(statuses: list[int | None], srun_rc: int, notice: tuple[int, ...] = ()) -> int:
    """The gang's status from each node's (None: that node's task wrote none) and srun's. srun returns
    the highest task status, so a node at 75 hides another at 1-74 (a crash while leaving). Here 75
    needs every node's word: any node with another non-zero status gives that status (the highest
    such, a node's own failure before a death by the notice the batch step received, ``notice``:
    a node dead of the notice must not hide another's crash, as the executor reads the notice's
    ``128 + n`` as a stop obeyed); else 75 if any node left with 75 (a node that finished while
    another was preempted resumes from the commit: never wrong); else srun's own. A missing word with
    srun at 75 is a failure (1): a node that may have crashed is not reported as preempted."""
    known = [s for s in statuses if s is not None]
    bad = [s for s in known if s not in (0, PREEMPTED_EXIT)]
    own = [s for s in bad if s - 128 not in notice]
    if own:
        return max(own)
    if bad:
        return max(bad)
    if len(known) < len(statuses):
        return 1 if srun_rc == PREEMPTED_EXIT else srun_rc
    if PREEMPTED_EXIT in known:
        return PREEMPTED_EXIT
    return srun_rc


def _node_status_path(status_file: str, node: int | str) -> str:
    return f"{status_file}.node{node}"


def _read_node_status(path: str) -> int | None:
    """A task's word (its own file, written by the job's user like everything here): None unless a
    small regular file whose ``rc`` is an integer."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        raw = os.read(fd, 4097)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        rc = json.loads(raw)["rc"] if len(raw) <= 4096 else None
    except (ValueError, KeyError, TypeError):
        return None
    return rc if isinstance(rc, int) and not isinstance(rc, bool) else None


def task(cmd: list[str]) -> int:
    """One node's task: the rank variables, then the command as a child. Not an exec: the step ends
    when this process does, and slurmstepd then kills what is left, which would be a dead launcher's
    workers in the middle of their checkpoint.

    The **workers** are the command's own children still alive when it ended (reparented here, the
    child subreaper, at that moment; a process it orphaned earlier is a child here by then too, and
    counts: nothing tells it apart, and reading it as a worker can only make a node ``failed``). They are waited for only when the command died of a signal (a
    launcher killed by the notice), and at most the grace (``GOODPUT_GRACE_S``, the run's ``grace_s``:
    the core cancels the job at that deadline anyway); then everything left here is SIGKILLed. A
    command that exited on its own (any status) is its own word: nothing it left is waited for, and
    whatever it left (a detached log shipper, a worker's helper) is killed before the task ends, so
    no stray process holds the nodes until the job's limit. The node's status is :func:`task_status`
    of the command's and the workers' statuses, written beside ``GOODPUT_STATUS_FILE`` for the batch
    step to read (srun's own status is only the highest of them)."""
    env = os.environ
    nodes = env.get("SLURM_NNODES", env.get("SLURM_JOB_NUM_NODES", "1"))
    per_node = env.get(ENV_GPUS_PER_NODE, "1")
    env.update(
        {
            "RANK": env.get("SLURM_PROCID", "0"),
            "WORLD_SIZE": env.get("SLURM_NTASKS", nodes),
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "1",
            "PET_NNODES": nodes,
            "PET_NODE_RANK": env.get("SLURM_NODEID", "0"),
            "PET_NPROC_PER_NODE": per_node,
            "PET_MASTER_ADDR": env.get("MASTER_ADDR", "127.0.0.1"),
            "PET_MASTER_PORT": env.get("MASTER_PORT", "29500"),
        }
    )
    try:
        grace = float(env.get(ENV_GRACE, ""))
        if not 0 <= grace <= 86400:
            raise ValueError(grace)
    except ValueError:
        grace = DEFAULT_GRACE_S
    # Slurm delivers the step's signals to every process, the command's included: here they are only
    # kept (a Python handler, reset to the default in the child at exec) and passed on to a child
    # that did not exist yet when one came
    got: list[int] = []
    for sig in (signal.SIGUSR1, signal.SIGTERM):
        signal.signal(sig, lambda signum, _frame: got.append(signum))
    reaper = subreaper()
    if not reaper:
        print("goodput.sched.live.slurm_launch: not a child subreaper here: workers a dead launcher orphans "
              "are not waited for", file=sys.stderr, flush=True)  # fmt: skip
    try:
        p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)
    except OSError as e:
        print(f"goodput.sched.live.slurm_launch: cannot start {cmd[0]!r}: {e}", file=sys.stderr)
        return _task_done(127)
    for sig in dict.fromkeys(got):
        with contextlib.suppress(ProcessLookupError):
            p.send_signal(sig)
    while True:
        try:
            rc = p.wait()
            break
        except InterruptedError:
            continue
    statuses: list[int] = []
    if rc < 0 and reaper:
        workers = children()
        ended = wait_for(workers, grace)
        late = [w for w in workers if w not in ended]
        if late:
            print(f"goodput.sched.live.slurm_launch: {len(late)} worker(s) still running {grace:g} s after the "
                  "launcher died: killed", file=sys.stderr, flush=True)  # fmt: skip
        statuses = [ended.get(w, -signal.SIGKILL) for w in workers]
    if reaper:
        left = kill_orphans()
        if left:
            print(f"goodput.sched.live.slurm_launch: cannot kill process(es) {left} left by the command",
                  file=sys.stderr, flush=True)  # fmt: skip
    return _task_done(task_status(rc, statuses, tuple(dict.fromkeys(got))))


def _task_done(rc: int) -> int:
    path = os.environ.get(ENV_STATUS_FILE)
    if path:
        _write_status(rc, _node_status_path(path, os.environ.get("SLURM_NODEID", "0")))
    return rc


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[0] not in ("batch", "task") or argv[1] != "--":
        print("usage: python -m goodput.sched.live.slurm_launch batch|task -- CMD [ARGS...]", file=sys.stderr)
        return 2
    return batch(argv[2:]) if argv[0] == "batch" else task(argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
