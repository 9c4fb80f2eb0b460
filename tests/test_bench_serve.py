"""``goodput bench serve`` end to end at a toy size: a real service subprocess, real HTTP, SIGKILL and a
restart. The speed figures are not asserted (the goals live in the command); what is asserted is the
JSON contract and that every accepted submission survived the kill exactly once."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from goodput.cli.main import app

CONTRACT = (
    "submissions_per_s",
    "latency_p50_ms",
    "latency_p99_ms",
    "tick_p99_ms",
    "lost",
    "duplicated",
    "goals",
    "pass",
)


def test_cli_json_small(tmp_path) -> None:
    args = ["bench", "serve", "--jobs", "200", "--clients", "4", "--dir", str(tmp_path), "--json"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    out = json.loads(r.output[r.output.index("{") :])
    for key in CONTRACT:
        assert key in out, key
    assert out["accepted"] == 200 and out["errors"] == 0
    assert out["lost"] == 0 and out["duplicated"] == 0 and out["unacknowledged"] == 0
    assert out["restored"] is True and out["running_during_load"] == 0  # drained: nothing started
    for key in ("submissions_per_s", "latency_p50_ms", "latency_p99_ms"):
        assert isinstance(out[key], float) and math.isfinite(out[key]) and out[key] > 0, key
    assert out["latency_p99_ms"] >= out["latency_p50_ms"]
    assert out["passes"] >= 1 and out["tick_p99_ms"] is not None and out["tick_p99_ms"] >= 0
    assert isinstance(out["goals"], dict) and len(out["goals"]) == 3
    assert out["pass"] == all(out["goals"].values())
    assert not list(tmp_path.iterdir())  # the work directory is removed without --keep


@pytest.mark.filterwarnings("ignore:Using `httpx`")  # starlette's TestClient on this httpx
def test_stats_is_admin_only(tmp_path) -> None:
    from fastapi.testclient import TestClient

    from goodput.sched.service import Service, create_app, local_pools, new_token

    svc = Service(f"sqlite:///{tmp_path / 's.db'}", local_pools(1, 1), state_dir=tmp_path / "state", url="http://x")
    svc.start()
    try:
        tenant, admin = new_token(svc.store, "a"), new_token(svc.store, "root", "admin")
        client = TestClient(create_app(svc))
        assert client.get("/stats", headers={"Authorization": f"Bearer {tenant}"}).status_code == 403
        r = client.get("/stats", headers={"Authorization": f"Bearer {admin}"})
        assert r.status_code == 200 and set(r.json()) >= {"passes", "pass_ms", "lock_wait_ms"}
        # a token's second use is answered from the cache, the same caller
        assert svc.caller(f"Bearer {tenant}") is svc.caller(f"Bearer {tenant}")
        assert client.get("/jobs", headers={"Authorization": "Bearer gp_unknown"}).status_code == 401
    finally:
        svc.close()
