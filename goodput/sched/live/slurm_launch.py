"""What runs inside a Slurm job of the Slurm executor: the batch step, then one task per node.

``python -m goodput.sched.live.slurm_launch batch -- CMD...`` is the batch script's one line. It runs
on the allocation's first node as the job's user, picks the gang's rendezvous (``MASTER_ADDR``:
this node's address as Slurm lists it, ``GOODPUT_NODE_ADDRS``; ``MASTER_PORT``: a port free here)
and starts ``srun`` with one task per node, each ``python -m goodput.sched.live.slurm_launch task --
CMD...``, which sets the rank variables from Slurm's (and torchrun's ``PET_*`` defaults: a gang's
command ``torchrun -m train`` is one torchrun per node, rendezvous at the first node) and runs the
command, waiting for it and for any worker it orphans.

The checkpoint signal reaches the batch step only (``scancel -b --signal=USR1``, or
``sbatch --signal=B:USR1@grace`` before a time limit): the batch step passes USR1 or TERM on to
srun, which forwards it to every task. A signal that comes before srun exists is kept and passed
on once it starts. The exit status is srun's (the highest task status: 75 when every task left
after its checkpoint), written to ``GOODPUT_STATUS_FILE`` too, so that the executor can still read
it once Slurm has forgotten the job (``MinJobAge``) and no accounting is kept.

Standard library only: it starts before the job's own imports.
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

ENV_NODE_ADDRS = "GOODPUT_NODE_ADDRS"  # "n1=10.0.0.1,n2=10.0.0.2": each node's address as Slurm has it
ENV_STATUS_FILE = "GOODPUT_STATUS_FILE"
ENV_GPUS_PER_NODE = "GOODPUT_GPUS_PER_NODE"
PREEMPTED_EXIT = 75  # goodput.sched.live.local.PREEMPTED_EXIT: the job left after its checkpoint
PR_SET_CHILD_SUBREAPER = 36


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


def _write_status(rc: int) -> None:
    path = os.environ.get(ENV_STATUS_FILE)
    if not path:
        return
    tmp = path + ".tmp"
    with contextlib.suppress(OSError):
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"rc": rc, "t": time.time(), "job": os.environ.get("SLURM_JOB_ID", "")}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)


def batch(cmd: list[str]) -> int:
    early: list[int] = []
    child: list[subprocess.Popen] = []

    def forward(signum: int, _frame: object) -> None:
        if child:
            with contextlib.suppress(ProcessLookupError):
                child[0].send_signal(signum)
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
    for sig in dict.fromkeys(early):
        with contextlib.suppress(ProcessLookupError):
            p.send_signal(sig)
    rc = p.wait()
    if rc < 0:
        rc = 128 - rc
    _write_status(rc)
    return rc


def _subreaper() -> bool:
    """Become the child subreaper (Linux): a launcher's workers orphaned by its death are ours to wait for."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _reap_orphans() -> list[int]:
    """Wait for every descendant reparented here; their exit statuses (as Popen's)."""
    out: list[int] = []
    while True:
        try:
            _, st = os.wait()
        except ChildProcessError:
            return out
        except InterruptedError:
            continue
        out.append(os.waitstatus_to_exitcode(st))


def task_status(command_rc: int, orphans: list[int]) -> int:
    """A node's status from its command's and its orphaned workers'. Slurm signals every process of
    the step, the launcher too: torchrun has no handler for SIGUSR1 and dies of it (138) while its
    workers checkpoint and leave with 75, orphaned to this task. When every one did, the node was
    preempted, whatever the launcher's own status (the local executor reads it the same way)."""
    if command_rc < 0:
        command_rc = 128 - command_rc
    if command_rc not in (0, PREEMPTED_EXIT) and orphans and all(c == PREEMPTED_EXIT for c in orphans):
        return PREEMPTED_EXIT
    return command_rc


def task(cmd: list[str]) -> int:
    """One node's task: the rank variables, then the command as a child, waited for; if it did not end
    with 0 or 75 (a launcher killed by the signal), also every worker it orphaned. Not an exec: the
    step ends when this process does, and slurmstepd then kills what is left, which would be a dead
    launcher's workers in the middle of their checkpoint. (A command that ends 0 or 75 is not waited
    past: a stray process it left must not hold the nodes.)"""
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
    # Slurm delivers the step's signals to every process, the command's included: here they are only
    # kept (a Python handler, reset to the default in the child at exec) and passed on to a child
    # that did not exist yet when one came
    early: list[int] = []
    for sig in (signal.SIGUSR1, signal.SIGTERM):
        signal.signal(sig, lambda signum, _frame: early.append(signum))
    if not _subreaper():
        print("goodput.sched.live.slurm_launch: not a child subreaper here: workers a dead launcher orphans "
              "are not waited for", file=sys.stderr, flush=True)  # fmt: skip
    try:
        p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)
    except OSError as e:
        print(f"goodput.sched.live.slurm_launch: cannot start {cmd[0]!r}: {e}", file=sys.stderr)
        return 127
    for sig in dict.fromkeys(early):
        with contextlib.suppress(ProcessLookupError):
            p.send_signal(sig)
    while True:
        try:
            rc = p.wait()
            break
        except InterruptedError:
            continue
    if rc in (0, PREEMPTED_EXIT):
        return rc  # the command's own word: anything it left behind is Slurm's to clean up with the step
    return task_status(rc, _reap_orphans())


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[0] not in ("batch", "task") or argv[1] != "--":
        print("usage: python -m goodput.sched.live.slurm_launch batch|task -- CMD [ARGS...]", file=sys.stderr)
        return 2
    return batch(argv[2:]) if argv[0] == "batch" else task(argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
