"""``goodput bench ckpt --dir s3://bucket/prefix``: goodput's save and load on an object store
against the plain client moving the same bytes, at the same part size and concurrency, in the
same run (goals: save and load each >= 0.9 x the raw client's throughput)."""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

GOAL = 0.9


def _state(total: int, ntensors: int) -> dict[str, torch.Tensor]:
    n = max(1, total // 4 // ntensors)
    g = torch.Generator().manual_seed(0)
    return {f"t{i}": torch.rand(n, generator=g) for i in range(ntensors)}


def _raw_upload(client: Any, bucket: str, key: str, data: memoryview, part: int, conc: int) -> None:
    """boto3 multipart upload of ``data``: ``conc`` parts in flight, each a slice of the buffer."""
    uid = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    bounds = [(a, min(a + part, len(data))) for a in range(0, len(data), part)]

    def up(i: int) -> dict:
        a, b = bounds[i]
        r = client.upload_part(Bucket=bucket, Key=key, UploadId=uid, PartNumber=i + 1, Body=bytes(data[a:b]))
        return {"PartNumber": i + 1, "ETag": r["ETag"]}

    with ThreadPoolExecutor(conc) as pool:
        parts = list(pool.map(up, range(len(bounds))))
    client.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=uid, MultipartUpload={"Parts": parts})


def _raw_download(client: Any, bucket: str, key: str, into: memoryview, part: int, conc: int) -> None:
    """Parallel ranged GETs of ``part`` bytes into ``into``."""
    bounds = [(a, min(a + part, len(into))) for a in range(0, len(into), part)]

    def down(i: int) -> None:
        a, b = bounds[i]
        body = client.get_object(Bucket=bucket, Key=key, Range=f"bytes={a}-{b - 1}")["Body"]
        at = a
        while at < b:
            chunk = body.read(min(b - at, 8 << 20))
            if not chunk:
                raise RuntimeError(f"s3://{bucket}/{key}: short read at {at}")
            into[at : at + len(chunk)] = chunk
            at += len(chunk)

    with ThreadPoolExecutor(conc) as pool:
        list(pool.map(down, range(len(bounds))))


def _timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


@contextlib.contextmanager
def server(location: str, endpoint: str | None, start_server: bool, **opts: Any) -> Iterator[Any]:
    """The S3 store of ``location`` configured (endpoint, part size, concurrency), with a local
    SeaweedFS started for the run and the bucket created in it when ``start_server``."""
    from goodput.ckpt.storage import s3

    weed = None
    if start_server:
        from goodput.demo.seaweed import Weed

        scratch = Path(tempfile.mkdtemp(prefix="goodput-bench-weed-"))
        weed = Weed(scratch / "data")
        weed.start()
        os.environ.update(weed.env())  # the writer processes and this one alike
        endpoint = weed.endpoint
    try:
        if endpoint:
            opts["endpoint_url"] = endpoint
        store = s3.configure(**{k: v for k, v in opts.items() if v})
        if start_server:
            store.client().create_bucket(Bucket=s3.split(location)[0])
        yield store
    finally:
        if weed is not None:
            weed.stop()
            shutil.rmtree(scratch, ignore_errors=True)  # the server's volumes: gigabytes a run


def run(
    location: str,
    total: int,
    *,
    ntensors: int = 8,
    repeat: int = 3,
    part_bytes: int | None = None,
    concurrency: int | None = None,
    endpoint: str | None = None,
    start_server: bool = False,
    on_phase: Callable[[int, int, str], None] | None = None,
) -> dict[str, Any]:
    from goodput import ckpt as gc
    from goodput.ckpt.storage import s3

    with server(location, endpoint, start_server, part_bytes=part_bytes, concurrency=concurrency) as store:
        bucket, prefix = s3.split(location)
        client = store.client()
        part, conc = store.options.part_bytes, store.options.concurrency
        base = f"{prefix}/goodput-bench-{uuid.uuid4().hex[:8]}".strip("/")
        state = _state(total, ntensors)
        nbytes = sum(t.numel() * 4 for t in state.values())
        flat = torch.cat([t.view(-1) for t in state.values()]).view(torch.uint8).numpy()
        data = memoryview(flat)
        sink = bytearray(len(data))
        out = {k: torch.zeros_like(v) for k, v in state.items()}
        halves = {
            k: gc.LocalShard(torch.zeros(v.numel() - v.numel() // 2), (v.numel(),), (v.numel() // 2,))
            for k, v in state.items()
        }
        phases = ["raw upload", "goodput save", "raw download", "goodput load", "goodput resharded load"]
        times: dict[str, list[float]] = {p: [] for p in phases}
        amplification: list[float] = []
        step = 0
        for r in range(repeat):
            raw_key = f"{base}/raw-{r}"
            url = f"s3://{bucket}/{base}/ours-{r}"
            # the raw download and goodput's load take turns going first: the one right after
            # the uploads meets a server still writing them back to its disk
            order = phases if r % 2 == 0 else [phases[0], phases[1], phases[3], phases[2], phases[4]]
            for i, ph in enumerate(order):
                if on_phase:
                    on_phase(step, repeat * len(phases), f"{ph} (repeat {r + 1}/{repeat})")
                step += 1
                if ph == "raw upload":
                    times[ph].append(_timed(lambda k=raw_key: _raw_upload(client, bucket, k, data, part, conc)))
                elif ph == "goodput save":
                    times[ph].append(_timed(lambda u=url: gc.save(state, u)))
                elif ph == "raw download":
                    times[ph].append(
                        _timed(lambda k=raw_key: _raw_download(client, bucket, k, memoryview(sink), part, conc))
                    )
                    if sink != flat.tobytes():
                        raise RuntimeError("raw download returned other bytes")
                elif ph == "goodput load":
                    for t in out.values():
                        t.zero_()  # touched beforehand, as the raw download's buffer is
                    times[ph].append(_timed(lambda u=url, o=out: gc.load(o, u)))
                    if not all(torch.equal(out[k], state[k]) for k in state):
                        raise RuntimeError("goodput load returned other values")
                else:  # the second half of each tensor, as one of two ranks would read it
                    for h in halves.values():
                        h.tensor.zero_()
                    before = store.bytes_read
                    times[ph].append(_timed(lambda u=url, h=halves: gc.load(h, u)))
                    need = sum(h.tensor.numel() * 4 for h in halves.values())
                    amplification.append((store.bytes_read - before) / need)
                del i
            with _quiet():
                store.remove_tree(Path(f"s3://{bucket}/{base}/ours-{r}"))
                client.delete_object(Bucket=bucket, Key=raw_key)
        med = {p: statistics.median(v) for p, v in times.items()}
        rate = {p: nbytes / med[p] / 1e6 for p in phases}
        rate["goodput resharded load"] = nbytes / 2 / med["goodput resharded load"] / 1e6
        save_ratio = rate["goodput save"] / rate["raw upload"]
        load_ratio = rate["goodput load"] / rate["raw download"]
        return {
            "location": f"s3://{bucket}/{base}",
            "endpoint": store.options.endpoint_url or os.environ.get("AWS_ENDPOINT_URL"),
            "bytes": nbytes,
            "tensors": ntensors,
            "repeat": repeat,
            "part_bytes": part,
            "concurrency": conc,
            "seconds": times,
            "mb_per_s": rate,
            "save_ratio": save_ratio,
            "load_ratio": load_ratio,
            "resharded_read_amplification": max(amplification) if amplification else None,
            "goal": GOAL,
            "pass": save_ratio >= GOAL and load_ratio >= GOAL,
            "cpus": os.cpu_count(),
            "threads": threading.active_count(),
        }


class _quiet:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return True


def render(res: dict[str, Any], console: Any) -> None:
    from rich.table import Table

    from goodput.plan.units import fmt_bytes

    t = Table(
        title=f"S3 checkpoint bench: {fmt_bytes(res['bytes'])} at {res['location']} "
        f"(part {fmt_bytes(res['part_bytes'])}, {res['concurrency']} in flight, median of {res['repeat']})"
    )
    for c in ("phase", "MB/s", "median s"):
        t.add_column(c)
    for p, r in res["mb_per_s"].items():
        t.add_row(p, f"{r:,.0f}", f"{statistics.median(res['seconds'][p]):.3f}")
    console.print(t)
    mark = "[green]meets[/green]" if res["pass"] else "[red]misses[/red]"
    console.print(
        f"save {res['save_ratio']:.2f} x raw upload, load {res['load_ratio']:.2f} x raw download: {mark} the "
        f"{res['goal']} x goal; resharded load read {res['resharded_read_amplification']:.3f} x the bytes it needs"
    )
