"""Fixtures for the scheduler's store: a real PostgreSQL server beside SQLite, so both dialects face one suite.

A mock would not catch what matters here (placeholder style, upsert syntax, transaction and collation
behaviour), so the PostgreSQL side starts a throwaway server from the Debian binaries. initdb and postgres
refuse to run as root; under root (CI containers, this sandbox) they run as the ``postgres`` user when
one exists, else ``nobody``, through :mod:`subprocess`'s ``user=``/``group=`` (no runuser/su needed).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest


def _pg_bindir() -> Path | None:
    """A directory holding initdb, pg_ctl and postgres of one version."""
    need = ("initdb", "pg_ctl", "postgres")
    candidates = []
    found = shutil.which("initdb")
    if found:
        candidates.append(Path(os.path.realpath(found)).parent)
    versions = glob.glob("/usr/lib/postgresql/*/bin")
    versions.sort(key=lambda p: int(p.split("/")[-2]) if p.split("/")[-2].isdigit() else 0, reverse=True)
    candidates += [Path(p) for p in versions]
    for d in candidates:
        if all(os.access(d / n, os.X_OK) for n in need):
            return d
    return None


def _run_as() -> pwd.struct_passwd | None:
    """The unprivileged account to run the server as, or None when we already are unprivileged."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    pytest.skip("running as root and no unprivileged user (postgres, nobody) to run PostgreSQL as")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _admin_url(base: str, db: str) -> str:
    return base.rsplit("/", 1)[0] + "/" + db


@pytest.fixture(scope="session")
def postgres_url():
    """``postgresql://goodput@127.0.0.1:PORT/goodput`` of a server that lives for the session."""
    try:
        import psycopg
    except ImportError:
        pytest.skip('psycopg 3 is not installed (pip install "goodput[pg]")')
    bindir = _pg_bindir()
    if bindir is None:
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl, postgres) not on PATH or under /usr/lib/postgresql")
    user = _run_as()
    # mkdtemp in /tmp, not under pytest's tmp (0700, root's), so that the server's user can reach it
    root = Path(tempfile.mkdtemp(prefix="goodput-pg-"))
    data, sock, log = root / "data", root / "sock", root / "server.log"
    sock.mkdir()
    kw: dict = {"cwd": root, "env": {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "LANG": "C"}}
    if user is not None:
        for p in (root, sock):
            os.chown(p, user.pw_uid, user.pw_gid)
        kw.update(user=user.pw_uid, group=user.pw_gid, extra_groups=[])
        kw["env"]["HOME"] = str(root)

    def run(*cmd: str) -> subprocess.CompletedProcess:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120, **kw)

    r = run(str(bindir / "initdb"), "-D", str(data), "-U", "goodput", "--auth=trust", "--no-locale", "-E", "UTF8")
    if r.returncode != 0:
        shutil.rmtree(root, ignore_errors=True)
        pytest.fail(f"initdb failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    port = 0
    for _attempt in range(3):  # a free port may be taken between the probe and the bind
        port = _free_port()
        opts = f"-c listen_addresses=127.0.0.1 -p {port} -k {sock} -c fsync=off -c max_connections=200"
        r = run(str(bindir / "pg_ctl"), "-D", str(data), "-l", str(log), "-o", opts, "-w", "-t", "60", "start")
        if r.returncode == 0:
            break
    else:
        text = log.read_text() if log.exists() else ""
        shutil.rmtree(root, ignore_errors=True)
        pytest.fail(f"pg_ctl start failed:\n{r.stdout}\n{r.stderr}\n{text}")
    base = f"postgresql://goodput@127.0.0.1:{port}/postgres"
    try:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute("CREATE DATABASE goodput")
        yield _admin_url(base, "goodput")
    finally:
        run(str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop")
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def fresh_pg_url(postgres_url):
    """A database of its own per test, dropped afterwards (WITH FORCE: a failed test may leave a store open)."""
    import psycopg

    name = f"t_{uuid.uuid4().hex[:16]}"
    admin = _admin_url(postgres_url, "postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield _admin_url(postgres_url, name)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request, tmp_path):
    """A fresh, empty store URL on each backend (PostgreSQL asked for lazily, so SQLite runs without it)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    return request.getfixturevalue("fresh_pg_url")
