"""What the S3 tests share besides the fixtures of ``tests/ckpt/conftest.py``: pointing this
process (and the ranks and writer processes it spawns, through the environment) at a server,
and listing what a test left in its bucket."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

from goodput.ckpt.storage import s3
from goodput.demo.seaweed import Weed


@contextmanager
def serving(w: Weed) -> Iterator[Weed]:
    """``w`` is where ``s3://`` goes, through the standard AWS chain, until the block ends; then
    whatever was there before (another server, or none) is back, and so is a fresh default
    storage (a test's ``s3.configure`` never outlives its server)."""
    old = {k: os.environ.get(k) for k in w.env()}
    os.environ.update(w.env())
    s3._default = None
    try:
        yield w
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        s3._default = None


def range_span(header: str) -> int:
    """Bytes a ``Range: bytes=a-b`` header asks for."""
    a, b = header.removeprefix("bytes=").split("-")
    return int(b) - int(a) + 1


def keys(bucket: str, prefix: str = "") -> list[str]:
    """Keys under ``bucket`` (a bucket name, or ``name/test prefix`` as the ``bucket`` fixture
    gives) + ``prefix``, relative to the test's prefix."""
    name, _, base = bucket.partition("/")
    full = f"{base}/{prefix}" if base else prefix
    c = s3.default_storage().client()
    out = []
    for page in c.get_paginator("list_objects_v2").paginate(Bucket=name, Prefix=full):
        out += [o["Key"][len(base) + 1 if base else 0 :] for o in page.get("Contents", [])]
    return sorted(out)


class FaultProxy:
    """A real HTTP proxy on loopback in front of a real S3 server (threaded: one thread per
    connection), answering as a throttled or failing store does, so the client and the server
    under test stay real:

    - ``fail_first(n)``: the next ``n`` requests (of ``methods``, all by default) get 503, their
      error code alternating SlowDown / ServiceUnavailable, as S3 answers a burst;
    - ``storm = True``: every request (of ``storm_methods``, whose path holds ``storm_part``, or
      each of a tuple of parts) gets 503 until it is set False again;
    - ``lose_response(part, n)``: the next ``n`` PUTs whose path holds ``part`` are applied
      by the server, then the connection is closed without an answer (a reset after the store
      acted: the client retries a request that already took effect);
    - ``cut_body(n, min_span, stall_s)``: the next ``n`` ranged GETs of more than ``min_span``
      bytes get their headers and half their body, then the connection is closed (a reset
      mid-body), after ``stall_s`` seconds of silence when given (the client's read times out).

    Everything else is forwarded as it came. ``answered_503``, ``lost``, ``cut`` and ``requests``
    count; ``ranges`` holds the Range header of every ranged GET, in order."""

    CODES = (b"SlowDown", b"ServiceUnavailable")

    def __init__(self, upstream: str):
        import http.client
        import http.server
        import threading
        from urllib.parse import urlsplit

        up = urlsplit(upstream)
        owner = self
        self.lock = threading.Lock()
        self.fail_left = 0
        self.fail_methods: tuple[str, ...] | None = None
        self.storm = False
        self.storm_methods: tuple[str, ...] | None = None
        self.storm_part: str | tuple[str, ...] = ""  # only requests whose path holds it (or all of them)
        self.lose_part, self.lose_left, self.lose_methods = "", 0, ("PUT",)
        self.cut_left, self.cut_min_span, self.cut_stall_s = 0, 0, 0.0
        self.answered_503 = 0
        self.lost = 0
        self.cut = 0
        self.ranges: list[str] = []
        self.requests: list[tuple[str, str, int]] = []  # (method, path, status answered)

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: object) -> None:
                pass

            def _any(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                m = self.command
                with owner.lock:
                    fail = owner.storm and (owner.storm_methods is None or m in owner.storm_methods)
                    parts = (owner.storm_part,) if isinstance(owner.storm_part, str) else owner.storm_part
                    fail = fail and all(p in self.path for p in parts)
                    if not fail and owner.fail_left > 0 and (owner.fail_methods is None or m in owner.fail_methods):
                        owner.fail_left -= 1
                        fail = True
                    lose = not fail and owner.lose_left > 0 and owner.lose_part in self.path and m in owner.lose_methods
                    if lose:
                        owner.lose_left -= 1
                    ranged = m == "GET" and "Range" in self.headers
                    if ranged:
                        owner.ranges.append(self.headers["Range"])
                    cut = (
                        not fail
                        and ranged
                        and owner.cut_left > 0
                        and range_span(self.headers["Range"]) > owner.cut_min_span
                    )
                    if cut:
                        owner.cut_left -= 1
                        owner.cut += 1
                    if fail:
                        code = owner.CODES[owner.answered_503 % 2]
                        owner.answered_503 += 1
                if fail:
                    msg = (
                        b"<Error><Code>" + code + b"</Code><Message>Please reduce your request rate.</Message></Error>"
                    )
                    self.send_response(503)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(msg) if m != "HEAD" else 0))
                    self.end_headers()
                    if m != "HEAD":
                        self.wfile.write(msg)
                    owner._log(m, self.path, 503)
                    return
                conn = http.client.HTTPConnection(up.hostname, up.port, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("expect", "connection")}
                conn.request(m, self.path, body=body, headers=headers)
                r = conn.getresponse()
                data = r.read()
                conn.close()
                if lose:
                    with owner.lock:
                        owner.lost += 1
                    owner._log(m, self.path, -1)
                    self.close_connection = True
                    return  # the server acted; the client hears nothing
                self.send_response(r.status)
                for k, v in r.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                length = r.getheader("Content-Length") if m == "HEAD" else str(len(data))
                self.send_header("Content-Length", length or "0")
                self.end_headers()
                if cut:
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    if owner.cut_stall_s > 0:
                        time.sleep(owner.cut_stall_s)
                    self.close_connection = True
                    owner._log(m, self.path, -2)
                    return
                if m != "HEAD":
                    self.wfile.write(data)
                owner._log(m, self.path, r.status)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _any

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def _log(self, method: str, path: str, status: int) -> None:
        with self.lock:
            self.requests.append((method, path, status))

    def fail_first(self, n: int, methods: tuple[str, ...] | None = None) -> None:
        with self.lock:
            self.fail_left, self.fail_methods = n, methods

    def lose_response(self, part: str, n: int = 1, methods: tuple[str, ...] = ("PUT",)) -> None:
        with self.lock:
            self.lose_part, self.lose_left, self.lose_methods = part, n, methods

    def cut_body(self, n: int, min_span: int = 0, stall_s: float = 0.0) -> None:
        with self.lock:
            self.cut_left, self.cut_min_span, self.cut_stall_s = n, min_span, stall_s

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
