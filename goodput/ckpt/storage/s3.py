"""S3-compatible object stores as checkpoint storage: ``s3://bucket/prefix/step_100``.

The commit protocol (docs/FORMAT.md) needs no rename and no overwrite of data, so an object store
serves it with the operations of :class:`goodput.ckpt.storage.base.Storage`: each rank's data file is
one object written by a multipart upload (parts in parallel, bounded memory), the metadata one
PUT, and the manifest, last, one small PUT, which is atomic on every S3 server. A first commit of
a checkpoint is a conditional PUT (``If-None-Match: *``): of two writers racing to commit one
checkpoint exactly one wins (:meth:`S3Storage.publish_new`). Loads read byte ranges (ranged GETs),
so a resharded load reads only what its boxes need, and every block checksum is verified as on
POSIX.

Endpoint, region and credentials come from boto3's standard chain (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``, ``~/.aws/config`` ...), or from
:func:`configure`. Retries (botocore's "standard" mode: exponential backoff with jitter) cover
throttling (503 whatever its error code, e.g. SeaweedFS's ``ErrTooManyRequest``), other 5xx,
connection resets and timeouts; a request that still fails raises an error naming the object.

A location ``s3://b/k`` is an :class:`goodput.ckpt.storage.location.S3Location` where the code joins names
onto it: it prints as the URL everywhere (handles, ``latest()``, listings, events). A ``Path`` of
it folds the double slash (``s3:/b/k``); both spellings are understood here.

:func:`configure` takes any subset of the options; what it leaves out comes from the standard
chain, the other half of a key included.
"""

from __future__ import annotations

import contextlib
import io
import os
import random
import re
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import CheckpointError, StorageError, StorageSaveError
from .base import Entry, Sink, Source, Storage

SCHEME = "s3"
MIN_PART = 5 << 20  # S3's smallest part (all but the last)
MAX_PARTS = 10_000
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]\Z")


def is_s3(location: Any) -> bool:
    s = os.fspath(location) if not isinstance(location, str) else location
    return isinstance(s, str) and s.startswith(f"{SCHEME}:/")


def split(location: Any) -> tuple[str, str]:
    """``(bucket, key prefix)`` of ``s3://bucket/a/b`` (or ``Path``'s ``s3:/bucket/a/b``), the
    prefix without its trailing slash. Refuses what an object key must not be here: empty, ``.``
    or ``..`` parts (a listing would not find them again)."""
    s = os.fspath(location)
    rest = s[len("s3://") :] if s.startswith("s3://") else s[len("s3:/") :]
    bucket, _, key = rest.partition("/")
    if not _BUCKET.match(bucket):
        raise ValueError(f"{url(location)!r}: {bucket!r} is not an S3 bucket name (3-63 of a-z, 0-9, '.', '-')")
    key = key.strip("/")
    if any(p in ("", ".", "..") for p in key.split("/")) and key:
        raise ValueError(f"{url(location)!r}: an object key may not hold empty, '.' or '..' parts")
    return bucket, key


def url(location: Any) -> str:
    s = os.fspath(location)
    return "s3://" + s[len("s3:/") :].lstrip("/") if s.startswith("s3:/") else s


@dataclass(frozen=True)
class S3Options:
    """How to reach the store; None takes boto3's standard chain (environment, config files)."""

    endpoint_url: str | None = None
    region: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = None
    part_bytes: int = 16 << 20  # multipart part size (>= 5 MiB)
    concurrency: int = 8  # parts in flight per file, and ranged GETs per load thread pool
    # per request, with backoff and jitter; botocore's AWS_MAX_ATTEMPTS when set, which the
    # asynchronous writer processes inherit (configure() is per process and never reaches them)
    max_attempts: int = field(default_factory=lambda: _env_attempts())
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        if self.part_bytes < MIN_PART:
            raise ValueError(f"part_bytes must be at least 5 MiB (S3's smallest part), got {self.part_bytes}")
        if self.concurrency < 1 or self.max_attempts < 1:
            raise ValueError("concurrency and max_attempts must be at least 1")


def _env_attempts() -> int:
    raw = os.environ.get("AWS_MAX_ATTEMPTS", "").strip()
    if not raw:
        return 8
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"AWS_MAX_ATTEMPTS={raw!r} is not a whole number") from None


class _Client:
    """One boto3 client per process (clients are thread-safe; they must not cross a fork)."""

    def __init__(self, options: S3Options):
        self.options = options
        self._pid = -1
        self._client: Any = None
        self._lock = threading.Lock()

    def get(self) -> Any:
        if self._client is None or self._pid != os.getpid():
            with self._lock:
                if self._client is None or self._pid != os.getpid():
                    self._client = self._make()
                    self._pid = os.getpid()
        return self._client

    def _make(self) -> Any:
        try:
            import boto3
            from botocore.config import Config
        except ImportError:
            raise ImportError("s3:// checkpoints need boto3: pip install 'goodput[s3]'") from None

        o = self.options
        config = Config(
            retries={"mode": "standard", "max_attempts": o.max_attempts},
            # boto3 >= 1.36 sends and demands CRC checksums by default, which servers other
            # than AWS reject or lack; goodput checksums every block itself
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
            s3={"addressing_style": "path"},
            max_pool_connections=max(10, 4 * o.concurrency),
            connect_timeout=o.connect_timeout_s,
            read_timeout=o.read_timeout_s,
        )
        session = boto3.session.Session()
        key, secret, token = o.access_key_id, o.secret_access_key, None
        if (key is None) != (secret is None):  # one half given: the standard chain gives the other
            chain = session.get_credentials()
            frozen = chain.get_frozen_credentials() if chain is not None else None
            if frozen is None or not frozen.access_key or not frozen.secret_key:
                given = "access_key_id" if key is not None else "secret_access_key"
                raise CheckpointError(
                    f"s3.configure({given}=...): the other half of the key is in no place the AWS chain looks "
                    "(AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, ~/.aws/credentials, ...); give both"
                )
            key, secret = key or frozen.access_key, secret or frozen.secret_key
            token = frozen.token if key == frozen.access_key else None
        return session.client(
            "s3",
            endpoint_url=o.endpoint_url,
            region_name=o.region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1",
            aws_access_key_id=key,
            aws_secret_access_key=secret,
            aws_session_token=token,
            config=config,
        )


def _code(e: Exception) -> str:
    resp = getattr(e, "response", None) or {}
    err = resp.get("Error", {})
    return str(err.get("Code") or resp.get("ResponseMetadata", {}).get("HTTPStatusCode") or "")


def _missing(e: Exception) -> bool:
    return _code(e) in ("404", "NoSuchKey", "NotFound", "NoSuchUpload")


def _why(e: Exception) -> str:
    code = _code(e)
    return f"{code}: {e}" if code and code not in str(e) else str(e)


class S3Sink(Sink):
    """One object written once, sequentially: a multipart upload whose parts go up in parallel
    while later ones fill (at most ``concurrency`` parts in memory), or one PUT when it stays
    under a part. Nothing is visible under the key until :meth:`finish` completes the upload;
    a failure aborts it, so no orphaned parts stay behind."""

    def __init__(self, store: S3Storage, bucket: str, key: str):
        self.store, self.bucket, self.key = store, bucket, key
        o = store.options
        self.part_bytes = o.part_bytes
        self.pos = 0
        self._buf = bytearray(self.part_bytes)
        self._fill = 0
        self._upload: str | None = None
        self._parts: list[Future] = []
        self._slots = threading.Semaphore(o.concurrency)
        self._pool: ThreadPoolExecutor | None = None
        self._done = False

    def write(self, data: memoryview) -> None:
        """Whole parts of a large write go up straight from the caller's memory (streamed from
        it, no copy), in parallel, and the call returns when they are up (the caller may reuse
        its buffer then); the rest fills the part buffer."""
        mv = memoryview(data).cast("B")
        self.pos += len(mv)
        direct: list[Future] = []
        while len(mv):
            if self._fill == 0 and len(mv) >= self.part_bytes:
                direct.append(self._send(mv[: self.part_bytes]))
                mv = mv[self.part_bytes :]
                continue
            n = min(len(mv), self.part_bytes - self._fill)
            self._buf[self._fill : self._fill + n] = mv[:n]
            self._fill += n
            mv = mv[n:]
            if self._fill == self.part_bytes:
                self._send_part()
        for f in direct:
            f.exception()  # wait; an error is raised at finish(), naming the object

    def align(self, to: int) -> None:
        pad = (-self.pos) % to
        if pad:
            self.write(memoryview(bytes(pad)))

    def _send_part(self) -> None:
        if self._fill == self.part_bytes:  # hand the full buffer over and fill a new one: no copy
            body: bytes | bytearray = self._buf
            self._buf = bytearray(self.part_bytes)
        else:
            body = bytes(memoryview(self._buf)[: self._fill])
        self._fill = 0
        self._send(body)

    def _send(self, body: bytes | bytearray | memoryview) -> Future:
        c = self.store.client()
        if self._upload is None:
            try:
                self._upload = c.create_multipart_upload(Bucket=self.bucket, Key=self.key)["UploadId"]
            except Exception as e:
                raise StorageSaveError(f"{self._url()}: starting the multipart upload failed: {_why(e)}") from None
            self._pool = ThreadPoolExecutor(self.store.options.concurrency, thread_name_prefix="goodput-s3-put")
        number = len(self._parts) + 1
        if number > MAX_PARTS:
            raise StorageSaveError(f"{self._url()}: more than {MAX_PARTS} parts; raise S3Options.part_bytes")
        self._failed()
        self._slots.acquire()  # bounded: at most ``concurrency`` parts held while they upload
        assert self._pool is not None
        f = self._pool.submit(self._put_part, number, body)
        self._parts.append(f)
        return f

    def _put_part(self, number: int, body: bytes | bytearray | memoryview) -> dict:
        try:
            stream = _ViewReader(body) if isinstance(body, memoryview) else body
            r = self.store.client().upload_part(
                Bucket=self.bucket, Key=self.key, UploadId=self._upload, PartNumber=number, Body=stream
            )
            return {"PartNumber": number, "ETag": r["ETag"]}
        finally:
            self._slots.release()

    def _failed(self) -> None:
        for f in self._parts:
            if f.done() and f.exception() is not None:
                raise StorageSaveError(f"{self._url()}: uploading part failed: {_why(f.exception())}")  # type: ignore[arg-type]

    def finish(self) -> None:
        c = self.store.client()
        if self._upload is None:
            try:
                c.put_object(Bucket=self.bucket, Key=self.key, Body=bytes(memoryview(self._buf)[: self._fill]))
            except Exception as e:
                raise StorageSaveError(f"{self._url()}: PUT failed: {_why(e)}") from None
            self._done = True
            return
        if self._fill:
            self._send_part()
        parts = []
        for f in self._parts:
            try:
                parts.append(f.result())
            except Exception as e:
                raise StorageSaveError(f"{self._url()}: uploading part failed: {_why(e)}") from None
        try:
            c.complete_multipart_upload(
                Bucket=self.bucket, Key=self.key, UploadId=self._upload, MultipartUpload={"Parts": parts}
            )
        except Exception as e:
            raise StorageSaveError(f"{self._url()}: completing the multipart upload failed: {_why(e)}") from None
        self._done = True

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        if self._upload is not None and not self._done:
            # best effort: an upload left behind is found by its key (it names the save) later
            with contextlib.suppress(Exception):  # the save already failed; cleanup is best effort
                self.store.client().abort_multipart_upload(Bucket=self.bucket, Key=self.key, UploadId=self._upload)
        self._buf = bytearray()

    def _url(self) -> str:
        return f"s3://{self.bucket}/{self.key}"


class _ViewReader(io.RawIOBase):
    """A seekable file over a memoryview: the HTTP client streams a part from it (botocore takes
    bytes or a file, not a view) and can rewind it to retry."""

    def __init__(self, view: memoryview):
        self._view = view
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        n = min(len(b), len(self._view) - self._pos)
        memoryview(b).cast("B")[:n] = self._view[self._pos : self._pos + n]
        self._pos += n
        return n

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: len(self._view)}[whence]
        self._pos = max(0, min(len(self._view), base + offset))
        return self._pos

    def tell(self) -> int:
        return self._pos

    def __len__(self) -> int:
        return len(self._view)


class S3Source(Source):
    """An object read by byte ranges (ranged GETs; the reader's threads issue them in parallel).

    Opened with the size the checkpoint records (no HEAD), every response's ``Content-Range``
    total is checked against it, so a truncated or replaced object still fails the read, naming
    it. Each body is read straight into the caller's buffer; a body cut short (a reset, a
    timeout) is asked for again from where it stopped, with backoff and jitter, since botocore
    retries a request only until its headers arrive."""

    def __init__(self, store: S3Storage, bucket: str, key: str, size: int, what: str = "file"):
        self.store, self.bucket, self.key = store, bucket, key
        self.name = f"s3://{bucket}/{key}"
        self.size = size
        self.what = what
        self.fd = None

    def read_into(self, buf: memoryview, offset: int, what: str | None = None) -> None:
        mv = memoryview(buf).cast("B")
        n = len(mv)
        if n == 0:
            return
        if offset + n > self.size:
            raise CheckpointError(f"{what or self.name}: file ends early at byte {self.size} (truncated)")
        got, failures = 0, 0
        while got < n:
            at = offset + got
            try:
                r = self.store.client().get_object(
                    Bucket=self.bucket, Key=self.key, Range=f"bytes={at}-{offset + n - 1}"
                )
            except Exception as e:
                raise self._refused(e, at, what) from None
            body = r["Body"]
            try:
                self._check_range(r, at, n - got, what)
                k, err = _read_body(body, mv[got:])
                got += k  # what arrived before a failure counts: the next GET asks for the rest
            finally:
                body.close()  # a refused or unfinished response's connection is closed, not pooled
            if got < n:
                failures += 1
                if failures >= self.store.options.max_attempts:
                    raise CheckpointError(
                        f"{what or self.name}: the ranged GETs of {self.name} were cut short {failures} times, "
                        f"the last at byte {offset + got}" + (f": {_why(err)}" if err is not None else "")
                    )
                _backoff(failures)
        self.store.bytes_read += n

    def _refused(self, e: Exception, at: int, what: str | None) -> CheckpointError:
        if _missing(e):
            reading = f" (reading {what})" if what and what != self.name else ""
            return CheckpointError(f"{self.what} {self.name!r} is missing{reading}")
        if _code(e) in ("416", "InvalidRange"):  # the object is shorter than the record
            return CheckpointError(
                f"{self.what} {self.name!r} ends before byte {at}, the checkpoint records {self.size} bytes "
                "(truncated or replaced)"
            )
        reading = f" (reading {what})" if what and what != self.name else ""
        return StorageError(f"{self.name}: ranged GET at byte {at} failed{reading}: {_why(e)}")

    def _check_range(self, r: dict, at: int, n: int, what: str | None) -> None:
        """The response is the range asked for, of an object of the recorded size."""
        cr = r.get("ContentRange")
        length = int(r.get("ContentLength", -1))
        if cr is None:  # a whole-object answer: a server that ignores Range
            if at == 0 and length == n == self.size:
                return
            raise CheckpointError(f"{what or self.name}: the server ignored the byte range asked of {self.name}")
        m = _CONTENT_RANGE.match(cr)
        if m is None:
            raise CheckpointError(f"{what or self.name}: unreadable Content-Range {cr!r} from {self.name}")
        a, b, total = int(m[1]), int(m[2]), m[3]
        if total != "*" and int(total) != self.size:
            raise CheckpointError(
                f"{self.what} {self.name!r} is {total} bytes, the checkpoint records {self.size} (truncated or replaced)"
            )
        if a != at or b - a + 1 != n or length not in (-1, n):
            raise CheckpointError(
                f"{what or self.name}: the server answered bytes {a}-{b} of {self.name} for {at}-{at + n - 1}"
            )

    def close(self) -> None:
        pass


_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)\Z")


_SLICE = 1 << 20


def _read_body(body: Any, into: memoryview) -> tuple[int, Exception | None]:
    """Read a response body into ``into``: the bytes read, and the error that stopped it short
    if one did (a reset, a timeout). The HTTP response under botocore's and
    urllib3's wrappers reads from the socket straight into the buffer (no intermediate bytes
    object, no second copy: on a loaded host that copy is a tenth of a load's CPU); anything
    else (an encoded body, another HTTP stack) goes through the wrappers' read."""
    raw = getattr(body, "_raw_stream", None)  # urllib3's HTTPResponse
    fp = getattr(raw, "_fp", None)  # http.client's HTTPResponse under it
    encoding = str(getattr(raw, "headers", {}).get("content-encoding", "identity")).lower()
    n, got = len(into), 0
    try:
        if fp is not None and hasattr(fp, "readinto") and hasattr(raw, "release_conn") and encoding == "identity":
            while got < n:
                # in slices: a buffered readinto fills its whole buffer or raises, and what it had
                # read when a timeout struck is lost to the count; a slice bounds that loss
                k = fp.readinto(into[got : got + _SLICE])
                if not k:
                    break
                got += k
            if fp.isclosed():  # the whole body was read: the connection goes back to the pool
                raw.release_conn()
            return got, None
        while got < n:
            chunk = body.read(min(n - got, 8 << 20))
            if not chunk:
                break
            into[got : got + len(chunk)] = chunk
            got += len(chunk)
    except Exception as e:  # noqa: BLE001 - the caller asks again for the rest
        return got, e
    return got, None


def _backoff(failures: int) -> None:
    """Full jitter, as botocore's standard mode: up to 0.1 s doubling, at most 5 s."""
    time.sleep(random.uniform(0, min(5.0, 0.1 * 2 ** (failures - 1))))


class S3Storage(Storage):
    """An S3-compatible object store (AWS S3, SeaweedFS, MinIO, Ceph RGW, ...)."""

    def __init__(self, options: S3Options | None = None):
        self.options = options or S3Options()
        self._client = _Client(self.options)
        self.bytes_read = 0  # ranged-GET bytes, for tests and benchmarks (approximate under threads)

    @property
    def read_threads(self) -> int:  # type: ignore[override]
        return max(4, self.options.concurrency)  # each thread waits on one ranged GET at a time

    def client(self) -> Any:
        return self._client.get()

    def _key(self, directory: Path | str, name: str | None = None) -> tuple[str, str]:
        bucket, prefix = split(directory)
        if name is None:
            return bucket, prefix
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(f"{name!r} is not a plain file name")
        return bucket, f"{prefix}/{name}" if prefix else name

    def prepare(self, directory: Path) -> None:
        bucket, _ = split(directory)
        try:
            self.client().head_bucket(Bucket=bucket)
        except Exception as e:
            raise StorageSaveError(f"{url(directory)!r}: bucket {bucket!r} cannot be reached: {_why(e)}") from None

    def create(self, directory: Path, name: str, direct: bool = False) -> Sink:
        return S3Sink(self, *self._key(directory, name))

    def put(self, directory: Path, name: str, data: bytes) -> None:
        bucket, key = self._key(directory, name)
        try:
            self.client().put_object(Bucket=bucket, Key=key, Body=bytes(data))
        except Exception as e:
            raise StorageSaveError(f"s3://{bucket}/{key}: PUT failed: {_why(e)}") from None

    def publish(self, directory: Path, name: str, data: bytes) -> None:
        self.put(directory, name, data)  # one PUT is atomic: readers see the old object or the new

    def publish_new(self, directory: Path, name: str, data: bytes) -> bool:
        """A conditional PUT. Its 412 is not always another writer's: when the store applied our
        PUT but its answer was lost (a reset, a timeout), botocore sends it again and the retry
        finds the object there. So a 412 reads the object back: our own bytes mean we won (the
        caller would otherwise remove the files of the checkpoint it has just committed)."""
        bucket, key = self._key(directory, name)
        body = bytes(data)
        try:
            self.client().put_object(Bucket=bucket, Key=key, Body=body, IfNoneMatch="*")
        except Exception as e:
            if _code(e) in ("412", "PreconditionFailed", "409", "ConditionalRequestConflict"):
                held = self._get(directory, name, "object", max(len(body), 1 << 20))
                return held == body  # bytes carrying the save's id and checksum: nobody else's
            raise StorageSaveError(f"s3://{bucket}/{key}: conditional PUT failed: {_why(e)}") from None
        return True

    def sync(self, directory: Path) -> None:
        pass  # a completed PUT is durable

    def _head(self, bucket: str, key: str, what: str) -> int:
        try:
            return int(self.client().head_object(Bucket=bucket, Key=key)["ContentLength"])
        except Exception as e:
            if _missing(e):
                raise CheckpointError(f"{what} 's3://{bucket}/{key}' is missing") from None
            raise StorageError(f"{what} 's3://{bucket}/{key}' cannot be opened: {_why(e)}") from None

    def open(self, directory: Path, name: str, what: str, size: int | None = None) -> Source:
        bucket, key = self._key(directory, name)
        if size is not None:  # checked on every GET instead of a HEAD now
            return S3Source(self, bucket, key, size, what)
        return S3Source(self, bucket, key, self._head(bucket, key, what), what)

    def get(self, directory: Path, name: str, what: str, limit: int) -> bytes:
        data = self._get(directory, name, what, limit)
        if data is None:
            bucket, key = self._key(directory, name)
            raise CheckpointError(f"{what} 's3://{bucket}/{key}' is missing")
        return data

    def get_if_exists(self, directory: Path, name: str, what: str, limit: int) -> bytes | None:
        """The object, or None when the store says it is missing; any other failure raises
        (:class:`StorageError`, after botocore's retries): it never reads as "missing"."""
        return self._get(directory, name, what, limit)

    def _get(self, directory: Path, name: str, what: str, limit: int) -> bytes | None:
        bucket, key = self._key(directory, name)
        try:
            r = self.client().get_object(Bucket=bucket, Key=key)
        except Exception as e:
            if _missing(e):
                return None
            raise StorageError(f"{what} 's3://{bucket}/{key}' cannot be read: {_why(e)}") from None
        size = int(r.get("ContentLength", 0))
        if size > limit:
            r["Body"].close()
            raise CheckpointError(f"{what} 's3://{bucket}/{key}' is {size} bytes, more than the {limit} it may be")
        try:
            data = r["Body"].read(limit + 1)
        except Exception as e:
            raise StorageError(f"{what} 's3://{bucket}/{key}' cannot be read: {_why(e)}") from None
        if len(data) > limit:
            raise CheckpointError(f"{what} 's3://{bucket}/{key}' is more than the {limit} bytes it may be")
        return data

    def exists(self, directory: Path, name: str) -> bool:
        bucket, key = self._key(directory, name)
        try:
            self.client().head_object(Bucket=bucket, Key=key)
            return True
        except Exception as e:
            if _missing(e):
                return False
            raise StorageError(f"'s3://{bucket}/{key}' cannot be checked: {_why(e)}") from None

    def list(self, directory: Path) -> list[Entry]:
        """Objects and common prefixes one level under ``directory``; FileNotFoundError when there
        is neither (as a missing directory on POSIX: an empty prefix does not exist on S3)."""
        bucket, prefix = self._key(directory)
        pre = f"{prefix}/" if prefix else ""
        out = []
        try:
            pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=pre, Delimiter="/")
            for page in pages:
                for p in page.get("CommonPrefixes", []):
                    name = p["Prefix"][len(pre) :].rstrip("/")
                    if name and "/" not in name:
                        out.append(Entry(name, "dir", 0.0, 0))
                for o in page.get("Contents", []):
                    name = o["Key"][len(pre) :]
                    if name and "/" not in name:
                        out.append(Entry(name, "file", o["LastModified"].timestamp(), int(o["Size"])))
        except Exception as e:
            # NoSuchBucket too: a typo must not read as "no checkpoint yet", and a store that has
            # just restarted can say it for a moment about a bucket it holds
            raise StorageError(f"{url(directory)!r} cannot be listed: {_why(e)}") from None
        if not out:
            raise FileNotFoundError(f"{url(directory)!r}: nothing is stored under this prefix")
        out.sort(key=lambda x: x.name)
        return out

    def remove(self, directory: Path, name: str) -> None:
        bucket, key = self._key(directory, name)
        with contextlib.suppress(Exception):  # best effort by contract
            self.client().delete_object(Bucket=bucket, Key=key)

    def remove_tree(self, directory: Path) -> None:
        bucket, prefix = self._key(directory)
        if not prefix:
            return  # never a whole bucket
        c = self.client()
        try:
            for page in c.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
                keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
                if keys:
                    c.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})
            self.abort_uploads(directory)
        except Exception as e:  # the caller says it: retention that stops in silence fills the bucket
            raise StorageError(f"'s3://{bucket}/{prefix}/' cannot be removed: {_why(e)}") from e

    def uploads(self, directory: Path) -> list[tuple[str, str]]:
        """Incomplete multipart uploads under ``directory``: ``(key, upload id)``. Their keys name
        the save they belong to (``data-<save id>-...``), so no start time is needed to tell whose
        they are (some servers give none)."""
        bucket, prefix = self._key(directory)
        out = []
        for page in self.client().get_paginator("list_multipart_uploads").paginate(Bucket=bucket, Prefix=prefix + "/"):
            out += [(u["Key"], u["UploadId"]) for u in page.get("Uploads", [])]
        return out

    def abort_uploads(self, directory: Path) -> int:
        """Abort every incomplete multipart upload under ``directory`` (at any depth)."""
        bucket, _ = self._key(directory)
        n = 0
        for key, uid in self.uploads(directory):
            try:
                self.client().abort_multipart_upload(Bucket=bucket, Key=key, UploadId=uid)
                n += 1
            except Exception:  # noqa: BLE001, S112 - another cleaner may have taken it
                continue
        return n


_default_lock = threading.Lock()
_default: S3Storage | None = None


def configure(**options: Any) -> S3Storage:
    """Set how ``s3://`` locations are reached in this process (see :class:`S3Options`); fields
    not given keep their values. Returns the storage now used."""
    global _default
    with _default_lock:
        base = _default.options if _default is not None else S3Options()
        _default = S3Storage(replace(base, **options))
        return _default


def default_storage() -> S3Storage:
    global _default
    with _default_lock:
        if _default is None:
            _default = S3Storage()
        return _default
