"""The Slurm executor: goodput decides, Slurm launches, tracks and signals.

Behind the same :class:`goodput.sched.core.executor.Executor` interface as the local executor, driven
the same way by the live service (``goodput sched serve --executor slurm --partition P``). Slurm is
given nothing to decide (SchedMD's advice for an external scheduler):

- **Nodes** come from ``sinfo --json``: every node of the partition, named as Slurm names it, with
  its GPU count from its ``gpu`` GRES (a node without GPUs is one slot, run ``--exclusive``). One
  goodput pool, named after the partition.
- **start** submits ONE Slurm job per gang, held (``sbatch --hold``) to exactly the nodes goodput
  chose (``-N n --nodelist=...`` and ``--gres=gpu:g`` or ``--exclusive``), ``--no-requeue`` (a
  requeue is goodput's: a new run, a new Slurm job, the same goodput job), ``--signal=B:USR1@grace``
  (a partition time limit warns like a preemption), as the tenant's Unix user (``--uid``/``--gid``;
  sbatch must then run as root). At once root's ``scontrol hold`` turns sbatch's hold (the user's
  own, which the user may release) into an administrator's (``JobHeldAdmin``), which the job's user
  cannot lift; a job that cannot be held so is cancelled (its run lost). Its Slurm id is written to
  the service's store (table ``slurm_runs``) before it can run; it is released (``scontrol
  release``) after the scheduling pass that started it is committed (:meth:`SlurmExecutor.after_pass`).
  A service killed anywhere in between finds either nothing, a held job it cancels (a start the
  store does not count), or a recorded one it releases or adopts: a run never starts twice.
- **The job's user owns the job** and Slurm lets an owner ``scontrol update`` its pending job
  (nodes, node count, GRES, partition, comment, excluded nodes, a dependency, a hold of its own),
  shrink its running one, or make it requeueable and requeue it. Every poll checks each live job
  of ours against what goodput submitted (its own record only: partition, comment, no requeue and
  no restart, node count, required and allocated nodes as sets, GPUs per node in ``tres_per_node``
  and none elsewhere, the allocated ``gres/gpu`` where Slurm tracks it); a job that differs is
  cancelled and its run reported ``failed`` (the tenant's doing: counted against the job, with its
  backoff), ``last_exit.tampered`` saying what changed.
- **notify** is ``scancel -b --signal=USR1`` (checkpoint) or ``--signal=TERM`` (stop) to the batch
  step, which passes it to every task (:mod:`goodput.sched.live.slurm_launch`); the job's Checkpointer
  commits and exits 75 (TERM the batch step passes on with ``scancel --signal=TERM``, never to srun,
  which would SIGKILL the step at once). **kill** is ``scancel``, asked again every
  ``CANCEL_RETRY_S`` while Slurm still runs the job (a cancel asked while slurmctld was away).
- **Exits** are read from one ``squeue --json`` per pass (no per-job polling): a job is gone when
  Slurm says it ended (never while ``COMPLETING``), so the nodes go back to the core only once
  Slurm has them free. ``COMPLETED`` → finished; exit 75 → preempted; cancelled by us, or dead of
  the notice signal we sent (the batch step's ``128 + n``, or the signal itself) → killed (a stop
  obeyed: requeued at once, as a kill at the deadline);
  ``NODE_FAIL``, ``BOOT_FAIL``, Slurm's own ``PREEMPTED`` or a cancel not ours → lost (an
  infrastructure loss); other exits → failed. A job Slurm no longer lists (older than
  ``MinJobAge``) is read from the status file its batch step wrote, or is lost.
- **Nodes** Slurm reports ``DOWN`` (or ``FAIL``) are lost to the core (their jobs resume from their
  commits, counted as infrastructure, not failure); back up, they are returned. A node an operator
  drains in Slurm (``scontrol update nodename=X state=DRAIN``) gets goodput's drain (no new
  placement, its jobs asked to checkpoint and leave by a deadline); ``state=RESUME`` returns it, but
  only if the core's drain was Slurm's (a node goodput drained itself stays drained). Slurm's down
  and drained nodes are read as levels every pass: a node Slurm holds is never offered, and the
  API's ``/nodes/X/up`` is refused while Slurm holds X (:meth:`SlurmExecutor.node_request`).
- The two reads of a pass go to slurmrestd's unix socket where one is configured, else (or when it
  fails) to ``squeue --json`` and ``sinfo --json``. One that fails (slurmctld restarting) changes
  nothing: the next pass asks again. (squeue and sinfo that cannot reach slurmctld exit 0 with an
  ``errors`` list and no job or node: a failed read, never "every job is gone".)
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pwd
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..core.model import Job, Node, Pool, PoolKind
from .local import (
    ENV_CKPT_ROOT,
    ENV_EPOCH,
    ENV_JOB_ID,
    ENV_NODES,
    ENV_RESUME,
    ENV_SLOTS,
    ENV_TOKEN_FILE,
    ENV_URL,
    PREEMPTED_EXIT,
    SAFE_ID,
    job_environment,
    remember_exit,
)
from .runas import RunAs
from .slurm_launch import ENV_GPUS_PER_NODE, ENV_GRACE, ENV_NODE_ADDRS, ENV_STATUS_FILE

log = logging.getLogger("goodput.sched.live.slurm")

# Slurm's job states (squeue --json ``job_state``)
LIVE = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING",
                  "REQUEUE_HOLD", "REQUEUE_FED", "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD"})  # fmt: skip
LOST_STATES = frozenset({"NODE_FAIL", "BOOT_FAIL", "PREEMPTED"})
DOWN_NODE_STATES = frozenset({"down", "fail", "failing"})
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
COMMENT = re.compile(r"^goodput:([0-9a-f]{12}):([A-Za-z0-9._-]{1,128}):([0-9]{1,9})\Z")
CANCEL_RETRY_S = 10.0  # a run goodput cancelled that Slurm still runs after this long is cancelled again
META_KEY = "."  # the row of the slurm_runs table that holds this service's instance id
DRAINED_KEY = ".drained"  # the row that holds the nodes goodput drained because Slurm had (a JSON list)


class SlurmError(OSError):
    """A Slurm command failed or answered what cannot be read; the message names the command. An
    OSError: like a store or a network that cannot be reached, it is the infrastructure's, not a job's."""


# ---------------------------------------------------------------------- the commands


@dataclass
class Slurm:
    """Slurm's command-line tools, run with a clean environment (``SLURM_CONF`` and ``PATH`` only), and
    optionally slurmrestd for the two reads of every pass (:meth:`state`)."""

    conf: str = ""  # SLURM_CONF; empty: Slurm's default
    timeout_s: float = 30.0
    rest_socket: str = ""  # slurmrestd's unix socket (rest_auth/local); empty: the CLI alone
    rest_api: str = "v0.0.38"  # the OpenAPI plugin's version in its paths (22.05: v0.0.38)
    reads: dict[str, int] = field(default_factory=lambda: {"slurmrestd": 0, "cli": 0})
    rest_error: str = ""  # why the last slurmrestd read failed ("" once one succeeds)

    def env(self) -> dict[str, str]:
        """The commands' whole environment: the service's PATH and SLURM_CONF, nothing a tenant set
        (sbatch runs as root and reads ``SBATCH_*``, ``SLURM_*`` and the loader's variables)."""
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        conf = self.conf or os.environ.get("SLURM_CONF", "")
        if conf:
            env["SLURM_CONF"] = conf
        return env

    def run(self, argv: list[str], *, env: dict[str, str] | None = None, stdin: str | None = None) -> str:
        try:
            p = subprocess.run(
                argv,
                env=env or self.env(),
                input=stdin,
                stdin=None if stdin is not None else subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=self.timeout_s,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise SlurmError(f"{argv[0]}: {e}") from None
        if p.returncode != 0:
            raise SlurmError(f"{' '.join(argv[:3])}...: exit {p.returncode}: {p.stderr.strip()[:500]}")
        return p.stdout

    def state(self, what: str) -> dict[str, Any]:
        """``jobs`` (as ``squeue --json``) or ``nodes`` (as ``sinfo --json``): from slurmrestd where one
        is configured (``GET /slurm/<api>/jobs|nodes``: the same records, from the same parser), else,
        or when it fails or answers errors, from the command, the failure kept in ``rest_error``."""
        argv = {"jobs": ["squeue", "--json"], "nodes": ["sinfo", "--json"]}[what]
        if self.rest_socket:
            try:
                d = self.rest_get(f"/slurm/{self.rest_api}/{what}")
                errs = d.get("errors") or []
                if errs:
                    raise SlurmError(f"slurmrestd {what}: {str(errs)[:300]}")
                if not isinstance(d.get(what), list):
                    raise SlurmError(f"slurmrestd {what}: no {what!r} list")
            except SlurmError as e:
                if str(e) != self.rest_error:
                    log.warning("%s: reading %s from the commands instead", e, what)
                self.rest_error = str(e)
            else:
                self.rest_error = ""
                self.reads["slurmrestd"] += 1
                return d
        d = self.json(argv)
        # squeue/sinfo --json that cannot reach slurmctld (restarting, down) exit 0 with "errors" and an
        # empty list: read as "no job is left", every run was reported gone and started again while
        # Slurm still ran it
        errs = d.get("errors") or []
        if errs:
            raise SlurmError(f"{' '.join(argv)}: {str(errs)[:300]}")
        if not isinstance(d.get(what), list):
            raise SlurmError(f"{' '.join(argv)}: no {what!r} list")
        self.reads["cli"] += 1
        return d

    def rest_get(self, path: str, limit: int = 256 << 20) -> dict[str, Any]:
        """One GET to slurmrestd over its unix socket: a JSON object of at most ``limit`` bytes."""
        import http.client
        import socket

        sock_path, timeout = self.rest_socket, self.timeout_s

        class Conn(http.client.HTTPConnection):
            def connect(self) -> None:
                self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self.sock.settimeout(timeout)
                self.sock.connect(sock_path)

        conn = Conn("localhost", timeout=timeout)
        try:
            conn.request("GET", path, headers={"Accept": "application/json"})
            r = conn.getresponse()
            raw = r.read(limit + 1)
            status = r.status
        except (OSError, http.client.HTTPException) as e:
            raise SlurmError(f"slurmrestd {self.rest_socket}: {e}") from None
        finally:
            conn.close()
        if len(raw) > limit:
            raise SlurmError(f"slurmrestd {path}: answer over {limit} bytes")
        try:
            d = json.loads(raw)
        except ValueError as e:
            raise SlurmError(f"slurmrestd {path}: HTTP {status}, not JSON ({e})") from None
        if not isinstance(d, dict):
            raise SlurmError(f"slurmrestd {path}: HTTP {status}, not an object")
        if status != 200 and not d.get("errors"):
            raise SlurmError(f"slurmrestd {path}: HTTP {status}")
        return d

    def json(self, argv: list[str]) -> dict[str, Any]:
        out = self.run(argv)
        try:
            d = json.loads(out)
        except ValueError as e:
            raise SlurmError(f"{argv[0]} --json: not JSON ({e})") from None
        if not isinstance(d, dict):
            raise SlurmError(f"{argv[0]} --json: not an object")
        return d


@dataclass(frozen=True)
class SlurmNode:
    name: str
    gpus: int  # 0: no gpu GRES (run --exclusive, one slot)
    addr: str
    state: str  # sinfo's base state, lower case (idle, allocated, mixed, down, ...)
    flags: tuple[str, ...]


def _gpus(gres: str) -> int:
    """GPUs in a GRES string: ``gpu:2``, ``gpu:a100:4(S:0-1)``, ``gpu:2,shard:8``."""
    total = 0
    for part in (gres or "").split(","):
        fields = part.split("(")[0].split(":")
        if fields[0] == "gpu" and len(fields) >= 2 and fields[-1].isdigit():
            total += int(fields[-1])
    return total


def read_nodes(slurm: Slurm, partition: str) -> list[SlurmNode]:
    """The partition's nodes from one ``sinfo --json`` (Slurm 22.05 has no ``scontrol --json``)."""
    d = slurm.state("nodes")
    out: dict[str, SlurmNode] = {}
    for n in d.get("nodes") or ():
        if not isinstance(n, dict):
            continue
        name = str(n.get("name", ""))
        if not SAFE_ID.match(name) or partition not in (n.get("partitions") or ()):
            continue
        state = n.get("state", "")
        if isinstance(state, list):  # newer Slurm: a list of flags, the base state first
            flags = tuple(str(s).upper() for s in state[1:]) + tuple(str(s).upper() for s in n.get("state_flags") or ())
            state = state[0] if state else ""
        else:
            flags = tuple(str(s).upper() for s in n.get("state_flags") or ())
        out[name] = SlurmNode(
            name, _gpus(str(n.get("gres", ""))), str(n.get("address") or name), str(state).lower(), flags
        )
    return [out[k] for k in sorted(out, key=_natural)]


def _natural(name: str) -> tuple:
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name))


def discover(slurm: Slurm, partition: str) -> tuple[list[Pool], list[Node], dict[str, SlurmNode]]:
    """goodput's pool and nodes for a Slurm partition: one pool named after it, one node per Slurm node."""
    nodes = read_nodes(slurm, partition)
    if not nodes:
        raise SlurmError(f"partition {partition!r}: sinfo lists no node in it")
    slots = {n.name: n.gpus or 1 for n in nodes}
    pool = Pool(name=partition, kind=PoolKind.ON_DEMAND, nodes=len(nodes), gpus_per_node=max(slots.values()))
    recs = [Node(name=n.name, pool=partition, kind=PoolKind.ON_DEMAND, gpus=slots[n.name]) for n in nodes]
    return [pool], recs, {n.name: n for n in nodes}


def read_cluster_json(path: str | os.PathLike) -> Any:
    """The cluster JSON of a service over Slurm (``serve --executor slurm``, ``check --partition``): a
    ``goodput.sched.sim.formats.Cluster`` whose ``pools`` are the file's if it gives any, else empty:
    over Slurm they come from ``sinfo``, so the file needs only its ``tenants`` and ``limits``. Pools it
    does give are read as the simulator reads them and must agree with Slurm's (:func:`check_pools`).
    A file that cannot be read raises ``ValueError``/``OSError`` naming it and the key at fault."""
    from ..core.governance import Governance, GovernanceError
    from ..sim import formats

    name = str(path)
    try:
        obj = json.loads(Path(path).read_text(encoding="utf-8"))
    except ValueError as e:
        raise formats.WorkloadError(f"{name}: not JSON ({e})") from None
    if not isinstance(obj, dict):
        raise formats.WorkloadError(f"{name}: expected an object, got {type(obj).__name__}")
    if "pools" in obj:
        return formats.read_cluster_json(path)
    if obj.get("events"):
        raise formats.WorkloadError(f"{name}: events: cluster events name pools, and this file gives none")
    try:
        gov = Governance.from_obj(obj.get("tenants"), obj.get("limits"))
    except GovernanceError as e:
        raise formats.WorkloadError(f"{name}: {e}") from None
    return formats.Cluster(pools=[], governance=gov)


def check_pools(given: list[Pool], found: list[Pool], partition: str) -> list[Pool]:
    """Slurm's pools, checked against a cluster JSON's: none given is agreement; given ones must be
    exactly Slurm's (one pool named after the partition, on-demand, as many nodes, as many GPUs per
    node), or a ``ValueError`` says where they differ. A given price is kept (Slurm knows none)."""
    if not given:
        return found
    want = {p.name: p for p in found}
    got = {p.name: p for p in given}
    if set(got) != set(want):
        raise ValueError(
            f"the cluster JSON's pools {sorted(got)} are not Slurm's: over --executor slurm the pool is the "
            f"partition {partition!r} (from sinfo); leave 'pools' out of the file, or name it {sorted(want)}"
        )
    out = []
    for name, f in want.items():
        g = got[name]
        diff = [
            f"{k} {getattr(g, k)!r} (Slurm: {getattr(f, k)!r})"
            for k in ("kind", "nodes", "gpus_per_node")
            if getattr(g, k) != getattr(f, k)
        ]
        if diff:
            raise ValueError(
                f"the cluster JSON's pool {name!r} disagrees with Slurm's partition {partition!r}: "
                + ", ".join(diff)
                + "; leave 'pools' out of the file (Slurm's are used) or make it match"
            )
        out.append(Pool(f.name, f.kind, f.nodes, f.gpus_per_node, g.price_per_gpu_hour, g.reclaim_per_node_hour))
    return out


def hostnames(spec: str) -> list[str]:
    """The names in a Slurm host list, as ``scontrol show hostnames`` expands it: ``n[1-3,5]``,
    ``gpu-[01-02]`` (the width kept), ``a[1-2]b[3-4]`` (every combination), ``n1,n[3-4]``. A
    ``ValueError`` for what is not one (an unclosed bracket, a reversed range, over 65,536 names)."""
    out: list[str] = []
    depth, start = 0, 0
    items = []
    for i, ch in enumerate(spec):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise ValueError(f"host list {spec!r}: nested brackets")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"host list {spec!r}: ']' without '['")
        elif ch == "," and depth == 0:
            items.append(spec[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"host list {spec!r}: unclosed '['")
    items.append(spec[start:])
    for item in items:
        item = item.strip()
        if not item:
            continue
        names = [""]
        for literal, ranges in re.findall(r"([^\[\]]*)(?:\[([^\]]*)\])?", item):
            choices = [literal]
            if ranges:
                choices = []
                for r in ranges.split(","):
                    m = re.fullmatch(r"\s*([0-9]+)(?:-([0-9]+))?\s*", r)
                    if m is None:
                        raise ValueError(f"host list {spec!r}: bad range {r!r}")
                    lo, hi = m.group(1), m.group(2) if m.group(2) is not None else m.group(1)
                    if int(hi) < int(lo) or int(hi) - int(lo) > 65536:
                        raise ValueError(f"host list {spec!r}: bad range {r!r}")
                    choices += [f"{literal}{k:0{len(lo)}d}" for k in range(int(lo), int(hi) + 1)]
            names = [a + b for a in names for b in choices]
            if len(names) + len(out) > 65536:
                raise ValueError(f"host list {spec!r}: too many names")
        out += names
    return out


def _tres_gpus(spec: str) -> int:
    """GPUs in a TRES string as Slurm shows a job's (``tres_per_node`` and the like): ``gres:gpu:2``
    (22.05), ``gres/gpu:2`` (23.02+), ``gres:gpu:a100:2``, ``gres/gpu`` (one); other TRES are 0."""
    total = 0
    for part in (spec or "").split(","):
        fields = re.sub(r"^gres[:/]", "", part.strip()).split(":")
        if fields[0] == "gpu":
            total += int(fields[-1]) if len(fields) >= 2 and fields[-1].isdigit() else 1
    return total


def _num(v: Any) -> int | None:
    """An integer field of Slurm's JSON: a plain int (22.05) or ``{"set": true, "number": n}``
    (23.02+); None where it is unset or neither (then not checked)."""
    if isinstance(v, dict):
        v = v.get("number") if v.get("set", True) else None
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _alloc_gpus(tres: str) -> int | None:
    """The GPUs a job was allocated, from its ``tres_alloc_str`` (``...,gres/gpu=4``): None where
    Slurm does not track them (``AccountingStorageTRES`` without ``gres/gpu``)."""
    m = re.search(r"(?:^|,)gres/gpu=([0-9]+)(?:,|$)", tres or "")
    return int(m.group(1)) if m else None


def exit_code(raw: Any) -> tuple[int | None, int | None]:
    """(status, signal) from squeue's ``exit_code``: a wait status (22.05) or an object (23.02+)."""
    if isinstance(raw, bool):
        return None, None
    if isinstance(raw, int):
        sig = raw & 0x7F
        return (raw >> 8) & 0xFF, sig or None
    if isinstance(raw, dict):
        rc = raw.get("return_code")
        sg = raw.get("signal")
        sig = (sg.get("id", sg.get("signal_id")) if isinstance(sg, dict) else None) or None
        if isinstance(rc, dict):
            rc = rc.get("number") if rc.get("set", True) else None
        return (int(rc) if isinstance(rc, int) else None), (int(sig) if isinstance(sig, int) and sig else None)
    return None, None


def _exit_detail(run: SlurmRun, state: str, raw: Any) -> dict:
    """What a job's ``last_exit`` shows of a run Slurm ended: Slurm's state and id (the handle an
    operator gives ``sacct``), the batch step's rc, and the signal that ended it. As over local
    slots, a run ended by a signal has ``rc`` minus the signal's number (Python's returncode) and
    ``signal`` its name, or ``"SIG<n>"`` for a number Python does not name."""
    rc, sig = exit_code(raw)
    detail: dict = {"rc": rc, "slurm_state": state, "slurm_id": run.slurm_id}
    if sig is not None:
        detail["rc"] = -sig
        try:
            detail["signal"] = signal.Signals(sig).name
        except ValueError:
            detail["signal"] = f"SIG{sig}"
    return detail


def parse_sacct(d: dict[str, Any]) -> dict[int, tuple[str, Any]]:
    """Slurm id -> (state, exit code) from ``sacct --json`` (``state.current``: a string in 22.05, a
    list in 23.02+; ``exit_code`` as :func:`exit_code` reads it)."""
    out: dict[int, tuple[str, Any]] = {}
    for j in d.get("jobs") or ():
        if not isinstance(j, dict) or not isinstance(j.get("job_id"), int):
            continue
        st = j.get("state")
        cur = st.get("current") if isinstance(st, dict) else st
        if isinstance(cur, list):
            cur = cur[0] if cur else ""
        out[j["job_id"]] = (str(cur or ""), j.get("exit_code"))
    return out


def _signal_numbers(names: Any) -> set[int]:
    """The numbers of the signals named (``"TERM"``, ``"USR1"``: as ``scancel --signal`` takes them)."""
    out: set[int] = set()
    for n in names or ():
        with contextlib.suppress(KeyError, TypeError, AttributeError):
            out.add(int(signal.Signals["SIG" + str(n).upper().removeprefix("SIG")]))
    return out


def obeyed(rc: int | None, sig: int | None, signalled: Any) -> bool:
    """Whether a run that ended with ``rc`` (or of signal ``sig``) died of a notice we sent it
    (``signalled``: the names we gave ``scancel --signal``): the batch step reports a gang killed by
    TERM as 143 (``128 + n``, :mod:`goodput.sched.live.slurm_launch`), Slurm a step killed by it as
    the signal. A stop obeyed, as a kill at the deadline is; a signal we did not send is a failure."""
    sent = _signal_numbers(signalled)
    if not sent:
        return False
    return (sig is not None and sig in sent) or (rc is not None and rc - 128 in sent)


def status_of(state: str, raw_exit: Any, *, killed: bool, signalled: Any = ()) -> str:
    """``Scheduler.report_exit``'s word for a Slurm job that ended in ``state``; ``signalled``: the
    notices we sent it (a job that dies of one obeyed our stop: ``killed``, not ``failed``)."""
    rc, sig = exit_code(raw_exit)
    if state == "COMPLETED" and rc == 0:
        return "finished"
    if state in LOST_STATES:
        return "lost"
    if state == "CANCELLED":
        return "killed" if killed else "lost"
    if rc == PREEMPTED_EXIT and not sig:
        return "preempted"
    if killed or obeyed(rc, sig, signalled):
        return "killed"
    return "failed"


# ---------------------------------------------------------------------- the records


@dataclass
class SlurmRun:
    """One run (job, epoch) as one Slurm job; stored before Slurm may start it."""

    job: str
    epoch: int
    slurm_id: int
    nodes: list[str]
    user: str
    dir: str
    released: bool = False
    killed: bool = False  # we cancelled it: CANCELLED reads as killed, not lost
    notified: str = ""  # a notice asked while Slurm still had it pending: sent once it runs
    # the notices sent (scancel --signal names), recorded before each is sent: a job that dies of one
    # obeyed our stop ("killed"), it did not fail
    signalled: list[str] = field(default_factory=list)
    submitted: float = 0.0
    stuck: bool = False  # released, but Slurm would not start it where goodput placed it: cancelled, lost
    released_at: float = 0.0
    gpus_per_node: int = -1  # the --gres=gpu:N it was submitted with; 0: --exclusive; -1: not recorded
    # why Slurm's record of it stopped being what goodput submitted (its owner changed it with
    # scontrol update or requeued it): cancelled, and reported failed
    tampered: str = ""


class RunTable:
    """The ``slurm_runs`` table in the service's own store (SQLite or PostgreSQL): one row per live
    run plus this service's instance id. A separate table, so the store's schema stays the store's."""

    def __init__(self, store: Any) -> None:
        self.store = store
        with store._use(), store._transaction(write=True) as cur:
            cur.execute("CREATE TABLE IF NOT EXISTS slurm_runs (job TEXT PRIMARY KEY, body TEXT NOT NULL)")

    def _put(self, key: str, body: str) -> None:
        s = self.store
        with s._use(), s._transaction(write=True) as cur:
            cur.execute(
                s._sql(
                    "INSERT INTO slurm_runs (job, body) VALUES (?, ?) ON CONFLICT (job) DO UPDATE SET body = excluded.body"
                ),
                (key, body),
            )

    def instance(self) -> str:
        s = self.store
        with s._use(), s._transaction(write=False) as cur:
            cur.execute(s._sql("SELECT body FROM slurm_runs WHERE job = ?"), (META_KEY,))
            row = cur.fetchone()
        if row is not None and re.fullmatch(r"[0-9a-f]{12}", str(row[0])):
            return str(row[0])
        inst = uuid.uuid4().hex[:12]
        self._put(META_KEY, inst)
        return inst

    def drained(self) -> set[str]:
        """The nodes Slurm had drained when this service last looked (so that a RESUME while it was
        down still returns them); a row that does not decode is logged and read as none."""
        s = self.store
        with s._use(), s._transaction(write=False) as cur:
            cur.execute(s._sql("SELECT body FROM slurm_runs WHERE job = ?"), (DRAINED_KEY,))
            row = cur.fetchone()
        if row is None:
            return set()
        try:
            names = json.loads(row[0])
            if not isinstance(names, list) or not all(isinstance(n, str) and SAFE_ID.match(n) for n in names):
                raise ValueError("not a list of node names")
        except ValueError as e:
            log.error("slurm_runs row %r does not decode (%s): no node counts as drained by Slurm", DRAINED_KEY, e)
            return set()
        return set(names)

    def save_drained(self, names: Iterable[str]) -> None:
        self._put(DRAINED_KEY, json.dumps(sorted(names)))

    def save(self, run: SlurmRun) -> None:
        self._put(run.job, json.dumps(asdict(run), sort_keys=True))

    def delete(self, job: str, epoch: int) -> None:
        s = self.store
        with s._use(), s._transaction(write=True) as cur:
            cur.execute(s._sql("SELECT body FROM slurm_runs WHERE job = ?"), (job,))
            row = cur.fetchone()
            if row is not None and _epoch_of(row[0]) == epoch:
                cur.execute(s._sql("DELETE FROM slurm_runs WHERE job = ?"), (job,))

    def load(self) -> list[SlurmRun]:
        s = self.store
        with s._use(), s._transaction(write=False) as cur:
            cur.execute("SELECT job, body FROM slurm_runs")
            rows = cur.fetchall()
        out = []
        for key, body in rows:
            if str(key).startswith("."):  # this service's own rows (instance id, drained nodes)
                continue
            try:
                raw = json.loads(body)
                run = SlurmRun(**{k: raw[k] for k in SlurmRun.__dataclass_fields__ if k in raw})
                if not SAFE_ID.match(run.job) or not isinstance(run.slurm_id, int):
                    raise ValueError("bad job id or Slurm id")
            except (ValueError, TypeError, KeyError) as e:
                log.error("slurm_runs row %r does not decode (%s): left alone", key, e)
                continue
            out.append(run)
        return out


CR_VAR = "_goodput_cr"  # the batch script's own (not exported) variable holding a carriage return


def _sh_word(v: str) -> str:
    """One shell word that expands to exactly ``v`` and holds no carriage return (``shlex.quote``'s
    pieces joined by ``"$_goodput_cr"``, which the batch script sets first)."""
    if "\r" not in v:
        return shlex.quote(v)
    return f'"${CR_VAR}"'.join(shlex.quote(piece) if piece else "" for piece in v.split("\r"))


def _epoch_of(body: Any) -> int:
    try:
        return int(json.loads(body).get("epoch", -1))
    except (ValueError, TypeError, AttributeError):
        return -1


# ---------------------------------------------------------------------- the executor


@dataclass
class View:
    """One ``squeue --json`` of the cluster: Slurm id -> its job record."""

    jobs: dict[int, dict[str, Any]] = field(default_factory=dict)
    t: float = 0.0


class SlurmExecutor:
    """Runs each gang as one Slurm job; a watcher thread reads Slurm once per pass.

    ``on_exit(job_id, epoch, status)`` as the local executor's; ``on_nodes(down, up, drained, resumed)``
    with every node Slurm holds down, every node it holds drained, the nodes back from down (every node
    at the first pass) and those whose Slurm drain the core took and Slurm has lifted (the caller takes
    its own lock for both; :func:`node_changes` applies them). ``on_nodes`` answers which of
    ``drained`` it drained on Slurm's word (None: all of them), which is how a RESUME tells Slurm's
    drains from goodput's own. ``run_as(job)`` is the identity a job runs as (None: the service's
    own; may raise, which fails the run), ``env_for(job)`` its spec's environment; the rest of a
    job's environment is the local executor's (``local.job_environment``), with its token in a file.
    """

    def __init__(
        self,
        state_dir: str | os.PathLike,
        *,
        store: Any,
        partition: str,
        url: str = "",
        slurm: Slurm | None = None,
        token_for: Callable[[Job], str] | None = None,
        on_exit: Callable[[str, int, str], None] | None = None,
        on_nodes: Callable[[list[str], list[str], list[str], list[str]], Iterable[str] | None] | None = None,
        run_as: Callable[[Job], RunAs | None] | None = None,
        env_for: Callable[[Job], dict[str, str]] | None = None,
        python: str = "",
        poll_s: float = 0.5,
    ) -> None:
        self.dir = Path(state_dir) / "slurm"
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o711)  # traversable, not listable: each run's own folder below is its user's, 0700
        self.partition = partition
        self.url = url
        self.slurm = slurm or Slurm()
        self.token_for = token_for
        self.on_exit = on_exit
        self.on_nodes = on_nodes
        self.run_as = run_as
        self.env_for = env_for
        self.python = python or sys.executable
        self.poll_s = poll_s
        self.stuck_s = 120.0
        self.table = RunTable(store)
        self.instance = self.table.instance()
        self.runs: dict[str, SlurmRun] = {}
        self.last_exit: dict[str, dict] = {}  # job id -> its last run's exit (rc, signal, Slurm's state), for the views
        self.nodes: dict[str, SlurmNode] = {}
        self.down: set[str] = set()  # nodes we reported down to the core
        self.drained: set[str] = self.table.drained()  # nodes we drained in the core because Slurm had
        self.slurm_held: dict[str, str] = {}  # node -> "down" | "drained": Slurm's word at the last read
        self._claimed: set[str] = set()  # nodes drained through the API during the current node pass
        self._first_nodes = True
        self.view = View()
        self.failures: list[str] = []  # Slurm commands that failed (kept short): what /healthz may show
        self._unreleased: list[str] = []
        self._cancelled_at: dict[int, float] = {}  # Slurm id -> when scancel was last asked for it
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ the Executor protocol

    def start(self, job: Job, nodes: tuple[str, ...], resume_from_s: float) -> None:
        """Submit the gang held; never raises into the pass (a run that cannot be submitted is reported at
        the next poll: lost when Slurm would not take it, failed when the job cannot run)."""
        with self._lock:
            old = self.runs.pop(job.id, None)
            if old is not None:  # the core starts only a job it does not count as running: never two
                self._forget(old)
            try:
                run = self._submit(job, nodes, resume_from_s)
            except Exception as e:  # noqa: BLE001 - the pass must go on
                # Slurm unreachable or refusing is the infrastructure's (lost: requeued, no failure
                # counted); a job that cannot run (its user, its command) fails, saying why
                log.error("job %s epoch %d: cannot submit to Slurm: %s", job.id, job.epoch, e)
                self._note(f"sbatch for {job.id}: {e}")
                infra = isinstance(e, SlurmError)
                run = SlurmRun(job.id, job.epoch, -1, list(nodes), "", "", released=True, stuck=infra)
            self.runs[job.id] = run
            if run.slurm_id >= 0:
                self._unreleased.append(job.id)

    def notify(self, job: Job, *, checkpoint: bool, deadline_s: float) -> None:
        sig = "USR1" if checkpoint else "TERM"
        with self._lock:
            run = self._current(job)
            if run is None or run.slurm_id < 0:
                return
            state = str(self.view.jobs.get(run.slurm_id, {}).get("job_state", ""))
            if not run.released or state == "PENDING":
                self._cancel(run)  # it never ran: nothing to checkpoint, and a signal would be refused
            elif not self._signal(run, sig):
                run.notified = sig  # not running yet (or slurmctld away): sent by the first pass that can
                self.table.save(run)

    def kill(self, job: Job) -> None:
        with self._lock:
            run = self._current(job)
            if run is not None and run.slurm_id >= 0:
                self._cancel(run)

    # ------------------------------------------------------------------ after the pass is committed

    def after_pass(self) -> None:
        """Release the runs the last scheduling pass started: its store commit (the core's ``started``)
        is done, and each run's Slurm id was stored at its submission."""
        with self._lock:
            ids, self._unreleased = self._unreleased, []
            for jid in ids:
                run = self.runs.get(jid)
                if run is not None and not run.released and not run.killed:
                    self._release(run)

    # ------------------------------------------------------------------ re-adoption after a restart

    def adopt(self, jobs: dict[str, Job]) -> dict[str, str]:
        """Take back the runs a previous service stored: ``{job id: adopted | released | cancelled}``.

        A run the store counts (running or preempting, same epoch) is adopted, and released if the
        previous service died between its start's commit and the release. Any other run is a start
        that never committed, or one already accounted for: cancelled (if Slurm still has it) and
        forgotten. Slurm jobs of this service that no record names (submitted, then the service
        died before storing the id) are cancelled at the first pass that can read Slurm.
        """
        out: dict[str, str] = {}
        with self._lock:
            for run in self.table.load():
                job = jobs.get(run.job)
                live = job is not None and job.epoch == run.epoch and job.state.value in ("running", "preempting")
                if live:
                    self.runs[run.job] = run
                    if not run.released and not run.killed and run.slurm_id >= 0:
                        self._release(run)
                        out[run.job] = "released"
                    else:
                        out[run.job] = "adopted"
                else:
                    if run.slurm_id >= 0:
                        self._cancel(run, save=False)
                    self.table.delete(run.job, run.epoch)
                    out[run.job] = "cancelled"
        return out

    def reconcile(self, jobs: dict[str, Job]) -> dict[str, str]:
        """After the scheduler was rebuilt from its store in this process (a store write failed): every
        run the store does not count (a start whose commit failed) is cancelled and forgotten, its exit
        never reported (the same epoch may be started again, and that run's exit is the one to report)."""
        out: dict[str, str] = {}
        with self._lock:
            for run in list(self.runs.values()):
                job = jobs.get(run.job)
                live = job is not None and job.epoch == run.epoch and job.state.value in ("running", "preempting")
                if not live:
                    del self.runs[run.job]
                    self._forget(run)
                    out[run.job] = "cancelled"
        return out

    def _forget(self, run: SlurmRun) -> None:
        """Cancel a run no one counts and drop every trace of it but its log (the lock held)."""
        if run.slurm_id >= 0:
            self._cancel(run, save=False)
        self._unreleased = [j for j in self._unreleased if j != run.job]
        self.table.delete(run.job, run.epoch)
        if run.dir:
            with contextlib.suppress(OSError):
                os.unlink(Path(run.dir, "token"))

    # ------------------------------------------------------------------ the watcher

    def start_watcher(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="goodput-slurm-executor", daemon=True)
            self._thread.start()

    def close(self) -> None:
        """Stop watching (the Slurm jobs keep running: a restarted service re-adopts them)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll()
            except Exception:  # noqa: BLE001 - one bad pass must not stop the watcher; logged
                log.exception("slurm executor: poll failed")
            self._stop.wait(self.poll_s)

    def poll(self) -> int:
        """Read Slurm once (squeue, sinfo); report exits and node changes; the number of exits reported."""
        try:
            q = self.slurm.state("jobs")
        except SlurmError as e:
            self._note(str(e))
            return 0  # slurmctld away (restarting): nothing is concluded from silence
        view = View({}, time.time())
        for j in q.get("jobs") or ():
            if isinstance(j, dict) and isinstance(j.get("job_id"), int):
                view.jobs[j["job_id"]] = j
        done: list[tuple[SlurmRun, str, dict]] = []  # (run, status, its last_exit detail)
        forgotten: list[SlurmRun] = []  # runs squeue no longer lists (older than MinJobAge)
        with self._lock:
            self.view = view
            for run in list(self.runs.values()):
                if run.slurm_id < 0:
                    done.append((run, "lost" if run.stuck else "failed", {"rc": None, "slurm_id": None}))
                    continue
                j = view.jobs.get(run.slurm_id)
                if j is None:
                    if run.submitted and view.t - run.submitted < 5.0:
                        continue  # just submitted: a view taken before sbatch answered
                    forgotten.append(run)
                    continue
                state = str(j.get("job_state", ""))
                if state in LIVE and not run.killed and not run.tampered:
                    why = self._tampering(run, j)
                    if why:
                        log.error("slurm job %d of %s (epoch %d, user %s) is no longer what goodput submitted: %s; "
                                  "cancelled, a failure of the job", run.slurm_id, run.job, run.epoch, run.user, why)  # fmt: skip
                        self._note(f"slurm job {run.slurm_id} of {run.job} changed in Slurm ({why}): cancelled")
                        run.tampered = why
                        self._cancel(run)
                        continue
                if state in LIVE:
                    if run.killed and state in ("PENDING", "RUNNING", "SUSPENDED", "CONFIGURING"):
                        # a cancel Slurm never acted on (slurmctld away when it was asked, or a service
                        # restarted since): asked again, or a run that ignores its stop holds its nodes
                        # for ever
                        if view.t - self._cancelled_at.get(run.slurm_id, 0.0) > CANCEL_RETRY_S:
                            log.warning("slurm job %d of %s (epoch %d) is still %s after goodput cancelled it: "
                                        "cancelled again", run.slurm_id, run.job, run.epoch, state)  # fmt: skip
                            self._scancel(run.slurm_id)
                        continue
                    if state == "PENDING" and run.released and not run.killed and self._stuck(run, j, view.t):
                        log.error("slurm job %d of %s stays pending (%s): cancelled, an infrastructure loss",
                                  run.slurm_id, run.job, j.get("state_reason"))  # fmt: skip
                        run.stuck = True
                        self._cancel(run)
                    elif run.notified and state == "PENDING":
                        self._cancel(run)
                    elif run.notified and state == "RUNNING" and self._signal(run, run.notified):
                        run.notified = ""
                        self.table.save(run)
                    continue
                st = (
                    "failed"
                    if run.tampered
                    else "lost"
                    if run.stuck
                    else status_of(state, j.get("exit_code"), killed=run.killed, signalled=run.signalled)
                )
                done.append((run, st, _exit_detail(run, state, j.get("exit_code"))))
            self._cancel_strays(view)
            self._cancelled_at = {k: t for k, t in self._cancelled_at.items() if k in view.jobs}
            if forgotten:  # accounting where it is kept (one sacct for all of them), else the status files
                acct = self._sacct([r.slurm_id for r in forgotten])
                for run in forgotten:
                    a = acct.get(run.slurm_id)
                    if a is not None and a[0] not in LIVE:
                        st = status_of(a[0], a[1], killed=run.killed, signalled=run.signalled)
                        done.append((run, "failed" if run.tampered else st, _exit_detail(run, a[0], a[1])))
                    else:
                        st, rc = self._status_file(run)
                        done.append((run, "failed" if run.tampered else st, {"rc": rc, "slurm_id": run.slurm_id}))
        for run, status, detail in done:
            if run.tampered:
                detail = {**detail, "tampered": run.tampered}
            # before the report, so that whoever sees the job requeued also sees how its run ended
            remember_exit(self.last_exit, run.job, {"epoch": run.epoch, "status": status, **detail})
            if self.on_exit is not None:
                self.on_exit(run.job, run.epoch, status)
            with self._lock:
                if self.runs.get(run.job) is run:
                    del self.runs[run.job]
                self.table.delete(run.job, run.epoch)  # after the report: a crash in between re-reports, ignored
            if run.dir:  # the run's log stays; its token goes with it (unlink removes a planted link, not its target)
                with contextlib.suppress(OSError):
                    os.unlink(Path(run.dir, "token"))
        self._poll_nodes()
        return len(done)

    def _poll_nodes(self) -> None:
        try:
            nodes = read_nodes(self.slurm, self.partition)
        except SlurmError as e:
            self._note(str(e))
            return
        self.apply_nodes(nodes)

    def apply_nodes(self, nodes: list[SlurmNode]) -> None:
        """One ``sinfo`` read of Slurm's node states into the core's. ``DOWN``/``FAIL`` is a loss,
        ``DRAIN`` (whatever the base state) is goodput's drain, anything else is up; a node back from
        down that still does not respond stays down.

        Levels, not edges: every pass hands the core every node Slurm holds down or drained, so that
        a node Slurm holds is never offered, whatever made it ``up`` in the core meanwhile (a restart,
        a race with the API's ``/up``, which also refuses: :meth:`node_request`). Only a drain the core
        took *because Slurm had drained the node* (``self.drained``, kept in the store) is undone by
        Slurm's RESUME; a node goodput had drained itself (``POST /nodes/X/drain``, before or after
        Slurm's drain) stays drained until goodput's ``/up``."""
        with self._lock:
            first = self._first_nodes
            self._claimed = set()
            down_now: set[str] = set()
            drained_now: set[str] = set()
            for n in nodes:
                self.nodes[n.name] = n
                if n.state in DOWN_NODE_STATES or ("NOT_RESPONDING" in n.flags and n.name in self.down):
                    down_now.add(n.name)
                elif "DRAIN" in n.flags:
                    drained_now.add(n.name)
            listed = {n.name for n in nodes}
            held = down_now | drained_now
            up = sorted(n for n in listed - held if first or n in self.down)
            resumed = sorted(n for n in self.drained & listed if n not in held)
            self.slurm_held = {**dict.fromkeys(drained_now, "drained"), **dict.fromkeys(down_now, "down")}
            if not (first or held or up or resumed):
                return
            down, drained = sorted(down_now), sorted(drained_now)
        took: Iterable[str] | None = None
        if self.on_nodes is not None:
            try:
                took = self.on_nodes(down, up, drained, resumed)
            except Exception:
                with self._lock:  # not applied (the store refused): the next pass reports every node again
                    self._first_nodes = True
                raise
        with self._lock:
            self._first_nodes = False
            self.down = down_now
            ours = (self.drained & drained_now) | (set(drained) if took is None else set(took) & drained_now)
            ours |= self.drained - listed  # a node sinfo no longer lists keeps its record
            ours -= self._claimed  # drained through the API while on_nodes ran: goodput's own
            if ours != self.drained:
                self.drained = ours
                try:
                    self.table.save_drained(self.drained)
                except Exception as e:  # noqa: BLE001 - the next change writes it again; the core is told now
                    self._note(f"cannot store the drained nodes: {e}")

    def node_request(self, name: str, what: str) -> str | None:
        """The service's ``POST /nodes/{name}/drain|up`` asks first (its lock held): None to go on, or
        why not. ``up`` is refused while Slurm holds the node drained or down (the core would offer a
        node Slurm will not run anything on: every start placed there would sit pending until the
        stuck rule cancels it as ``lost``). ``drain`` makes the node's drain goodput's own: Slurm's
        RESUME no longer returns it."""
        with self._lock:
            if what == "up":
                held = self.slurm_held.get(name)
                if held:
                    return (
                        f"node {name!r} is {held} in Slurm: goodput offers it once Slurm does "
                        f"(scontrol update nodename={name} state=RESUME)"
                    )
                return None
            if what == "drain":
                self._claimed.add(name)  # a pass between its Slurm read and its bookkeeping leaves it too
            if what == "drain" and name in self.drained:
                self.drained.discard(name)
                try:
                    self.table.save_drained(self.drained)
                except Exception as e:  # noqa: BLE001 - the drain itself is the core's, and stands
                    self._note(f"cannot store the drained nodes: {e}")
            return None

    # ------------------------------------------------------------------ Slurm calls

    def _submit(self, job: Job, nodes: tuple[str, ...], resume_from_s: float) -> SlurmRun:
        if not SAFE_ID.match(job.id):
            raise ValueError(f"job id {job.id!r} is not a safe file name")
        if not job.command:
            raise ValueError(f"job {job.id!r}: command is empty")
        who = self.run_as(job) if self.run_as is not None else None  # may refuse: the run fails, saying why
        # a folder per submission: a start of the same epoch after a restart (the first never committed)
        # must not share it with the cancelled run, which may still be writing its status there
        run_dir = self.dir / f"{job.id}.{job.epoch}.{uuid.uuid4().hex[:8]}"
        run_dir.mkdir(mode=0o700)
        os.chmod(run_dir, 0o700)
        argv = [self.python, "-m", "goodput.sched.live.slurm_launch", "batch", "--", *job.command]
        token = run_dir / "token"
        token.write_text(self.token_for(job) if self.token_for is not None else "", encoding="ascii")
        log_file = run_dir / "log"
        log_file.touch()
        for p in (token, log_file):
            os.chmod(p, 0o600)
        if who is not None:
            for p in (run_dir, log_file, token):
                os.chown(p, who.uid, who.gid)
        gpn = job.gpus_per_node
        gpus = [self.nodes[n].gpus if n in self.nodes else gpn for n in nodes]
        own = {
            ENV_JOB_ID: job.id,
            ENV_EPOCH: str(job.epoch),
            ENV_URL: self.url,
            ENV_TOKEN_FILE: str(token),
            ENV_CKPT_ROOT: job.ckpt_root,
            ENV_RESUME: repr(float(resume_from_s)),
            ENV_NODES: ",".join(nodes),
            ENV_SLOTS: str(len(nodes) * gpn),
            ENV_GPUS_PER_NODE: str(gpn),
            ENV_STATUS_FILE: str(run_dir / "status.json"),
            ENV_GRACE: repr(float(job.ckpt.grace_s)),
            ENV_NODE_ADDRS: ",".join(f"{n}={self.nodes[n].addr}" for n in nodes if n in self.nodes),
        }
        spec_env = self.env_for(job) if self.env_for is not None else {}
        env = job_environment(dict(os.environ), spec_env, own, who)
        # the job's environment is set by its batch script, never through root's sbatch process (whose
        # own environment a tenant's SBATCH_*, SLURM_CONF, PATH or LD_PRELOAD must not reach); the
        # script goes on sbatch's stdin: no file the job's user could swap before root reads it
        # sbatch refuses a script with a carriage return before a newline (a tenant's "a\r\nb" made
        # every start of the job an infrastructure loss): no CR is written, a variable holds it
        lines = ["#!/bin/sh", f"{CR_VAR}=$(printf '\\r')"]
        for k, v in sorted(env.items()):
            if not ENV_NAME.match(k) or "\0" in v:
                raise ValueError(f"job {job.id!r}: environment variable {k!r} cannot be exported")
            lines.append(f"export {k}={_sh_word(v)}")
        lines.append("exec " + " ".join(_sh_word(a) for a in argv))
        script = "\n".join(lines) + "\n"
        grace = max(1, int(job.ckpt.grace_s))
        cmd = [
            "sbatch", "--parsable", "--hold", f"--partition={self.partition}",
            f"--nodes={len(nodes)}", f"--nodelist={','.join(nodes)}", "--ntasks-per-node=1",
            f"--job-name=gp-{job.id}"[:120], f"--comment=goodput:{self.instance}:{job.id}:{job.epoch}",
            "--no-requeue", f"--signal=B:USR1@{grace}", "--export=ALL", f"--chdir={run_dir}",
            f"--output={log_file}", "--open-mode=append",
        ]  # fmt: skip
        gres = gpn if all(g > 0 for g in gpus) else 0
        cmd.append(f"--gres=gpu:{gres}" if gres else "--exclusive")
        if who is not None:
            cmd += [f"--uid={who.uid}", f"--gid={who.gid}"]
        out = self.slurm.run(cmd, stdin=script).strip()
        m = re.match(r"^([0-9]+)", out)
        if m is None:
            raise SlurmError(f"sbatch answered {out!r}, not a job id")
        sid = int(m.group(1))
        # sbatch --hold is the job user's own hold (JobHeldUser), which the user may release; root's
        # hold is an administrator's (JobHeldAdmin), which only an operator can. Refused (the user
        # released it in between and it started or ended, or slurmctld went away): never run.
        try:
            self.slurm.run(["scontrol", "hold", str(sid)])
        except SlurmError as e:
            self._scancel(sid)
            raise SlurmError(f"slurm job {sid} cannot be put under goodput's hold (cancelled): {e}") from None
        user = who.user if who is not None else pwd.getpwuid(os.geteuid()).pw_name
        run = SlurmRun(
            job.id, job.epoch, sid, list(nodes), user, str(run_dir), submitted=time.time(), gpus_per_node=gres
        )
        try:
            self.table.save(run)  # before it may run
        except Exception:
            self._scancel(run.slurm_id)
            raise
        return run

    def _release(self, run: SlurmRun) -> None:
        try:
            self.slurm.run(["scontrol", "release", str(run.slurm_id)])
        except SlurmError as e:
            # the next pass retries; a job Slurm no longer has is read as gone by the poll
            self._note(f"release {run.slurm_id}: {e}")
            self._unreleased.append(run.job)
            return
        run.released, run.released_at = True, time.time()
        self.table.save(run)

    def _signal(self, run: SlurmRun, sig: str) -> bool:
        """``sig`` to the run's batch step; False if Slurm refused (the core's deadline still kills it).
        Recorded (and stored) before it is sent, so that a job dying of it reads as having obeyed."""
        if sig not in run.signalled:
            run.signalled.append(sig)
            self.table.save(run)
        try:
            self.slurm.run(["scancel", "--batch", f"--signal={sig}", str(run.slurm_id)])
        except SlurmError as e:
            self._note(f"signal {sig} to {run.slurm_id}: {e}")
            return False
        return True

    def _cancel(self, run: SlurmRun, *, save: bool = True) -> None:
        run.killed = True
        if save:
            self.table.save(run)
        self._scancel(run.slurm_id)

    def _scancel(self, slurm_id: int) -> None:
        self._cancelled_at[slurm_id] = time.time()
        try:
            self.slurm.run(["scancel", str(slurm_id)])
        except SlurmError as e:
            self._note(f"scancel {slurm_id}: {e}")

    def _cancel_strays(self, view: View) -> None:
        """Cancel live Slurm jobs of this service that no run names (submitted, then the service died
        before it stored the id; or adopted as not counted)."""
        mine = {(r.job, r.epoch) for r in self.runs.values()}
        for sid, j in view.jobs.items():
            m = COMMENT.match(str(j.get("comment") or ""))
            if m is None or m.group(1) != self.instance or str(j.get("job_state", "")) not in LIVE:
                continue
            if (m.group(2), int(m.group(3))) in mine:
                continue
            if time.time() - float(j.get("submit_time") or 0) < 10.0:
                continue  # a submission in flight on another thread
            log.warning("slurm job %d (%s epoch %s) is not a run of the store: cancelled", sid, m.group(2), m.group(3))
            self._scancel(sid)

    def _sacct(self, ids: list[int]) -> dict[int, tuple[str, Any]]:
        """Slurm id -> (state, exit code) from accounting; {} where none is kept (sacct absent or
        refusing: accounting is off by default) or its answer cannot be read."""
        if not ids or shutil.which("sacct", path=self.slurm.env()["PATH"]) is None:
            return {}
        try:
            d = self.slurm.json(["sacct", "--json", "-X", "-j", ",".join(str(i) for i in ids)])
        except SlurmError:
            return {}
        return parse_sacct(d)

    def _status_file(self, run: SlurmRun) -> tuple[str, int | None]:
        """The status of a run Slurm no longer lists, from its batch step's status file; else lost
        (with the file's rc, None where there was none).
        The file sits in the job user's folder: opened without following a link, never blocking on a
        FIFO, a regular file of at most 4 KiB, only its integer ``rc`` believed."""
        if run.stuck:
            return "lost", None
        try:
            fd = os.open(Path(run.dir, "status.json"), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode) or st.st_size > 4096:
                    raise ValueError("not a small regular file")
                raw = os.read(fd, 4096)
            finally:
                os.close(fd)
            rc = json.loads(raw)["rc"]
            if not isinstance(rc, int) or isinstance(rc, bool):
                raise ValueError("rc is not an integer")
        except (OSError, ValueError, KeyError, TypeError):
            return ("killed" if run.killed else "lost"), None
        if rc == 0:
            return "finished", rc
        if rc == PREEMPTED_EXIT:
            return "preempted", rc
        return ("killed" if run.killed or obeyed(rc, None, run.signalled) else "failed"), rc

    def _stuck(self, run: SlurmRun, j: dict[str, Any], now: float) -> bool:
        """Released long ago and still pending: Slurm will not run it on the nodes goodput chose (a node
        drained or reserved in Slurm, a limit of the partition). Not while its nodes are still being
        cleaned up after the run before (``Resources``), nor within ``stuck_s`` of its release."""
        reason = str(j.get("state_reason") or "")
        since = max(float(j.get("eligible_time") or 0), run.released_at or run.submitted)
        return now - since > self.stuck_s and reason not in ("Resources", "Priority", "None", "BeginTime")

    def _tampering(self, run: SlurmRun, j: dict[str, Any]) -> str:
        """What of a live Slurm job of ours is no longer what goodput submitted ("" if nothing): its owner
        (the tenant's Unix user) may ``scontrol update`` its own pending job (nodes, node count, GRES,
        partition, comment, dependency, excluded nodes, a hold of its own), shrink a running one, or
        make it requeueable and requeue it; goodput's placement and "a run never starts twice" rest on
        none of that happening. Only this job's own record is read, only this job is acted on."""
        # a field this Slurm's record lacks is not checked: a false alarm would fail every run
        state = str(j.get("job_state", ""))
        if "partition" in j and str(j.get("partition", "")) != self.partition:
            return f"partition {j.get('partition')!r}, not {self.partition!r}"
        want = f"goodput:{self.instance}:{run.job}:{run.epoch}"
        comment = j.get("comment")
        if isinstance(comment, dict):  # 23.02+: {"job": ..., "administrator": ..., "system": ...}
            comment = comment.get("job")
        if "comment" in j and str(comment or "") != want:
            return f"comment {str(comment)[:80]!r}, not {want!r}"
        restarts = _num(j.get("restart_cnt"))
        if j.get("requeue") is True or (restarts or 0) > 0:
            return f"made requeueable or requeued (restarts {restarts})"
        if state.startswith("REQUEUE"):
            return f"requeued ({state})"
        if state not in ("PENDING", "RUNNING"):
            return ""  # ending, or one of Slurm's own transitions: read as it ends
        given = set(run.nodes)
        count, most = _num(j.get("node_count")), _num(j.get("max_nodes"))
        if count not in (None, len(run.nodes)) or most not in (None, 0, len(run.nodes)):
            return f"{count}-{most} nodes, not {len(run.nodes)}"
        try:
            req = set(self._hostnames(str(j.get("required_nodes") or "")))
            got = set(self._hostnames(str(j.get("nodes") or ""))) if state == "RUNNING" else given
            exc = set(self._hostnames(str(j.get("excluded_nodes") or "")))
        except (ValueError, SlurmError) as e:
            self._note(f"slurm job {run.slurm_id}: its node lists cannot be read ({e}); checked next pass")
            return ""
        if "required_nodes" in j and req != given:
            return f"required nodes {sorted(req)}, not {sorted(given)}"
        if got != given:
            return f"running on {sorted(got)}, not {sorted(given)}"
        if exc & given:
            return f"its own nodes {sorted(exc & given)} excluded"
        if run.gpus_per_node >= 0 and "tres_per_node" in j:
            per_node = _tres_gpus(str(j.get("tres_per_node") or ""))
            other = sum(_tres_gpus(str(j.get(k) or "")) for k in ("tres_per_job", "tres_per_socket", "tres_per_task"))
            if per_node != run.gpus_per_node or other:
                return f"GPUs per node {j.get('tres_per_node')!r}, not {run.gpus_per_node}"
            alloc = _alloc_gpus(str(j.get("tres_alloc_str") or ""))
            # --exclusive (gpus_per_node 0, a node without GPU GRES in the gang) is given every GPU of
            # its nodes where Slurm tracks them: no count to compare with
            if (
                state == "RUNNING"
                and run.gpus_per_node > 0
                and alloc is not None
                and alloc != run.gpus_per_node * len(run.nodes)
            ):
                return f"allocated {alloc} GPUs, not {run.gpus_per_node * len(run.nodes)}"
        reason = str(j.get("state_reason") or "")
        if state == "PENDING" and run.released and (reason == "JobHeldUser" or reason.startswith("Dependency")):
            return f"pending on its user's {reason} after goodput released it"
        return ""

    def _hostnames(self, spec: str) -> list[str]:
        """:func:`hostnames`; where it cannot read a list, Slurm's own ``scontrol show hostnames``."""
        if not spec:
            return []
        try:
            return hostnames(spec)
        except ValueError:
            return self.slurm.run(["scontrol", "show", "hostnames", spec]).split()

    def _current(self, job: Job) -> SlurmRun | None:
        run = self.runs.get(job.id)
        return run if run is not None and run.epoch == job.epoch else None

    def _note(self, msg: str) -> None:
        log.warning("slurm executor: %s", msg)
        self.failures.append(f"{time.time():.3f} {msg}")
        del self.failures[:-50]


# ---------------------------------------------------------------------- wiring into the service


def node_changes(
    sched: Any,
    down: Iterable[str],
    up: Iterable[str],
    drained: Iterable[str] = (),
    resumed: Iterable[str] = (),
    *,
    drain_grace_s: float = 30.0,
) -> NodeChanges:
    """Slurm's node view into the core (call with the service's lock held); levels, so a call that
    finds the core already agreeing changes nothing:

    - ``down``: every node Slurm holds down; one the core does not count lost is lost now (its jobs
      resume from their commits, counted as infrastructure);
    - ``drained``: every node Slurm holds drained; one the core has ``up`` gets goodput's drain, as
      ``POST /nodes/{name}/drain?grace_s=`` gives it: no new placement there, each running job asked
      to checkpoint (when its write fits) and leave by now + ``drain_grace_s``, killed at that
      deadline, requeued as an infrastructure loss (docs/SCHED.md). One already ``reclaiming`` (goodput
      drained it itself) is left alone, and is not reported as taken;
    - ``up``: nodes back from down, returned if the core has them lost; ``resumed``: nodes whose drain
      the core took because Slurm had (the executor keeps which: ``SlurmExecutor.drained``), returned.

    The answer names the nodes whose state changed, and those of ``drained`` drained now on Slurm's
    word (the executor adds them to its own)."""
    from ..core.model import Health

    nodes = sched.cap.nodes
    changed: list[str] = []
    lost = [n for n in down if n in nodes and nodes[n].health is not Health.LOST]
    if lost:
        sched.node_lost(lost)
        changed += lost
    back = [n for n in up if n in nodes and nodes[n].health is Health.LOST]
    back += [n for n in resumed if n in nodes and nodes[n].health is not Health.UP and n not in back]
    if back:
        sched.node_up(back)
        changed += back
    drain = [n for n in drained if n in nodes]
    took: list[str] = []
    if drain:
        from_loss = [n for n in drain if nodes[n].health is Health.LOST]  # back from down, but drained
        if from_loss:
            sched.node_up(from_loss)
        took = [n for n in drain if nodes[n].health is Health.UP]
        if took:
            sched.reclaim_notice(took, sched.clock.now() + drain_grace_s, why="node_loss")
            changed += took
    return NodeChanges(changed, took)


@dataclass(frozen=True)
class NodeChanges:
    changed: list[str]  # nodes whose health :func:`node_changes` changed
    took: list[str]  # nodes it drained on Slurm's word


__all__ = [
    "RunTable",
    "Slurm",
    "SlurmError",
    "SlurmExecutor",
    "SlurmNode",
    "SlurmRun",
    "NodeChanges",
    "check_pools",
    "discover",
    "exit_code",
    "hostnames",
    "node_changes",
    "parse_sacct",
    "read_cluster_json",
    "read_nodes",
    "service_executor",
    "status_of",
]


def service_executor(
    svc: Any,
    *,
    url: str,
    partition: str,
    poll_s: float = 0.5,
    slurm_conf: str = "",
    python: str = "",
    allow_root_jobs: bool = False,
    drain_grace_s: float = 30.0,
    pools: list[Pool] | None = None,
    slurmrestd: str = "",
) -> tuple[list[Pool], list[Node], SlurmExecutor]:
    """The pools, nodes and executor of a live service over Slurm partition ``partition``
    (``goodput sched serve --executor slurm --partition P``); ``svc`` is the service being built
    (its ``lock``, ``wake``, ``sched``, ``store``, ``state_dir``, ``users``, ``envs`` and ``_job_token``
    are used). ``allow_root_jobs`` is the service's own setting, which its ``users`` map applies.
    ``drain_grace_s`` is the notice a job on a node drained in Slurm gets (as ``POST /nodes/{name}/drain``'s
    ``grace_s``); ``pools`` are the cluster JSON's, if it gave any: a ``ValueError`` unless they are Slurm's.
    ``slurmrestd``: its unix socket, where one runs; the per-pass reads go there (the CLI if it fails)."""
    del allow_root_jobs
    if (
        isinstance(drain_grace_s, bool)
        or not isinstance(drain_grace_s, (int, float))
        or not 0 <= drain_grace_s <= 86400
    ):
        raise ValueError(f"slurm.drain_grace_s: expected seconds in [0, 86400], got {drain_grace_s!r}")
    slurm = Slurm(conf=slurm_conf, rest_socket=slurmrestd)
    found, nodes, seen = discover(slurm, partition)
    pools = check_pools(list(pools or ()), found, partition)

    def on_exit(job_id: str, epoch: int, status: str) -> None:
        with svc.lock:
            svc.sched.report_exit(job_id, epoch, status)
        svc.wake.set()

    def on_nodes(down: list[str], up: list[str], drained: list[str], resumed: list[str]) -> list[str]:
        with svc.lock:
            got = node_changes(svc.sched, down, up, drained, resumed, drain_grace_s=drain_grace_s)
        if got.changed:
            svc.wake.set()
        return got.took

    def run_as(job: Job) -> RunAs | None:
        return svc.users.for_tenant(job.tenant)  # the service's tenant -> Unix user map (goodput.sched.live.runas)

    def env_for(job: Job) -> dict[str, str]:
        return dict(getattr(svc, "envs", {}).get(job.id, {}))

    ex = SlurmExecutor(
        svc.state_dir,
        store=svc.store,
        partition=partition,
        url=url,
        slurm=slurm,
        token_for=svc._job_token,
        on_exit=on_exit,
        on_nodes=on_nodes,
        run_as=run_as,
        env_for=env_for,
        python=python,
        poll_s=poll_s,
    )
    ex.nodes.update(seen)
    return pools, nodes, ex
