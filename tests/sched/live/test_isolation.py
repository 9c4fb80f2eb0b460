"""Tenants isolated from the service and from each other, on real Unix users (issue 24, item 1).

The service runs as root (as these tests do) with tenants alice and bob mapped to two users made
for the test with ``useradd`` and removed after it. bob's job, a shell script, tries what the issue's
attacker did: read the operator's admin token and alice's job token (its environment, every
``/proc/*/environ`` and ``cmdline`` it can open, the files), read and write alice's log and
checkpoints, write the store. Everything is refused by the kernel, because the job runs as bob, with
an environment that holds no secret, and every file of the service or of alice is 0600/0700.

Skipped with the reason where the tests do not run as root or ``useradd`` is missing.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from .test_service import Server, _run_record

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("useradd") is None or shutil.which("userdel") is None,
    reason="needs root and useradd/userdel to make the tenants' Unix users",
)

ALICE_JOB = (
    'echo "alice-log-secret $GOODPUT_JOB_ID"\n'
    'echo alice-data > "$GOODPUT_CKPT_ROOT/secret"\n'
    'touch "$GOODPUT_CKPT_ROOT/ready"\n'
    "exec sleep 300\n"
)

# each probe prints "<name> OK" or "<name> DENIED"; everything it could read goes to loot.txt
BOB_JOB = r"""
R="$GOODPUT_CKPT_ROOT"
probe() { name=$1; shift; if "$@" >> "$R/loot.txt" 2>/dev/null; then echo "$name OK"; else echo "$name DENIED"; fi; }
{
  id -u > "$R/uid.txt"
  env > "$R/env.txt"
  for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do cat "$f" 2>/dev/null | tr '\0' '\n' >> "$R/loot.txt"; done
  probe read_alice_token cat "$ALICE_TOKEN"
  probe read_alice_log cat "$ALICE_LOG"
  probe read_alice_ckpt cat "$ALICE_CKPT/secret"
  probe list_alice_ckpt ls "$ALICE_CKPT"
  probe write_alice_log sh -c 'echo bob >> "$ALICE_LOG"'
  probe write_alice_ckpt sh -c 'echo bob > "$ALICE_CKPT/evil"'
  probe read_store cat "$STORE"
  probe write_store sh -c 'echo bob >> "$STORE"'
  probe read_key cat "$KEYFILE"
  probe list_runs ls "$RUNS"
  probe list_state ls "$STATE"
  probe signal_alice sh -c 'kill -0 "$ALICE_PID"'
  probe own_token cat "$GOODPUT_JOB_TOKEN_FILE"
} > "$R/probes.txt"
"""


def _useradd(name: str) -> None:
    r = subprocess.run(
        ["useradd", "--no-create-home", "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", name],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        pytest.skip(f"useradd {name} failed: {r.stderr.strip()}")


@pytest.fixture
def users():
    """Two fresh Unix users (alice's and bob's), removed after the test with their processes."""
    tag = uuid.uuid4().hex[:6]
    names = (f"gpa{tag}", f"gpb{tag}")
    made = []
    try:
        for n in names:
            _useradd(n)
            made.append(n)
        yield names
    finally:
        for n in made:
            subprocess.run(["pkill", "-KILL", "-u", n], capture_output=True)
            subprocess.run(["userdel", n], capture_output=True)


@pytest.fixture
def base():
    """A world-traversable directory (0755), unlike pytest's 0700 tmp: what protects the store and the
    state directory here is their own mode, not a parent the tenants cannot enter."""
    d = Path(tempfile.mkdtemp(prefix="gp-iso-"))
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _server(server_factory, base: Path, tenants: list[dict], extra: tuple) -> Server:
    s = server_factory(tenants=tenants, extra=extra)
    s.state = base / "state"
    s.db = f"sqlite:///{base / 'sched.db'}"
    return s


@pytest.fixture
def server(tmp_path):
    servers: list[Server] = []

    def make(**kw) -> Server:  # noqa: ANN003
        s = Server(tmp_path, 1, **kw)
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.stop()
        runs = s.state / "runs"
        for rec in runs.glob("*.json") if runs.exists() else ():
            with contextlib.suppress(OSError, ValueError, KeyError):
                os.killpg(json.loads(rec.read_text())["pgid"], 9)


def test_bobs_job_cannot_reach_the_operator_alice_or_the_store(server, users, base):
    alice_user, bob_user = users
    tenants = [{"name": "alice", "user": alice_user}, {"name": "bob", "user": bob_user}]
    s = _server(server, base, tenants, extra=("--rate-limit", "100"))  # no --allow-root-jobs: users required
    s.nodes = 2
    from .test_service import cluster_json

    s.cluster = cluster_json(base / "cluster.json", 2, tenants)
    operator = s.token("ops", "--admin")
    alice, bob = s.token("alice"), s.token("bob")
    s.env = {**os.environ, "GOODPUT_TOKEN": operator}  # the operator's token in the service's environment
    s._admin = operator
    s.start()
    assert any("their tenant's Unix user" in n for n in s.health["notes"]), s.health

    code, a = s.post("/jobs", {"name": "a", "command": ["/bin/sh", "-c", ALICE_JOB], "limit_s": 600}, alice)
    assert code == 201, a
    ja = s.wait_job(a["id"], alice, lambda j: j["state"] == "running")
    rec = _run_record_at(s.state, a["id"], 1)
    a_root = Path(ja["ckpt_root"])
    deadline = time.monotonic() + 30
    while not (a_root / "ready").exists():
        assert time.monotonic() < deadline, Path(rec["log"]).read_text()
        time.sleep(0.1)
    alice_token = (Path(rec["workdir"]) / "token").read_text()
    assert alice_token.startswith("gpj_")

    env = {
        "ALICE_TOKEN": str(Path(rec["workdir"]) / "token"),
        "ALICE_LOG": rec["log"],
        "ALICE_CKPT": str(a_root),
        "ALICE_PID": str(_child_pid(rec["pid"])),
        "STORE": str(base / "sched.db"),
        "KEYFILE": str(s.state / "secret"),
        "RUNS": str(s.state / "runs"),
        "STATE": str(s.state),
    }
    code, b = s.post("/jobs", {"name": "b", "command": ["/bin/sh", "-c", BOB_JOB], "env": env}, bob)
    assert code == 201, b
    jb = s.wait_job(b["id"], bob, lambda j: j["state"] in ("finished", "failed"), timeout=60)
    assert jb["state"] == "finished", jb
    b_root = Path(jb["ckpt_root"])
    probes = dict(line.split() for line in (b_root / "probes.txt").read_text().splitlines())
    assert probes.pop("own_token") == "OK"  # its own run's token it may read
    assert probes and set(probes.values()) == {"DENIED"}, probes
    import pwd

    assert int((b_root / "uid.txt").read_text()) == pwd.getpwnam(bob_user).pw_uid
    job_env = (b_root / "env.txt").read_text()
    loot = (b_root / "loot.txt").read_text() if (b_root / "loot.txt").exists() else ""
    for secret in (operator, alice_token, alice, bob):
        assert secret not in job_env and secret not in loot
    assert "GOODPUT_TOKEN=" not in job_env and "GOODPUT_JOB_TOKEN=" not in job_env
    assert "HOME=/nonexistent\n" in job_env and f"USER={bob_user}\n" in job_env
    # alice's files are as they were: bob neither wrote her log nor her checkpoints, nor the store
    assert "bob" not in Path(rec["log"]).read_text()
    assert not (a_root / "evil").exists()
    assert (a_root / "secret").read_text() == "alice-data\n"
    # bob's view of his jobs and events names nothing of alice's
    code, events = s.get("/events", bob)
    assert code == 200 and a["id"] not in events
    view = s.get(f"/jobs/{b['id']}", bob)[1]
    del view["env"]  # bob's own input (it names alice's paths), not a disclosure
    assert a["id"] not in json.dumps(view)
    assert s.get(f"/jobs/{a['id']}", bob)[0] == 404
    assert s.post(f"/jobs/{a['id']}/cancel", {}, alice)[0] == 200
    s.wait_job(a["id"], alice, lambda j: j["state"] == "cancelled", timeout=60)


def test_files_are_private_and_a_root_service_refuses_a_tenant_without_a_user(server, users, base):
    alice_user, _ = users
    tenants = [{"name": "alice", "user": alice_user}, {"name": "nouser"}, {"name": "rooty", "user": "root"}]
    s = _server(server, base, tenants, extra=("--rate-limit", "100"))
    from .test_service import cluster_json

    s.cluster = cluster_json(base / "cluster.json", 2, tenants)
    alice, nouser, rooty = s.token("alice"), s.token("nouser"), s.token("rooty")
    s.start()
    spec = {"name": "x", "command": ["/bin/sh", "-c", "sleep 300"]}
    code, err = s.post("/jobs", spec, nouser)
    assert code == 403 and "--allow-root-jobs" in err["detail"] and "--user" in err["detail"], err
    code, err = s.post("/jobs", spec, rooty)
    assert code == 403 and "root" in err["detail"], err
    # a mapping made with `token add --user` works too (the service picks it up within a second)
    late = s.token("late", "--user", alice_user)
    time.sleep(1.2)
    code, j = s.post("/jobs", {**spec, "name": "late"}, late)
    assert code == 201, j
    code, a = s.post("/jobs", spec, alice)
    assert code == 201, a
    s.wait_job(a["id"], alice, lambda j: j["state"] == "running")
    rec = _run_record_at(s.state, a["id"], 1)
    import pwd

    uid = pwd.getpwnam(alice_user).pw_uid

    def mode(p: str | Path) -> tuple[int, int]:
        st = os.lstat(p)
        return stat.S_IMODE(st.st_mode), st.st_uid

    assert mode(base / "sched.db") == (0o600, 0)
    assert mode(s.state) == (0o711, 0)
    assert mode(s.state / "secret") == (0o600, 0)
    for d in ("runs", "logs"):
        assert mode(s.state / d) == (0o700, 0)
    assert mode(rec["log"]) == (0o600, 0)
    assert mode(s.state / "runs" / f"{a['id']}.1.json") == (0o600, 0)
    assert mode(rec["workdir"]) == (0o700, uid)
    assert mode(Path(rec["workdir"]) / "token") == (0o600, uid)
    assert mode(s.state / "ckpt" / "alice") == (0o700, uid)
    for jid, tok in ((a["id"], alice), (j["id"], late)):
        assert s.post(f"/jobs/{jid}/cancel", {}, tok)[0] == 200


# bob's job fills its own checkpoint root with directories; the service lists that root, as root, for
# every view of the job (latest_on_disk), seconds of work per view
BIG_ROOT_JOB = 'cd "$GOODPUT_CKPT_ROOT" && seq 1 30000 | sed s/^/d/ | xargs mkdir && touch made && exec sleep 300\n'


def test_bob_viewing_his_huge_checkpoint_root_holds_up_no_one_else(server, users, base):
    """40 concurrent views of bob's job whose root holds 30,000 directories: each used to list the root
    on a worker thread of the shared pool (40 threads), so every synchronous endpoint of every tenant
    hung behind bob's listings. Now a tenant's listings run one at a time on a pool of their own (the
    same root's views share one listing), and alice's requests answer at once meanwhile."""
    import concurrent.futures as cf

    alice_user, bob_user = users
    tenants = [{"name": "alice", "user": alice_user}, {"name": "bob", "user": bob_user}]
    s = _server(server, base, tenants, extra=("--rate-limit", "100"))
    s.nodes = 2
    from .test_service import cluster_json

    s.cluster = cluster_json(base / "cluster.json", 2, tenants)
    alice, bob = s.token("alice"), s.token("bob")
    s.start()
    code, b = s.post("/jobs", {"name": "big", "command": ["/bin/sh", "-c", BIG_ROOT_JOB]}, bob)
    assert code == 201, b
    jb = s.wait_job(b["id"], bob, lambda j: j["state"] == "running")
    root = Path(jb["ckpt_root"])
    deadline = time.monotonic() + 120
    while not (root / "made").exists():
        assert time.monotonic() < deadline, "bob's job did not make its directories"
        time.sleep(0.2)
    pool = cf.ThreadPoolExecutor(48)
    try:
        views = [pool.submit(s.get, f"/jobs/{b['id']}", bob) for _ in range(44)]
        time.sleep(2.0)  # bob's views are in (each one a listing of 30,000 entries, before the fix)
        t0 = time.monotonic()
        code, listed = s.get("/jobs", alice)
        waited = time.monotonic() - t0
        assert code == 200 and listed == {"jobs": []}, listed
        code, a = s.post("/jobs", {"name": "a", "command": ["/bin/sh", "-c", "exit 0"]}, alice)
        waited = max(waited, time.monotonic() - t0)
        assert code == 201, a
        # generous for a machine shared by several test runs; before the fix alice waited for minutes
        assert waited < 5.0, f"alice waited {waited:.1f} s behind bob's listings"
    finally:
        for f in views:
            f.cancel()
        pool.shutdown(wait=False, cancel_futures=True)
    assert s.post(f"/jobs/{b['id']}/cancel", {}, bob)[0] == 200


# bob's fork bomb, bounded so a failing run cannot take the machine's pids: children until fork fails
FORK_JOB = r"""
import os, time
root = os.environ["GOODPUT_CKPT_ROOT"]
n, why = 0, "none"
for _ in range(400):
    try:
        pid = os.fork()
    except OSError as e:
        why = type(e).__name__
        break
    if pid == 0:
        time.sleep(300)
        os._exit(0)
    n += 1
limit = [x for x in open("/proc/self/limits") if x.startswith("Max processes")][0].split()[2]
open(os.path.join(root, "forks.txt"), "w").write(f"{n} {why} {limit}\n")
time.sleep(300)
"""


def test_bobs_fork_bomb_stops_at_his_process_limit_and_alices_job_still_runs(server, users, base):
    """Without a bound, a tenant's user inherits the service's RLIMIT_NPROC (96,363 here, with a pid_max
    of 32,768): one job could take every pid and the service could start no one's job. The supervisor
    gives the command --max-user-procs (RLIMIT_NPROC of the user: all its jobs together, no cgroups)."""
    alice_user, bob_user = users
    tenants = [{"name": "alice", "user": alice_user}, {"name": "bob", "user": bob_user}]
    s = _server(server, base, tenants, extra=("--rate-limit", "100", "--max-user-procs", "64"))
    s.nodes = 2
    from .test_service import cluster_json

    s.cluster = cluster_json(base / "cluster.json", 2, tenants)
    alice, bob = s.token("alice"), s.token("bob")
    s.start()
    code, b = s.post("/jobs", {"name": "bomb", "command": ["/usr/bin/python3", "-c", FORK_JOB]}, bob)
    assert code == 201, b
    jb = s.wait_job(b["id"], bob, lambda j: j["state"] == "running")
    out = Path(jb["ckpt_root"]) / "forks.txt"
    deadline = time.monotonic() + 60
    while not out.exists():
        assert time.monotonic() < deadline, "bob's job did not report its forks"
        time.sleep(0.2)
    n, why, limit = out.read_text().split()
    assert limit == "64" and why == "BlockingIOError" and int(n) < 64, (n, why, limit)
    code, a = s.post("/jobs", {"name": "a", "command": ["/bin/sh", "-c", "exit 0"]}, alice)
    assert code == 201, a
    ja = s.wait_job(a["id"], alice, lambda j: j["state"] in ("finished", "failed"), timeout=60)
    assert ja["state"] == "finished", ja
    assert s.post(f"/jobs/{b['id']}/cancel", {}, bob)[0] == 200


def _run_record_at(state: Path, jid: str, epoch: int) -> dict:
    return json.loads((state / "runs" / f"{jid}.{epoch}.json").read_text())


def _child_pid(supervisor: int) -> int:
    import psutil

    kids = psutil.Process(supervisor).children()
    return kids[0].pid if kids else supervisor


_ = _run_record  # the helper the restart tests share; this file reads records under its own state dir
