"""Fixtures for the Slurm executor's tests: a real Slurm on 127.0.0.1 and real Unix users.

``slurm`` starts munged, slurmctld and four slurmd (``n1``..``n4``, two fake GPUs each) in a
temporary directory on free ports (``goodput.demo.slurm_cluster``) and stops them after the test:
every job cancelled and waited for, then the recorded PIDs killed, never anything by name. It skips,
saying why, where the binaries are absent or the test is not root (slurmd must start jobs as their
users). ``tenant_users`` creates two throwaway Unix users with ``useradd`` and removes them after.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest

from goodput.demo.slurm_cluster import SlurmCluster, missing


@pytest.fixture
def slurm():
    reason = missing()
    if reason:
        pytest.skip(reason)
    # /tmp, not pytest's 0700 tmp_path: job users reach their run folders and munged wants 0755
    root = Path(tempfile.mkdtemp(prefix="goodput-slurm-"))
    cluster = SlurmCluster(root)
    try:
        cluster.start()
    except Exception:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
        raise
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def tenant_users():
    """{"alice": user, "bob": user}: two fresh Unix users (no home, no login), removed after."""
    if os.geteuid() != 0:
        pytest.skip("creating Unix users needs root")
    if shutil.which("useradd") is None or shutil.which("userdel") is None:
        pytest.skip("useradd/userdel absent")
    tag = uuid.uuid4().hex[:6]
    users = {"alice": f"gpa{tag}", "bob": f"gpb{tag}"}
    made = []
    try:
        for u in users.values():
            subprocess.run(["useradd", "-M", "-d", "/nonexistent", "-s", "/usr/sbin/nologin", u], check=True)
            made.append(u)
        yield users
    finally:
        for u in made:
            subprocess.run(["userdel", u], check=False, capture_output=True)
