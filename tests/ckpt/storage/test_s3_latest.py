"""Errors never look like "no checkpoint" (issue 25, item 4), and S3 locations are URLs
everywhere (item 7): against a real SeaweedFS of each test's own (stopped, restarted, wrong
credentials), so the session's shared server is never disturbed."""

from __future__ import annotations

import os
import threading
import time
import uuid

import pytest
import torch

import goodput.ckpt as gc
from goodput.ckpt.errors import StorageError
from goodput.ckpt.storage import s3
from goodput.demo.seaweed import Weed

# ``own_weed`` (tests/ckpt/conftest.py): a server each test may stop, restart or misconfigure


def _committed_run(bucket: str) -> str:
    s3.default_storage().client().create_bucket(Bucket=bucket)
    root = f"s3://{bucket}/run"
    ck = gc.Checkpointer(root, interval=1, mode="thread")
    h = ck.save(1, {"w": torch.arange(4.0)})
    assert repr(h).startswith(f"AsyncSave(path='{root}/step_000000001'")  # a URL, not s3:/
    h.result()
    ck.close()
    return root


def test_latest_raises_on_a_stopped_server_and_never_says_none_after_a_restart(own_weed: Weed) -> None:
    weed = own_weed
    root = _committed_run(f"t-{uuid.uuid4().hex[:12]}")
    assert str(gc.latest(root)) == f"{root}/step_000000001"
    assert gc.latest(root + "/empty") is None  # the store answers: nothing there
    s3.configure(max_attempts=2, connect_timeout_s=1, read_timeout_s=2)

    ck = gc.Checkpointer(root, interval=1, mode="thread")
    weed.kill()
    with pytest.raises(StorageError, match=f"'{root}'"):
        gc.latest(root)
    with pytest.raises(StorageError, match=f"'{root}'"):
        ck.restore({"w": torch.zeros(4)})
    ck.close()

    # restarted on the same data: while it comes up, every answer is an error or the truth
    answers: list[str] = []
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            try:
                got = gc.latest(root)
                answers.append("none" if got is None else str(got))
            except StorageError:
                answers.append("error")
            time.sleep(0.02)

    t = threading.Thread(target=poll)
    t.start()
    try:
        weed.start()
        deadline = time.monotonic() + 30
        while answers.count(f"{root}/step_000000001") < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        t.join(60)
    print("answers while restarting:", {a: answers.count(a) for a in set(answers)})
    assert "none" not in answers, answers
    assert answers.count(f"{root}/step_000000001") >= 5, answers[-10:]
    out = {"w": torch.zeros(4)}
    ck2 = gc.Checkpointer(root, interval=1, mode="thread")
    assert ck2.restore(out) == 1 and torch.equal(out["w"], torch.arange(4.0))
    ck2.close()
    with pytest.raises(StorageError, match="no-such-bucket"):  # a typo is no "no checkpoint yet" either
        gc.latest("s3://no-such-bucket/run")


def test_wrong_credentials_raise_and_partial_credentials_complete(own_weed: Weed) -> None:
    weed = own_weed
    bucket = f"t-{uuid.uuid4().hex[:12]}"
    root = _committed_run(bucket)
    s3.configure(access_key_id="wrong-key", secret_access_key="wrong-secret", max_attempts=2)
    with pytest.raises(StorageError, match=f"'{root}'"):
        gc.latest(root)
    s3._default = None
    # half a key given: the chain (here the environment) completes it
    s3.configure(secret_access_key=os.environ["AWS_SECRET_ACCESS_KEY"])
    assert str(gc.latest(root)) == f"{root}/step_000000001"
    s3._default = None
    s3.configure(access_key_id=os.environ["AWS_ACCESS_KEY_ID"], endpoint_url=weed.endpoint)
    listed = [str(p) for p, _ in gc.list_checkpoints(root)]
    assert listed == [f"{root}/step_000000001"]
    assert all("s3:/" not in s.replace("s3://", "") for s in listed)
    s3._default = None
