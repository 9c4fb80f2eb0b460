"""Bounds the hostile review of the live service found missing (its attack_biglog, attack_headers,
attack_http and attack_stream scripts): a job view's history from an index by job, capped; a header
block past its bound refused; a chunked body over 1 MiB a 413; every ``/events`` stream counted
against the per-tenant cap. The history test is in-process; the others run a real ``goodput sched
serve`` and speak HTTP to it over sockets."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import sqlite3
import threading
import time

from goodput.sched.live.service import HISTORY_MAX, MAX_BODY

from .test_retention import make as make  # noqa: F401 - the fixture
from .test_service import server as server  # noqa: F401 - the fixture


def test_a_jobs_history_comes_from_an_index_capped_to_its_newest_records(make, tmp_path):  # noqa: F811
    """GET /jobs/{id}'s ``history``: the job's records only, the newest HISTORY_MAX of them with
    ``history_dropped`` counting the rest; records restored from the store at start-up are in it, and
    a job removed by retention leaves the index."""
    svc, api = make(max_ended_per_tenant=2)
    keeper = api.submit({"name": "keeper", "command": ["/bin/true"]})["id"]  # no pass runs: it stays pending
    with svc.lock:
        for i in range(HISTORY_MAX + 200):
            svc.sched.log.emit(float(i), "commit_rejected", job=keeper, epoch=0, reason=f"r{i}")
        for i in range(5000):  # other jobs' records: never part of keeper's history
            svc.sched.log.emit(float(i), "commit_rejected", job="other.00000000", epoch=0, reason="x")
    v = api.show(keeper)
    total = 1 + HISTORY_MAX + 200  # its submitted record, then the emitted ones
    assert len(v["history"]) == HISTORY_MAX and v["history_dropped"] == total - HISTORY_MAX
    assert v["history"][-1]["reason"] == f"r{HISTORY_MAX + 199}"  # the newest, oldest first
    assert v["history"][0]["reason"] == f"r{total - HISTORY_MAX - 1}"
    assert all(r["job"] == keeper for r in v["history"])
    api.cancel(keeper)  # a record emitted after the view is in the next one
    v = api.show(keeper)
    assert v["history"][-1]["event"] == "cancelled" and v["history_dropped"] == total + 1 - HISTORY_MAX
    # retention removes ended jobs (max_ended_per_tenant 2): their entries leave the index
    ended = []
    for _ in range(4):
        jid = api.submit({"name": "gone", "command": ["/bin/true"]})["id"]
        api.cancel(jid)
        ended.append(jid)
    svc.pass_once()
    with svc.lock:  # keeper and the 2 oldest removed, the newest 2 kept
        assert svc.sched.jobs.keys().isdisjoint([keeper, *ended[:2]]) and set(ended[2:]) <= svc.sched.jobs.keys()
        assert set(svc._history) <= set(svc.sched.jobs) and keeper not in svc._history
    svc.close()
    small = ended[3]
    # the store's events at start-up: the restored scheduler's log, indexed as well
    with contextlib.closing(sqlite3.connect(tmp_path / "s.db")) as db:
        seq = db.execute("SELECT MAX(seq) FROM events").fetchone()[0]
        rows = []
        for i in range(1500):
            seq += 1
            body = {"t": 1.0 + i, "event": "commit_rejected", "job": small, "epoch": 0, "reason": f"s{i}"}
            rows.append((seq, json.dumps(body, separators=(",", ":"))))
        db.executemany("INSERT INTO events (seq, body) VALUES (?, ?)", rows)
        db.commit()
    svc, api = make(max_ended_per_tenant=2)
    v = api.show(small)
    assert len(v["history"]) == HISTORY_MAX and v["history_dropped"] == 2 + 1500 - HISTORY_MAX  # + submitted, cancelled
    assert v["history"][-1]["reason"] == "s1499" and v["history"][0]["reason"] == f"s{1500 - HISTORY_MAX}"


def _exchange(port: int, head: bytes, parts, timeout: float = 20.0) -> tuple[bytes, int]:  # noqa: ANN001
    """Send ``head`` then each of ``parts`` on a thread while reading the answer here: the answer (as
    far as it came before the server closed) and how many bytes of ``parts`` went out."""
    so = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sent = [0]

    def send() -> None:
        with contextlib.suppress(OSError):
            so.sendall(head)
            for p in parts:
                so.sendall(p)
                sent[0] += len(p)

    th = threading.Thread(target=send, daemon=True)
    th.start()
    out = b""
    try:
        while b"\r\n\r\n" not in out:
            d = so.recv(65536)
            if not d:
                break
            out += d
    except OSError:
        pass  # a reset after the answer, or no answer in time (the old parser's silence)
    so.close()
    th.join(timeout)
    return out, sent[0]


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))


def test_a_header_block_past_its_bound_is_refused_and_not_buffered(server):  # noqa: F811
    """No token needed to send headers: 4 connections each offering 16 MiB of an unfinished header
    block get a 400 once past the bound (64 KiB) and are closed; the service's memory does not hold
    them, and it answers as before."""
    s = server().start()
    base = _rss_kb(s.proc.pid)
    line = b"X-Pad: " + b"p" * 8000 + b"\r\n"
    results: list[tuple[bytes, int]] = [(b"", 0)] * 4

    def one(k: int) -> None:
        results[k] = _exchange(s.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n", (line for _ in range(2000)), 10.0)

    ths = [threading.Thread(target=one, args=(k,)) for k in range(4)]
    for th in ths:
        th.start()
    for th in ths:
        th.join(60)
    for answer, sent in results:
        assert answer.split(b" ")[1:2] in ([b"400"], [b"431"]), answer[:200]
        assert sent < 2000 * len(line), "the server read all 16 MiB of headers"
    assert _rss_kb(s.proc.pid) - base < 40_000, (base, _rss_kb(s.proc.pid))
    conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=10)
    conn.request("GET", "/healthz")
    assert conn.getresponse().status == 200
    conn.close()


def test_a_chunked_body_over_the_limit_is_413_and_a_small_one_is_read(server, tmp_path):  # noqa: F811
    """A body without Content-Length (Transfer-Encoding: chunked) over 1 MiB is the documented 413,
    not FastAPI's 400; a chunked body within the limit reaches the endpoint as it came."""
    s = server()
    alice = s.token("alice")
    s.start()
    head = (
        "POST /jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
        f"Authorization: Bearer {alice}\r\n\r\n"
    ).encode()
    chunk = b"%x\r\n" % 65536 + b"y" * 65536 + b"\r\n"
    answer, _ = _exchange(s.port, head, [chunk] * (MAX_BODY // 65536 + 8) + [b"0\r\n\r\n"])
    assert answer.split(b" ")[1:2] == [b"413"], answer[:300]
    assert b"larger than" in answer or b"413" in answer
    # within the limit, chunked by http.client: the body is replayed to the endpoint unchanged
    spec = {"name": "chunked", "command": ["/bin/true"], "nodes": 1, "gpus_per_node": 1, "limit_s": 60}
    raw = json.dumps(spec).encode()
    conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=10)
    conn.request(
        "POST",
        "/jobs",
        body=iter([raw[:10], raw[10:]]),
        headers={"Authorization": f"Bearer {alice}", "Content-Type": "application/json"},
        encode_chunked=True,
    )
    r = conn.getresponse()
    got = json.loads(r.read())
    conn.close()
    assert r.status == 201 and got["id"].startswith("chunked."), (r.status, got)


def _open_stream(port: int, path: str, token: str) -> tuple[socket.socket, bytes]:
    """A stream opened and never read past its status line."""
    so = socket.create_connection(("127.0.0.1", port), timeout=10)
    so.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    so.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\r\n".encode())
    return so, so.recv(64).split(b" ")[1]


def test_every_events_stream_counts_against_the_tenants_cap(server):  # noqa: F811
    """Streams followed or not hold a slot of the tenant's cap (4): bob holding 4 gets a 429 for a
    5th, even one that is not followed, while alice still gets hers; a slot freed is usable again."""
    s = server()
    alice, bob = s.token("alice"), s.token("bob")
    s.start()
    held = [_open_stream(s.port, "/events?since=0&follow=true", bob) for _ in range(4)]
    assert [st for _, st in held] == [b"200"] * 4
    so, st = _open_stream(s.port, "/events?since=0&limit=100000", bob)
    so.close()
    assert st == b"429", st
    so, st = _open_stream(s.port, "/events?since=0&limit=100000", alice)
    so.close()
    assert st == b"200", st
    code, _ = s.get("/events?since=0", alice)
    assert code == 200
    held.pop()[0].close()
    deadline = time.monotonic() + 10  # a closed stream is noticed within half a second
    while True:
        code, _ = s.get("/events?since=0", bob)
        if code == 200:
            break
        assert code == 429 and time.monotonic() < deadline, code
        time.sleep(0.2)
    for so, _ in held:
        so.close()
    deadline = time.monotonic() + 10
    while s.get("/service", s._admin)[1]["streams"]:
        assert time.monotonic() < deadline, "streams still counted after they closed"
        time.sleep(0.2)
