"""A store that answers 503 (SlowDown, ServiceUnavailable) for a while, as S3 does under load:
a burst is retried with backoff and the save and the load succeed; a storm longer than the
retries is a StorageError naming the object, with nothing committed, and ``latest()`` never
names the step it interrupted. A real HTTP proxy on loopback injects the faults
(:class:`tests.ckpt.s3_server.FaultProxy`); the store behind it is the session's real SeaweedFS."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

import goodput.ckpt as gc
from goodput.ckpt.errors import StorageError
from goodput.ckpt.format.format import MANIFEST
from goodput.ckpt.storage import s3
from goodput.demo.seaweed import Weed
from tests.ckpt.s3_server import FaultProxy, keys

W = torch.arange(3 << 20, dtype=torch.float32)  # 12 MiB: three 5 MiB parts, in parallel


@pytest.fixture
def proxy(weed: Weed, bucket: str) -> Iterator[FaultProxy]:
    """``s3://`` of this process goes through the proxy (``bucket``'s teardown resets it)."""
    with FaultProxy(weed.endpoint) as p:
        s3.configure(endpoint_url=p.endpoint, part_bytes=5 << 20, max_attempts=8)
        yield p


def _state(step: int) -> dict:
    return {"w": W + step, "meta": {"step": step, "lr": 1e-3 * step}}


def _blank() -> dict:
    return {"w": torch.zeros_like(W), "meta": {"step": None, "lr": None}}


def _exact(out: dict, step: int) -> bool:
    return torch.equal(out["w"], W + step) and out["meta"] == {"step": step, "lr": 1e-3 * step}


def test_a_burst_of_503s_is_retried_and_the_save_and_the_load_succeed(bucket: str, proxy: FaultProxy) -> None:
    root = f"s3://{bucket}/burst"
    # the save's first five requests, whatever they are (one request may meet all five: within
    # its eight tries, with backoff and jitter between them)
    proxy.fail_first(5)
    ck = gc.Checkpointer(root, interval=1, mode="thread")
    ck.save(1, _state(1)).result()
    assert proxy.answered_503 == 5
    proxy.fail_first(5, ("PUT", "POST"))  # a burst on the writes of the next save
    ck.save(2, _state(2)).result()
    ck.close()
    assert proxy.answered_503 == 10
    proxy.fail_first(5)  # and the restore's: listing, manifest, metadata, ranged GETs
    out = _blank()
    fresh = gc.Checkpointer(root, interval=1, mode="thread")
    assert fresh.restore(out) == 2 and _exact(out, 2)
    fresh.close()
    assert proxy.answered_503 == 15
    codes = [c for _, _, c in proxy.requests]
    assert codes.count(503) == 15 and all(c in (200, 204, 206, 404, 503) for c in codes), set(codes)


def test_a_storm_longer_than_the_retries_fails_naming_the_object_and_commits_nothing(
    bucket: str, proxy: FaultProxy
) -> None:
    s3.configure(max_attempts=2)  # a budget of two tries a request (one retry): the storm outlasts it
    root = f"s3://{bucket}/storm"
    ck = gc.Checkpointer(root, interval=1, mode="thread")
    ck.save(1, _state(1)).result()

    proxy.storm_methods, proxy.storm = ("PUT", "POST"), True  # every write refused
    step2 = rf"s3://{bucket}/storm/step_000000002/(data|metadata)-[0-9a-f]+-?\S*"
    with pytest.raises(StorageError, match=rf"{step2}.*(SlowDown|ServiceUnavailable)") as e:
        ck.save(2, _state(2)).result()
    assert isinstance(e.value, gc.SaveError) and "nothing was committed" in str(e.value)
    with pytest.raises(StorageError, match=rf"{step2}.*(SlowDown|ServiceUnavailable)") as e:
        gc.save(_state(2), f"{root}/step_000000002", step=2)
    assert isinstance(e.value, gc.SaveError) and "nothing was committed" in str(e.value)

    proxy.storm_methods = None  # every request refused: latest() is an error, never None or step 1
    with pytest.raises(StorageError, match=f"'{root}'"):
        gc.latest(root)
    proxy.storm_methods, proxy.storm_part = ("GET",), "/data-"  # only the data's ranged GETs
    with pytest.raises(
        StorageError, match=rf"s3://{bucket}/storm/step_000000001/data-\S+: ranged GET .*(SlowDown|ServiceUnavailable)"
    ):
        gc.load(_blank(), f"{root}/step_000000001")
    proxy.storm, proxy.storm_part = False, ""

    # the storm is over: the interrupted step is no checkpoint, the last committed one is whole
    assert str(gc.latest(root)) == f"{root}/step_000000001"
    assert not [k for k in keys(bucket, "storm/step_000000002/") if k.endswith(MANIFEST)]
    out = _blank()
    assert gc.Checkpointer(root, interval=1, mode="thread").restore(out) == 1 and _exact(out, 1)
    with pytest.raises(StorageError, match="the previous asynchronous save failed"):
        ck.save(3, _state(3))  # the failed save is reported once more, at the next call, as designed
    ck.save(3, _state(3)).result()  # and then the save goes through
    ck.close()
    assert str(gc.latest(root)) == f"{root}/step_000000003"
    out = _blank()
    gc.load(out, gc.latest(root))
    assert _exact(out, 3) and gc.Checkpoint(gc.latest(root)).verify() > 0


def test_a_commit_whose_answer_was_lost_is_not_taken_for_a_lost_race(bucket: str, proxy: FaultProxy) -> None:
    """The store applies the manifest's conditional PUT and the answer is lost; botocore sends it
    again and the store says 412 (it is there). That is our own manifest, not another writer's:
    the save succeeds and keeps its files (taken for a lost race, it would remove the data of the
    checkpoint it had just committed)."""
    url = f"s3://{bucket}/lost/step_000000001"
    proxy.lose_response(f"/{MANIFEST}", 1)
    res = gc.save(_state(1), url, step=1)
    assert proxy.lost == 1 and isinstance(res, gc.SaveResult)
    out = _blank()
    gc.load(out, url)
    assert _exact(out, 1) and gc.Checkpoint(url).verify() > 0
    assert str(gc.latest(f"s3://{bucket}/lost")) == url
