"""A real SeaweedFS S3 server on 127.0.0.1 for the object-store tests and `goodput bench ckpt --start-server`.

Ports are free ones below 55000 whose gRPC twin (port + 10000) is free too. Readiness is S3
answering *and* a volume server registered with the master: after a restart S3 answers before
the volume server has reported its volumes, and reads fail with InternalError until it has.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
from pathlib import Path

ACCESS_KEY = "goodput-test"
SECRET_KEY = "goodput-test-secret"


def weed_binary() -> str | None:
    for d in (sysconfig.get_path("scripts"), os.path.dirname(sys.executable)):
        p = os.path.join(d, "weed")
        if os.access(p, os.X_OK):
            return p
    return shutil.which("weed")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def _ports(n: int) -> list[int]:
    rng = random.Random()
    out: list[int] = []
    while len(out) < n:
        p = rng.randrange(20000, 45000)
        used = set(out) | {q + 10000 for q in out}
        if p not in used and p + 10000 not in used and _free(p) and _free(p + 10000):
            out.append(p)
    return out


class Weed:
    """``weed server`` with S3, its data in ``directory`` (a restart keeps the data)."""

    def __init__(self, directory: Path):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.s3_port, self.master, self.volume, self.filer = _ports(4)
        self.config = self.dir.parent / f"{self.dir.name}-s3.json"
        creds = {"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}
        ident = {"name": "goodput", "credentials": [creds], "actions": ["Admin", "Read", "List", "Tagging", "Write"]}
        self.config.write_text(json.dumps({"identities": [ident]}))
        self.proc: subprocess.Popen | None = None
        self.log_path = self.dir.parent / f"{self.dir.name}.log"

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    def start(self, timeout: float = 90.0) -> None:
        weed = weed_binary()
        assert weed is not None
        cmd = [
            weed, "-logtostderr", "server", f"-dir={self.dir}", "-s3", f"-s3.port={self.s3_port}", f"-master.port={self.master}",
            f"-volume.port={self.volume}", f"-filer.port={self.filer}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            "-s3.port.iceberg=0", "-s3.port.lance=0", "-master.telemetry=false", "-volume.preStopSeconds=0",
            # each bucket is a collection that grows 7 volumes at once: room for a few buckets
            "-master.volumeSizeLimitMB=256", "-volume.max=64", "-master.electionTimeout=1s",
            f"-s3.config={self.config}",
        ]  # fmt: skip
        log = open(self.log_path, "ab")  # noqa: SIM115 - the server's whole life
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"weed exited with {self.proc.returncode}; see {self.log_path}")
            if self._s3_answers() and self._volume_servers() > 0:
                return
            time.sleep(0.2)
        self.kill()
        raise TimeoutError(f"SeaweedFS did not serve S3 within {timeout} s; see {self.log_path}")

    def _s3_answers(self) -> bool:
        try:
            urllib.request.urlopen(self.endpoint, timeout=1)
        except urllib.error.HTTPError:
            return True  # any HTTP answer (403 to an anonymous request) means it serves
        except OSError:
            return False
        return True

    def _volume_servers(self) -> int:
        try:
            j = json.load(urllib.request.urlopen(f"http://127.0.0.1:{self.master}/dir/status", timeout=1))
        except (OSError, ValueError):
            return 0
        topo = j.get("Topology") or {}
        return sum(len(r.get("DataNodes") or []) for dc in topo.get("DataCenters") or [] for r in dc.get("Racks") or [])

    def stop(self, sig: int = signal.SIGTERM, grace_s: float = 2.0) -> None:
        """SIGTERM, then SIGKILL after ``grace_s``: weed takes 15 s to stop on SIGTERM even when
        idle, and acknowledged writes survive a SIGKILL (they are on disk when it answers)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)
        try:
            self.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def env(self) -> dict[str, str]:
        """The standard AWS variables that point boto3 (here and in spawned ranks) at it."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": "us-east-1",
        }
