"""``goodput bench serve`` end to end at a toy size: a real service subprocess, real HTTP, SIGKILL and a
restart. The speed figures are not asserted (the goals live in the command); what is asserted is the
JSON contract and that every accepted submission survived the kill exactly once."""

from __future__ import annotations

import json
import math
import threading
import time
import urllib.error
import urllib.request

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
    # the default SIGKILLs the service in the middle of the load and restarts it on the same store: the
    # clients' retries with their idempotency keys neither lose nor double a submission
    assert out["killed_mid_load"] is True and out["config"]["kill_after"] == 100
    assert 100 <= out["accepted_at_kill"] < 200 and out["outage_s"] > 0
    assert out["replayed"] <= out["retried"]
    for key in ("submissions_per_s", "latency_p50_ms", "latency_p99_ms"):
        assert isinstance(out[key], float) and math.isfinite(out[key]) and out[key] > 0, key
    assert out["latency_p99_ms"] >= out["latency_p50_ms"]
    assert out["passes"] >= 1 and out["tick_p99_ms"] is not None and out["tick_p99_ms"] >= 0
    assert isinstance(out["goals"], dict) and len(out["goals"]) == 3
    assert out["pass"] == all(out["goals"].values())
    assert not list(tmp_path.iterdir())  # the work directory is removed without --keep


def _get(url: str, token: str) -> tuple[int, dict]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, {}


def test_stats_is_admin_only(tmp_path) -> None:
    """On a real uvicorn server in this process: /stats answers admins only, tokens are cached."""
    import uvicorn

    from goodput.sched.live.local import free_port
    from goodput.sched.live.service import Service, create_app, local_pools, new_token

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    svc = Service(f"sqlite:///{tmp_path / 's.db'}", local_pools(1, 1), state_dir=tmp_path / "state", url=url)
    svc.start()
    server = uvicorn.Server(uvicorn.Config(create_app(svc), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.05)
        tenant, admin = new_token(svc.store, "a"), new_token(svc.store, "root", "admin")
        assert _get(url + "/stats", tenant)[0] == 403
        code, body = _get(url + "/stats", admin)
        assert code == 200 and set(body) >= {"passes", "pass_ms", "lock_wait_ms"}
        # a token's use is answered from the cache (refreshed from the store every half second)
        from goodput.sched.live.service import digest

        assert svc.caller(f"Bearer {tenant}") == svc.caller(f"Bearer {tenant}")
        assert digest(tenant) in svc._tokens
        assert _get(url + "/jobs", "gp_unknown")[0] == 401
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        svc.close()
