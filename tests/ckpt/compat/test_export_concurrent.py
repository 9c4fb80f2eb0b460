"""Two exports into one destination, a destination inside the checkpoint, and the multipart
upload a killed ``s3://`` export leaves behind.

Real ``goodput ckpt export`` processes: one is stopped (SIGSTOP) while it holds the destination,
so that a second export meets it mid-write every time, then let go (SIGCONT) and must finish
undisturbed; one is SIGKILLed mid-upload (watching ``ListMultipartUploads``), and the next
export must abort what it left, and nothing else.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import goodput.ckpt as gc
from goodput.ckpt.compat import exporter
from goodput.ckpt.compat.exporter import INDEX, ExportError
from tests.ckpt.compat.test_export_interrupted import MARKER, SHARD, N, _export_cmd, _kill_when, _save, _state


def _stop_when(cmd: list[str], ready: Callable[[], bool], timeout: float = 120.0) -> subprocess.Popen | None:
    """Run ``cmd``; SIGSTOP it the moment ``ready()`` holds. The stopped process, or None when
    it ended first."""
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if ready():
            p.send_signal(signal.SIGSTOP)
            return p
        if p.poll() is not None:
            return None
        time.sleep(0.0005)
    p.kill()
    p.wait()
    return None


def _resume(p: subprocess.Popen) -> str:
    """Let the stopped export go on; it must finish. Its stderr."""
    p.send_signal(signal.SIGCONT)
    _, err = p.communicate(timeout=300)
    assert p.returncode == 0, err.decode()[-3000:]
    return err.decode()


def _values(dst: str | Path) -> list[float]:
    s = _state()
    gc.load(s, dst)
    return [round(float(v[0]), 2) for v in s.values()]


def test_a_second_export_into_a_destination_being_written_fails_at_once(tmp_path: Path) -> None:
    """Export A is stopped while it writes ``hf/``. Before, export B with ``--overwrite`` removed
    A's marker and shards and wrote its own: A then went on beside it, and the directory held a mix
    (or lost its marker while A still wrote). Now B fails at once, naming the destination and A
    (pid, host, start), and touches nothing; A finishes and the directory is A's export."""
    _save(tmp_path / "ck1", 1.0)
    _save(tmp_path / "ck2", 2.0)
    for attempt in range(3):
        dst = tmp_path / f"hf{attempt}"
        a = _stop_when(
            _export_cmd(tmp_path / "ck1", dst, "--prefix", "model.", "--max-shard-size", SHARD),
            lambda: (dst / MARKER).exists(),  # noqa: B023
        )
        if a is not None:
            break
    else:
        pytest.fail("the export finished every time before it could be stopped")
    try:
        held = {n: (dst / n).stat().st_ino for n in os.listdir(dst)}
        note = json.loads((dst / MARKER).read_text())
        assert note["pid"] == a.pid
        for overwrite in (True, False):
            t0 = time.monotonic()
            with pytest.raises(ExportError) as e:
                gc.export(tmp_path / "ck2", dst, prefix="model.", max_shard_size=SHARD, overwrite=overwrite)
            assert time.monotonic() - t0 < 30  # at once: it does not wait for A
            msg = str(e.value)
            assert f"another export is writing into {str(dst)!r}" in msg, msg
            assert f"pid {a.pid} on host {socket.gethostname()!r}" in msg and "started " in msg, msg
            assert {n: (dst / n).stat().st_ino for n in os.listdir(dst)} == held  # nothing of A's touched
        r = subprocess.run(_export_cmd(tmp_path / "ck2", dst, "--prefix", "model.", "--max-shard-size", SHARD, "--overwrite"),
                           capture_output=True, text=True, timeout=300)  # fmt: skip
        assert r.returncode == 1 and "another export is writing into" in " ".join(r.stderr.split()), r.stderr
        assert json.loads((dst / MARKER).read_text())["pid"] == a.pid
    finally:
        _resume(a)
    assert MARKER not in os.listdir(dst)
    assert _values(dst) == [round(1.0 + i / 100, 2) for i in range(N)]


def test_a_marker_whose_export_may_still_run_is_not_taken_over(tmp_path: Path) -> None:
    """A marker of a live process on this host (an export that did not lock: an older goodput),
    or of a process on another host (whether it runs cannot be told from here), is not removed by
    ``--overwrite``: refused, saying how to go on. A dead process's marker on this host is taken
    over, as a SIGKILLed export's is (test_export_interrupted.py)."""
    gc.save({"model": {"w": torch.ones(4)}}, tmp_path / "ck")
    dst = tmp_path / "hf"
    dst.mkdir()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        (dst / MARKER).write_text(
            json.dumps({"pid": sleeper.pid, "host": socket.gethostname(), "started": time.time()})
        )
        with pytest.raises(ExportError, match=rf"another export is writing into '{dst}': pid {sleeper.pid} on host"):
            gc.export(tmp_path / "ck", dst, overwrite=True)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert json.loads((dst / MARKER).read_text())["pid"] == sleeper.pid
    (dst / MARKER).write_text(json.dumps({"pid": 4242, "host": "elsewhere.example", "started": 1.0e9}))
    with pytest.raises(
        ExportError,
        match=rf"pid 4242 on host 'elsewhere.example'.* if it is not running, remove '{dst}/{MARKER}' and export again",
    ):
        gc.export(tmp_path / "ck", dst, overwrite=True)
    assert (dst / MARKER).exists()
    # the sleeper is gone now: its marker (this host, pid gone) is an export that died
    (dst / MARKER).write_text(json.dumps({"pid": sleeper.pid, "host": socket.gethostname(), "started": 1.0e9}))
    gc.export(tmp_path / "ck", dst, overwrite=True)
    assert sorted(os.listdir(dst)) == ["model.safetensors"]


def test_an_s3_export_meeting_a_running_one_fails_at_once(tmp_path: Path, bucket: str) -> None:
    """The same on ``s3://``: the marker is created by a conditional PUT (``If-None-Match: *``),
    so exactly one of two exports holds the prefix; the other fails naming it and the holder."""
    from goodput.ckpt.storage import s3

    _save(tmp_path / "ck1", 1.0)
    _save(tmp_path / "ck2", 2.0)
    name, _, base = bucket.partition("/")
    client = s3.default_storage().client()

    def has_marker(prefix: str) -> bool:
        try:
            client.head_object(Bucket=name, Key=f"{base}/{prefix}/{MARKER}")
            return True
        except Exception:  # noqa: BLE001 - missing
            return False

    for attempt in range(3):
        dst = f"s3://{bucket}/hf{attempt}"
        cmd = _export_cmd(tmp_path / "ck1", dst, "--prefix", "model.", "--max-shard-size", SHARD)
        a = _stop_when(cmd, lambda: has_marker(f"hf{attempt}"))  # noqa: B023
        if a is not None:
            break
    else:
        pytest.fail("the export finished every time before it could be stopped")
    try:
        for overwrite in (True, False):
            with pytest.raises(ExportError, match=rf"another export is writing into '{dst}': pid {a.pid} on host"):
                gc.export(tmp_path / "ck2", dst, prefix="model.", max_shard_size=SHARD, overwrite=overwrite)
        body = client.get_object(Bucket=name, Key=f"{base}/hf{attempt}/{MARKER}")["Body"].read()
        assert json.loads(body)["pid"] == a.pid
    finally:
        _resume(a)
    assert _values(dst) == [round(1.0 + i / 100, 2) for i in range(N)]


def test_a_destination_inside_the_checkpoint_is_refused(tmp_path: Path) -> None:
    """Before, only the checkpoint itself was refused: ``ck/hf`` (or ``ck/../ck/hf``, a link into
    it, ``s3://b/run/ck/hf``) wrote the export into the checkpoint's own directory. Now refused
    by resolved path, and on ``s3://`` by bucket and key components (``ck2`` is not in ``ck``)."""
    gc.save({"model": {"w": torch.ones(3)}}, tmp_path / "ck")
    os.symlink(tmp_path / "ck", tmp_path / "link")
    held = sorted(os.listdir(tmp_path / "ck"))
    for dst in (tmp_path / "ck" / "hf", tmp_path / "ck" / ".." / "ck" / "hf", tmp_path / "link" / "a" / "b"):
        for overwrite in (False, True):
            with pytest.raises(ExportError, match=rf"the destination '{dst}' is inside the checkpoint"):
                gc.export(tmp_path / "ck", dst, prefix="model.", overwrite=overwrite)
    with pytest.raises(ExportError, match="is inside the checkpoint"):
        gc.export(tmp_path / "ck", tmp_path / "ck" / "m.pt", prefix="model.", format="torch")
    assert sorted(os.listdir(tmp_path / "ck")) == held
    with pytest.raises(ExportError, match="'s3://bucket/run/ck/hf' is inside the checkpoint 's3://bucket/run/ck'"):
        gc.export("s3://bucket/run/ck", "s3://bucket/run/ck/hf", overwrite=True)
    assert exporter._contains("s3://bucket/run/ck", "s3://bucket/run/ck/a/b")
    assert not exporter._contains("s3://bucket/run/ck", "s3://bucket/run/ck2")
    assert not exporter._contains("s3://bucket/run/ck", "s3://other/run/ck/hf")
    assert not exporter._contains(tmp_path / "ck", tmp_path / "ck2")
    gc.export(tmp_path / "ck", tmp_path / "ck2", prefix="model.")  # a sibling that shares the prefix "ck"
    # the checkpoint inside the destination: --overwrite removes only the export's own names at
    # the top of the destination, never a directory, so the checkpoint stays whole
    out = tmp_path / "out"
    gc.save({"model": {"w": torch.full((3,), 7.0)}}, out / "ck")
    gc.export(out / "ck", out, prefix="model.", overwrite=True)
    gc.export(out / "ck", out, prefix="model.", overwrite=True, max_shard_size=4)
    s = {"model": {"w": torch.zeros(3)}}
    gc.load(s, out / "ck")
    assert float(s["model"]["w"][0]) == 7.0


def _uploads(client: object, name: str, prefix: str) -> list[dict]:
    out: list[dict] = []
    for page in client.get_paginator("list_multipart_uploads").paginate(Bucket=name, Prefix=prefix):  # type: ignore[attr-defined]
        out += page.get("Uploads", [])
    return out


def test_an_s3_export_killed_mid_upload_leaves_no_incomplete_upload_after_the_next(tmp_path: Path, bucket: str) -> None:
    """SIGKILLed while a shard's multipart upload is open: the upload stays (billed, invisible to
    listings). Before, the next export left it for good. Now the ``--overwrite`` export that takes
    over the dead export's marker aborts the uploads that export started (the exporter's own
    file names, opened while its marker stood), and never another's under the prefix: another name,
    the export's name a level down, or a name of the exporter's this export does not write opened
    before the dead export began."""
    from goodput.ckpt.storage import s3

    m = 5 << 20  # float32 elements: 20 MiB a tensor, more than a 16 MiB part: a multipart upload each
    gc.save({"model": {f"t{i}": torch.full((m,), float(i)) for i in range(3)}}, tmp_path / "ck")
    name, _, base = bucket.partition("/")
    client = s3.default_storage().client()
    foreign: dict[str, str] = {}
    for attempt in range(3):
        dst = f"s3://{bucket}/hf{attempt}"
        pre = f"{base}/hf{attempt}/"
        earlier = f"{pre}model-00001-of-00009.safetensors"  # someone's, before the dead export began
        foreign = {earlier: client.create_multipart_upload(Bucket=name, Key=earlier)["UploadId"]}
        time.sleep(3)  # the stores' clocks count seconds
        cmd = _export_cmd(tmp_path / "ck", dst, "--prefix", "model.", "--max-shard-size", "20MiB")
        if _kill_when(cmd, lambda: any(u["Key"] != earlier for u in _uploads(client, name, pre))) == -signal.SIGKILL:  # noqa: B023
            break
    else:
        pytest.fail("the export finished every time before it could be killed mid-upload")
    dead = [u for u in _uploads(client, name, pre) if u["Key"] not in foreign]
    assert dead and all(u["Key"].startswith(f"{pre}model-0000") and "-of-00003" in u["Key"] for u in dead), dead
    # someone else's uploads under the prefix: another name, and the export's name one level down
    for key in (f"{pre}notes.bin", f"{pre}sub/model.safetensors"):
        foreign[key] = client.create_multipart_upload(Bucket=name, Key=key)["UploadId"]
    try:
        with pytest.raises(ExportError, match="an earlier export into it did not finish"):
            gc.export(tmp_path / "ck", dst, prefix="model.", max_shard_size="20MiB")
        assert {u["UploadId"] for u in _uploads(client, name, pre)} >= {u["UploadId"] for u in dead}
        # two shards now: the dead export's keys (-of-00003) are none this export writes
        res = gc.export(tmp_path / "ck", dst, prefix="model.", max_shard_size="40MiB", overwrite=True)
        left = {u["Key"]: u["UploadId"] for u in _uploads(client, name, pre)}
        assert left == foreign, (left, foreign)
        assert sorted(res.aborted) == sorted(f"s3://{name}/{u['Key']}" for u in dead)
    finally:
        for key, uid in foreign.items():
            client.abort_multipart_upload(Bucket=name, Key=key, UploadId=uid)
    s = {f"t{i}": torch.zeros(m) for i in range(3)}
    gc.load(s, dst)
    assert [float(v[-1]) for v in s.values()] == [0.0, 1.0, 2.0]
    assert json.loads(client.get_object(Bucket=name, Key=f"{pre}{INDEX}")["Body"].read())["weight_map"]
