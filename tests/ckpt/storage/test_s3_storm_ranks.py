"""A 503 storm on the writes of a two-rank asynchronous save: every rank fails with the storage's
error, naming its object, as soon as the store's retries are spent — never after the save's
timeout, which is set far above that budget (an hour) so that waiting it out cannot pass for a
prompt failure. Nothing is committed, the last committed step still loads, and the next save
after the storm commits. The ranks are real processes on gloo, their writers real threads or
writer processes, the store a real SeaweedFS behind :class:`tests.ckpt.s3_server.FaultProxy`."""

from __future__ import annotations

import pytest
import torch

import goodput.ckpt as gc
from goodput.ckpt.errors import StorageError
from goodput.ckpt.format.format import MANIFEST
from goodput.demo.seaweed import Weed
from tests.ckpt.s3_server import FaultProxy, keys
from tests.distributed import run_ranks

N = 1 << 18  # floats per rank: one 1 MiB object each
HOUR = 3600.0
STEP2 = "/step_000000002/"


def _state(rank: int, step: int) -> dict:
    local = torch.arange(N, dtype=torch.float32) + rank * N + step
    return {"w": gc.LocalShard(local, (2 * N,), (rank * N,)), "meta": {"step": step}}


def _exact(root: str, step: int) -> bool:
    out = {"w": torch.zeros(2 * N), "meta": {"step": None}}
    gc.load(out, f"{root}/step_{step:09d}")
    return torch.equal(out["w"], torch.arange(2 * N, dtype=torch.float32) + step) and out["meta"] == {"step": step}


def _ranks(rank: int, world: int, root: str, mode: str) -> dict:
    ck = gc.Checkpointer(root, interval=1, mode=mode, timeout=HOUR)
    ck.save(1, _state(rank, 1)).result()
    try:
        ck.save(2, _state(rank, 2)).result(timeout=HOUR)
        failed: dict = {"type": None}
    except BaseException as e:  # noqa: BLE001 - the test inspects it
        failed = {
            "type": type(e).__name__,
            "storage": isinstance(e, StorageError),
            "save": isinstance(e, gc.SaveError),
            "msg": str(e),
        }
    try:  # the failed save is reported once more, at the next call, on every rank
        ck.save(3, _state(rank, 3))
        again = None
    except gc.SaveError as e:
        again = str(e)
    ck.save(3, _state(rank, 3)).result(timeout=HOUR)
    ck.close()
    return {"failed": failed, "again": again, "latest": str(gc.latest(root)), "step1": _exact(root, 1)}


# "all": every write of step 2 (data, done reports, abort, manifest) is refused; "rank1": only
# rank 1's (its data and its done report), so rank 0 writes and waits for a report that the
# storage will never carry: it hears of rank 1's failure through the process group's store
STORMS = {"all": STEP2, "rank1": (STEP2, "-r00001")}


@pytest.mark.parametrize("mode", ["thread", "process"])
@pytest.mark.parametrize("storm", sorted(STORMS))
def test_a_write_storm_fails_every_rank_of_an_async_save_with_the_storage_error(
    weed: Weed, bucket: str, mode: str, storm: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = f"s3://{bucket}/ranks-{storm}-{mode}"
    with FaultProxy(weed.endpoint) as proxy:
        # for the whole test: step 1 and step 3 are not touched
        proxy.storm_methods, proxy.storm_part, proxy.storm = ("PUT", "POST"), STORMS[storm], True
        # the ranks and their writer processes inherit the environment: through the proxy, two
        # tries a request (botocore's variable; a second or two of backoff, far below an hour)
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")
        # run_ranks' own limit only keeps a hung run from hanging the suite: the assertion is
        # on the error each rank got, which an hour's timeout could never produce in time
        out = run_ranks(_ranks, 2, root, mode, timeout=900)
        assert proxy.answered_503 > 0
        # the parent's checks, through the proxy too (step 2's writes only are refused)
        assert not [k for k in keys(bucket, f"ranks-{storm}-{mode}{STEP2}") if k.endswith(MANIFEST)]
        assert _exact(root, 3) and _exact(root, 1)
    for rank, r in enumerate(out):
        f = r["failed"]
        assert f["type"] == "StorageSaveError" and f["storage"] and f["save"], (rank, f)
        assert "nothing was committed" in f["msg"], f["msg"]
        # the object at fault: each rank's own, or rank 1's where only its writes failed
        assert f"{bucket}/ranks-{storm}-{mode}{STEP2}data-" in f["msg"], f["msg"]
        if storm == "rank1":
            assert "-r00001-" in f["msg"], f["msg"]
        assert "SlowDown" in f["msg"] or "ServiceUnavailable" in f["msg"], f["msg"]
        assert "within" not in f["msg"], f["msg"]  # not a timeout's wording
        assert r["again"] is not None and "the previous asynchronous save failed" in r["again"]
        assert r["latest"] == f"{root}/step_000000003" and r["step1"]
