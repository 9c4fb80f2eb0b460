"""Checkpoints on an S3-compatible object store, against a real SeaweedFS on 127.0.0.1."""

from __future__ import annotations

import os
import shutil
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch

import goodput.ckpt as gc
from goodput.ckpt.format.format import MANIFEST
from goodput.ckpt.storage import s3
from goodput.demo.seaweed import Weed
from tests.ckpt.s3_server import FaultProxy, range_span
from tests.ckpt.s3_server import keys as _keys
from tests.distributed import run_ranks

# the server: tests/ckpt/conftest.py (one SeaweedFS for the session, ``bucket``: a prefix of the test's own)


def test_locations_are_parsed_and_bad_ones_refused() -> None:
    assert s3.split("s3://bucket/a/b/") == ("bucket", "a/b")
    assert s3.split(Path("s3://bucket/a/b")) == ("bucket", "a/b")  # Path folds the double slash
    assert s3.url(Path("s3://bucket/a")) == "s3://bucket/a"
    with pytest.raises(ValueError, match="is not an S3 bucket name"):
        s3.split("s3://ab/x")
    with pytest.raises(ValueError, match=r"'\.\.' parts"):
        s3.split("s3://bucket/a/../b")
    assert isinstance(gc.storage.storage_for("s3://bucket/x"), s3.S3Storage)
    with pytest.raises(ValueError, match="S3Options.part_bytes|at least 5 MiB"):
        s3.S3Options(part_bytes=1 << 20)


def _state(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "model": {"w": torch.randn(64, 32, generator=g), "b": torch.randn(32, generator=g).to(torch.bfloat16)},
        "np": np.arange(10, dtype=np.int64),
        "step": 7,
        "meta": {"lr": 0.1, "names": ["a", "b"]},
        "blob": __import__("io").BytesIO(b"opaque bytes"),
    }


def test_round_trip_of_every_state_type(bucket: str) -> None:
    url = f"s3://{bucket}/run/step_7"
    state = _state(0)
    gc.save(state, url, step=7)
    out = _state(1)
    out["np"] = np.zeros(10, dtype=np.int64)
    out["step"], out["meta"] = 0, {"lr": 0.0, "names": []}
    gc.load(out, checkpoint_id=url, strict=False)
    assert torch.equal(out["model"]["w"], state["model"]["w"]) and torch.equal(out["model"]["b"], state["model"]["b"])
    assert (out["np"] == np.arange(10)).all() and out["step"] == 7 and out["meta"] == {"lr": 0.1, "names": ["a", "b"]}
    assert out["blob"].getvalue() == b"opaque bytes"
    assert gc.Checkpoint(url).verify() > 0
    assert str(gc.latest(f"s3://{bucket}/run")).endswith("step_7")


def test_large_files_go_up_as_parallel_multipart_uploads(bucket: str) -> None:
    st = s3.configure(part_bytes=5 << 20, concurrency=4)
    try:
        w = torch.arange(6 << 20, dtype=torch.float32)  # 24 MiB: five parts
        url = f"s3://{bucket}/big"
        gc.save({"w": w}, url)
        out = {"w": torch.zeros_like(w)}
        gc.load(out, url)
        assert torch.equal(out["w"], w)
        assert st.uploads(Path(url)) == []  # every upload completed, none left behind
    finally:
        s3.configure(part_bytes=s3.S3Options().part_bytes, concurrency=s3.S3Options().concurrency)


def test_a_resharded_load_reads_only_the_ranges_it_needs(bucket: str) -> None:
    url = f"s3://{bucket}/shard"
    full = torch.arange(1024 * 256, dtype=torch.float32).reshape(1024, 256)  # 1 MiB
    gc.save({"w": full}, url)
    st = s3.default_storage()
    part = {"w": gc.LocalShard(torch.zeros(128, 256), (1024, 256), (512, 0))}
    before = st.bytes_read
    gc.load(part, url)
    read = st.bytes_read - before
    need = 128 * 256 * 4
    assert torch.equal(part["w"].tensor, full[512:640])
    # the data ranges, their block checksums and the small metadata: within 1.1 x what is needed
    assert read <= 1.1 * need, (read, need)


def test_create_if_absent_has_exactly_one_winner(bucket: str) -> None:
    store, base = s3.default_storage(), Path(f"s3://{bucket}/cia")
    for i in range(10):
        barrier, won = threading.Barrier(2), [False, False]

        def go(k: int, i: int = i, barrier: threading.Barrier = barrier, won: list = won) -> None:
            barrier.wait()
            won[k] = store.publish_new(base / str(i), MANIFEST, b"%d" % k)

        ts = [threading.Thread(target=go, args=(k,)) for k in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert sum(won) == 1, (i, won)
        assert store.get(base / str(i), MANIFEST, "m", 10) == b"%d" % won.index(True)


def test_two_committers_of_one_checkpoint_exactly_one_wins(bucket: str) -> None:
    """Two saves started together: where both reach the commit before either commits, exactly one
    wins (the other's files are removed); where one commits first, the later one replaces it, as
    any save into an existing checkpoint. Repeated until the first case has happened."""
    for attempt in range(30):
        url = f"s3://{bucket}/race{attempt}"
        results: list[object] = [None, None]
        barrier = threading.Barrier(2)

        def go(i: int, url: str = url, results: list = results, barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            try:
                results[i] = gc.save({"w": torch.full((1000,), float(i))}, url, no_dist=True)
            except gc.SaveError as e:
                results[i] = e

        ts = [threading.Thread(target=go, args=(i,)) for i in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        losses = [r for r in results if isinstance(r, gc.SaveError)]
        if not losses:
            assert all(isinstance(r, gc.SaveResult) for r in results), results
            continue  # they did not overlap at the commit: try again
        wins = [r for r in results if not isinstance(r, Exception)]
        assert len(wins) == 1 and len(losses) == 1, results
        assert f"another save committed '{url}' first" in str(losses[0])  # the URL as given
        out = {"w": torch.zeros(1000)}
        gc.load(out, url)
        assert torch.equal(out["w"], torch.full((1000,), float(results.index(wins[0]))))
        # the loser's files are gone: only the winner's data, metadata and manifest remain
        ck = gc.Checkpoint(url)
        names = {k.rsplit("/", 1)[-1] for k in _keys(bucket, f"race{attempt}/")}
        assert names == {MANIFEST, ck.manifest.metadata.name, *(f.name for f in ck.metadata.files)}
        return
    pytest.fail("30 pairs of saves never overlapped at the commit")


def test_a_missing_checkpoint_and_a_missing_bucket_are_named(bucket: str) -> None:
    with pytest.raises(gc.CheckpointError, match=f"'s3://{bucket}/nothing' is not a committed checkpoint"):
        gc.load({"w": torch.zeros(1)}, f"s3://{bucket}/nothing")
    with pytest.raises(gc.SaveError, match="bucket 'no-such-bucket-here' cannot be reached"):
        gc.save({"w": torch.zeros(1)}, "s3://no-such-bucket-here/x")
    assert gc.latest(f"s3://{bucket}/none") is None


def _ranks(rank: int, world: int, url: str) -> list:
    t = torch.arange(16.0).reshape(4, 4)
    shard = gc.LocalShard(t[rank * 2 : rank * 2 + 2].clone(), (4, 4), (rank * 2, 0))
    gc.save({"w": shard, "rep": torch.ones(3) * 5}, f"{url}/sync")
    gc.async_save({"w": shard, "rep": torch.ones(3) * 5}, checkpoint_id=f"{url}/async").result(timeout=120)
    out = []
    for name in ("sync", "async"):
        cols = gc.LocalShard(torch.zeros(4, 2), (4, 4), (0, rank * 2))
        into = {"w": cols, "rep": torch.zeros(3)}
        gc.load(into, f"{url}/{name}")
        out.append([torch.equal(cols.tensor, t[:, rank * 2 : rank * 2 + 2]), into["rep"].tolist()])
    return out


def test_multi_rank_saves_and_loads(bucket: str) -> None:
    url = f"s3://{bucket}/ranks"
    assert run_ranks(_ranks, 2, url, timeout=180) == [[[True, [5.0] * 3]] * 2] * 2
    whole = {"w": torch.zeros(4, 4), "rep": torch.zeros(3)}
    gc.load(whole, f"{url}/async")
    assert torch.equal(whole["w"], torch.arange(16.0).reshape(4, 4))


def test_checkpointer_latest_and_retention(bucket: str) -> None:
    root = f"s3://{bucket}/ckr"
    ck = gc.Checkpointer(root, interval=1, keep=2)
    for step in range(1, 5):
        ck.maybe_save(step, {"w": torch.full((4,), float(step))})
        ck.wait()
    ck.close()
    steps = sorted({k.split("/")[1] for k in _keys(bucket, "ckr/") if k.count("/") >= 2})
    assert len(steps) == 2 and steps[-1].endswith("4"), steps
    assert str(gc.latest(root)).endswith(steps[-1])
    out = {"w": torch.zeros(4)}
    fresh = gc.Checkpointer(root, interval=1)
    assert fresh.restore(out) == 4 and torch.equal(out["w"], torch.full((4,), 4.0))
    fresh.close()


def test_server_killed_mid_upload_then_restarted(own_weed: Weed) -> None:
    """Killed mid-upload: the save fails naming the object and commits nothing. Restarted on the
    same data: the next save succeeds and the Checkpointer's start-up cleanup aborts the dead
    save's multipart upload and removes its objects. A server of its own: the shared one is
    never killed."""
    weed, bucket = own_weed, f"t-{uuid.uuid4().hex[:12]}"
    s3.default_storage().client().create_bucket(Bucket=bucket)
    root = f"s3://{bucket}/kill"
    # one part at a time: the upload lasts long enough to be killed in the middle
    st = s3.configure(part_bytes=5 << 20, concurrency=1, max_attempts=2, connect_timeout_s=2, read_timeout_s=10)
    failed: list[BaseException] = []
    w = torch.randn(64 << 20 >> 2)  # 64 MiB: thirteen parts

    def save() -> None:
        try:
            gc.save({"w": w}, f"{root}/step_00000001", step=1)
        except BaseException as e:  # noqa: BLE001 - the test inspects it
            failed.append(e)

    t = threading.Thread(target=save)
    try:
        t.start()
        deadline = time.monotonic() + 60
        while not st.uploads(Path(root)) and t.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert t.is_alive(), "the save finished before the server could be killed"
        weed.kill()
        t.join(120)
        assert not t.is_alive() and len(failed) == 1
        assert isinstance(failed[0], gc.SaveError) and "nothing was committed" in str(failed[0])
        assert "/kill/step_00000001/data-" in str(failed[0])  # the object at fault
        weed.start()
        assert gc.latest(root) is None  # nothing was committed
        assert st.uploads(Path(root)) or _keys(bucket, "kill/")  # the dead save left something behind
        ck = gc.Checkpointer(root, interval=1)  # start-up cleanup: no save is in flight
        assert st.uploads(Path(root)) == [] and not [k for k in _keys(bucket, "kill/") if "step_00000001" in k]
        ck.save(2, {"w": w})
        ck.wait()
        ck.close()
        out = {"w": torch.zeros_like(w)}
        assert gc.Checkpointer(root, interval=1).restore(out) == 2 and torch.equal(out["w"], w)
    finally:
        s3.configure(**{f: getattr(s3.S3Options(), f) for f in ("part_bytes", "concurrency", "max_attempts")})
        s3.configure(connect_timeout_s=s3.S3Options().connect_timeout_s, read_timeout_s=s3.S3Options().read_timeout_s)


def test_cli_commands_take_s3_locations(weed: Weed, bucket: str) -> None:
    import json
    import subprocess
    import sys

    root = f"s3://{bucket}/cli"
    gc.save({"w": torch.arange(8.0)}, f"{root}/step_00000003", step=3)
    env = {k: v for k, v in os.environ.items() if k != "AWS_ENDPOINT_URL"}  # the endpoint as an option

    def cli(*args: str) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "goodput.cli.main", "ckpt", "--endpoint", weed.endpoint, *args]
        return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)

    ls = cli("ls", root, "--json")
    assert ls.returncode == 0, ls.stderr
    assert [(r["path"], r["step"]) for r in json.loads(ls.stdout)] == [(f"{root}/step_00000003", 3)]
    v = cli("verify", f"{root}/step_00000003")
    assert v.returncode == 0 and f"ok: {root}/step_00000003" in " ".join(v.stdout.split()), v.stdout + v.stderr
    i = cli("inspect", f"{root}/step_00000003", "--json")
    assert i.returncode == 0 and "w" in i.stdout
    assert json.loads(i.stdout)["path"] == f"{root}/step_00000003"  # a URL, never s3:/
    vj = cli("verify", "--json", f"{root}/step_00000003")
    assert vj.returncode == 0 and json.loads(vj.stdout)["path"] == f"{root}/step_00000003"
    table = cli("ls", root)
    assert table.returncode == 0 and "step_00000003" in table.stdout and "s3:/" + bucket not in table.stdout
    missing = cli("ls", f"s3://{bucket}/none")
    assert missing.returncode == 2 and "does not exist" in missing.stderr


def test_throttling_is_retried_and_a_persistent_one_fails_naming_the_object(weed: Weed, bucket: str) -> None:
    proxy = FaultProxy(weed.endpoint)
    try:
        proxy.fail_first(3, ("PUT", "POST"))  # the first three writes answered 503
        s3.configure(endpoint_url=proxy.endpoint, part_bytes=5 << 20, max_attempts=5)
        w = torch.arange(3 << 20, dtype=torch.float32)  # 12 MiB: three parts
        url = f"s3://{bucket}/throttled"
        gc.save({"w": w}, url)  # three 503s in a row, each retried with backoff and jitter
        assert proxy.answered_503 == 3
        out = {"w": torch.zeros_like(w)}
        gc.load(out, url)
        assert torch.equal(out["w"], w)
        # throttled for good: the save gives up, names the object, commits nothing
        proxy.storm_methods, proxy.storm = ("PUT", "POST"), True
        s3.configure(max_attempts=2)
        with pytest.raises(gc.SaveError, match=r"s3://.*/throttled2/data-.*(SlowDown|ServiceUnavailable|503)"):
            gc.save({"w": w}, f"s3://{bucket}/throttled2")
        assert gc.latest(f"s3://{bucket}") is None or "throttled2" not in str(gc.latest(f"s3://{bucket}"))
        assert not [k for k in _keys(bucket, "throttled2/") if k.endswith("manifest.json")]
    finally:
        proxy.close()
        s3.configure(endpoint_url=None, part_bytes=s3.S3Options().part_bytes, max_attempts=s3.S3Options().max_attempts)


def test_a_read_cut_short_mid_body_is_asked_again_from_where_it_stopped(weed: Weed, bucket: str) -> None:
    """botocore retries a request only until its headers arrive; a body cut short after that is
    goodput's to resume: the load asks for the rest of the range and the values are exact."""
    w = torch.arange(3 << 20, dtype=torch.float32)
    url = f"s3://{bucket}/cut"
    gc.save({"w": w}, url)
    proxy = FaultProxy(weed.endpoint)
    proxy.cut_body(3)  # the first three ranged GETs: half the body, then a reset
    try:
        s3.configure(endpoint_url=proxy.endpoint, max_attempts=5)
        out = {"w": torch.zeros_like(w)}
        gc.load(out, url)
        assert proxy.cut == 3 and torch.equal(out["w"], w)
        proxy.cut_body(10_000)  # every body cut: the load gives up naming the object
        s3.configure(max_attempts=2)
        with pytest.raises(gc.CheckpointError, match=r"s3://.*/cut/(data|metadata)-.*cut short 2 times"):
            gc.load({"w": torch.zeros_like(w)}, url)
    finally:
        proxy.close()
        s3.configure(endpoint_url=None, max_attempts=s3.S3Options().max_attempts)
    # a body that stalls halfway (the read times out: an exception, not an end) resumes from
    # where it stopped too: the next GET starts at the half already in the buffer
    proxy = FaultProxy(weed.endpoint)
    proxy.cut_body(1, min_span=4 << 20, stall_s=3.0)  # the first GET over 4 MiB stalls halfway
    try:
        s3.configure(endpoint_url=proxy.endpoint, max_attempts=5, read_timeout_s=1.0)
        out = {"w": torch.zeros_like(w)}
        gc.load(out, url)
        assert proxy.cut == 1 and torch.equal(out["w"], w)
        # the stalled GET (the first over 4 MiB) and the one after it, for the rest of its range
        i = next(k for k, r in enumerate(proxy.ranges) if range_span(r) > 4 << 20)
        (a0, b0), (a1, b1) = (map(int, r.removeprefix("bytes=").split("-")) for r in proxy.ranges[i : i + 2])
        assert b1 == b0 and a0 < a1 <= a0 + (b0 - a0 + 1) // 2, proxy.ranges
    finally:
        proxy.close()
        s3.configure(endpoint_url=None, max_attempts=s3.S3Options().max_attempts, read_timeout_s=60.0)


def test_a_damaged_object_is_named_without_a_head_request(bucket: str) -> None:
    """Data objects are opened with the size the metadata records (no HEAD); every ranged GET's
    Content-Range total is checked against it, so a truncated, a grown and a missing object each
    fail the load naming the object."""
    w = torch.arange(1 << 16, dtype=torch.float32)
    name, _, base = bucket.partition("/")
    c = s3.default_storage().client()
    for damage in ("truncated", "grown", "missing"):
        url = f"s3://{bucket}/{damage}"
        gc.save({"w": w}, url)
        (key,) = [f"{base}/{k}" for k in _keys(bucket, f"{damage}/") if "/data-" in f"/{k}"]
        body = c.get_object(Bucket=name, Key=key)["Body"].read()
        if damage == "missing":
            c.delete_object(Bucket=name, Key=key)
            want = r"data file 's3://.*/missing/data-.*' is missing"
        else:
            c.put_object(Bucket=name, Key=key, Body=body[:-4096] if damage == "truncated" else body + bytes(4096))
            want = rf"data file 's3://.*/{damage}/data-.*' (is {len(body) + 4096} bytes|ends before byte \d+), the checkpoint records {len(body)}"
            if damage == "truncated":
                want = rf"data file 's3://.*/truncated/data-.*' (is {len(body) - 4096} bytes|ends before byte \d+)"
        with pytest.raises(gc.CheckpointError, match=want):
            gc.load({"w": torch.zeros_like(w)}, url)


def _tiered_two(rank: int, world: int, root: str, tmp: str, steps: list[int]) -> tuple:
    ck = gc.Checkpointer(root, fast=Path(tmp) / f"node{rank}", interval=1, drain_every=2, fast_keep=4)
    state = {"w": gc.LocalShard(torch.zeros(1 << 16), (1 << 17,), ((1 << 16) * rank,))}
    restored = ck.restore(state), ck.restored_tier, float(state["w"].tensor[0])
    for s in steps:
        state["w"].tensor.fill_(s * 10 + rank)
        ck.save(s, state).result()
    assert ck.wait_drained(120)
    ck.close()
    return restored


def test_a_tiered_checkpointer_drains_to_s3_and_restores_from_it_when_the_fast_tier_is_gone(
    bucket: str, tmp_path: Path
) -> None:
    root = f"s3://{bucket}/run"
    assert run_ranks(_tiered_two, 2, root, str(tmp_path), [1, 2, 3]) == [(None, None, 0.0)] * 2
    assert sorted(k for k in _keys(bucket, "run/") if k.endswith("MANIFEST.json")) == [
        "run/step_000000002/MANIFEST.json"
    ]  # drain_every=2: step 2 only went to the durable tier
    assert not [k for k in _keys(bucket, "run/") if "/.goodput-" in k and "step_000000002" in k]
    # the same nodes: step 3 from the fast tier
    assert run_ranks(_tiered_two, 2, root, str(tmp_path), []) == [(3, "fast", 30.0), (3, "fast", 31.0)]
    # every node replaced: step 2 from the object store
    for r in (0, 1):
        shutil.rmtree(tmp_path / f"node{r}")
    assert run_ranks(_tiered_two, 2, root, str(tmp_path), []) == [(2, "durable", 20.0), (2, "durable", 21.0)]
