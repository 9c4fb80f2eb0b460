"""A real Slurm cluster on 127.0.0.1 for the Slurm executor's tests and ``goodput demo --part slurm``.

Debian's Slurm 22.05 (packages ``slurmctld slurmd slurm-client munge``): one ``munged`` with a
private key and socket, one ``slurmctld`` and four ``slurmd`` (``n1``..``n4``, each 4 CPUs and 2
fake GPUs: character devices made with mknod and listed in gres.conf), all in the foreground of
processes this module started, on free ports, everything under one directory. Stopping cancels
every job, waits for them to end (a killed slurmd does not kill its jobs) and kills only the PIDs
recorded here. The daemons must run as root (SlurmUser=root; slurmd sets job uids).

Partitions: ``goodput`` (Default, ``PreemptMode=OFF``: the partition the executor drives, whose
jobs Slurm itself never preempts), and ``low``/``high`` (partition-priority preemption with a
grace time) for measuring Slurm's own preemption against goodput's on the same nodes.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "sinfo", "srun")
INSTALL_HINT = (
    "Slurm is not installed here: on Debian or Ubuntu, as root, "
    "`apt-get install -y --no-install-recommends slurmctld slurmd slurm-client munge` (about 12 s, 3.5 MB); "
    "the daemons then run from a temporary directory as root, nothing is configured system-wide"
)


def missing() -> str | None:
    """Why a local cluster cannot be started here, or None when it can."""
    absent = [b for b in BINARIES if shutil.which(b) is None and not os.access(f"/usr/sbin/{b}", os.X_OK)]
    if absent:
        return f"{', '.join(absent)} absent. {INSTALL_HINT}"
    if os.geteuid() != 0:
        return "the local Slurm cluster runs its daemons as root (slurmd starts jobs as their users); not root here"
    return None


def _which(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


def _free_ports(n: int, *, consecutive: bool = False) -> list[int]:
    """Free TCP ports on 127.0.0.1 (``consecutive``: a run of n, for slurmd's Port=[a-b])."""
    import random

    rng = random.Random()
    for _ in range(1000):
        base = rng.randrange(20000, 60000 - n)
        ports = list(range(base, base + n)) if consecutive else [base]
        ok = True
        for p in ports:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return ports
    raise RuntimeError("no free ports on 127.0.0.1")


@dataclass
class SlurmCluster:
    """A running local cluster: its directory, environment (``SLURM_CONF``) and daemons."""

    root: Path
    nodes: int = 4
    cpus: int = 4
    gpus: int = 2
    grace_s: int = 10  # the low partition's GraceTime (Slurm's own preemption)
    partition: str = "goodput"
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    ctld_port: int = 0
    slurmd_base: int = 0

    @property
    def conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """The environment Slurm's commands need to reach this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    @property
    def node_names(self) -> list[str]:
        return [f"n{i}" for i in range(1, self.nodes + 1)]

    # ------------------------------------------------------------------ configuration

    def write_config(self) -> None:
        r = self.root
        for d in ("etc", "state", "spool", "log", "run", "dev", "munge"):
            (r / d).mkdir(parents=True, exist_ok=True)
        os.chmod(r, 0o755)  # munged refuses a socket folder it thinks others can hijack; 0700 it refuses too
        os.chmod(r / "munge", 0o755)
        keydir = r / "munge-key"
        keydir.mkdir(mode=0o700, exist_ok=True)
        key = keydir / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
            os.chmod(key, 0o400)
        for i in range(self.gpus):
            dev = r / "dev" / f"gpu{i}"
            if not dev.exists():
                os.mknod(dev, 0o666 | 0o020000, os.makedev(195, i))  # a character device: plain files are refused
        self.ctld_port = self.ctld_port or _free_ports(1)[0]
        self.slurmd_base = self.slurmd_base or _free_ports(self.nodes, consecutive=True)[0]
        host = socket.gethostname().split(".")[0]
        last = self.slurmd_base + self.nodes - 1
        gres = f"Gres=gpu:{self.gpus}" if self.gpus else ""
        devs = f"{r}/dev/gpu[0-{self.gpus - 1}]" if self.gpus > 1 else f"{r}/dev/gpu0"
        conf = f"""\
ClusterName=goodput
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={self.ctld_port}
SlurmdPort={self.slurmd_base}
CommunicationParameters=NoInAddrAny,NoCtldInAddrAny
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={r}/munge/munge.sock,cred_expire=10
SlurmUser=root
SlurmdUser=root
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool/%n
SlurmctldPidFile={r}/run/slurmctld.pid
SlurmdPidFile={r}/run/slurmd-%n.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SlurmdParameters=config_overrides
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0,sched_interval=2,bf_interval=2
SlurmctldParameters=preempt_send_user_signal
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
GresTypes=gpu
KillWait=5
SlurmdTimeout=10
ReturnToService=2
MinJobAge=300
MpiDefault=none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
NodeName=n[1-{self.nodes}] NodeHostname={host} NodeAddr=127.0.0.1 Port=[{self.slurmd_base}-{last}] CPUs={self.cpus} RealMemory=1000 {gres}
PartitionName={self.partition} Nodes=ALL Default=YES PriorityTier=1 PreemptMode=OFF MaxTime=INFINITE
PartitionName=low Nodes=ALL PriorityTier=1 GraceTime={self.grace_s} PreemptMode=REQUEUE MaxTime=INFINITE
PartitionName=high Nodes=ALL PriorityTier=10 PreemptMode=OFF MaxTime=INFINITE
"""
        self.conf.write_text(conf, encoding="utf-8")
        if self.gpus:
            (r / "etc" / "gres.conf").write_text(f"NodeName=n[1-{self.nodes}] Name=gpu File={devs}\n", encoding="utf-8")

    # ------------------------------------------------------------------ daemons

    def _spawn(self, key: str, argv: list[str]) -> None:
        log = open(self.root / "log" / f"{key}.out", "ab")  # noqa: SIM115 - kept open for the daemon's life
        self.procs[key] = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
        )
        log.close()

    def start_munge(self) -> None:
        r = self.root
        self._spawn(
            "munged",
            [
                _which("munged"), "-F", f"--socket={r}/munge/munge.sock", f"--key-file={r}/munge-key/munge.key",
                f"--log-file={r}/log/munged.log", f"--pid-file={r}/run/munged.pid", f"--seed-file={r}/run/munge.seed",
            ],
        )  # fmt: skip
        _wait(lambda: (r / "munge" / "munge.sock").exists(), 10, "munged's socket", self)

    def start_ctld(self) -> None:
        self._spawn("slurmctld", [_which("slurmctld"), "-D", "-f", str(self.conf)])

    def start_slurmd(self, name: str) -> None:
        (self.root / "spool" / name).mkdir(parents=True, exist_ok=True)
        self._spawn(f"slurmd-{name}", [_which("slurmd"), "-D", "-N", name, "-f", str(self.conf)])

    def start(self, timeout_s: float = 60.0) -> SlurmCluster:
        reason = missing()
        if reason:
            raise RuntimeError(reason)
        self.write_config()
        self.start_munge()
        self.start_ctld()
        for n in self.node_names:
            self.start_slurmd(n)
        self.wait_idle(self.nodes, timeout_s)
        return self

    def wait_idle(self, count: int, timeout_s: float = 60.0) -> None:
        """Until ``sinfo`` shows ``count`` idle nodes."""

        def ready() -> bool:
            out = self.run(["sinfo", "-h", "-t", "idle", "-p", self.partition, "-o", "%D"], check=False)
            return out.strip().isdigit() and int(out.strip()) >= count

        _wait(ready, timeout_s, f"{count} idle Slurm nodes", self)

    def run(self, argv: list[str], *, check: bool = True, timeout_s: float = 30.0) -> str:
        """One Slurm command against this cluster; its stdout."""
        p = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=timeout_s, check=False)
        if check and p.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: exit {p.returncode}: {p.stderr.strip()}")
        return p.stdout

    def kill(self, key: str, sig: int = signal.SIGKILL) -> None:
        """Signal one daemon this cluster started (``slurmctld``, ``slurmd-n2``, ``munged``) and wait for it."""
        p = self.procs.get(key)
        if p is None or p.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            p.send_signal(sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=30)

    def start_restd(self, user: str = "nobody") -> str:
        """slurmrestd on a unix socket (``rest_auth/local``: a client is who the socket says it is), as
        ``user`` (it refuses to run as root), with the OpenAPI plugin that needs no slurmdbd; its socket's
        path once it answers. RuntimeError where slurmrestd is absent (Debian: ``apt-get install -y
        slurmrestd``) or does not come up."""
        import pwd

        exe = shutil.which("slurmrestd") or "/usr/sbin/slurmrestd"
        if not os.access(exe, os.X_OK):
            raise RuntimeError("slurmrestd absent: on Debian or Ubuntu, `apt-get install -y slurmrestd`")
        d = self.root / "rest"
        d.mkdir(mode=0o755, exist_ok=True)
        pw = pwd.getpwnam(user)
        os.chown(d, pw.pw_uid, pw.pw_gid)  # it binds the socket after dropping to the user
        sock = d / "rest.sock"
        self._spawn("slurmrestd", [exe, "-f", str(self.conf), "-a", "rest_auth/local", "-s", "openapi/v0.0.38",
                                   "-u", user, f"unix:{sock}"])  # fmt: skip
        _wait(lambda: sock.exists() or self.procs["slurmrestd"].poll() is not None, 20, "slurmrestd's socket", self)
        if not sock.exists():
            raise RuntimeError(
                "slurmrestd exited: " + (self.root / "log" / "slurmrestd.out").read_text(errors="replace")
            )
        return str(sock)

    def restart_ctld(self) -> None:
        self.kill("slurmctld", signal.SIGTERM)
        self.start_ctld()
        _wait(lambda: self.run(["scontrol", "ping"], check=False).find("UP") >= 0, 30, "slurmctld back", self)

    def stop(self) -> None:
        """Cancel every job, wait until none is left, then end the daemons this cluster started."""
        ctld = self.procs.get("slurmctld")
        if ctld is not None and ctld.poll() is None:
            with contextlib.suppress(Exception):
                self.run(["scancel", "--full", "-u", "root"], check=False)
                for line in self.run(["squeue", "-h", "-o", "%i"], check=False).split():
                    self.run(["scancel", line], check=False)

                def drained() -> bool:
                    out = self.run(["squeue", "-h", "-t", "all", "-o", "%T"], check=False).split()
                    return not [s for s in out if s in ("RUNNING", "COMPLETING", "PENDING", "CONFIGURING", "SUSPENDED")]

                with contextlib.suppress(TimeoutError):
                    _wait(drained, 30, "jobs cancelled", None)
        order = ["slurmrestd"] + [k for k in self.procs if k.startswith("slurmd-")] + ["slurmctld", "munged"]
        for key in order:
            self.kill(key, signal.SIGTERM)
            self.kill(key, signal.SIGKILL)

    def log_tail(self, n: int = 40) -> str:
        out = []
        for f in sorted((self.root / "log").glob("*.log")):
            with contextlib.suppress(OSError):
                out.append(f"== {f.name}\n" + "\n".join(f.read_text(errors="replace").splitlines()[-n:]))
        return "\n".join(out)


def _wait(cond, timeout_s: float, what: str, cluster: SlurmCluster | None) -> None:  # noqa: ANN001
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if cond():
            return
        dead = [k for k, p in (cluster.procs.items() if cluster is not None else ()) if p.poll() is not None]
        if dead and what.endswith("idle Slurm nodes"):
            raise RuntimeError(f"Slurm daemons exited while starting: {', '.join(dead)}\n{cluster.log_tail()}")
        time.sleep(0.1)
    tail = cluster.log_tail() if cluster is not None else ""
    raise TimeoutError(f"no {what} after {timeout_s:.0f} s\n{tail}")


@contextlib.contextmanager
def local_cluster(root: str | os.PathLike, **kw):  # noqa: ANN003, ANN201
    """A started :class:`SlurmCluster` under ``root``, stopped on exit."""
    c = SlurmCluster(Path(root), **kw)
    try:
        c.start()
        yield c
    finally:
        c.stop()


__all__ = ["INSTALL_HINT", "SlurmCluster", "local_cluster", "missing"]
