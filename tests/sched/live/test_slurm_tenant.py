"""A tenant's Unix user owns the Slurm job of each of its runs, and Slurm lets an owner release its own
held job, ``scontrol update`` it while pending (nodes, node count, GRES, partition, comment) and shrink
it while running. These tests do exactly that, as the tenant's user on a real Slurm, and show that the
hold is one the user cannot lift and that every other change is caught at the next poll: the job is
cancelled and its run reported ``failed``, saying what changed. The normal path is unchanged.

Skipped, with the reason, where Slurm's binaries are absent or the tests are not root.
"""

from __future__ import annotations

import json
import pwd
import subprocess
import sys
import time
from pathlib import Path

import pytest

from goodput.sched.live.slurm import SlurmExecutor, SlurmRun, _tres_gpus, hostnames

from .slurm_cluster import slurm, tenant_users  # noqa: F401 - fixtures

# ---------------------------------------------------------------------- units without Slurm


def test_host_lists_expand_as_slurm_expands_them():
    assert hostnames("n[1-3,5]") == ["n1", "n2", "n3", "n5"]
    assert hostnames("gpu-[08-10],x") == ["gpu-08", "gpu-09", "gpu-10", "x"]
    assert hostnames("a[1-2]b[3-4]") == ["a1b3", "a1b4", "a2b3", "a2b4"]
    assert hostnames("n1,n[3-4]") == ["n1", "n3", "n4"] and hostnames("") == []
    for bad in ("n[1-", "n]", "n[3-1]", "n[a]", "n[[1]]", "n[1-99999999]"):
        with pytest.raises(ValueError):
            hostnames(bad)


def test_gpus_are_read_from_each_tres_shape():
    assert _tres_gpus("gres:gpu:2") == 2 and _tres_gpus("gres/gpu:2") == 2
    assert _tres_gpus("gres:gpu:a100:4") == 4 and _tres_gpus("gres/gpu") == 1
    assert _tres_gpus("gres:shard:8,gres:gpu:1") == 1 and _tres_gpus("") == 0


def test_a_record_that_is_what_was_submitted_passes_and_each_change_is_named(tmp_path):
    from goodput.sched.live.store import open_store

    ex = SlurmExecutor(tmp_path / "st", store=open_store(f"sqlite:///{tmp_path / 's.db'}"), partition="p")
    run = SlurmRun("j.00000001", 1, 5, ["n2", "n1"], "u", "/x", released=True, gpus_per_node=2)
    ok = {
        "job_state": "RUNNING", "partition": "p", "comment": f"goodput:{ex.instance}:j.00000001:1",
        "requeue": False, "restart_cnt": 0, "node_count": 2, "max_nodes": 2, "required_nodes": "n[1-2]",
        "nodes": "n[1-2]", "excluded_nodes": "", "tres_per_node": "gres:gpu:2", "tres_per_job": "",
        "tres_alloc_str": "cpu=2,node=2,gres/gpu=4", "state_reason": "None",
    }  # fmt: skip
    assert ex._tampering(run, ok) == ""
    assert ex._tampering(run, {**ok, "job_state": "PENDING", "nodes": "", "tres_alloc_str": ""}) == ""
    newer = {"node_count": {"set": True, "number": 2}, "max_nodes": {"set": True, "number": 2},
             "restart_cnt": {"set": True, "number": 0}, "tres_per_node": "gres/gpu:2"}  # fmt: skip
    assert ex._tampering(run, {**ok, **newer}) == ""  # 23.02+'s shapes
    assert ex._tampering(run, {**ok, **newer, "node_count": {"set": True, "number": 3}})
    changed = {
        "partition": "low", "comment": "goodput:x", "requeue": True, "restart_cnt": 1, "node_count": 3,
        "max_nodes": 3, "required_nodes": "n[1,3]", "nodes": "n[2-3]", "excluded_nodes": "n2",
        "tres_per_node": "gres:gpu:1", "tres_per_job": "gres:gpu:8", "tres_alloc_str": "gres/gpu=8",
        "job_state": "REQUEUE_HOLD",
    }  # fmt: skip
    for k, v in changed.items():
        assert ex._tampering(run, {**ok, k: v}), (k, v)
    held = {**ok, "job_state": "PENDING", "nodes": "", "state_reason": "JobHeldUser"}
    assert ex._tampering(run, held)
    run.released = False  # goodput's own hold, before its release: not the user's doing
    assert ex._tampering(run, {**held, "state_reason": "JobHeldAdmin"}) == ""


def test_an_exclusive_run_given_every_gpu_of_its_nodes_is_not_tampering(tmp_path):
    """A gang with a GPU-less node runs --exclusive (gpus_per_node 0); where Slurm tracks GPUs it
    allocates every GPU of the node (``gres/gpu=2`` in ``tres_alloc_str``), which the check read as
    "allocated 2 GPUs, not 0" and failed every such run (a review of the check itself). Missing
    fields (another Slurm's record) are not checked either."""
    from goodput.sched.live.store import open_store

    ex = SlurmExecutor(tmp_path / "st", store=open_store(f"sqlite:///{tmp_path / 's.db'}"), partition="p")
    run = SlurmRun("j.00000001", 1, 5, ["n1"], "u", "/x", released=True, gpus_per_node=0)
    rec = {
        "job_state": "RUNNING", "partition": "p", "comment": f"goodput:{ex.instance}:j.00000001:1",
        "requeue": False, "restart_cnt": 0, "node_count": 1, "max_nodes": 0, "required_nodes": "n1",
        "nodes": "n1", "excluded_nodes": "", "tres_per_node": "", "tres_alloc_str": "cpu=4,node=1,gres/gpu=2",
    }  # fmt: skip
    assert ex._tampering(run, rec) == ""
    bare = {k: v for k, v in rec.items() if k not in ("partition", "comment", "required_nodes", "tres_per_node")}
    assert ex._tampering(run, bare) == ""
    assert ex._tampering(run, {**rec, "comment": {"job": f"goodput:{ex.instance}:j.00000001:1"}}) == ""  # 23.02+


# ---------------------------------------------------------------------- on a real Slurm


def test_host_lists_agree_with_scontrol_show_hostnames(slurm):  # noqa: F811
    for spec in ("n[1-3,5]", "gpu-[08-10],x", "a[1-2]b[3-4]", "n1,n[3-4]", "x[009-011]"):
        assert hostnames(spec) == slurm.run(["scontrol", "show", "hostnames", spec]).split(), spec


def test_a_tenant_can_neither_release_nor_retarget_its_job(slurm, tenant_users, tmp_path):  # noqa: F811
    """As the tenant's Unix user: ``scontrol release`` of its held job is refused (goodput's hold is an
    administrator's); ``scontrol update`` of its nodes, GRES, node count, partition or comment is
    accepted by Slurm, and the next poll cancels the job before it runs and reports the run failed,
    naming the change; ``scontrol requeue`` of a running job is refused; a running job shrunk with
    ``NumNodes=1`` is cancelled and failed. An untouched job runs where it was put, undisturbed.

    The first part needs no job to run; the running part needs a Python the tenant can run (not so
    for a checkout under a private directory, such as a clean clone in ``mktemp -d``): without one it
    is skipped, after the first part has passed, saying why."""
    from goodput.demo.slurm import Runtime, runtime_for
    from goodput.sched.core.model import Job, JobState
    from goodput.sched.live.runas import resolve
    from goodput.sched.live.slurm import Slurm, discover
    from goodput.sched.live.store import open_store

    user = tenant_users["alice"]
    who = resolve(user)
    try:
        rt = runtime_for([user])
        no_runtime = ""
    except RuntimeError as e:  # the held jobs of the first part never run: any path will do
        rt, no_runtime = Runtime(sys.executable, ""), str(e)
    sl = Slurm(conf=str(slurm.conf))
    _pools, _nodes, seen = discover(sl, slurm.partition)
    ex = SlurmExecutor(Path(slurm.root) / "gp", store=open_store(f"sqlite:///{tmp_path / 's.db'}"),
                       partition=slurm.partition, slurm=sl, run_as=lambda j: who, python=rt.python,
                       env_for=lambda j: {"PYTHONPATH": rt.pythonpath})  # fmt: skip
    ex.nodes.update(seen)
    exits: list[tuple[str, str]] = []
    ex.on_exit = lambda j, e, st: exits.append((j, st))

    def as_tenant(*argv: str) -> subprocess.CompletedProcess:
        pw = pwd.getpwnam(user)
        return subprocess.run(list(argv), env={"PATH": "/usr/bin:/bin:/usr/sbin", "SLURM_CONF": str(slurm.conf)},
                              user=pw.pw_uid, group=pw.pw_gid, extra_groups=[], capture_output=True, text=True,
                              timeout=30, cwd="/")  # fmt: skip

    def record(sid: int) -> dict:
        q = json.loads(sl.run(["squeue", "--json"]))
        return next(j for j in q["jobs"] if j["job_id"] == sid)

    def start(name: str, nodes: tuple[str, ...], gpn: int = 1) -> int:
        job = Job(id=name, tenant="t", priority=0, nodes=len(nodes), gpus_per_node=gpn, submit_s=0.0,
                  command=("sleep", "120"))  # fmt: skip
        job.epoch, job.state = 1, JobState.RUNNING
        ex.start(job, nodes, 0.0)
        sid = ex.runs[name].slurm_id
        assert sid > 0, ex.failures
        r = record(sid)
        assert r["user_name"] == user and r["job_state"] == "PENDING" and r["state_reason"] == "JobHeldAdmin", r
        return sid

    # (a) the owner's release of goodput's hold is refused
    a = start("a.00000001", ("n1",))
    p = as_tenant("scontrol", "release", str(a))
    assert p.returncode != 0 and "Access/permission denied" in p.stderr, p
    assert record(a)["state_reason"] == "JobHeldAdmin"
    # (b, c) each change Slurm accepts from the owner of a pending job, one per job
    attacks = {
        "a.00000001": ["NodeList=n3"],
        "b.00000002": ["Gres=gpu:2"],
        "c.00000003": ["NumNodes=2-2"],
        "d.00000004": ["Partition=low"],
        "e.00000005": [f"Comment=goodput:{ex.instance}:other.00000009:1"],
    }
    ids = {"a.00000001": a}
    for name, node in zip(list(attacks)[1:], ("n1", "n2", "n2", "n4"), strict=True):
        ids[name] = start(name, (node,))
    for name, change in attacks.items():
        p = as_tenant("scontrol", "update", f"JobId={ids[name]}", *change)
        assert p.returncode == 0, (name, p)  # Slurm lets the owner do it: goodput must catch it
    ex.poll()
    ex.after_pass()  # releases nothing: each was cancelled first
    deadline = time.monotonic() + 60
    while len(exits) < len(attacks) and time.monotonic() < deadline:
        ex.poll()
        time.sleep(0.3)
    assert sorted(exits) == [(n, "failed") for n in sorted(attacks)], (exits, ex.failures)
    for name, sid in ids.items():
        r = record(sid)
        assert r["job_state"] == "CANCELLED" and not r["nodes"], r  # never ran
        assert ex.last_exit[name]["status"] == "failed" and ex.last_exit[name]["tampered"], ex.last_exit[name]
    why = {n: ex.last_exit[n]["tampered"] for n in ids}
    assert "required nodes" in why["a.00000001"] and "GPUs" in why["b.00000002"], why
    assert "nodes" in why["c.00000003"] and "partition" in why["d.00000004"] and "comment" in why["e.00000005"]
    # the normal path: a 2-node run released, running on its nodes, polled: untouched
    if no_runtime:
        pytest.skip(f"the part with a running job: {no_runtime[:300]}")
    exits.clear()
    f = start("f.00000006", ("n3", "n4"))
    ex.after_pass()
    while record(f)["job_state"] != "RUNNING" and time.monotonic() < deadline:
        time.sleep(0.3)
    for _ in range(3):
        ex.poll()
        time.sleep(0.3)
    r = record(f)
    assert r["job_state"] == "RUNNING" and hostnames(r["nodes"]) == ["n3", "n4"] and not exits, (r, ex.failures)
    assert not ex.runs["f.00000006"].tampered
    # requeue is refused (--no-requeue); a shrink is accepted by Slurm and caught
    p = as_tenant("scontrol", "requeue", str(f))
    assert p.returncode != 0 and "disabled" in p.stderr, p
    p = as_tenant("scontrol", "update", f"JobId={f}", "NumNodes=1")
    assert p.returncode == 0, p
    while not exits and time.monotonic() < deadline:
        ex.poll()
        time.sleep(0.3)
    assert exits == [("f.00000006", "failed")] and "nodes" in ex.last_exit["f.00000006"]["tampered"], ex.last_exit
    assert ex.table.load() == []
